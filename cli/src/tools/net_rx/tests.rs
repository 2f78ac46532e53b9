//! Unit tests of net-rx's hook choice.

use super::*;

#[test]
fn hooks_follow_the_flags() {
    let args = |extra: &[&str]| -> Args {
        use clap::FromArgMatches;
        #[derive(clap::Parser)]
        struct P {
            #[command(flatten)]
            a: Args,
        }
        let mut v = vec!["t"];
        v.extend_from_slice(extra);
        let m = <P as clap::CommandFactory>::command().get_matches_from(v);
        P::from_arg_matches(&m).unwrap().a
    };
    let events = |a: &Args| hooks_for(a).iter().map(|h| h.event).collect::<Vec<_>>();
    assert_eq!(
        events(&args(&[])),
        [
            "skb:kfree_skb",
            "irq:softirq_entry",
            "irq:softirq_exit",
            "napi:napi_poll"
        ]
    );
    assert_eq!(events(&args(&["--drops-only"])), ["skb:kfree_skb"]);
    assert_eq!(events(&args(&["--consume"])).len(), 5);
    let forced = hooks_for(&args(&["--attach", "raw_tp"]));
    assert_eq!(forced[0].programs, [(AttachMode::RawTp, "tk_nr_drop_raw")]);
    assert!(HOOKS.iter().skip(1).all(|h| h.optional));
    assert!(!HOOKS[0].optional);
}
