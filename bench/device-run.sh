#!/usr/bin/env bash
# The many-core figures, in one run on a lent 16-core machine (no network there): the
# wheels the server needs beyond that machine's Python (`.whl/`, cp312), Go NSQ 1.3.0's
# nsqd, bench_writer and bench_reader and etcd's binary (`.gobin/`: `cp /usr/bin/etcd
# .gobin/`) travel with the tree, all ignored by git (.git/info/exclude); `.old/` (optional,
# ignored too: `git archive REV src bench`) is an earlier tree measured beside.
#
#   run(command="SECTIONS=replicated,saturation bash bench/device-run.sh",
#       carry=[".whl", ".gobin"], timeout_s=600)
#
# SECTIONS (comma-separated; default: replicated,saturation, what the 2026-11-30 runs left
# out) picks what runs; each writes under $OUT:
#   startup      startup.md     exec to /ping OK: pynsqd, pynsqd --workers 4, Go nsqd
#   cores        cores.json     Go nsqd at GOMAXPROCS=k against pynsqd --workers k (CORES)
#   retained     retained.json  the same with a retained topic (pynsqd --retention-time=1h)
#   old          old.json       the earlier tree's retained topic, where `.old/` is there
#   replicated   replicated.md  issue 52: three nodes of --workers W, each on its own W cores,
#                               replicas=3, acks=all, fsync, against one --workers W node with
#                               retention and Go nsqd on W cores (W in REPLICATED_WORKERS)
#   headers      headers-{memory,disk}.json  issue 55: MPUB with and without headers (bench/headers.py)
#   saturation   saturation-K.json  issue 53: Go's writer and reader at once (16 connections
#                               each, on cores 8-15) against a server on K cores (SAT_CORES)
# Sized for the device's 15 minutes: the default sections take about 7 (ROUNDS=2, RUNFOR=4).
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH="/tmp/site:$PWD/src" PYTHONUNBUFFERED=1
OUT="${OUT:-/tmp/device-out}"
SECTIONS=",${SECTIONS:-replicated,saturation},"
CORES="${CORES:-1,2,4,8}"
ROUNDS="${ROUNDS:-2}"
RUNFOR="${RUNFOR:-4}"
REPLICATED_WORKERS="${REPLICATED_WORKERS:-1 2 4}"
SAT_CORES="${SAT_CORES:-1 2 4 8}"
mkdir -p "$OUT"
echo "cores: $(nproc); $(python3 --version); kernel $(uname -r); sections ${SECTIONS}"
python3 -m compileall -q src .old/src 2>/dev/null
printf '#!/bin/sh\nexec python3 -m pynsqd "$@"\n' > /tmp/pynsqd-bin
chmod +x /tmp/pynsqd-bin
has() { [[ "$SECTIONS" == *",$1,"* ]]; }
if has startup; then
    python3 bench/startup.py --rounds 5 --workers 4 --nsqd /tmp/pynsqd-bin \
        --go-nsqd .gobin/nsqd 2>&1 | tee "$OUT/startup.md"
fi
if has cores; then
    python3 bench/cores.py --go-bin .gobin --cores "$CORES" --shared 16 \
        --rounds "$ROUNDS" --runfor "$RUNFOR" --out "$OUT/cores.json" 2>&1 | tee "$OUT/cores.log"
fi
if has retained; then
    python3 bench/cores.py --go-bin .gobin --cores "$CORES" --shared 16 \
        --py-flags=--retention-time=1h --rounds "$ROUNDS" --runfor "$RUNFOR" \
        --out "$OUT/retained.json" 2>&1 | tee "$OUT/retained.log"
fi
if has old && [ -d .old/src ]; then
    PYTHONPATH="/tmp/site:$PWD/.old/src" python3 .old/bench/cores.py --go-bin .gobin --cores "" \
        --shared 16 --py-flags=--retention-time=1h --rounds "$ROUNDS" --runfor "$RUNFOR" \
        --out "$OUT/old.json" 2>&1 | tee "$OUT/old.log"
fi
if has replicated; then
    # The nodes and the pynsqd the bench starts: a `nsqd` on PATH beside this python.
    mkdir -p /tmp/pybin && cp /tmp/pynsqd-bin /tmp/pybin/nsqd
    for w in $REPLICATED_WORKERS; do
        echo "## three nodes of --workers $w, each on its own $w cores" | tee -a "$OUT/replicated.md"
        PATH="/tmp/pybin:$PATH" python3 bench/replication_bench.py --cores-per-node "$w" \
            --writers $((3 * w)) --rounds "$ROUNDS" --runfor "$RUNFOR" --etcd .gobin/etcd \
            --go-nsqd .gobin/nsqd --setups "unreplicated w$w,replicated fsync w$w" \
            2>&1 | tee -a "$OUT/replicated.md"
    done
fi
if has headers; then
    # Issue 55: MPUB with two small headers against the same messages without, the server on
    # core 0 and the publishers on cores of their own, its data on tmpfs (the machine's disk
    # wrote back between rounds and moved them by a third): messages kept in memory (a queue
    # big enough for all), then past --mem-queue-size to the disk queue.
    for mode in memory disk; do
        flags=""
        [ "$mode" = memory ] && flags=--server-flags=--mem-queue-size=100000000
        TMPDIR=/dev/shm python3 bench/headers.py --rounds "${HEADER_ROUNDS:-9}" --seconds 3 \
            --conns "${HEADER_CONNS:-6}" $flags --only plain --only negotiated \
            --only "two small headers" --only "plain, same bytes" \
            --out "$OUT/headers-$mode.json" 2>&1 | tee "$OUT/headers-$mode.log"
    done
fi
if has saturation; then
    for k in $SAT_CORES; do
        python3 bench/saturation.py --go-bin .gobin --cores "$(seq -s, 0 $((k - 1)))" \
            --load-cores 8,9,10,11,12,13,14,15 --tool-procs 16 --rounds "$ROUNDS" \
            --runfor 5 --out "$OUT/saturation-$k.json" 2>&1 | tee -a "$OUT/saturation.log"
    done
fi
