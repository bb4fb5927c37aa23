"""Every core of a host: ``nsqd --workers N``, N processes behind one address.

The package, by concept (uvicorn's ``supervisors/`` is the model):

- ``spec.py``: what the supervisor tells a worker (``WorkerSpec``), a worker's own options, the
  file of each worker's client connections (``ConnectionCounts``).
- ``supervisor.py``: binds the node's sockets once, keeps N workers running.
- ``peers.py``: one worker's view of the others (``Workers``): its share of the sockets, where a
  topic's log lives, topics and channels made on every worker.
- ``admin.py``: HTTP between workers: an admin call made on every worker, a call answered by the
  worker whose partition or topic it is about, ``/stats`` and ``/ping`` for the node;
  ``members.py``: on a replicated node (every worker a member of the cluster), a call about the
  cluster passed to the member it is about, and the members' answers in one.
- ``relay.py``: a channel's links to the other workers' copies (lent messages,
  ``core/lending.py``); ``forward.py``: publishes to a topic another worker keeps; both are
  made of ``dial.py``'s ``PeerLink``, the client side of a link (one IDENTIFY, one frame
  splitter).
- ``link.py``: the serving side of a link from another worker (``WorkerLink``).
- ``lone.py``: the other workers when there are none (``LoneProcess``): ``nsqd.workers`` in a
  single process.

Nothing is imported here: ``cli`` and the supervisor load ``spec.py`` alone.
"""
