/// A task's life in a window: born inside it, dead inside it, both, neither; a death
/// stamp before the birth (clock skew between CPUs) is an empty life, never negative.
#[test]
fn alive_is_the_part_of_the_window_the_task_lived() {
    let w = (1_000, 2_000);
    let v = |born_ns, exit_ns| probes_common::sched::SchedVal {
        born_ns,
        exit_ns,
        ..probes_common::sched::SchedVal::ZERO
    };
    assert_eq!(super::alive(&v(10, 0), w), (1_000, 2_000));
    assert_eq!(super::alive(&v(1_500, 0), w), (1_500, 2_000));
    assert_eq!(super::alive(&v(10, 1_200), w), (1_000, 1_200));
    assert_eq!(super::alive(&v(1_300, 1_200), w), (1_300, 1_300));
    assert_eq!(super::alive(&v(1_300, 1_700), w), (1_300, 1_700));
    assert_eq!(super::rate_secs(400_000_000, 10.0), 1.0);
    assert_eq!(super::rate_secs(4_000_000_000, 10.0), 4.0);
    assert_eq!(super::rate_secs(400_000_000, 0.5), 0.5);
}

use super::*;
use crate::kernel::hooks::AttachMode;

#[test]
fn hooks_attach_switch_last_and_only_switch_is_required() {
    assert_eq!(HOOKS.last().unwrap().event, "sched:sched_switch");
    for h in HOOKS {
        assert_eq!(h.optional, h.event != "sched:sched_switch", "{}", h.event);
        assert_eq!(h.programs[0].0, AttachMode::TpBtf);
        assert_eq!(h.programs[1].0, AttachMode::RawTp);
    }
}

/// `sched_wakeup` is attached for steal or `--from wakeup`, and only then.
#[test]
fn the_wakeup_hook_attaches_for_steal_or_from_wakeup() {
    let has = |steal, from| hooks_for(steal, from).iter().any(|h| h.event == STEAL_HOOK);
    assert!(!has(false, WakeFrom::Waking));
    assert!(has(true, WakeFrom::Waking));
    assert!(has(false, WakeFrom::Wakeup));
    assert_eq!(hooks_for(true, WakeFrom::Wakeup).len(), HOOKS.len());
}

/// The meta line and the title say which event the waits start at, and nothing when
/// they are run_delay's.
#[test]
fn the_wake_definition_is_in_meta_and_title() {
    let keys = |from: WakeFrom, wall| {
        let m = from.meta(Meta::default(), wall).extra;
        (m["wake_wait_clock"].clone(), m["wake_from"].clone())
    };
    assert_eq!(
        keys(WakeFrom::Waking, true),
        ("wall".into(), "sched_waking".into())
    );
    assert_eq!(
        keys(WakeFrom::Wakeup, true),
        ("wall".into(), "sched_wakeup".into())
    );
    assert_eq!(
        keys(WakeFrom::Wakeup, false),
        ("run_delay".into(), serde_json::Value::Null)
    );
    assert!(WakeFrom::Waking
        .definition(true)
        .contains("from sched_waking (the wakeup path and any IPI included)"));
    assert!(WakeFrom::Wakeup
        .definition(true)
        .contains("from sched_wakeup"));
    assert!(WakeFrom::Waking.definition(false).contains("run_delay"));
    assert_eq!(WakeFrom::default(), WakeFrom::Waking);
}

#[test]
fn wake_slots_are_a_power_of_two() {
    let n = wake_slots();
    assert!(n.is_power_of_two() && (4096..=65536).contains(&n), "{n}");
}

#[test]
fn names_prefer_the_row_then_idle() {
    let mut r = row(
        7,
        7,
        b"w".to_vec(),
        None,
        Title::default(),
        &SchedVal::ZERO,
        (0, 1),
    );
    r.v.voluntary = 2;
    assert_eq!(r.switches(), 2);
    assert_eq!(Who::of(&r, true).tid, Some(7));
    r.comm = b"worker".to_vec();
    let n = Names::of(&[r]);
    assert_eq!(n.get(7), b"worker");
    assert_eq!(n.get(0), b"[idle]");
    let p = Peer::new(7, 3, 5, Some(9), &n, true);
    assert_eq!(
        (p.who.pid, p.who.tid, p.text()),
        (3, Some(7), "worker(7)".to_string())
    );
}

fn pair(a: u32, b: u32, count: u64, ns: u64) -> Pair {
    Pair {
        a,
        a_tgid: a,
        b,
        b_tgid: b,
        count,
        ns,
    }
}

#[test]
fn peers_are_grouped_by_their_a_task_in_drained_order() {
    let pairs = [pair(1, 9, 5, 500), pair(2, 9, 4, 400), pair(1, 8, 3, 300)];
    let by = ByA::of(&pairs);
    let names = Names::of(&[]);
    let ids = |id| -> Vec<(u32, u64)> {
        by.peers(id, &names, false, true)
            .iter()
            .map(|p| (p.id, p.count))
            .collect()
    };
    assert_eq!(ids(1), [(9, 5), (8, 3)]);
    assert_eq!(ids(2), [(9, 4)]);
    assert!(ids(3).is_empty());
    assert_eq!(by.peers(1, &names, false, true)[1].delay_ns, Some(300));
}

#[test]
fn the_row_cap_grows_with_rows_shown_and_max_keys() {
    let scope = Scope::default();
    let cap =
        |scope: &Scope, rows| Cap::new(scope, rows, |v| v.voluntary, Box::new(|_| false)).rows;
    assert_eq!(cap(&scope, 25), ROW_CAP);
    assert_eq!(cap(&scope, 5000), 5000);
    assert_eq!(cap(&scope, 0), usize::MAX);
    let keys = Scope {
        max_keys: Some(4096),
        ..Scope::default()
    };
    assert_eq!(cap(&keys, 25), 4096);
}
