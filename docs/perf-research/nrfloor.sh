#!/bin/bash
# nrfloor.sh: kernel ns per dropped datagram (bpf_stats over all of a tracer's programs / Udp NoPorts delta), loopback flood to a closed port
BIN=${TRACEKIT_BIN:-target/release/tracekit}
sysctl -qw kernel.bpf_stats_enabled=1
noports() { awk '/^Udp:/{n++} /^Udp:/&&n==2{print $3}' /proc/net/snmp; }
ids_of() { bpftool prog show --json | python3 -c 'import json,sys,re; b=set(sys.argv[1].split(",")); print(",".join(str(p["id"]) for p in json.load(sys.stdin) if str(p["id"]) not in b and re.match(r"(tk_|kfree_skb|napi_poll|softirq_)", p.get("name",""))))' "$1"; }
runtime() { bpftool prog show --json | python3 -c '
import json,sys
ids=set(sys.argv[1].split(","))
print(sum(p.get("run_time_ns",0) for p in json.load(sys.stdin) if str(p["id"]) in ids))' "$1"; }
flood() { python3 -c '
import socket
s=socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
for i in range(20000): s.sendto(b"x"*64, ("127.0.0.1", 47999))'; }
measure() { local name=$1 wait=$2; shift 2
  local before=$(bpftool prog show --json | python3 -c 'import json,sys; print(",".join(str(p["id"]) for p in json.load(sys.stdin)))')
  "$@" > /dev/null 2>&1 & local pid=$!
  sleep $wait
  local ids=$(ids_of "$before")
  local r0=$(runtime $ids) n0=$(noports)
  taskset -c 1 bash -c "$(declare -f flood); flood"
  local r1=$(runtime $ids) n1=$(noports)
  kill -INT $pid; wait $pid 2>/dev/null
  echo "$name $(( (r1-r0) / (n1-n0) )) ns/drop ($((n1-n0)) drops, progs $ids)"
}
for round in 1 2 3 4 5; do
  measure floor-net-rx-path 2 $BIN bench-floor --hook net-rx-path --duration 60s
  measure net-rx 2 $BIN net-rx --duration 60s
  measure bpftrace-one-liner 6 bpftrace -e 'tracepoint:skb:kfree_skb { @[args->reason] = count(); }'
done
