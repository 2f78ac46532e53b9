#!/bin/bash
# fsk.sh N_FSYNC label tracer-args... : kernel ns per program-run and per call with bpf_stats
N=$1; shift; LABEL=$1; shift
TK=/work/wt-perf/target/release/tracekit
WL=/work/wt-perf/target/x86_64-unknown-linux-gnu/release/tk-workload
mkdir -p /work/wt-perf/target/bench-scratch
echo 1 > /proc/sys/kernel/bpf_stats_enabled
$TK "$@" --json > /tmp/fsk.out 2>/tmp/fsk.err &
TPID=$!
for i in $(seq 200); do grep -q '"type":"meta"' /tmp/fsk.out 2>/dev/null && break; sleep 0.02; done
if [ -n "$FSK_COLD_MB" ]; then python3 docs/perf-research/coldfsync.py ${FSK_PATH:-/dev/shm/fsk} $N $FSK_COLD_MB > /tmp/fsk.wl; else $WL fsync ${FSK_PATH:-/work/wt-perf/target/bench-scratch/fsk} $N 0 > /tmp/fsk.wl; fi
ids=$(python3 -c "
import json
for l in open('/tmp/fsk.out'):
    v=json.loads(l)
    if v.get('type')=='meta':
        print(' '.join(str(p['id']) for p in v['programs']))
        break")
python3 - $N "$LABEL" $ids <<'PY'
import sys, subprocess, ctypes, struct, os
N=int(sys.argv[1]); label=sys.argv[2]; ids=[int(x) for x in sys.argv[3:]]
libc = ctypes.CDLL(None, use_errno=True)
def bpf(cmd, attr):
    buf = ctypes.create_string_buffer(attr, 160)
    return libc.syscall(321, cmd, buf, 160), buf
tot=0; parts=[]
for i in ids:
    fd,_=bpf(13, struct.pack("I", i))
    info = ctypes.create_string_buffer(256)
    bpf(15, struct.pack("IIQ", fd, 256, ctypes.addressof(info))); os.close(fd)
    raw=info.raw; name=raw[64:80].split(b"\0")[0].decode()
    rt,rc=struct.unpack_from("QQ", raw, 192); vi=struct.unpack_from("I", raw, 216)[0]
    # only fsync runs matter: per-program ns/run
    parts.append(f"{name} runs={rc} ns/run={rt/max(rc,1):.0f} vi={vi}")
    tot+=rt
print(f"{label}: per fsync call {tot/N:.0f} ns | " + " | ".join(parts) + f" | load {open('/proc/loadavg').read().split()[0]}")
PY
kill -INT $TPID; wait $TPID 2>/dev/null
echo 0 > /proc/sys/kernel/bpf_stats_enabled
