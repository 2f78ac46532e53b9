//! irq-lat unit tests on fixture rows and tables.

use super::{findings::*, rows::*, *};
use probes_common::irq_lat::KIND_SOFT;

/// A value of `count` runs of `ns` each.
fn val(count: u64, ns: u64, unhandled: u64) -> IrqVal {
    let mut v = IrqVal::ZERO;
    for _ in 0..count {
        v.hist.record(ns);
    }
    v.unhandled = unhandled;
    v
}

fn row(cpu: u32, kind: u32, num: u32, name: &str, count: u64, ns: u64) -> IrqRow {
    IrqRow::new(Some(cpu), kind, num, name.into(), &val(count, ns, 0), 1.0)
}

#[test]
fn softirq_names_come_from_the_table_else_the_kernels_order() {
    let fixed = softirq_names(None);
    assert_eq!(fixed[&3], "NET_RX");
    assert_eq!(fixed[&9], "RCU");
    // An empty table (unreadable format) is no table.
    assert_eq!(softirq_names(Some(vec![]))[&1], "TIMER");
    let fmt = crate::kernel::tracefs::parse_format(
        "name: softirq_entry\nID: 1\nformat:\n\tfield:unsigned short common_type;\toffset:0;\tsize:2;\tsigned:0;\n\tfield:unsigned int vec;\toffset:8;\tsize:4;\tsigned:0;\n\nprint fmt: \"vec=%u [action=%s]\", REC->vec, __print_symbolic(REC->vec, { 0, \"HI\" }, { 3, \"NET_RX\" }, { 10, \"NEW_VEC\" })\n",
        "fixture",
    )
    .unwrap();
    let m = softirq_names(Some(fmt.symbols("vec")));
    assert_eq!(m[&3], "NET_RX");
    assert_eq!(m[&10], "NEW_VEC");
    assert_eq!(fmt.offset_of("vec", &[4]).unwrap(), 8);
}

#[test]
fn shares_are_per_irq_across_cpus_and_cpu_rows_sum_kinds() {
    let mut rows = vec![
        row(0, KIND_SOFT, 3, "NET_RX", 10, 1_000),
        row(1, KIND_SOFT, 3, "NET_RX", 30, 1_000),
        row(1, KIND_HARD, 36, "virtio1-req.0", 5, 2_000),
        IrqRow::new(None, KIND_HARD, 0, "[other]".into(), &val(1, 7, 0), 1.0),
    ];
    set_shares(&mut rows);
    assert_eq!(rows[0].share_ppm, 250_000);
    assert_eq!(rows[1].share_ppm, 750_000);
    assert_eq!(rows[2].share_ppm, 1_000_000);
    assert_eq!(rows[3].share_ppm, 0);
    let cpus = cpu_rows(&rows, 1.0);
    assert_eq!(cpus.len(), 2, "[other] has no CPU");
    assert_eq!((cpus[1].soft_ns, cpus[1].hard_ns), (30_000, 10_000));
    assert_eq!((cpus[1].soft_count, cpus[1].hard_count), (30, 5));
    assert_eq!(cpus[1].irq_ppm, 40);
    assert_eq!(cpus[1].top, "NET_RX softirq");
    assert_eq!(rows[2].what(), "IRQ 36 virtio1-req.0");
}

#[test]
fn all_net_rx_on_one_cpu_is_an_imbalance_timer_per_cpu_is_not() {
    // 1 s window: NET_RX 50 ms on CPU 1, 2 ms on CPU 0; TIMER all on CPU 0 (per CPU by nature).
    let mut rows = vec![
        row(1, KIND_SOFT, 3, "NET_RX", 50_000, 1_000),
        row(0, KIND_SOFT, 3, "NET_RX", 2_000, 1_000),
        row(0, KIND_SOFT, 1, "TIMER", 20_000, 1_000),
    ];
    set_shares(&mut rows);
    let cpus = cpu_rows(&rows, 1.0);
    let f = findings(&rows, &cpus, &[], 2, 1.0);
    assert_eq!(f.len(), 1, "{f:?}");
    assert_eq!(f[0].cause, IRQ_IMBALANCE);
    assert_eq!(f[0].subject.name.as_deref(), Some("CPU 1"));
    assert_eq!(f[0].ev("share_ppm"), Some(961_538.0));
    assert_eq!(f[0].ev("cpu_ns"), Some(50_000_000.0));
    assert!(f[0].advice.contains("RPS"), "{}", f[0].advice);
    assert_eq!(f[0].next.as_deref(), Some("tracekit net-rx --duration 10s"));
    // One CPU: nothing to balance over.
    assert!(findings(&rows, &cpus, &[], 1, 1.0).is_empty());
    // Below 1 % of a CPU: negligible.
    let small = vec![row(1, KIND_SOFT, 3, "NET_RX", 9, 1_000_000)];
    assert!(findings(&small, &cpu_rows(&small, 1.0), &[], 2, 1.0).is_empty());
}

#[test]
fn a_cpu_in_interrupt_work_past_ten_percent_is_a_storm_naming_the_top_irq() {
    let irqs = vec![Irq {
        irq: 36,
        per_cpu: vec![0, 100],
        name: "virtio1-req.0".into(),
        affinity: Some(vec![1]),
    }];
    // Hard IRQ 36: 120 ms of 1 s on CPU 1, half of them IRQ_NONE; CPU 0 has the rest.
    let mut rows = vec![
        IrqRow::new(
            Some(1),
            KIND_HARD,
            36,
            "virtio1-req.0".into(),
            &val(1_000, 120_000, 500),
            1.0,
        ),
        row(0, KIND_HARD, 36, "virtio1-req.0", 10, 1_000),
    ];
    set_shares(&mut rows);
    let cpus = cpu_rows(&rows, 1.0);
    let f = findings(&rows, &cpus, &irqs, 2, 1.0);
    let storm: Vec<_> = f.iter().filter(|f| f.cause == IRQ_STORM).collect();
    assert_eq!(storm.len(), 1, "{f:?}");
    assert_eq!(storm[0].subject.name.as_deref(), Some("CPU 1"));
    assert_eq!(storm[0].ev("cpu_ppm"), Some(120_000.0));
    assert_eq!(storm[0].ev("top_unhandled"), Some(500.0));
    assert!(
        storm[0].summary.contains("IRQ 36 virtio1-req.0"),
        "{}",
        storm[0].summary
    );
    assert!(storm[0]
        .advice
        .contains("/proc/irq/36/smp_affinity_list (allowed CPUs now: 1)"));
    assert!(storm[0].advice.contains("IRQ_NONE"));
    // The same CPU holds all hard-IRQ time: an imbalance too.
    assert!(f.iter().any(|f| f.cause == IRQ_IMBALANCE), "{f:?}");
    // 9.9 % is not a storm.
    let calm = vec![row(1, KIND_SOFT, 1, "TIMER", 99, 1_000_000)];
    assert!(findings(&calm, &cpu_rows(&calm, 1.0), &[], 2, 1.0).is_empty());
}

#[test]
fn attach_restricts_every_hook_to_one_mode() {
    for (m, mode) in [
        (ForceMode::TpBtf, AttachMode::TpBtf),
        (ForceMode::RawTp, AttachMode::RawTp),
        (ForceMode::Tracepoint, AttachMode::Tracepoint),
    ] {
        let h = hooks_for(Some(m));
        assert_eq!(h.len(), 4);
        assert!(h
            .iter()
            .all(|h| h.programs.len() == 1 && h.programs[0].0 == mode));
    }
    assert!(hooks_for(None).iter().all(|h| h.programs.len() == 3));
}
