"""``python -m pynsqd``: the nsqd command (``python -m pynsqd.lookupd.cli`` is nsqlookupd's)."""

import sys

from .cli import main

sys.exit(main())
