//! Research: time the parts of start-up that are not bpf() syscalls.
use std::time::Instant;
use tracekit::btf::Btf;

fn main() {
    for round in 0..5 {
        let t = Instant::now();
        let data = std::fs::read("/sys/kernel/btf/vmlinux").unwrap();
        let t_read = t.elapsed();
        let t = Instant::now();
        let _old = Btf::parse(data, "vmlinux").unwrap();
        let t_index_heap = t.elapsed();
        let t = Instant::now();
        let btf = Btf::from_file(std::path::Path::new("/sys/kernel/btf/vmlinux")).unwrap();
        let t_file = t.elapsed();
        let t = Instant::now();
        let offs = tracekit::tools::sched::task_offsets(&btf).unwrap();
        let t_offs = t.elapsed();
        let t = Instant::now();
        let n = btf.proto_params("btf_trace_sched_switch");
        let t_proto = t.elapsed();
        let t = Instant::now();
        let s = btf
            .tp_btf_stub(&["sched_process_free", "sched_switch"])
            .is_some();
        let t_stub = t.elapsed();
        println!("round {round}: read() {t_read:?} + index {t_index_heap:?} | mmap+index {t_file:?} task_offsets {t_offs:?} proto {t_proto:?} stub(free+switch) {t_stub:?} ({} types, {n:?} {s} pid@{})", btf.len(), offs.pid);
    }
}
