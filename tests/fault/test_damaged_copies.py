"""A copy that lost data is never trusted with the commit point (issue 56, item 4).

Real etcd, three real pynsqd processes, kill -9 and a file damaged between a stop and a start,
as Jepsen's NATS analysis did (one truncated file on one node lost acknowledged messages from
every copy). Synchronisation is on observable state: the node's log, ``/topic/replication``.
"""

from __future__ import annotations

import os
import random
import signal
from pathlib import Path

import pytest

from pynsqd.client.connection import Connection

from ..integration.replication_harness import (
    Cluster,
    Etcd,
    Node,
    replicate,
    wait_in_sync,
    wait_leader,
)
from ..waiting import wait_for

TOPIC = "orders"


@pytest.fixture
def cluster(three_nodes: Cluster) -> Cluster:
    return three_nodes


def publish(node: Node, bodies: list[bytes]) -> None:
    """MPUBs of 100 to ``node``, each answered OK (acks=all: on every in-sync copy)."""
    assert node.proc is not None
    with Connection(f"127.0.0.1:{node.proc.port}").connect() as conn:
        for i in range(0, len(bodies), 100):
            conn.mpub(TOPIC, bodies[i : i + 100])


def wait_holds(cluster: Cluster, node: Node, acked: list[bytes]) -> None:
    """Until ``node``'s copy of partition 1 holds exactly ``acked`` (a guard of 30 s)."""
    wait_for(
        lambda: [r[2] for r in cluster.read_partition(TOPIC, 1, node)] == acked,
        f"node {node.node_id}'s copy of partition 1 to hold every acknowledged message",
        30,
    )


def since_start(node: Node) -> str:
    """The node's log since its last start."""
    return node.log.read_text(errors="replace").rpartition("INFO: nsqd v")[2]


