"""nsqd's HTTP side: the HTTP API, /stats, /metrics, statsd and e2e latency percentiles.

Everything here runs on nsqd's event loop and reads the live topic, channel and client objects;
nothing is copied or kept in step. Handlers return data or raise ``HTTPError`` (``api.py``),
``server.py`` turns that into nsqd's responses.
"""
