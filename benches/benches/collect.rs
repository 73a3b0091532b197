//! Collection speed against its own baseline, measured in one run, in both
//! exploration modes (sampled actions, and the deterministic argmax).
//!
//! (a) the bare single-thread loop: CartPole step + linear policy + every frame
//!     written into plain reused arrays (the physical limit of one core);
//! (b) `Rollout` collecting the same frames (core crate);
//! (p) the bare loop on every core at once, on plain threads;
//! (c) the in-process actor system, 2 nodes x 1 env, async and sync.
//! Prints frames/s and the ratios b/a, c/(cores x a) and c/p, for each mode.
//! `ROLLOUT_BENCH_ONLY=cpair` alternates short windows of a, p and c in one process
//! instead, for a busy machine (see `cpair`).
//!
//! Run: `cargo bench -p rollout-benches --bench collect`

use std::hint::black_box;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use rollout::env::{CartPole, CartPoleConfig};
use rollout::policy::{ActionsMut, Linear, Policy};
use rollout::rollout::{Rollout, RolloutConfig, TrajIds};
use rollout::{Action, Env, ExplorationType, PolicyConfig};
use rollout_actors::DistributedCollector;

const F: usize = 10_000;

/// The two exploration modes, in the order they are reported.
const MODES: [(ExplorationType, &str); 2] = [
    (ExplorationType::Random, "sampling"),
    (ExplorationType::Deterministic, "deterministic"),
];

