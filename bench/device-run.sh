#!/usr/bin/env bash
# The many-core figures, in one run on a lent 16-core machine (no network there): the
# wheels the server needs beyond that machine's Python (`.whl/`: cramjam, ddsketch, cp312)
# and Go NSQ 1.3.0's nsqd, bench_writer and bench_reader (`.gobin/`) travel with the tree,
# both ignored by git (.git/info/exclude). Writes under $OUT:
#   startup.md  exec to /ping OK: pynsqd, pynsqd --workers 4, Go nsqd (bench/startup.py)
#   cores.json  Go nsqd at GOMAXPROCS=k against pynsqd --workers k (bench/cores.py)
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH="/tmp/site:$PWD/src" PYTHONUNBUFFERED=1
OUT="${OUT:-/tmp/device-out}"
mkdir -p "$OUT"
echo "cores: $(nproc); $(python3 --version)"
printf '#!/bin/sh\nexec python3 -m pynsqd "$@"\n' > /tmp/pynsqd-bin
chmod +x /tmp/pynsqd-bin
python3 bench/startup.py --rounds 7 --workers 4 --nsqd /tmp/pynsqd-bin --go-nsqd .gobin/nsqd \
    2>&1 | tee "$OUT/startup.md"
python3 bench/cores.py --go-bin .gobin --cores "${CORES:-1,2,4,8,16}" --shared 16 \
    --rounds 2 --runfor 4 --out "$OUT/cores.json" 2>&1 | tee "$OUT/cores.log"
