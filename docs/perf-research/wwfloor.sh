#!/bin/bash
# wwfloor.sh: kernel ns per context switch (bpf_stats over all of a tracer's programs, /proc/stat ctxt) on perf bench sched pipe
BIN=${TRACEKIT_BIN:-target/release/tracekit}
sysctl -qw kernel.bpf_stats_enabled=1
ctxt() { awk '/^ctxt/{print $2}' /proc/stat; }
progstats() { bpftool prog show --json | python3 -c '
import json,sys
ids=set(sys.argv[1].split(","))
t=0
for p in json.load(sys.stdin):
    if str(p["id"]) in ids: t+=p.get("run_time_ns",0)
print(t)' "$1"; }
measure() { # name, cmd...
  local name=$1; shift
  before_ids=$(bpftool prog show --json | python3 -c 'import json,sys; print(",".join(str(p["id"]) for p in json.load(sys.stdin)))')
  "$@" > /dev/null 2>&1 & local pid=$!
  sleep 2
  ids=$(bpftool prog show --json | python3 -c 'import json,sys; b=set(sys.argv[1].split(",")); import re; print(",".join(str(p["id"]) for p in json.load(sys.stdin) if str(p["id"]) not in b and re.match(r"(tk_floor|tk_sched|sched_|handle_)", p.get("name",""))))' "$before_ids")
  local r0=$(progstats $ids) c0=$(ctxt)
  taskset -c 1 perf bench sched pipe -l 50000 > /dev/null 2>&1
  local r1=$(progstats $ids) c1=$(ctxt)
  kill -INT $pid; wait $pid 2>/dev/null
  echo "$name $(( (r1-r0) / (c1-c0) )) ns/switch ($((c1-c0)) switches, progs $ids)"
}
for round in 1 2 3 4 5; do
  measure floor-counter $BIN bench-floor --hook sched-switch --duration 30s
  measure floor-wake-wait $BIN bench-floor --hook wake-wait --duration 30s
  measure floor-wake-wait-proc $BIN bench-floor --hook wake-wait-proc --duration 30s
  measure ctxsw $BIN ctxsw --duration 30s
  measure runq-lat $BIN runq-lat --duration 30s
  measure runqlat runqlat 30 1
done
