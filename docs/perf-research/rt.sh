#!/bin/bash
# run root integration tests: rt.sh ctxsw runq_lat ...
cd /work/wt-perf
export PATH=$HOME/.cargo/bin:$PATH CARGO_TARGET_X86_64_UNKNOWN_LINUX_GNU_RUSTFLAGS="-C target-feature=+crt-static" TRACEKIT_BIN=/work/wt-perf/target/release/tracekit
args=()
for t in "$@"; do args+=(--test "$t"); done
cargo test --release --target x86_64-unknown-linux-gnu -p tracekit-tests "${args[@]}" 2>&1 | grep -E "^test |test result|FAILED|panicked|error\[" 
