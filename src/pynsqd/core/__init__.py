"""Topics, channels, messages and the timed queue: nsqd's semantics, free of sockets.

Nothing here imports asyncio. Time and callbacks come from a ``Scheduler`` (an event loop
satisfies it), so the core is driven by the server in production and by a fake clock in tests.
"""