def cut_newest_segment(directory: Path) -> int:
    """Cut the newest segment of a log directory to half its size (mid-record: what a lost
    tail looks like); returns the bytes taken away."""
    newest = max(directory.glob("*.log"), key=lambda p: int(p.stem))
    size = newest.stat().st_size
    with newest.open("r+b") as f:
        f.truncate(size // 2)
    return size - size // 2


@pytest.mark.parametrize("mark", ["kept", "damaged"])
def test_a_copy_cut_short_never_leads_and_the_others_keep_what_was_acknowledged(
    cluster: Cluster, mark: str
) -> None:
    """Node 2, in sync, loses the tail of its copy of partition 1 while every node is down
    (killed within milliseconds: the in-sync set in etcd still names all three). It comes back
    first and alone: it must not lead with fewer records than were committed (the others
    would then truncate theirs to its end: acknowledged messages gone from every copy). It
    says the partition is offline and why; node 3 comes back and leads; node 2 fetches what
    it lost; node 1 comes back and takes its partition back; every copy holds every
    acknowledged message. With its ``synced`` mark damaged too (both slots), the copy cannot
    tell what it lost: it used to be trusted (the mark read as unknown hid the loss); now it
    counts as having lost its tail until it has caught up with a leader."""
    replicate(cluster)
    one, two, three = cluster.nodes
    acked = [b"m%04d" % i for i in range(600)]
    publish(one, acked)
    for n in (two, one, three):
        n.send_signal(signal.SIGKILL)
    for n in (two, one, three):
        assert n.proc is not None
        n.proc.p.wait(timeout=20)
        n.proc.log_file.close()
    copy = two.store / "replicas" / "1" / TOPIC
    assert cut_newest_segment(copy) > 0
    if mark == "damaged":
        (copy / "synced").write_bytes(b"\xff" * 1024)
    two.start()
    wait_for(lambda: "partition orders/1: offline" in since_start(two), "node 2 says so", 30)
    text = since_start(two)
    assert "lost offsets" in text, text
    if mark == "damaged":
        assert (
            "synced mark is unreadable" in text and "what its last fsync covered is unknown" in text
        )
    assert cluster.partition(TOPIC, 1) is None  # nobody leads it
    three.start()
    assert wait_leader(cluster, TOPIC, 1, timeout=30)["node"] == 3
    one.start()
    wait_in_sync(cluster, TOPIC, 1)
    for n in cluster.nodes:
        wait_holds(cluster, n, acked)
    for n in cluster.nodes:
        assert "truncated to offset" not in since_start(n), f"node {n.node_id} cut its log"


def test_a_copy_with_a_gap_in_a_closed_segment_fetches_it_again_from_its_leader(
    tmp_path: Path, etcd: Etcd
) -> None:
    """Node 2's copy loses the second half of a closed segment while it is down: at open the
    log says "offsets A-B are lost (damaged records); reads skip them". It used to stay in sync
    and could lead with the gap (readers skipped acknowledged records). Now it cuts its copy at
    the gap, fetches everything from there again from the leader, and serves every
    acknowledged message."""
    cluster = Cluster(tmp_path, etcd, 3, "--max-bytes-per-file=65536")
    try:
        replicate(cluster)
        one, two, _ = cluster.nodes
        acked = [b"m%05d" % i for i in range(6000)]
        publish(one, acked)
        wait_holds(cluster, two, acked)
        two.kill()
        copy = two.store / "replicas" / "1" / TOPIC
        segments = sorted(copy.glob("*.log"), key=lambda p: int(p.stem))
        assert len(segments) >= 3, segments
        middle = segments[len(segments) // 2]
        with middle.open("r+b") as f:
            f.truncate(middle.stat().st_size // 2)
        middle.with_suffix(".index").unlink(missing_ok=True)
        two.start()
        wait_for(lambda: "are damaged; fetching everything" in since_start(two), "the repair", 30)
        assert "are lost (damaged records)" in since_start(two)
        wait_in_sync(cluster, TOPIC, 1)
        wait_holds(cluster, two, acked)
    finally:
        cluster.stop()


def test_damaged_metadata_gives_one_line_and_the_node_starts_and_catches_up(
    cluster: Cluster,
) -> None:
    """A byte flipped in node 2's ``epochs`` file of partition 1 stopped it at every start;
    one flipped in its ``cluster.id`` put a control character into its storage id (every
    ``GET /topic/log`` answered 500, yet it could lead). Now: the id is restored from its
    copy (the same member: no new copy of every partition), the epochs file is set aside and
    the copy, which cannot tell which records a leader would keep, fetches its log again and
    joins the in-sync set again; nothing acknowledged is missing anywhere."""
    replicate(cluster)
    one, two, three = cluster.nodes
    acked = [b"m%04d" % i for i in range(600)]
    publish(one, acked)
    wait_holds(cluster, two, acked)
    storage = two.json("GET", "/info")["storage_id"]
    two.kill()
    epochs = two.store / "replicas" / "1" / TOPIC / "epochs"
    for path, index in ((epochs, 5), (two.data / "cluster.id", 2)):
        raw = bytearray(path.read_bytes())
        raw[index] ^= 0x40
        path.write_bytes(bytes(raw))
    two.start()
    wait_for(lambda: two.joined, "node 2 to join", 60)
    text = since_start(two)
    assert f"{epochs} is damaged" in text and "cluster.id was damaged" in text, text
    assert two.json("GET", "/info")["storage_id"] == storage
    wait_in_sync(cluster, TOPIC, 1)
    wait_holds(cluster, two, acked)
    for n in (one, three):
        assert "truncated to offset" not in since_start(n), f"node {n.node_id} cut its log"


def flip_inside_a_closed_segment(copy: Path, which: int) -> None:
    """Flip one bit in the middle of closed segment ``which`` of a copy, its saved index kept:
    the open reads the index and checks only the records after its last entry."""
    segments = sorted(copy.glob("*.log"), key=lambda p: int(p.stem))
    assert len(segments) > which + 1, segments
    seg = segments[which]
    assert seg.with_suffix(".index").exists()
    raw = bytearray(seg.read_bytes())
    raw[len(raw) // 3] ^= 0x01
    seg.write_bytes(bytes(raw))


def wait_taken_back(cluster: Cluster) -> None:
    """Until the origin, node 1, leads partition 1 again (a guard of 60 s)."""

    def led_by_one() -> bool:
        return (cluster.partition(TOPIC, 1) or {}).get("node") == 1

    wait_for(led_by_one, "node 1 to take its partition back", 60)


def served_right(cluster: Cluster, node: Node, acked: list[bytes], partition: int = 1) -> bool:
    """Read everything ``node`` serves of ``partition``: each record must be the one
    acknowledged at its offset (a damaged one is never served, under any offset); True once
    it serves them all."""
    got = cluster.read_partition(TOPIC, partition, node)
    for offset, _, body in got:
        assert body == acked[offset], (node.node_id, partition, offset)
    return len(got) == len(acked)


def test_a_bit_flipped_in_a_closed_segment_is_never_served_and_is_fetched_again(
    tmp_path: Path, etcd: Etcd
) -> None:
    """Issue 56 item 4: a bit flipped inside a closed segment whose index reads cleanly went
    unnoticed (only the records after the last index entry were checked at open): the node
    led and served records that fail their checksum. Now the segment's blocks are checked
    when first read: on a follower, the bad record and the rest of its segment are never
    served and are fetched again from the leader; on the leader, it steps down for an
    in-sync copy, then fetches them again and takes its partition back. No other copy cuts
    anything, and every copy ends holding every acknowledged message."""
    cluster = Cluster(tmp_path, etcd, 3, "--max-bytes-per-file=65536")
    try:
        replicate(cluster)
        one, two, three = cluster.nodes
        acked = [b"m%05d" % i for i in range(6000)]
        publish(one, acked)
        for n in cluster.nodes:
            wait_holds(cluster, n, acked)
        # A follower's copy.
        two.kill()
        flip_inside_a_closed_segment(two.store / "replicas" / "1" / TOPIC, 1)
        two.start()
        wait_in_sync(cluster, TOPIC, 1)
        wait_for(lambda: served_right(cluster, two, acked), "node 2 to serve it all", 60)
        text = since_start(two)
        assert "failed its check when read" in text and "fetching everything from" in text
        # The leader's (the origin's) copy.
        one.kill()
        assert wait_leader(cluster, TOPIC, 1, timeout=30)["node"] != 1
        flip_inside_a_closed_segment(one.store / f"{TOPIC}.log", 2)
        one.start()
        wait_taken_back(cluster)
        wait_for(lambda: served_right(cluster, one, acked), "node 1 to serve it all", 60)
        text = since_start(one)
        assert "failed its check when read" in text, text
        assert "stepping down - its copy lost offsets" in text, text
        wait_taken_back(cluster)
        for n in cluster.nodes:
            wait_holds(cluster, n, acked)
        # Node 2 cut its own copy once, to fetch its damaged records again; node 3 never.
        assert since_start(two).count("truncated to offset") == 1
        assert "truncated to offset" not in since_start(three)
    finally:
        cluster.stop()


#: ``PYNSQD_FAULT_SCALE`` (``scripts/replication-faults``): more cycles of the random attack.
SCALE = float(os.environ.get("PYNSQD_FAULT_SCALE", "1"))


@pytest.mark.timeout(900)  # scaled by PYNSQD_FAULT_SCALE
def test_random_flips_in_closed_segments_never_serve_other_content_nor_lose_anything(
    tmp_path: Path, etcd: Etcd
) -> None:
    """The attack on item 4 at random: each cycle kills one node (kill -9), flips 1-3 random
    bits in random closed segments of the copies it holds (its own partition's and the
    others'), starts it again and reads both partitions from every node until each serves
    every acknowledged message. Every read, during the repair too, must serve each offset
    with the content acknowledged there. In every other cycle the damaged node is killed
    again in the middle of its repair, once it has found the damage."""
    seed = random.randrange(1 << 30)
    rng = random.Random(seed)
    # A 10-s lease, not the harness's 2 s: under the suite's load one lapsed during the first
    # publishes ("its leadership key is gone (lease lapsed)"). It costs nothing here: a
    # restarted node revokes its killed self's lease at once, and nothing waits for one to lapse.
    cluster = Cluster(tmp_path, etcd, 3, "--max-bytes-per-file=65536", "--etcd-lease-ttl=10s")
    try:
        replicate(cluster)
        acked = {
            1: [b"one-%05d" % i for i in range(5000)],
            2: [b"two-%05d" % i for i in range(3000)],
        }
        for origin, bodies in acked.items():
            publish(cluster.node(origin), bodies)
        wait_served_whole(cluster, acked, f"seed {seed}, before any damage")
        for cycle in range(max(2, round(2 * SCALE))):
            # A copy fetched again in one answer is one segment: a node may hold none closed.
            victim = rng.choice([n for n in cluster.nodes if closed_segments(n)])
            victim.kill()
            flipped = flip_at_random(victim, rng)
            why = f"seed {seed}, cycle {cycle}, node {victim.node_id}, flipped {flipped}"
            restart(victim, why)
            if cycle % 2:
                wait_for(
                    lambda: found_or_whole(cluster, victim, acked),  # noqa: B023 (waited here)
                    f"node {victim.node_id} to read its copies ({why})",
                    60,
                )
                victim.kill()
                restart(victim, why)
            wait_served_whole(cluster, acked, why)
            for origin in acked:
                wait_in_sync(cluster, TOPIC, origin)
    finally:
        cluster.stop()


def flip_at_random(node: Node, rng: random.Random) -> list[str]:
    """Flip 1-3 random bits in random closed segments of the copies ``node`` holds (its own
    partition's log and its copies of the others'); where, for the failure message."""
    closed = closed_segments(node)
    flipped = []
    for _ in range(rng.randint(1, 3)):
        seg = rng.choice(closed)
        raw = bytearray(seg.read_bytes())
        at = rng.randrange(len(raw))
        raw[at] ^= 1 << rng.randrange(8)
        seg.write_bytes(bytes(raw))
        flipped.append(f"{seg.relative_to(node.store)}:{at}")
    return flipped


def closed_segments(node: Node) -> list[Path]:
    """The closed segments of every copy ``node`` holds (each but the newest of a copy)."""
    copies = [node.store / f"{TOPIC}.log", *node.store.glob(f"replicas/*/{TOPIC}")]
    return [
        seg for copy in copies for seg in sorted(copy.glob("*.log"), key=lambda p: int(p.stem))[:-1]
    ]


def restart(node: Node, why: str) -> None:
    node.start()
    wait_for(lambda: node.joined, f"node {node.node_id} to join ({why})", 60)


def found_or_whole(cluster: Cluster, node: Node, acked: dict[int, list[bytes]]) -> bool:
    """Read every partition from ``node`` (checked: ``served_right``): whether it has found
    damage, or serves everything."""
    whole = all(served_right(cluster, node, bodies, origin) for origin, bodies in acked.items())
    return whole or "failed its check when read" in since_start(node)


def wait_served_whole(cluster: Cluster, acked: dict[int, list[bytes]], why: str) -> None:
    """Until every node serves every partition whole, each read checked (``served_right``)."""
    for node in cluster.nodes:
        for origin, bodies in acked.items():
            wait_for(
                lambda n=node, o=origin, b=bodies: served_right(cluster, n, b, o),
                f"node {node.node_id} to serve partition {origin} whole ({why})",
                90,
            )
