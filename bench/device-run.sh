#!/usr/bin/env bash
# The many-core figures, in one run on a lent 16-core machine (no network there): the
# wheels the server needs beyond that machine's Python (`.whl/`, cp312) and Go NSQ 1.3.0's
# nsqd, bench_writer and bench_reader (`.gobin/`) travel with the tree, both ignored by git
# (.git/info/exclude); `.old/` (optional, ignored too: `git archive REV src bench`) is an
# earlier tree measured beside. Writes under $OUT:
#   startup.md     exec to /ping OK: pynsqd, pynsqd --workers 4, Go nsqd (bench/startup.py)
#   cores.json     Go nsqd at GOMAXPROCS=k against pynsqd --workers k (bench/cores.py)
#   retained.json  the same with a retained topic (pynsqd --retention-time=1h)
#   old.json       the earlier tree's retained topic, where `.old/` is there
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH="/tmp/site:$PWD/src" PYTHONUNBUFFERED=1
OUT="${OUT:-/tmp/device-out}"
CORES="${CORES:-1,2,4,8}"
ROUNDS="${ROUNDS:-2}"
RUNFOR="${RUNFOR:-4}"
mkdir -p "$OUT"
echo "cores: $(nproc); $(python3 --version); kernel $(uname -r)"
python3 -m compileall -q src .old/src 2>/dev/null
printf '#!/bin/sh\nexec python3 -m pynsqd "$@"\n' > /tmp/pynsqd-bin
chmod +x /tmp/pynsqd-bin
python3 bench/startup.py --rounds 5 --workers 4 --nsqd /tmp/pynsqd-bin --go-nsqd .gobin/nsqd \
    2>&1 | tee "$OUT/startup.md"
python3 bench/cores.py --go-bin .gobin --cores "$CORES" --shared 16 \
    --rounds "$ROUNDS" --runfor "$RUNFOR" --out "$OUT/cores.json" 2>&1 | tee "$OUT/cores.log"
python3 bench/cores.py --go-bin .gobin --cores "$CORES" --shared 16 --py-flags=--retention-time=1h \
    --rounds "$ROUNDS" --runfor "$RUNFOR" --out "$OUT/retained.json" 2>&1 | tee "$OUT/retained.log"
if [ -d .old/src ]; then
    PYTHONPATH="/tmp/site:$PWD/.old/src" python3 .old/bench/cores.py --go-bin .gobin --cores "" \
        --shared 16 --py-flags=--retention-time=1h --rounds "$ROUNDS" --runfor "$RUNFOR" \
        --out "$OUT/old.json" 2>&1 | tee "$OUT/old.log"
fi
