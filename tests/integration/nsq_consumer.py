"""A real NSQ consumer in a process of its own, for the failover tests: pynsq (tornado) or gnsq
(gevent), given only nsqlookupd's HTTP address. Every message body is written to ``--out`` (a
line each, flushed) before it is FIN'd, so a body missing from the file was never handed over,
and a body twice was delivered twice.

    python nsq_consumer.py --client pynsq --lookupd http://127.0.0.1:4161 --topic t --channel c
        --out received.txt
"""

from __future__ import annotations

import argparse
import signal
import sys


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--client", choices=("pynsq", "gnsq"), required=True)
    ap.add_argument("--lookupd", required=True)
    ap.add_argument("--topic", required=True)
    ap.add_argument("--channel", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--max-in-flight", type=int, default=20)
    args = ap.parse_args()
    out = open(args.out, "ab", buffering=0)  # noqa: SIM115 - lives as long as the process

    def record(body: bytes) -> None:
        out.write(body + b"\n")

    if args.client == "pynsq":
        import nsq
        import tornado.ioloop

        def handler(msg: nsq.Message) -> bool:
            record(msg.body)
            return True

        nsq.Reader(
            topic=args.topic,
            channel=args.channel,
            message_handler=handler,
            lookupd_http_addresses=[args.lookupd],
            lookupd_poll_interval=1,
            lookupd_poll_jitter=0.0,
            max_in_flight=args.max_in_flight,
            max_tries=0,  # never give a message up unrecorded
        )
        loop = tornado.ioloop.IOLoop.current()
        signal.signal(signal.SIGTERM, lambda *_: loop.add_callback_from_signal(loop.stop))
        loop.start()
        return 0
    import gevent.monkey

    gevent.monkey.patch_all()
    import gnsq

    consumer = gnsq.Consumer(
        args.topic,
        args.channel,
        lookupd_http_addresses=[args.lookupd],
        lookupd_poll_interval=1,
        lookupd_poll_jitter=0.0,
        max_in_flight=args.max_in_flight,
        max_tries=0,  # never give a message up unrecorded
        max_backoff_duration=0,
    )

    @consumer.on_message.connect
    def handler(_consumer: object, message: gnsq.Message) -> None:
        record(message.body)  # gnsq FINs when the handler returns

    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    consumer.start()
    return 0


if __name__ == "__main__":
    sys.exit(main())
