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

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// The bare loop on every core at once, on plain threads: what the machine can
/// really do in parallel (a VM's cores rarely scale perfectly).
fn parallel_bare(secs: f64) -> f64 {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let handles: Vec<_> = (0..cores)
        .map(|_| {
            std::thread::spawn(move || {
                let mut bare = Bare::new();
                rate(secs, F, || bare.run())
            })
        })
        .collect();
    handles.into_iter().map(|h| h.join().expect("bare thread")).sum()
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
    // Profiling aid: `ROLLOUT_BENCH_ONLY=bare|rollout|parallel|async|sync` runs that one for 3 s.
    if let Ok(which) = std::env::var("ROLLOUT_BENCH_ONLY") {
        let rate = match which.as_str() {
            "bare" => {
                let mut bare = Bare::new();
                rate(3.0, F, || bare.run())
            }
            "parallel" => parallel_bare(3.0),
            "async" | "sync" => {
                let mut c = collector(which == "sync");
                let r = rate(3.0, F, || {
                    let batch = c.next_batch().expect("batch").expect("endless");
                    c.recycle(batch);
                });
                c.shutdown().expect("shutdown");
                r
            }
            _ => {
                let mut ro = rollout();
                rate(3.0, F, || {
                    let batch = ro.collect().expect("collect");
                    ro.recycle(batch);
                })
            }
        };
        println!("{which}: {rate:.0} frames/s");
        return;
    }
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let rounds = 9;
    let secs = 0.3;
    let mut bare = Bare::new();
    let mut ro = rollout();
    let mut asy = collector(false);
    let mut syn = collector(true);
    let pull = |c: &mut DistributedCollector| {
        let batch = c.next_batch().expect("batch").expect("endless");
        black_box(batch.data.numel());
        c.recycle(batch);
    };
    // Every round measures everything back to back, so a slow spell of this
    // (shared, virtual) machine hits a round's baseline and its candidates alike;
    // ratios are taken per round and the median is reported.
    let (mut a, mut b, mut p, mut ca, mut cs) = (vec![], vec![], vec![], vec![], vec![]);
    let (mut rb, mut rp, mut rca, mut rcs, mut rpa, mut rps) = (vec![], vec![], vec![], vec![], vec![], vec![]);
    for _ in 0..rounds {
        let ra = rate(secs, F, || bare.run());
        let rr = rate(secs, F, || {
            let batch = ro.collect().expect("collect");
            ro.recycle(batch);
        });
        let rpar = parallel_bare(secs);
        let rasy = rate(secs, F, || pull(&mut asy));
        let rsyn = rate(secs, F, || pull(&mut syn));
        rb.push(rr / ra);
        rp.push(rpar / (cores as f64 * ra));
        rca.push(rasy / (cores as f64 * ra));
        rcs.push(rsyn / (cores as f64 * ra));
        rpa.push(rasy / rpar);
        rps.push(rsyn / rpar);
        a.push(ra);
        b.push(rr);
        p.push(rpar);
        ca.push(rasy);
        cs.push(rsyn);
    }
    asy.shutdown().expect("shutdown");
    syn.shutdown().expect("shutdown");
    println!("median of {rounds} interleaved rounds, CartPole-v1 + linear policy, {F} frames per batch, {cores} cores");
    println!("(a)  bare loop, 1 thread            {:>12.0} frames/s", median(a));
    println!(
        "(b)  Rollout, 1 thread              {:>12.0} frames/s   b/a = {:.3}",
        median(b),
        median(rb)
    );
    println!(
        "(p)  bare loop on {cores} threads         {:>12.0} frames/s   p/({cores}a) = {:.3}",
        median(p),
        median(rp)
    );
    println!(
        "(c)  collector async 2 nodes x 1 env {:>12.0} frames/s   c/({cores}a) = {:.3}   c/p = {:.3}",
        median(ca),
        median(rca),
        median(rpa)
    );
    println!(
        "(c') collector sync 2 nodes x 1 env  {:>12.0} frames/s   c'/({cores}a) = {:.3}   c'/p = {:.3}",
        median(cs),
        median(rcs),
        median(rps)
    );
}
