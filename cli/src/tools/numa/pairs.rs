//! `numa`'s system-wide migration numbers: pages NUMA balancing migrated, by destination node,
//! and the scheduler's task moves and swaps by (source, destination) node pair; pure functions
//! of one window's numbers, tested on fixtures below.

use probes_common::numa::PairKey;
use serde::Serialize;

use super::report::SummaryRow;

/// Scheduler NUMA moves (or swaps) from one node to another in a window, system-wide.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct NodePair {
    pub src_node: u32,
    pub dst_node: u32,
    pub count: u64,
}

/// The drained `NUMA_PAIRS` entries of one `kind`, summed by (source, destination), in that
/// order.
pub fn node_pairs(drained: &[(PairKey, u64)], kind: u32) -> Vec<NodePair> {
    let mut by: std::collections::BTreeMap<(u32, u32), u64> = Default::default();
    for (k, n) in drained.iter().filter(|(k, _)| k.kind == kind) {
        *by.entry((k.src, k.dst)).or_default() += n;
    }
    by.into_iter()
        .map(|((src_node, dst_node), count)| NodePair {
            src_node,
            dst_node,
            count,
        })
        .collect()
}

/// `0→1 ×3, 1→0 ×1`, or `none`.
fn pairs_text(p: &[NodePair]) -> String {
    if p.is_empty() {
        return "none".into();
    }
    p.iter()
        .map(|x| format!("{}→{} ×{}", x.src_node, x.dst_node, x.count))
        .collect::<Vec<_>>()
        .join(", ")
}

/// The system note on where NUMA balancing moved things: pages by destination node (`None`: no
/// hinting-fault hook), task moves and swaps by node pair.
pub fn migration_note(pages_to: Option<&[u64]>, moves: &[NodePair], swaps: &[NodePair]) -> String {
    let pages = match pages_to {
        Some(v) if v.iter().any(|&n| n > 0) => v
            .iter()
            .enumerate()
            .filter(|(_, &n)| n > 0)
            .map(|(node, n)| format!("{n} to node {node}"))
            .collect::<Vec<_>>()
            .join(", "),
        Some(_) => "none".into(),
        None => "unknown (no fentry/kprobe on task_numa_fault)".into(),
    };
    format!(
        "balancing: pages migrated by destination {pages} (source node not traceable); task moves {}; swaps {}",
        pairs_text(moves),
        pairs_text(swaps)
    )
}

/// Per-node sums of the rows' `pages_migrated_by_node` (`None` when no row has them: no hook).
pub fn pages_by_node(rows: &[SummaryRow], width: usize) -> Option<Vec<u64>> {
    let mut out: Option<Vec<u64>> = None;
    for v in rows
        .iter()
        .filter_map(|r| r.pages_migrated_by_node.as_ref())
    {
        let acc = out.get_or_insert_with(|| vec![0; width]);
        for (a, b) in acc.iter_mut().zip(v) {
            *a += b;
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(pid: u32) -> SummaryRow {
        SummaryRow {
            id: pid,
            ..Default::default()
        }
    }

    #[test]
    fn pairs_by_node_and_their_note() {
        use probes_common::numa::{PAIR_MOVE, PAIR_SWAP};
        let k = |kind, src, dst| PairKey {
            gen: 1,
            kind,
            src,
            dst,
        };
        let drained = [
            (k(PAIR_MOVE, 1, 0), 2),
            (k(PAIR_SWAP, 0, 1), 5),
            (k(PAIR_MOVE, 0, 1), 1),
            (k(PAIR_MOVE, 1, 0), 1),
        ];
        let moves = node_pairs(&drained, PAIR_MOVE);
        assert_eq!(
            moves,
            vec![
                NodePair {
                    src_node: 0,
                    dst_node: 1,
                    count: 1
                },
                NodePair {
                    src_node: 1,
                    dst_node: 0,
                    count: 3
                }
            ]
        );
        let swaps = node_pairs(&drained, PAIR_SWAP);
        assert_eq!(
            serde_json::to_value(&swaps).unwrap(),
            serde_json::json!([{"src_node": 0, "dst_node": 1, "count": 5}])
        );
        let mut a = row(1);
        a.pages_migrated_by_node = Some(vec![8000, 0]);
        let mut b = row(2);
        b.pages_migrated_by_node = Some(vec![192, 7]);
        let sum = pages_by_node(&[a, b, row(3)], 2);
        assert_eq!(sum, Some(vec![8192, 7]));
        assert_eq!(pages_by_node(&[row(3)], 2), None);
        assert_eq!(
            migration_note(sum.as_deref(), &moves, &[]),
            "balancing: pages migrated by destination 8192 to node 0, 7 to node 1 (source node not traceable); task moves 0→1 ×1, 1→0 ×3; swaps none"
        );
        let n = migration_note(None, &[], &swaps);
        assert!(
            n.contains("unknown (no fentry/kprobe") && n.ends_with("swaps 0→1 ×5"),
            "{n}"
        );
        assert!(migration_note(Some(&[0, 0]), &[], &[]).contains("destination none"));
    }
}
