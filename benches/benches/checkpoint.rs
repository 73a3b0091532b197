//! What a checkpoint costs, against the batch it sits between, measured in one run.
//!
//! A sync collector (CartPole-v1, sampling linear policy, 2 nodes x 2 envs, 10,000
//! frames per batch) alternates: one batch (the baseline), one `checkpoint()` (every
//! node snapshots its envs' states and generators), one encode to the file format.
//! Local nodes and process nodes (the states then cross loopback TCP). Prints the
//! medians and the ratio checkpoint / batch.
//!
//! Run: `cargo bench -p rollout-benches --bench checkpoint`

use std::time::Instant;

use rollout::PolicyConfig;
use rollout_actors::{DistributedCollector, Launcher};

const ROUNDS: usize = 15;

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn run(launcher: Launcher) {
    let mut b = DistributedCollector::builder()
        .env("CartPole-v1")
        .policy(PolicyConfig::Linear)
        .nodes(2)
        .envs_per_node(2)
        .frames_per_batch(10_000)
        .sync(true)
        .seed(1)
        .launcher(launcher.clone());
    if matches!(launcher, Launcher::Process) {
        b = b.node_program(rollout_tests::rollout_release_bin());
    }
    let mut c = b.build().expect("collector");
    c.next_batch().expect("warm-up batch");
    let (mut batch, mut ckpt, mut encode) = (Vec::new(), Vec::new(), Vec::new());
    let mut bytes = 0;
    for _ in 0..ROUNDS {
        let t = Instant::now();
        let got = c.next_batch().expect("batch").expect("endless");
        batch.push(t.elapsed().as_secs_f64());
        c.recycle(got);
        let t = Instant::now();
        let k = c.checkpoint().expect("checkpoint");
        ckpt.push(t.elapsed().as_secs_f64());
        let t = Instant::now();
        bytes = k.to_bytes().expect("encode").len();
        encode.push(t.elapsed().as_secs_f64());
    }
    c.shutdown().expect("shutdown");
    let (b, k, e) = (median(batch), median(ckpt), median(encode));
    println!(
        "{launcher:?}: batch {:.2} ms, checkpoint {:.3} ms, encode {:.3} ms ({bytes} bytes); checkpoint/batch = {:.4}",
        b * 1e3,
        k * 1e3,
        e * 1e3,
        k / b
    );
}

fn main() {
    run(Launcher::Local);
    run(Launcher::Process);
}
