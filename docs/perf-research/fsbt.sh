#!/bin/bash
# fsbt.sh N label : bpftrace fsync hist, kernel ns per call
N=$1; LABEL=$2
WL=/work/wt-perf/target/x86_64-unknown-linux-gnu/release/tk-workload
before=$(bpftool prog show --json | python3 -c "import json,sys; print(' '.join(str(p['id']) for p in json.load(sys.stdin)))")
echo 1 > /proc/sys/kernel/bpf_stats_enabled
stdbuf -oL bpftrace -e 'tracepoint:syscalls:sys_enter_fsync { @s[tid] = nsecs; } tracepoint:syscalls:sys_exit_fsync /@s[tid]/ { @ns = hist(nsecs - @s[tid]); delete(@s[tid]); }' > /tmp/fsbt.out 2>&1 &
BP=$!
for i in $(seq 300); do grep -q Attaching /tmp/fsbt.out 2>/dev/null && break; sleep 0.02; done
sleep 0.2
$WL fsync /work/wt-perf/target/bench-scratch/fsk $N 0 > /dev/null
python3 - $N "$LABEL" "$before" <<'PY'
import sys, json, subprocess
N=int(sys.argv[1]); label=sys.argv[2]; before=set(sys.argv[3].split())
progs=json.loads(subprocess.check_output(["bpftool","prog","show","--json"]))
tot=0; parts=[]
for p in progs:
    if str(p['id']) in before or p.get('type')!='tracepoint': continue
    rc=p.get('run_cnt',0); rt=p.get('run_time_ns',0)
    if rc==0: continue
    tot+=rt; parts.append(f"{p.get('name','?')} runs={rc} ns/run={rt/max(rc,1):.0f} vi=0")
print(f"{label}: per fsync call {tot/N:.0f} ns | " + " | ".join(parts) + f" | load {open('/proc/loadavg').read().split()[0]}")
PY
kill -INT $BP; wait $BP 2>/dev/null
echo 0 > /proc/sys/kernel/bpf_stats_enabled
