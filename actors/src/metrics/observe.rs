//! The trainer actor's view of its metrics: it tells what passes through it (a
//! `continue` sent, a node's message, a batch yielded, a restart) and the counts move.

use std::collections::VecDeque;
use std::time::Instant;

use rollout::machine::Collected;
use rollout::message::{FromNode, ToNode};

use super::registry::{DropReason, FailureReason, NodeMetrics, RefusalReason, RunMetrics, FAILURE_REASONS};

/// Longest queue of unanswered `continue`s timed per node: a node that never answers
/// cannot grow it without bound.
const MAX_ASKED: usize = 8;

/// One node's handles and the times of its `continue`s not yet answered.
#[derive(Debug)]
struct NodeSeries {
    metrics: NodeMetrics,
    asked: VecDeque<Instant>,
}

/// What the trainer counts into, on its own thread: per-node handles by index, made
/// once per node (the first time it is seen), so a batch touches atomics only.
#[derive(Debug)]
pub(crate) struct TrainerMetrics {
    run: RunMetrics,
    nodes: Vec<NodeSeries>,
}

impl TrainerMetrics {
    /// Counts into `run`, for a run of `total_frames` (negative: no end), every series
    /// of the first `nodes` nodes at zero from the start.
    pub(crate) fn new(run: RunMetrics, total_frames: i64, nodes: usize) -> TrainerMetrics {
        run.target_frames.set(total_frames);
        let mut m = TrainerMetrics { run, nodes: Vec::new() };
        if let Some(last) = nodes.checked_sub(1) {
            m.node(last);
        }
        m
    }

    /// Node `node`'s series, made the first time.
    fn node(&mut self, node: usize) -> &mut NodeSeries {
        while self.nodes.len() <= node {
            let metrics = self.run.node(self.nodes.len());
            self.nodes.push(NodeSeries {
                metrics,
                asked: VecDeque::new(),
            });
        }
        &mut self.nodes[node]
    }

    /// The trainer sends `msg` to `node`: a `continue` starts a batch's clock.
    pub(crate) fn on_send(&mut self, node: usize, msg: &ToNode) {
        if let ToNode::Continue(_) = msg {
            let s = self.node(node);
            if s.asked.len() == MAX_ASKED {
                s.asked.pop_front();
            }
            s.asked.push_back(Instant::now());
        }
    }

    /// A node's message reached the trainer.
    pub(crate) fn on_node(&mut self, msg: &FromNode) {
        match msg {
            FromNode::Batch(b) => {
                let s = self.node(b.node);
                if let Some(asked) = s.asked.pop_front() {
                    let seconds = asked.elapsed().as_secs_f64();
                    self.run.latency.observe(seconds);
                }
            }
            FromNode::WeightsUpdated { node, version } => {
                self.node(*node).metrics.weights_version.set(*version as i64);
            }
            FromNode::Failed { node, .. } => self.failed(*node, FailureReason::Failed),
            FromNode::Leave { .. } => {
                self.run.left.inc();
            }
            _ => {}
        }
    }

    /// A batch was yielded (before delivery), and `collected` frames in all so far.
    pub(crate) fn on_yield(&mut self, c: &Collected, collected: u64) {
        let frames = c.data.numel() as u64;
        match c.node {
            Some(n) => {
                let s = &self.node(n).metrics;
                s.frames.inc_by(frames);
                s.batches.inc();
                if let Some(&v) = c.weights_versions.first() {
                    s.weights_version.set(v as i64);
                }
            }
            None => {
                // Sync: one equal share per node.
                let shares = c.weights_versions.len().max(1) as u64;
                for (n, &v) in c.weights_versions.iter().enumerate() {
                    let s = &self.node(n).metrics;
                    s.frames.inc_by(frames / shares);
                    s.batches.inc();
                    s.weights_version.set(v as i64);
                }
            }
        }
        self.run.collected_frames.set(collected as i64);
        self.run.policy_lag.observe(c.policy_lag as f64);
    }

    /// A batch of `frames` frames was dropped unyielded: its weights lagged too far.
    pub(crate) fn dropped_lagging(&self, frames: u64) {
        self.run.dropped(DropReason::PolicyLag, frames);
    }

    /// Node `node` failed for `reason`: its unanswered `continue`s are not timed.
    pub(crate) fn failed(&mut self, node: usize, reason: FailureReason) {
        let s = self.node(node);
        s.asked.clear();
        if let Some(i) = FAILURE_REASONS.iter().position(|&r| r == reason) {
            s.metrics.failures[i].inc();
        }
    }

    /// Node `node` is being restarted.
    pub(crate) fn restarting(&mut self, node: usize) {
        let s = self.node(node);
        s.asked.clear();
        s.metrics.restarts.inc();
    }

    /// The run refused a node that joined (its slot held).
    pub(crate) fn refused(&self) {
        self.run.refused(RefusalReason::Admission);
    }

    /// A node joined a running (elastic) run.
    pub(crate) fn joined(&self) {
        self.run.joined.inc();
    }

    /// The stored weights are version `version`.
    pub(crate) fn stored(&self, version: u64) {
        self.run.weights_version.set(version as i64);
    }

    /// The trainer's periodic look: `up` nodes not down, and bytes moved since the last.
    pub(crate) fn on_tick(&self, up: usize, bytes_in: u64, bytes_out: u64) {
        self.run.nodes_up.set(up as i64);
        self.run.bytes_in.inc_by(bytes_in);
        self.run.bytes_out.inc_by(bytes_out);
    }
}

#[cfg(test)]
mod tests {
    use rollout::message::{Continue, FromNode, ToNode};
    use rollout::TensorDict;

