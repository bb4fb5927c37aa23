"""Sans-IO NSQ V2 protocol: bytes in, commands out; commands in, bytes out.

Nothing in this package imports asyncio or touches a socket, so the same code serves the server,
the blocking client used by the Spark connector, and the tests.
"""
