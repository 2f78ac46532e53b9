#!/bin/bash
# fsfloor.sh: kernel ns per fsync call (bpf_stats over all of a tracer's programs / calls made), 300 x (write 4 KiB + fsync) on the work tree's disk
BIN=${TRACEKIT_BIN:-target/release/tracekit}
DIR=${DIR:-$PWD/target}
sysctl -qw kernel.bpf_stats_enabled=1
ids_of() { bpftool prog show --json | python3 -c 'import json,sys,re; b=set(sys.argv[1].split(",")); print(",".join(str(p["id"]) for p in json.load(sys.stdin) if str(p["id"]) not in b and re.match(r"(tk_|sys_enter_fsync|sys_exit_fsync)", p.get("name",""))))' "$1"; }
runtime() { bpftool prog show --json | python3 -c '
import json,sys
ids=set(sys.argv[1].split(","))
print(sum(p.get("run_time_ns",0) for p in json.load(sys.stdin) if str(p["id"]) in ids))' "$1"; }
loop() { python3 -c '
import os,sys
fd=os.open(sys.argv[1], os.O_WRONLY|os.O_CREAT|os.O_TRUNC)
for i in range(300): os.write(fd, b"x"*4096); os.fsync(fd)
os.close(fd); os.unlink(sys.argv[1])' "$DIR/fsfloor.dat"; }
measure() { local name=$1 wait=$2; shift 2
  local before=$(bpftool prog show --json | python3 -c 'import json,sys; print(",".join(str(p["id"]) for p in json.load(sys.stdin)))')
  "$@" > /dev/null 2>&1 & local pid=$!
  sleep $wait
  local ids=$(ids_of "$before")
  local r0=$(runtime $ids)
  loop
  local r1=$(runtime $ids)
  kill -INT $pid; wait $pid 2>/dev/null
  echo "$name $(( (r1-r0) / 300 )) ns/call (progs $ids)"
}
for round in 1 2 3 4 5; do
  measure floor-counter-pair 2 $BIN bench-floor --hook fsync-pair --duration 60s
  measure floor-timed 2 $BIN bench-floor --hook fsync-timed --duration 60s
  measure fsync-lat 2 $BIN fsync-lat --duration 60s
  measure bpftrace-hist 6 bpftrace -e 'tracepoint:syscalls:sys_enter_fsync { @s[tid] = nsecs; } tracepoint:syscalls:sys_exit_fsync /@s[tid]/ { @h = hist(nsecs - @s[tid]); delete(@s[tid]); }'
done
