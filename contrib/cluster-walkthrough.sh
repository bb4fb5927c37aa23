#!/usr/bin/env bash
# A three-process NSQ cluster on one machine: one nsqlookupd and two nsqd that register with it.
# docs/operations.md walks through it; tests/system/test_operations.py runs it as written.
#   contrib/cluster-walkthrough.sh [BIN_DIR]     (BIN_DIR: where nsqd/nsqlookupd are; .venv/bin)
# Ports: BASE+0/1 nsqlookupd TCP/HTTP, BASE+10/11 and BASE+20/21 the two nsqd (BASE=14100).
set -euo pipefail
bin=${1:-.venv/bin}
base=${BASE:-14100}
work=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null; wait 2>/dev/null; rm -rf "$work"' EXIT
http() {  # http METHOD URL [BODY]: print the response body (no curl needed)
  "$bin/python" -c 'import sys, urllib.request as u
r = u.Request(sys.argv[2], data=sys.argv[3].encode() if len(sys.argv) > 3 else None, method=sys.argv[1])
print(u.urlopen(r, timeout=5).read().decode())' "$@"
}
wait_for() {  # wait_for URL PID LOG: until it answers (60 s at most); a process that exits shows its log
  local deadline=$((SECONDS + 60))
  while ((SECONDS < deadline)); do
    http GET "$1" >/dev/null 2>&1 && return 0
    if ! kill -0 "$2" 2>/dev/null; then
      echo "exited before $1 answered; its log:" >&2; tail -n 5 "$3" >&2; return 1
    fi
    sleep 0.1
  done
  echo "no answer from $1 in 60 s; its log:" >&2; tail -n 5 "$3" >&2; return 1
}

# 1. nsqlookupd
"$bin/nsqlookupd" --tcp-address=127.0.0.1:$base --http-address=127.0.0.1:$((base + 1)) \
  --broadcast-address=127.0.0.1 2>"$work/lookupd.log" &
wait_for "http://127.0.0.1:$((base + 1))/ping" $! "$work/lookupd.log"

# 2. two nsqd, each with its own data directory, registering with it
for n in 1 2; do
  mkdir "$work/nsqd$n"
  "$bin/nsqd" --tcp-address=127.0.0.1:$((base + 10 * n)) --http-address=127.0.0.1:$((base + 10 * n + 1)) \
    --data-path="$work/nsqd$n" --broadcast-address=127.0.0.1 \
    --lookupd-tcp-address=127.0.0.1:$base 2>"$work/nsqd$n.log" &
  wait_for "http://127.0.0.1:$((base + 10 * n + 1))/ping" $! "$work/nsqd$n.log"
done

# 3. publish to each node: the topic appears on both, and nsqlookupd knows both producers
http POST "http://127.0.0.1:$((base + 11))/pub?topic=orders" "order 1" >/dev/null
http POST "http://127.0.0.1:$((base + 21))/pub?topic=orders" "order 2" >/dev/null
for _ in $(seq 100); do
  producers=$(http GET "http://127.0.0.1:$((base + 1))/lookup?topic=orders")
  case "$producers" in *"$((base + 10))"*"$((base + 20))"*|*"$((base + 20))"*"$((base + 10))"*) break;; esac
  sleep 0.1
done
echo "lookup: $producers"
http GET "http://127.0.0.1:$((base + 1))/nodes" | "$bin/python" -c \
  'import json, sys; print("nodes:", sorted(p["tcp_port"] for p in json.load(sys.stdin)["producers"]))'
echo "cluster ok"
