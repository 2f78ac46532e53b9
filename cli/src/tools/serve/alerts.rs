//! The shipped alert rules (`deploy/alerts.yml`, `deploy/prometheusrule.yaml`) against what
//! serve exports: every cause a collector can conclude is in exactly one alert, both files hold
//! the same groups, and each alert reads `tracekit_finding_score`. `promtool check rules` and
//! `promtool test rules` run in tests/fleet.rs, beside a real Prometheus and Alertmanager.

use serde_norway::Value;

fn deploy(file: &str) -> Value {
    let p = format!("{}/../deploy/{file}", env!("CARGO_MANIFEST_DIR"));
    let text = std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{p}: {e}"));
    serde_norway::from_str(&text).unwrap_or_else(|e| panic!("{p}: {e}"))
}

/// (alert, expr) of every rule in `groups`.
fn rules(groups: &Value) -> Vec<(String, String)> {
    groups
        .as_sequence()
        .expect("groups is a list")
        .iter()
        .flat_map(|g| g["rules"].as_sequence().cloned().unwrap_or_default())
        .map(|r| {
            (
                r["alert"].as_str().unwrap_or_default().to_string(),
                r["expr"].as_str().unwrap_or_default().to_string(),
            )
        })
        .collect()
}

/// The causes an alert's `cause=~"a|b"` matcher lists.
fn causes(expr: &str) -> Vec<String> {
    let Some(at) = expr.find("cause=~\"") else {
        return Vec::new();
    };
    let rest = &expr[at + 8..];
    rest[..rest.find('"').unwrap_or(rest.len())]
        .split('|')
        .map(str::to_string)
        .collect()
}

#[test]
fn the_operator_rule_holds_the_same_groups() {
    assert_eq!(
        deploy("alerts.yml")["groups"],
        deploy("prometheusrule.yaml")["spec"]["groups"]
    );
}

#[test]
fn every_cause_serve_can_conclude_is_in_exactly_one_alert() {
    let rules = rules(&deploy("alerts.yml")["groups"]);
    for (alert, expr) in &rules {
        assert!(
            expr.contains("tracekit_finding_score{cause=~"),
            "{alert}: {expr}"
        );
    }
    // What serve can run: every collector but profile's samplers (a profile is not a finding
    // to page on), with the causes each declares beside its rows.
    let mut want: Vec<&str> = crate::tools::TOOLS
        .iter()
        .filter(|t| !t.hidden && t.name != "profile")
        .flat_map(|t| t.causes.iter().map(|c| c.name))
        .collect();
    // (triage's node checks, cpu-steal and pressure, are not collectors: serve does not run
    // them, and no alert waits for them.)
    want.sort_unstable();
    want.dedup();
    for cause in &want {
        let alerts: Vec<&str> = rules
            .iter()
            .filter(|(_, e)| causes(e).iter().any(|c| c == cause))
            .map(|(a, _)| a.as_str())
            .collect();
        assert_eq!(alerts.len(), 1, "cause {cause} is in alerts {alerts:?}");
    }
    // And no alert names a cause nobody concludes (a typo never fires).
    for (alert, expr) in &rules {
        for c in causes(expr) {
            assert!(
                want.contains(&c.as_str()),
                "{alert} names unknown cause {c}"
            );
        }
    }
}
