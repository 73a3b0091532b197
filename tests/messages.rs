//! Message-level helpers for the testkit harness scenarios.

use rollout::message::{Batch, FromNode};

/// The one `Batch` in a node's `replies`; panics on anything else.
pub fn only_batch(replies: Vec<FromNode>) -> Batch {
    assert_eq!(replies.len(), 1, "exactly one message: {replies:?}");
    match replies.into_iter().next() {
        Some(FromNode::Batch(b)) => b,
        other => panic!("expected a Batch, got {other:?}"),
    }
}

/// A compact view of what a trainer sent, for comparing message sequences:
/// `(node, "C<seq>:<frames>" | "W<version>" | "S<seed>" | "X" | "P<id>" (snapshot) | "R<node>" (restore))`.
pub fn describe_sent(sent: &[(usize, rollout::message::ToNode)]) -> Vec<(usize, String)> {
    use rollout::message::ToNode;
    sent.iter()
        .map(|(n, m)| {
            let s = match m {
                ToNode::Continue(c) => format!("C{}:{}", c.seq, c.frames),
                ToNode::UpdateWeights(u) => format!("W{}", u.weights.version),
                ToNode::Seed(s) => format!("S{}", s.seed),
                ToNode::Shutdown => "X".to_string(),
                ToNode::Snapshot { id } => format!("P{id}"),
                ToNode::Restore(st) => format!("R{}", st.node),
            };
            (*n, s)
        })
        .collect()
}
