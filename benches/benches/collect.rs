//! Collection speed against its own baseline, measured in one run.
//!
//! (a) the bare single-thread loop: CartPole step + linear policy + every frame
//!     written into plain reused arrays (the physical limit of one core);
//! (b) `Rollout` collecting the same frames (core crate);
//! (c) the in-process actor system, 2 nodes x 1 env, async and sync.
//! Prints frames/s and the ratios b/a and c/(cores x a).
//!
//! Run: `cargo bench -p rollout-benches --bench collect`

use std::hint::black_box;
use std::time::{Duration, Instant};

use rollout::env::{CartPole, CartPoleConfig};
use rollout::policy::{ActionsMut, Linear, Policy};
use rollout::rollout::{Rollout, RolloutConfig, TrajIds};
use rollout::{Action, Env, PolicyConfig, Spec};
use rollout_actors::DistributedCollector;

const F: usize = 10_000;

fn linear(env: &CartPole) -> Linear {
    Linear::new(env.observation_spec(), env.action_spec(), 0, 1).expect("linear policy")
}

/// The bare loop: no trait objects, no bookkeeping beyond the frame itself.
struct Bare {
    env: CartPole,
    policy: Linear,
    cur: [f32; 4],
    obs: Vec<f32>,
    next_obs: Vec<f32>,
    action: Vec<i64>,
    reward: Vec<f32>,
    done: Vec<bool>,
    terminated: Vec<bool>,
    truncated: Vec<bool>,
    traj: Vec<i64>,
    step: Vec<i64>,
    traj_id: i64,
    step_count: i64,
}

impl Bare {
    fn new() -> Bare {
        let mut env = CartPole::new(CartPoleConfig::default()).expect("cartpole");
        let policy = linear(&env);
        let mut cur = [0.0; 4];
        env.reset(Some(0), &mut cur).expect("reset");
        Bare {
            env,
            policy,
            cur,
            obs: vec![0.0; F * 4],
            next_obs: vec![0.0; F * 4],
            action: vec![0; F],
            reward: vec![0.0; F],
            done: vec![false; F],
            terminated: vec![false; F],
            truncated: vec![false; F],
            traj: vec![0; F],
            step: vec![0; F],
            traj_id: 0,
            step_count: 0,
        }
    }

    fn run(&mut self) {
        let mut a = [0i64; 1];
        for i in 0..F {
            self.obs[i * 4..i * 4 + 4].copy_from_slice(&self.cur);
            self.policy
                .act(&self.cur, 1, ActionsMut::Discrete(&mut a))
                .expect("act");
            self.action[i] = a[0];
            let tr = self
                .env
                .step(Action::Discrete(a[0]), &mut self.next_obs[i * 4..i * 4 + 4])
                .expect("step");
            self.cur.copy_from_slice(&self.next_obs[i * 4..i * 4 + 4]);
            self.reward[i] = tr.reward as f32;
            self.terminated[i] = tr.terminated;
            self.truncated[i] = tr.truncated;
            self.done[i] = tr.terminated || tr.truncated;
            self.traj[i] = self.traj_id;
            self.step[i] = self.step_count;
            self.step_count += 1;
            if tr.terminated || tr.truncated {
                self.env.reset(None, &mut self.cur).expect("reset");
                self.traj_id += 1;
                self.step_count = 0;
            }
        }
        black_box(&self.obs);
    }
}

fn rollout() -> Rollout {
    let env = CartPole::new(CartPoleConfig::default()).expect("cartpole");
    let policy = Box::new(linear(&env));
    Rollout::new(
        vec![Box::new(env)],
        policy,
        vec![TrajIds::new(0, 1).expect("ids")],
        RolloutConfig {
            frames_per_batch: F,
            ..RolloutConfig::default()
        },
    )
    .expect("rollout")
}

/// Frames per second of `f` run repeatedly for about `secs` (after one warm-up call).
fn rate(secs: f64, frames_per_call: usize, mut f: impl FnMut()) -> f64 {
    f();
    let start = Instant::now();
    let mut calls = 0u64;
    while start.elapsed() < Duration::from_secs_f64(secs) {
        f();
        calls += 1;
    }
    (calls * frames_per_call as u64) as f64 / start.elapsed().as_secs_f64()
}

fn best(rounds: usize, mut f: impl FnMut() -> f64) -> f64 {
    (0..rounds).map(|_| f()).fold(0.0, f64::max)
}

fn collector(sync: bool) -> DistributedCollector {
    DistributedCollector::builder()
        .env("CartPole-v1")
        .policy(PolicyConfig::Linear)
        .nodes(2)
        .envs_per_node(1)
        .frames_per_batch(F)
        .total_frames(-1)
        .sync(sync)
        .seed(0)
        .build()
        .expect("collector")
}

fn main() {
    let _ = Spec::Discrete { n: 2 };
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let rounds = 5;
    let mut bare = Bare::new();
    let mut ro = rollout();
    let (mut a, mut b) = (0.0f64, 0.0f64);
    // Interleave the two so machine noise hits both alike.
    for _ in 0..rounds {
        a = a.max(rate(0.4, F, || bare.run()));
        b = b.max(rate(0.4, F, || {
            let batch = ro.collect().expect("collect");
            ro.recycle(batch);
        }));
    }
    println!("bare loop (1 thread)        {:>12.0} frames/s", a);
    println!(
        "Rollout   (1 thread)        {:>12.0} frames/s   ratio b/a = {:.3}",
        b,
        b / a
    );

    for sync in [false, true] {
        let mut c = collector(sync);
        let got = best(3, || {
            rate(1.0, F, || {
                let batch = c.next_batch().expect("batch").expect("endless");
                black_box(batch.data.numel());
                c.recycle(batch);
            })
        });
        let a2 = rate(0.4, F, || bare.run()).max(a);
        c.shutdown().expect("shutdown");
        println!(
            "collector {} 2 nodes x 1 env {:>10.0} frames/s   ratio c/({cores} x a) = {:.3}",
            if sync { "sync " } else { "async" },
            got,
            got / (cores as f64 * a2)
        );
    }
}
