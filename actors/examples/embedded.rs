//! The embedded use: the collector runs inside your own actix `System`, and an
//! actor of yours (a `Learner`) receives every batch as a message.
//!
//! The learner subscribes to the trainer, prints a line per batch, sends new
//! weights back every few batches and, when the run is finished, stops the
//! nodes, their arbiters and the system. Run with
//! `cargo run -p rollout-actors --example embedded`.

use actix::prelude::*;
use rollout::{PolicyConfig, PolicySpec, Registry, Tensor, Weights};
use rollout_actors::messages::{PushWeights, StopNodes, StoreWeights, Subscribe, TrainerEvent};
use rollout_actors::trainer::Trainer;
use rollout_actors::CollectorBuilder;

/// Push new weights after every this many batches.
const PUSH_EVERY: u64 = 3;

/// The user's actor: consumes batches, "trains", sends weights back.
struct Learner {
    trainer: Addr<Trainer>,
    /// The env-worker arbiters `start()` returned (handles: the owner joins them).
    arbiters: Vec<ArbiterHandle>,
    /// The weights being "trained".
    weights: Weights,
    batches: u64,
}

impl Actor for Learner {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Self::Context) {
        self.trainer.do_send(Subscribe(ctx.address().recipient()));
    }
}

impl Handler<TrainerEvent> for Learner {
    type Result = ();

    fn handle(&mut self, ev: TrainerEvent, ctx: &mut Self::Context) {
        match ev {
            TrainerEvent::Batch(b) => {
                println!(
                    "batch {:>2}: {} frames from node {:?}, weights version {}",
                    b.index,
                    b.data.numel(),
                    b.node,
                    b.weights_version
                );
                self.batches += 1;
                if self.batches.is_multiple_of(PUSH_EVERY) {
                    // A stand-in for an optimiser step.
                    for t in self.weights.tensors.values_mut() {
                        if let Tensor::F32(a) = t {
                            a.mapv_inplace(|x| 0.9 * x + 0.01);
                        }
                    }
                    // Messages to one actor arrive in order: the push sends what was stored.
                    self.trainer.do_send(StoreWeights(self.weights.clone()));
                    self.trainer.do_send(PushWeights(None));
                }
            }
            TrainerEvent::Finished => {
                println!("finished after {} batches", self.batches);
                let stop = self.trainer.send(StopNodes);
                let arbiters = std::mem::take(&mut self.arbiters);
                ctx.spawn(
                    async move {
                        match stop.await {
                            Ok(Ok(())) => println!("all nodes down"),
                            Ok(Err(e)) => eprintln!("stopping the nodes: {e}"),
                            Err(e) => eprintln!("the trainer is gone: {e}"),
                        }
                        for a in &arbiters {
                            a.stop();
                        }
                        System::current().stop();
                    }
                    .into_actor(self),
                );
            }
            TrainerEvent::Failed(e) => {
                eprintln!("collection failed: {e}");
                for a in &self.arbiters {
                    a.stop();
                }
                System::current().stop_with_code(1);
            }
        }
    }
}

fn main() -> anyhow::Result<()> {
    // The initial weights of the policy the nodes run, to "train" from.
    let probe = Registry::with_builtins().make(&"CartPole-v1".into())?;
    let policy = PolicySpec::from(PolicyConfig::Linear).build(probe.observation_spec(), probe.action_spec(), 0)?;
    let weights = policy.weights().clone();

    let sys = System::new();
    let arbiters = sys.block_on(async move {
        let started = CollectorBuilder::default()
            .env("CartPole-v1")
            .policy(PolicyConfig::Linear)
            .nodes(2)
            .frames_per_batch(1000)
            .total_frames(10_000)
            .seed(0)
            .start()?;
        let handles = started.arbiters.iter().map(Arbiter::handle).collect();
        Learner {
            trainer: started.trainer,
            arbiters: handles,
            weights,
            batches: 0,
        }
        .start();
        anyhow::Ok(started.arbiters)
    })?;
    sys.run()?;
    // The system has stopped: join the env-worker threads off its thread.
    for a in arbiters {
        let _ = a.join();
    }
    Ok(())
}
