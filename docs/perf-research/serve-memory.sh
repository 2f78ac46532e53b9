#!/bin/bash
# serve-memory.sh [SECONDS]: two `tracekit serve` (glibc default, arena_max=1) under process churn; RSS every 10 s
mkdir -p ${OUT:-/tmp/tk-serve-memory}
T=${1:-600}
BIN=${TRACEKIT_BIN:-$PWD/target/release/tracekit}
cd ${OUT:-/tmp/tk-serve-memory}
$BIN serve --listen 127.0.0.1:9511 --duration $((T+30))s > a.out 2> a.err & A=$!
GLIBC_TUNABLES=glibc.malloc.arena_max=1 $BIN serve --listen 127.0.0.1:9512 --duration $((T+30))s > b.out 2> b.err & B=$!
sleep 3
( end=$((SECONDS+T)); n=0; while [ $SECONDS -lt $end ]; do dd if=/dev/zero of=${OUT:-/tmp/tk-serve-memory}/f bs=4k count=1 conv=fsync status=none; sleep 0.05 & sleep 0.15; n=$((n+1)); done; echo "churn: $n dd, $n sleep" > churn.txt ) &
C=$!
( while kill -0 $C 2>/dev/null; do curl -s 127.0.0.1:9511/metrics > /dev/null; curl -s 127.0.0.1:9512/metrics >/dev/null; sleep 15; done ) &
t0=$SECONDS
: > rss.txt
while kill -0 $C 2>/dev/null; do
  ra=$(awk '/VmRSS|RssAnon/{printf "%s ", $2}' /proc/$A/status); rb=$(awk '/VmRSS|RssAnon/{printf "%s ", $2}' /proc/$B/status)
  echo "$((SECONDS-t0)) A $ra B $rb" >> rss.txt
  sleep 10
done
kill -TERM $A $B; wait $A $B 2>/dev/null
echo done >> rss.txt
