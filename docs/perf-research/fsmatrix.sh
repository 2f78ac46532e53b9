#!/bin/bash
# fsmatrix.sh ROUNDS N cfg... ; cfg = label:MODE or floor-pair / floor-enter
R=$1; shift; N=$1; shift
out=/tmp/fsmatrix.$$; : > $out
for r in $(seq $R); do
  for c in "$@"; do
    case $c in
      floor-pair) docs/perf-research/fsk.sh $N $c bench-floor --hook fsync-pair >> $out 2>/dev/null;;
      bpftrace) docs/perf-research/fsbt.sh $N $c >> $out 2>/dev/null;;
      floor-enter) docs/perf-research/fsk.sh $N $c bench-floor --hook fsync >> $out 2>/dev/null;;
      *) TRACEKIT_FS_MODE=${c#*:} docs/perf-research/fsk.sh $N $c fsync-lat >> $out 2>/dev/null;;
    esac
  done
done
python3 - $out <<'PY'
import sys,re,statistics as st
rows={}
for l in open(sys.argv[1]):
    m=re.match(r"(\S+): per fsync call (\d+) ns \| (.*) \| load ([\d.]+)",l)
    if not m: continue
    lab=m.group(1); d=rows.setdefault(lab,{'call':[],'load':[]})
    d['call'].append(int(m.group(2))); d['load'].append(float(m.group(4)))
    for p in m.group(3).split(' | '):
        pm=re.match(r"(\S+) runs=(\d+) ns/run=(\d+) vi=(\d+)",p)
        if pm and int(pm.group(2))>0:
            d.setdefault(pm.group(1),[]).append(int(pm.group(3)))
            d['vi_'+pm.group(1)]=pm.group(4)
for lab,d in rows.items():
    parts=[f"{k} {st.median(v):.0f}" for k,v in d.items() if k not in('call','load') and not k.startswith('vi_')]
    vis=[f"{k[3:]}:{v}" for k,v in d.items() if k.startswith('vi_')]
    print(f"{lab:14s} per-call median {st.median(d['call']):6.0f} ns (n={len(d['call'])}, min {min(d['call'])}, max {max(d['call'])}) | ns/run medians: {', '.join(parts)} | verified {' '.join(vis)} | load {st.median(d['load']):.1f}")
PY