    use super::*;

    fn yielded(node: Option<usize>, versions: Vec<u64>, rows: usize, steps: usize) -> Collected {
        Collected {
            index: 0,
            node,
            weights_version: versions.iter().copied().min().unwrap_or(0),
            weights_versions: versions,
            policy_lag: 0,
            lagging: false,
            data: TensorDict::new(&[rows, steps]),
        }
    }

    fn line(text: &str, series: &str) -> Option<f64> {
        text.lines()
            .find_map(|l| l.strip_prefix(series).and_then(|v| v.trim().parse().ok()))
    }

    #[test]
    fn every_nodes_series_is_there_from_the_start_at_zero() {
        let run = RunMetrics::new();
        let _m = TrainerMetrics::new(run.clone(), 100, 3);
        let text = run.encode();
        for node in 0..3 {
            assert_eq!(
                line(&text, &format!("rollout_frames_total{{node=\"{node}\"}}")),
                Some(0.0)
            );
            assert_eq!(
                line(&text, &format!("rollout_node_restarts_total{{node=\"{node}\"}}")),
                Some(0.0)
            );
        }
        assert_eq!(line(&text, "rollout_target_frames"), Some(100.0));
        assert_eq!(
            line(&text, "rollout_login_refusals_total{reason=\"timeout\"}"),
            Some(0.0)
        );
        assert!(text.contains("rollout_build_info{version=\""), "{text}");
        assert!(text.trim_end().ends_with("# EOF"), "{text}");
    }

    #[test]
    fn async_and_sync_batches_count_per_node_and_latency_once_per_answered_continue() {
        let run = RunMetrics::new();
        let mut m = TrainerMetrics::new(run.clone(), -1, 2);
        let c = Continue { seq: 1, frames: 10 };
        m.on_send(1, &ToNode::Continue(c));
        let batch = crate::testkit::scripted_batch(1, c, 1, 4, 0.0);
        m.on_node(&FromNode::Batch(batch.clone()));
        // A batch with no `continue` timed (its clock cleared by a failure) is not observed.
        m.failed(1, FailureReason::Failed);
        m.on_node(&FromNode::Batch(batch));
        m.on_yield(&yielded(Some(1), vec![4], 1, 10), 10);
        // Sync: a share a node.
        m.on_yield(&yielded(None, vec![4, 3], 2, 10), 30);
        m.restarting(1);
        let text = run.encode();
        assert_eq!(line(&text, "rollout_frames_total{node=\"0\"}"), Some(10.0));
        assert_eq!(line(&text, "rollout_frames_total{node=\"1\"}"), Some(20.0));
        assert_eq!(line(&text, "rollout_batches_total{node=\"1\"}"), Some(2.0));
        assert_eq!(line(&text, "rollout_node_weights_version{node=\"0\"}"), Some(4.0));
        assert_eq!(line(&text, "rollout_node_weights_version{node=\"1\"}"), Some(3.0));
        assert_eq!(line(&text, "rollout_batch_latency_seconds_count"), Some(1.0));
        assert_eq!(line(&text, "rollout_collected_frames"), Some(30.0));
        assert_eq!(line(&text, "rollout_node_restarts_total{node=\"1\"}"), Some(1.0));
        assert_eq!(
            line(&text, "rollout_node_failures_total{node=\"1\",reason=\"failed\"}"),
            Some(1.0)
        );
        assert_eq!(
            line(&text, "rollout_node_failures_total{node=\"0\",reason=\"failed\"}"),
            Some(0.0)
        );
    }

    #[test]
    fn every_yielded_batchs_lag_is_observed_and_dropped_batches_counted_by_reason() {
        let run = RunMetrics::new();
        let mut m = TrainerMetrics::new(run.clone(), -1, 1);
        let text = run.encode();
        assert_eq!(
            line(&text, "rollout_dropped_batches_total{reason=\"policy_lag\"}"),
            Some(0.0),
            "from the start, at zero"
        );
        for lag in [0, 0, 1, 5] {
            let mut c = yielded(Some(0), vec![1], 1, 10);
            c.policy_lag = lag;
            m.on_yield(&c, 10);
        }
        m.dropped_lagging(40);
        let text = run.encode();
        assert_eq!(line(&text, "rollout_policy_lag_count"), Some(4.0));
        assert_eq!(line(&text, "rollout_policy_lag_sum"), Some(6.0));
        assert_eq!(line(&text, "rollout_policy_lag_bucket{le=\"0.0\"}"), Some(2.0));
        assert_eq!(line(&text, "rollout_policy_lag_bucket{le=\"1.0\"}"), Some(3.0));
        assert_eq!(line(&text, "rollout_policy_lag_bucket{le=\"4.0\"}"), Some(3.0));
        assert_eq!(line(&text, "rollout_policy_lag_bucket{le=\"8.0\"}"), Some(4.0));
        assert_eq!(
            line(&text, "rollout_dropped_batches_total{reason=\"policy_lag\"}"),
            Some(1.0)
        );
        assert_eq!(
            line(&text, "rollout_dropped_frames_total{reason=\"policy_lag\"}"),
            Some(40.0)
        );
    }

    #[test]
    fn unanswered_continues_are_timed_in_a_bounded_queue() {
        let mut m = TrainerMetrics::new(RunMetrics::new(), -1, 1);
        for seq in 0..100 {
            m.on_send(0, &ToNode::Continue(Continue { seq, frames: 1 }));
        }
        assert_eq!(m.nodes[0].asked.len(), MAX_ASKED);
    }
}
