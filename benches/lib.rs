//! Benchmarks live in benches/; this is what several of them share.

pub mod independent;
pub mod one_node;
pub mod tls_cost;

use actix::Addr;
use rollout_actors::messages::{NextBatch, Recycle};
use rollout_actors::trainer::Trainer;

/// One batch pulled as a consumer on the trainer's own thread pulls it (an
/// embedded run): `NextBatch`, then the batch recycled. Its frames, for the count.
pub async fn pull_embedded(trainer: &Addr<Trainer>) -> usize {
    let batch = trainer
        .send(NextBatch)
        .await
        .expect("mailbox")
        .expect("batch")
        .expect("endless");
    let frames = std::hint::black_box(batch.data.numel());
    trainer.do_send(Recycle {
        node: batch.node,
        data: batch.data,
    });
    frames
}

/// The median of `v` (the upper one of an even count).
pub fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}
