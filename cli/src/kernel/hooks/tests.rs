use super::*;
use crate::kernel::tracefs::parse_format;

fn probe(ok: bool) -> Probe {
    Probe {
        available: ok,
        why: if ok { "yes".into() } else { "no: test".into() },
    }
}

const SWITCH: Hook = Hook {
    event: "sched:sched_switch",
    raw: None,
    fields: &["prev_pid"],
    programs: &[
        (AttachMode::TpBtf, "tk_switch"),
        (AttachMode::RawTp, "tk_switch_raw"),
    ],
    optional: false,
    group: "",
    when: "",
};

const FN: Hook = Hook {
    event: "vfs_fsync_range",
    raw: None,
    fields: &[],
    programs: &[(AttachMode::Fentry, "tk_f"), (AttachMode::Kprobe, "tk_k")],
    optional: true,
    group: "",
    when: "",
};

fn fmt() -> EventFormat {
    parse_format(
        "name: sched_switch\nID: 1\nformat:\n\tfield:unsigned short common_type;\toffset:0;\tsize:2;\tsigned:0;\n\tfield:pid_t prev_pid;\toffset:24;\tsize:4;\tsigned:1;\n\nprint fmt: \"\"\n",
        "test",
    )
    .unwrap()
}

#[test]
fn raw_tp_when_btf_is_absent_and_why() {
    let env = Env::fixed(
        false,
        probe(true),
        probe(false),
        probe(false),
        Err("x".into()),
    );
    let sy = Symbols::default();
    let c = choose(&Facts::new(&SWITCH, &env, &sy).with_format(Ok(fmt())));
    assert_eq!(c.mode, Some((AttachMode::RawTp, "tk_switch_raw")));
    assert_eq!(c.rejected.len(), 1);
    assert!(c.rejected[0].1.contains("no kernel BTF"), "{c:?}");
}

#[test]
fn no_mode_for_a_function_without_fentry_or_kprobes() {
    let env = Env::fixed(
        true,
        probe(true),
        probe(false),
        probe(false),
        Err("x".into()),
    );
    let sy = Symbols::default();
    let c = choose(&Facts::new(&FN, &env, &sy));
    assert_eq!(c.mode, None);
    assert_eq!(c.rejected.len(), 2);
    assert!(c.rejected[0].1.starts_with("fentry unavailable"), "{c:?}");
    assert!(c.rejected[1].1.starts_with("kprobes unavailable"), "{c:?}");
    let (ok, why) = tool_verdict(std::slice::from_ref(&c));
    assert!(!ok && why.contains("none of its 1 optional hooks"), "{why}");
}

#[test]
fn missing_fields_reject_the_classic_mode_and_groups_fall_together() {
    const A: Hook = Hook {
        event: "x:a",
        raw: None,
        fields: &["nope"],
        programs: &[(AttachMode::Tracepoint, "tk_a")],
        optional: true,
        group: "pair",
        when: "",
    };
    const B: Hook = Hook {
        event: "x:b",
        raw: None,
        fields: &[],
        programs: &[(AttachMode::Tracepoint, "tk_b")],
        optional: true,
        group: "pair",
        when: "",
    };
    let env = Env::fixed(
        false,
        probe(false),
        probe(false),
        probe(false),
        Err("x".into()),
    );
    let sy = Symbols::default();
    let a = choose(&Facts::new(&A, &env, &sy).with_format(Ok(fmt())));
    assert!(a.rejected[0].1.contains("lacks field(s) nope"), "{a:?}");
    // Without tracefs, B is rejected for its format too: both skipped.
    let all = choose_all(&[A, B], &env, &sy);
    assert!(all.iter().all(|c| c.mode.is_none()));
    let (ok, _) = tool_verdict(&all);
    assert!(!ok);
}

#[test]
fn required_hook_failing_names_it() {
    let c = Choice {
        event: "sched:sched_switch",
        optional: false,
        mode: None,
        why: "no attach mode works on this kernel".into(),
        rejected: vec![(AttachMode::RawTp, "raw tracepoints unavailable".into())],
    };
    let (ok, why) = tool_verdict(&[c]);
    assert!(!ok);
    assert_eq!(
        why,
        "required hook sched:sched_switch cannot attach (raw tracepoints unavailable)"
    );
}
