//! The one-node collector against the independent CartPole loop (issue 28, item 4),
//! shared by the `collect` bench (`ROLLOUT_BENCH_ONLY=independent|independent_best`)
//! and the `policy` bench's targets.
//!
//! Three collect the same frames, acting alike: (i) the independent loop
//! ([`crate::independent`]), (b) `Rollout` alone, and (c1) the collector as `rollout
//! collect --nodes 1 --policy linear --exploration-type deterministic` builds it (one
//! node, one env, async, the CLI's worker nice), each batch pulled and recycled as the
//! CLI does. All three act with the collector's weights: the episodes' lengths, so
//! the resets' share of the frames, depend on them. None records (b and c1 as a
//! deterministic run's nodes do by default; the independent loop has nothing to record).

use std::hint::black_box;
use std::time::Instant;

use rollout::env::{CartPole, CartPoleConfig};
use rollout::policy::{Linear, Policy};
use rollout::rollout::{Rollout, RolloutConfig, TrajIds};
use rollout::{Env, ExplorationType, PolicyConfig};
use rollout_actors::DistributedCollector;

use crate::independent::Independent;

/// The env worker's nice: the CLI's (10), or `ROLLOUT_BENCH_NICE` (profiling: what the
/// hand-over costs once the worker is not preempted by the actors' threads).
fn worker_nice() -> i32 {
    std::env::var("ROLLOUT_BENCH_NICE")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(rollout::node_spec::DEFAULT_WORKER_NICE)
}

/// The collector as `rollout collect --nodes 1 --policy linear --exploration-type
/// deterministic` builds it (one node, one env, async, the CLI's worker nice), endless, on
/// batches of `frames` frames, each node `prefetch` batches ahead of the consumer.
pub fn one_node_collector(frames: usize, prefetch: usize) -> DistributedCollector {
    DistributedCollector::builder()
        .env("CartPole-v1")
        .policy(PolicyConfig::Linear)
        .nodes(1)
        .worker_nice(worker_nice())
        .envs_per_node(1)
        .frames_per_batch(frames)
        .total_frames(-1)
        .exploration_type(ExplorationType::Deterministic)
        .seed(0)
        .prefetch(prefetch)
        .build()
        .expect("collector")
}

/// The three loops, built to act alike on batches of `frames` frames.
pub struct OneNode {
    /// The independent loop (i).
    pub ind: Independent,
    /// `Rollout` alone (b).
    pub ro: Rollout,
    /// The one-node collector (c1).
    pub c1: DistributedCollector,
    frames: usize,
}

impl OneNode {
    /// The three, deterministic (the independent loop does not sample), on batches of
    /// `frames` frames.
    pub fn new(frames: usize) -> OneNode {
        let mode = ExplorationType::Deterministic;
        let c1 = one_node_collector(frames, 0);
        let w = c1.policy_weights(0).expect("weights").expect("node 0's weights");
        let env = || CartPole::new(CartPoleConfig::default()).expect("cartpole");
        let probe = env();
        let mut policy = Linear::new(probe.observation_spec(), probe.action_spec(), 0, 1).expect("linear policy");
        policy.set_exploration(mode);
        policy.set_shared_weights(&w).expect("the collector's weights");
        let ro = Rollout::new(
            vec![Box::new(env()) as Box<dyn Env>],
            Box::new(policy),
            vec![TrajIds::new(0, 1).expect("ids")],
            RolloutConfig {
                frames_per_batch: frames,
                ..RolloutConfig::default()
            },
        )
        .expect("rollout")
        // As the collector's node: a deterministic run records nothing by default.
        .recording(false);
        let (wt, bt) = (
            w.f32_slice("weight").expect("weight"),
            w.f32_slice("bias").expect("bias"),
        );
        let row = |j: usize| [wt[j * 4], wt[j * 4 + 1], wt[j * 4 + 2], wt[j * 4 + 3]];
        let ind = Independent::new(frames, [row(0), row(1)], [bt[0], bt[1]]);
        OneNode { ind, ro, c1, frames }
    }

    /// One batch of (i).
    pub fn run_i(&mut self) {
        self.ind.run();
    }

    /// One batch of (b), recycled.
    pub fn run_b(&mut self) {
        let batch = self.ro.collect().expect("collect");
        self.ro.recycle(batch);
    }

    /// One batch of (c1), pulled and recycled as the CLI does.
    pub fn pull_c1(&mut self) {
        let batch = self.c1.next_batch().expect("batch").expect("endless");
        black_box(batch.data.numel());
        self.c1.recycle(batch);
    }

    /// Frames per batch.
    pub fn frames(&self) -> usize {
        self.frames
    }

    /// Stops the collector.
    pub fn shutdown(mut self) {
        self.c1.shutdown().expect("shutdown");
    }
}

/// What [`best_of_windows`] measured, frames/s.
pub struct Best {
    /// The fastest window of (i), (b) and (c1).
    pub i: f64,
    /// See `i`.
    pub b: f64,
    /// See `i`.
    pub c1: f64,
    /// The medians of the rounds' b/i and c1/i, as a check on the fastest windows.
    pub median_b: f64,
    /// See `median_b`.
    pub median_c1: f64,
}

/// For a busy machine: `rounds` rounds of windows of `window` batches of (i), (b) and
/// (c1), alternating; the fastest window of each is what it does when nothing else
/// runs on its core. c1's window starts after one untimed batch: the one its node
/// collected ahead while the others ran. c1 is frames/s of wall time with two threads
/// (the node's worker stepping, the trainer taking the batches), i of one: the
/// collector is as fast as the loop when its one stepping thread is.
pub fn best_of_windows(three: &mut OneNode, window: usize, rounds: usize) -> Best {
    let frames = three.frames();
    let fps = |three: &mut OneNode, f: fn(&mut OneNode)| {
        let start = Instant::now();
        for _ in 0..window {
            f(three);
        }
        (window * frames) as f64 / start.elapsed().as_secs_f64()
    };
    let (mut best, mut rb, mut rc) = ([0.0f64; 3], Vec::new(), Vec::new());
    for _ in 0..rounds {
        let i = fps(three, OneNode::run_i);
        let b = fps(three, OneNode::run_b);
        three.pull_c1();
        let c = fps(three, OneNode::pull_c1);
        for (m, v) in best.iter_mut().zip([i, b, c]) {
            *m = m.max(v);
        }
        rb.push(b / i);
        rc.push(c / i);
    }
    let [i, b, c1] = best;
    Best {
        i,
        b,
        c1,
        median_b: crate::median(rb),
        median_c1: crate::median(rc),
    }
}
