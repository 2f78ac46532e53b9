//! `bench-floor`, the benchmark's control: the cheapest program on a hook attaches and counts.
//! Its VM check runs in every guest kernel of `cargo xtask vm-test`.

use tracekit_tests::*;

#[test]
fn counts_every_switch_of_a_pipe_ping_pong() {
    require_root();
    vm_check().unwrap();
}

/// bench-floor: the cheapest sched_switch program attaches and counts.
pub fn vm_check() -> Result<String, String> {
    let (lines, _, modes) = tracekit_tests::vm::traced_with(
        &["bench-floor", "--hook", "sched-switch"],
        &["pingpong", "200"],
        // Run on one hook by request: doctor's other hooks for it go unattached.
        false,
    )?;
    let events: u64 = lines
        .iter()
        .filter(|l| l["type"] == "stats")
        .filter_map(|l| l["events"].as_u64())
        .sum();
    if events < 400 {
        return Err(format!(
            "only {events} sched_switch events for 400 pipe hops"
        ));
    }
    Ok(format!("{events} events; {modes}"))
}