fn linear(env: &CartPole, mode: ExplorationType) -> Linear {
    let mut p = Linear::new(env.observation_spec(), env.action_spec(), 0, 1).expect("linear policy");
    p.set_exploration(mode);
    p
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
    fn new(mode: ExplorationType) -> Bare {
        let mut env = CartPole::new(CartPoleConfig::default()).expect("cartpole");
        let policy = linear(&env, mode);
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

fn rollout(mode: ExplorationType) -> Rollout {
    let env = CartPole::new(CartPoleConfig::default()).expect("cartpole");
    let policy = Box::new(linear(&env, mode));
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

/// Frames per second of `f` run repeatedly for about `secs` (after one warm-up call),
/// or exactly `ROLLOUT_BENCH_CALLS` times when that is set (for instruction counts
/// under callgrind, which do not depend on the machine's load).
fn rate(secs: f64, frames_per_call: usize, mut f: impl FnMut()) -> f64 {
    f();
    if let Some(n) = std::env::var("ROLLOUT_BENCH_CALLS")
        .ok()
        .and_then(|v| v.parse::<u64>().ok())
    {
        let start = Instant::now();
        for _ in 0..n {
            f();
        }
        return (n * frames_per_call as u64) as f64 / start.elapsed().as_secs_f64();
    }
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
fn parallel_bare(secs: f64, mode: ExplorationType) -> f64 {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let handles: Vec<_> = (0..cores)
        .map(|_| {
            std::thread::spawn(move || {
                let mut bare = Bare::new(mode);
                rate(secs, F, || bare.run())
            })
        })
        .collect();
    handles.into_iter().map(|h| h.join().expect("bare thread")).sum()
}

/// A knob of the profiling runs (`ROLLOUT_BENCH_NODES`, `ROLLOUT_BENCH_NICE`), or `default`.
fn knob(name: &str, default: usize) -> usize {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

fn collector(sync: bool, mode: ExplorationType) -> DistributedCollector {
    DistributedCollector::builder()
        .env("CartPole-v1")
        .policy(PolicyConfig::Linear)
        .nodes(knob("ROLLOUT_BENCH_NODES", 2))
        .worker_nice(knob("ROLLOUT_BENCH_NICE", 10) as i32)
        .envs_per_node(1)
        .frames_per_batch(F)
        .total_frames(-1)
        .sync(sync)
        .exploration_type(mode)
        .seed(0)
        .build()
        .expect("collector")
}

/// The frame rates of one round in one mode, all measured back to back.
struct Round {
    bare: f64,
    rollout: f64,
    parallel: f64,
    async_c: f64,
    sync_c: f64,
}

/// Everything one mode needs, built once and reused by every round.
struct Setup {
    mode: ExplorationType,
    bare: Bare,
    rollout: Rollout,
    async_c: DistributedCollector,
    sync_c: DistributedCollector,
}

impl Setup {
    fn new(mode: ExplorationType) -> Setup {
        Setup {
            mode,
            bare: Bare::new(mode),
            rollout: rollout(mode),
            async_c: collector(false, mode),
            sync_c: collector(true, mode),
        }
    }

    fn round(&mut self, secs: f64) -> Round {
        let pull = |c: &mut DistributedCollector| {
            let batch = c.next_batch().expect("batch").expect("endless");
            black_box(batch.data.numel());
            c.recycle(batch);
        };
        let bare = &mut self.bare;
        let ro = &mut self.rollout;
        Round {
            bare: rate(secs, F, || bare.run()),
            rollout: rate(secs, F, || {
                let batch = ro.collect().expect("collect");
                ro.recycle(batch);
            }),
            parallel: parallel_bare(secs, self.mode),
            async_c: rate(secs, F, || pull(&mut self.async_c)),
            sync_c: rate(secs, F, || pull(&mut self.sync_c)),
        }
    }

    fn shutdown(mut self) {
        self.async_c.shutdown().expect("shutdown");
        self.sync_c.shutdown().expect("shutdown");
    }
}

/// Prints the medians of one mode's rounds; every ratio is taken within a round.
fn report(name: &str, rounds: &[Round], cores: usize) {
    let med = |f: &dyn Fn(&Round) -> f64| median(rounds.iter().map(f).collect());
    let n = cores as f64;
    println!("{name}:");
    println!(
        "  (a)  bare loop, 1 thread             {:>12.0} frames/s",
        med(&|r| r.bare)
    );
    println!(
        "  (b)  Rollout, 1 thread               {:>12.0} frames/s   b/a = {:.3}",
        med(&|r| r.rollout),
        med(&|r| r.rollout / r.bare)
    );
    println!(
        "  (p)  bare loop on {cores} threads          {:>12.0} frames/s   p/({cores}a) = {:.3}",
        med(&|r| r.parallel),
        med(&|r| r.parallel / (n * r.bare))
    );
    println!(
        "  (c)  collector async 2 nodes x 1 env {:>12.0} frames/s   c/({cores}a) = {:.3}   c/p = {:.3}",
        med(&|r| r.async_c),
        med(&|r| r.async_c / (n * r.bare)),
        med(&|r| r.async_c / r.parallel)
    );
    println!(
        "  (c') collector sync 2 nodes x 1 env  {:>12.0} frames/s   c'/({cores}a) = {:.3}   c'/p = {:.3}",
        med(&|r| r.sync_c),
        med(&|r| r.sync_c / (n * r.bare)),
        med(&|r| r.sync_c / r.parallel)
    );
}

/// `ROLLOUT_BENCH_ONLY=pair`: the bare loop and `Rollout` alternate batch by batch for
/// 3 s and each batch is timed; the fastest batch of each is what the core can do when
/// nobody else runs on it, so their ratio holds even on a busy machine.
fn pair(mode: ExplorationType) {
    let mut bare = Bare::new(mode);
    let mut ro = rollout(mode);
    let (mut tb, mut tr) = (Vec::new(), Vec::new());
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(3) {
        let t = Instant::now();
        bare.run();
        tb.push(t.elapsed().as_secs_f64());
        let t = Instant::now();
        let batch = ro.collect().expect("collect");
        tr.push(t.elapsed().as_secs_f64());
        ro.recycle(batch);
    }
    let min = |v: &[f64]| v.iter().copied().fold(f64::INFINITY, f64::min);
    let (b, r) = (min(&tb), min(&tr));
    println!(
        "pair ({mode:?}, {} batches each): bare {:.0}, rollout {:.0} frames/s at best; b/a = {:.3} (medians: {:.3})",
        tb.len(),
        F as f64 / b,
        F as f64 / r,
        b / r,
        median(tb.clone()) / median(tr.clone())
    );
}

/// The bare loop on threads of their own, parked between rounds: the parallel
/// baseline of `cpair`.
struct BareThreads {
    go: Arc<Barrier>,
    handles: Vec<std::thread::JoinHandle<()>>,
    stop: Arc<AtomicBool>,
    /// The length of the next round, as `f64` bits.
    secs: Arc<AtomicU64>,
    /// Batches run in the round, over all threads.
    done: Arc<AtomicUsize>,
}

impl BareThreads {
    fn new(mode: ExplorationType, threads: usize) -> BareThreads {
        let go = Arc::new(Barrier::new(threads + 1));
        let stop = Arc::new(AtomicBool::new(false));
        let secs = Arc::new(AtomicU64::new(0));
        let done = Arc::new(AtomicUsize::new(0));
        let handles = (0..threads)
            .map(|_| {
                let (go, stop, secs, done) = (go.clone(), stop.clone(), secs.clone(), done.clone());
                std::thread::spawn(move || {
                    let mut bare = Bare::new(mode);
                    loop {
                        go.wait();
                        if stop.load(Ordering::Relaxed) {
                            return;
                        }
                        let secs = f64::from_bits(secs.load(Ordering::Relaxed));
                        let t = Instant::now();
                        let mut n = 0;
                        while n == 0 || t.elapsed().as_secs_f64() < secs {
                            bare.run();
                            n += 1;
                        }
                        done.fetch_add(n, Ordering::Relaxed);
                        go.wait();
                    }
                })
            })
            .collect();
        BareThreads {
            go,
            handles,
            stop,
            secs,
            done,
        }
    }

    /// Frames per second of every thread running batches for about `secs`.
    fn rate(&self, secs: f64) -> f64 {
        self.secs.store(secs.to_bits(), Ordering::Relaxed);
        let t = Instant::now();
        self.go.wait();
        self.go.wait();
        let elapsed = t.elapsed().as_secs_f64();
        (self.done.swap(0, Ordering::Relaxed) * F) as f64 / elapsed
    }

    fn stop(self) {
        self.stop.store(true, Ordering::Relaxed);
        self.go.wait();
        for h in self.handles {
            h.join().expect("bare thread");
        }
    }
}

/// `ROLLOUT_BENCH_ONLY=cpair`: short windows of the bare loop on one thread (a, 4 ms),
/// on 2 threads (p, 4 ms) and of async collection with 2 nodes (c, 10 batches)
/// alternate for 6 s. The best window of each is what it does when the machine is
/// ours, the medians what it does on average: ratios that hold better on a busy
/// machine than those of separate runs.
fn cpair(mode: ExplorationType) {
    const PULLS: usize = 10;
    let nodes = knob("ROLLOUT_BENCH_NODES", 2);
    let one = BareThreads::new(mode, 1);
    let bare = BareThreads::new(mode, nodes);
    let mut c = collector(false, mode);
    let pull = |c: &mut DistributedCollector| {
        let batch = c.next_batch().expect("batch").expect("endless");
        c.recycle(batch);
    };
    let (mut a, mut p, mut col) = (Vec::new(), Vec::new(), Vec::new());
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(6) {
        a.push(one.rate(0.004));
        p.push(bare.rate(0.004));
        // The batches collected since the last window, untimed: from here every
        // node collects, released as these are yielded.
        for _ in 0..nodes {
            pull(&mut c);
        }
        let t = Instant::now();
        for _ in 0..PULLS {
            pull(&mut c);
        }
        col.push((PULLS * F) as f64 / t.elapsed().as_secs_f64());
        // The batches in flight finish before the next window (bench pacing).
        std::thread::sleep(Duration::from_millis(3));
    }
    one.stop();
    bare.stop();
    c.shutdown().expect("shutdown");
    let best = |v: &[f64]| v.iter().copied().fold(0.0, f64::max);
    let med = |v: &[f64]| median(v.to_vec());
    let n = nodes as f64;
    println!(
        "cpair ({mode:?}, {nodes} nodes, {} windows each), best / median frames/s: a {:.0} / {:.0}, p {:.0} / {:.0}, c {:.0} / {:.0}; \
         p/({nodes}a) {:.3} / {:.3}, c/({nodes}a) {:.3} / {:.3}, c/p {:.3} / {:.3}",
        a.len(),
        best(&a),
        med(&a),
        best(&p),
        med(&p),
        best(&col),
        med(&col),
        best(&p) / (n * best(&a)),
        med(&p) / (n * med(&a)),
        best(&col) / (n * best(&a)),
        med(&col) / (n * med(&a)),
        best(&col) / best(&p),
        med(&col) / med(&p)
    );
}

fn main() {
    // Profiling aid: `ROLLOUT_BENCH_ONLY=bare|rollout|parallel|async|sync` runs that one
    // for 3 s (or `ROLLOUT_BENCH_CALLS` batches); `ROLLOUT_BENCH_MODE=deterministic` picks
    // the argmax policy (default: sampling); `ROLLOUT_BENCH_NODES` and
    // `ROLLOUT_BENCH_NICE` set the collectors' nodes (2) and worker nice (10);
    // `ROLLOUT_BENCH_ONLY=pair|cpair`: see `pair` and `cpair`.
    let mode = match std::env::var("ROLLOUT_BENCH_MODE").as_deref() {
        Ok("deterministic") => ExplorationType::Deterministic,
        _ => ExplorationType::Random,
    };
    if let Ok(which) = std::env::var("ROLLOUT_BENCH_ONLY") {
        if which == "pair" {
            pair(mode);
            return;
        }
        if which == "cpair" {
            cpair(mode);
            return;
        }
        let rate = match which.as_str() {
            "bare" => {
                let mut bare = Bare::new(mode);
                rate(3.0, F, || bare.run())
            }
            "parallel" => parallel_bare(3.0, mode),
            "async" | "sync" => {
                let mut c = collector(which == "sync", mode);
                let r = rate(3.0, F, || {
                    let batch = c.next_batch().expect("batch").expect("endless");
                    c.recycle(batch);
                });
                c.shutdown().expect("shutdown");
                r
            }
            _ => {
                let mut ro = rollout(mode);
                rate(3.0, F, || {
                    let batch = ro.collect().expect("collect");
                    ro.recycle(batch);
                })
            }
        };
        println!("{which} ({mode:?}): {rate:.0} frames/s");
        return;
    }
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let rounds = 9;
    let secs = 0.3;
    let mut setups: Vec<Setup> = MODES.iter().map(|&(m, _)| Setup::new(m)).collect();
    // Every round measures everything of both modes back to back, so a slow spell of
    // this (shared, virtual) machine hits a round's baselines and its candidates alike;
    // ratios are taken per round and the median is reported.
    let mut results: Vec<Vec<Round>> = setups.iter().map(|_| Vec::new()).collect();
    for _ in 0..rounds {
        for (s, r) in setups.iter_mut().zip(&mut results) {
            r.push(s.round(secs));
        }
    }
    for s in setups {
        s.shutdown();
    }
    println!("median of {rounds} interleaved rounds, CartPole-v1 + linear policy, {F} frames per batch, {cores} cores");
    for ((_, name), r) in MODES.iter().zip(&results) {
        report(name, r, cores);
    }
}
