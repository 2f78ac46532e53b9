#!/bin/bash
# usage: su.sh N cmd... ; prints exec->last attach ms for each run and median
N=$1; shift
vals=()
for i in $(seq $N); do
  strace -f -ttt --seccomp-bpf -e trace=execve,bpf,ioctl -o /tmp/su.$$ "$@" >/dev/null 2>&1
  v=$(awk '/execve\(/ && !s {s=$2} /BPF_LINK_CREATE|BPF_RAW_TRACEPOINT_OPEN|PERF_EVENT_IOC_SET_BPF|PERF_EVENT_IOC_ENABLE/ && !/= -1/ {l=$2} END {printf "%.1f", (l-s)*1000}' /tmp/su.$$)
  vals+=($v)
done
rm -f /tmp/su.$$
med=$(printf "%s\n" "${vals[@]}" | sort -n | awk '{a[NR]=$1} END {print (NR%2? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2)}')
echo "$* :: ${vals[*]} :: median $med :: load $(cut -d' ' -f1 /proc/loadavg)"
