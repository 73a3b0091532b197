//! Collection speed against its own baseline, measured in one run, in both
//! exploration modes (sampled actions, and the deterministic argmax).
//!
//! (a) the bare single-thread loop: CartPole's inlined step + the linear policy's
//!     inlined fixed-size `act` (the code `Rollout`'s compiled path runs) + every frame
//!     written into plain reused arrays, nothing else (the physical limit of one core);
//! (b) `Rollout` collecting the same frames (core crate);
//! (p) the bare loop on every core at once, on plain threads;
//! (c) the in-process actor system, 2 nodes x 1 env, async and sync, pulled with the
//!     blocking `DistributedCollector` from this thread;
//! (ce) the same async collection pulled by a task on the trainer's own thread, as an
//!     embedded run (`CollectorBuilder::start_embedded`) does: no thread wake-ups
//!     between trainer and consumer;
//! (a8), (b8), (p8) the same as (a), (b), (p) with 8 envs per loop (one policy call per
//!     step for the 8 observations), against their own 8-env bare loop.
//! Prints frames/s and the ratios b/a, c/(cores x a), c/p, ce/p and b8/a8, for each mode.
//! `ROLLOUT_BENCH_ONLY=cpair` alternates short windows of a, p and c in one process
//! instead, for a busy machine (see `cpair`).
//!
//! Run: `cargo bench -p rollout-benches --bench collect`

use std::hint::black_box;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Barrier, OnceLock};
use std::time::{Duration, Instant};

use rollout::env::{CartPole, CartPoleConfig};
use rollout::policy::{ActionsMut, Linear, Policy};
use rollout::rollout::{Rollout, RolloutConfig, TrajIds};
use rollout::{Action, Env, ExplorationType, PolicyConfig};
use rollout_actors::messages::StopNodes;
use rollout_actors::{CollectorBuilder, DistributedCollector};
use rollout_benches::median;
use rollout_benches::one_node::{best_of_windows, OneNode};

/// Frames per batch: 10,000, or `ROLLOUT_BENCH_FRAMES` in the profiling runs (how the
/// per-batch costs of collection scale against the per-frame ones).
fn batch_frames() -> usize {
    static FRAMES: OnceLock<usize> = OnceLock::new();
    *FRAMES.get_or_init(|| knob("ROLLOUT_BENCH_FRAMES", 10_000))
}

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

/// The bare loop over `k` CartPoles: concrete types, the env's step and the policy's
/// fixed-size `act` inlined (the very code `Rollout`'s compiled path runs), one policy
/// call for the `k` observations per step, every frame written into reused arrays
/// laid out `[k, F/k]` as `Rollout`'s, and no bookkeeping beyond the frame itself (no
/// size, NaN or trajectory-length checks). It is the limit `Rollout` is held to.
struct Bare {
    k: usize,
    envs: Vec<CartPole>,
    policy: Linear,
    cur: Vec<f32>,
    act: Vec<i64>,
    obs: Vec<f32>,
    next_obs: Vec<f32>,
    action: Vec<i64>,
    reward: Vec<f32>,
    done: Vec<bool>,
    terminated: Vec<bool>,
    truncated: Vec<bool>,
    traj: Vec<i64>,
    step: Vec<i64>,
    traj_id: Vec<i64>,
    step_count: Vec<i64>,
    /// Env `k`'s episode ended: reset it before its next step (as `Rollout` does).
    needs_reset: Vec<bool>,
}

impl Bare {
    fn new(mode: ExplorationType, k: usize) -> Bare {
        let mut cur = vec![0.0; k * 4];
        let envs: Vec<CartPole> = (0..k)
            .map(|i| {
                let mut env = CartPole::new(CartPoleConfig::default()).expect("cartpole");
                env.reset(Some(i as u64), &mut cur[i * 4..i * 4 + 4]).expect("reset");
                env
            })
            .collect();
        let policy = linear(&envs[0], mode);
        Bare {
            k,
            envs,
            policy,
            cur,
            act: vec![0; k],
            obs: vec![0.0; batch_frames() * 4],
            next_obs: vec![0.0; batch_frames() * 4],
            action: vec![0; batch_frames()],
            reward: vec![0.0; batch_frames()],
            done: vec![false; batch_frames()],
            terminated: vec![false; batch_frames()],
            truncated: vec![false; batch_frames()],
            traj: vec![0; batch_frames()],
            step: vec![0; batch_frames()],
            traj_id: (0..k as i64).collect(),
            step_count: vec![0; k],
            needs_reset: vec![false; k],
        }
    }

    fn run(&mut self) {
        match self.k {
            1 => self.run_k::<1>(),
            8 => self.run_k::<8>(),
            _ => self.run_k::<0>(),
        }
        black_box(&self.obs);
    }

    /// The loop for `K` envs (0: as many as there are), `F/K` steps each. Fields are
    /// borrowed apart into plain slices first and their sizes checked once, so the
    /// compiler keeps them in registers and drops the per-frame bounds checks (as
    /// `Rollout`'s loop does). One function per `K`, each compiled on its own.
    #[inline(never)]
    fn run_k<const K: usize>(&mut self) {
        let Bare {
            k,
            envs,
            policy,
            cur,
            act,
            obs,
            next_obs,
            action,
            reward,
            done,
            terminated,
            truncated,
            traj,
            step,
            traj_id,
            step_count,
            needs_reset,
        } = self;
        let k_envs = if K == 0 { *k } else { K };
        let steps = batch_frames() / k_envs;
        let n = k_envs * steps;
        let (envs, cur, act) = (&mut envs[..k_envs], &mut cur[..k_envs * 4], &mut act[..k_envs]);
        let (traj_id, step_count) = (&mut traj_id[..k_envs], &mut step_count[..k_envs]);
        let needs_reset = &mut needs_reset[..k_envs];
        let (obs, next_obs) = (&mut obs[..n * 4], &mut next_obs[..n * 4]);
        let (action, reward, traj, step) = (&mut action[..n], &mut reward[..n], &mut traj[..n], &mut step[..n]);
        let (done, terminated, truncated) = (&mut done[..n], &mut terminated[..n], &mut truncated[..n]);
        for t in 0..steps {
            for k in 0..k_envs {
                if needs_reset[k] {
                    if envs[k].reset(None, &mut cur[k * 4..k * 4 + 4]).is_err() {
                        panic!("reset");
                    }
                    traj_id[k] += k_envs as i64;
                    step_count[k] = 0;
                    needs_reset[k] = false;
                }
            }
            if policy.act_fixed::<4>(cur, k_envs, ActionsMut::Discrete(act)).is_err() {
                panic!("act");
            }
            for k in 0..k_envs {
                let i = k * steps + t;
                let c = &mut cur[k * 4..k * 4 + 4];
                obs[i * 4..i * 4 + 4].copy_from_slice(c);
                let a = act[k];
                action[i] = a;
                let Ok(tr) = envs[k].step_inline(Action::Discrete(a), c) else {
                    panic!("step");
                };
                next_obs[i * 4..i * 4 + 4].copy_from_slice(c);
                let end = tr.terminated || tr.truncated;
                reward[i] = tr.reward as f32;
                terminated[i] = tr.terminated;
                truncated[i] = tr.truncated;
                done[i] = end;
                traj[i] = traj_id[k];
                step[i] = step_count[k];
                step_count[k] += 1;
                needs_reset[k] = end;
            }
        }
    }
}

fn rollout(mode: ExplorationType, k: usize) -> Rollout {
    let envs: Vec<Box<dyn Env>> = (0..k)
        .map(|_| Box::new(CartPole::new(CartPoleConfig::default()).expect("cartpole")) as Box<dyn Env>)
        .collect();
    let policy = Box::new(linear(
        &CartPole::new(CartPoleConfig::default()).expect("cartpole"),
        mode,
    ));
    Rollout::new(
        envs,
        policy,
        (0..k as u64).map(|i| TrajIds::new(i, k as u64).expect("ids")).collect(),
        RolloutConfig {
            frames_per_batch: batch_frames(),
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

/// The bare loop on every core at once, on plain threads: what the machine can
/// really do in parallel (a VM's cores rarely scale perfectly).
fn parallel_bare(secs: f64, mode: ExplorationType, k: usize) -> f64 {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let handles: Vec<_> = (0..cores)
        .map(|_| {
            std::thread::spawn(move || {
                let mut bare = Bare::new(mode, k);
                rate(secs, batch_frames(), || bare.run())
            })
        })
        .collect();
    handles.into_iter().map(|h| h.join().expect("bare thread")).sum()
}

/// A knob of the profiling runs (`ROLLOUT_BENCH_NODES`, `ROLLOUT_BENCH_NICE`), or `default`.
fn knob(name: &str, default: usize) -> usize {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

/// The collectors' settings: CartPole and the linear policy, 1 env per node, endless.
fn settings(sync: bool, mode: ExplorationType) -> CollectorBuilder {
    DistributedCollector::builder()
        .env("CartPole-v1")
        .policy(PolicyConfig::Linear)
        .nodes(knob("ROLLOUT_BENCH_NODES", 2))
        .worker_nice(knob("ROLLOUT_BENCH_NICE", 10) as i32)
        .envs_per_node(1)
        .frames_per_batch(batch_frames())
        .total_frames(-1)
        .sync(sync)
        .exploration_type(mode)
        .seed(0)
}

fn collector(sync: bool, mode: ExplorationType) -> DistributedCollector {
    settings(sync, mode).build().expect("collector")
}

/// The frame rates of one round in one mode, all measured back to back.
struct Round {
    bare: f64,
    rollout: f64,
    parallel: f64,
    async_c: f64,
    /// Async, pulled by a task on the trainer's thread (an embedded run).
    embedded_c: f64,
    sync_c: f64,
    /// The bare loop over 8 envs (one policy call per step for the 8).
    bare8: f64,
    /// `Rollout` over 8 envs.
    rollout8: f64,
    /// The 8-env bare loop on every core at once.
    parallel8: f64,
}

/// Everything one mode needs, built once and reused by every round.
struct Setup {
    mode: ExplorationType,
    bare: Bare,
    rollout: Rollout,
    bare8: Bare,
    rollout8: Rollout,
    async_c: DistributedCollector,
    embedded_c: EmbeddedPull,
    sync_c: DistributedCollector,
}

impl Setup {
    fn new(mode: ExplorationType) -> Setup {
        Setup {
            mode,
            bare: Bare::new(mode, 1),
            rollout: rollout(mode, 1),
            bare8: Bare::new(mode, 8),
            rollout8: rollout(mode, 8),
            async_c: collector(false, mode),
            embedded_c: EmbeddedPull::new(mode),
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
        let bare8 = &mut self.bare8;
        let ro8 = &mut self.rollout8;
        Round {
            bare: rate(secs, batch_frames(), || bare.run()),
            rollout: rate(secs, batch_frames(), || {
                let batch = ro.collect().expect("collect");
                ro.recycle(batch);
            }),
            parallel: parallel_bare(secs, self.mode, 1),
            async_c: rate(secs, batch_frames(), || pull(&mut self.async_c)),
            embedded_c: self.embedded_c.rate(secs),
            sync_c: rate(secs, batch_frames(), || pull(&mut self.sync_c)),
            bare8: rate(secs, batch_frames(), || bare8.run()),
            rollout8: rate(secs, batch_frames(), || {
                let batch = ro8.collect().expect("collect");
                ro8.recycle(batch);
            }),
            parallel8: parallel_bare(secs, self.mode, 8),
        }
    }

    fn shutdown(mut self) {
        self.async_c.shutdown().expect("shutdown");
        self.embedded_c.stop();
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
        "  (ce) embedded async 2 nodes x 1 env  {:>12.0} frames/s   ce/({cores}a) = {:.3}   ce/p = {:.3}",
        med(&|r| r.embedded_c),
        med(&|r| r.embedded_c / (n * r.bare)),
        med(&|r| r.embedded_c / r.parallel)
    );
    println!(
        "  (c') collector sync 2 nodes x 1 env  {:>12.0} frames/s   c'/({cores}a) = {:.3}   c'/p = {:.3}",
        med(&|r| r.sync_c),
        med(&|r| r.sync_c / (n * r.bare)),
        med(&|r| r.sync_c / r.parallel)
    );
    println!(
        "  (a8) bare loop, 8 envs, 1 thread     {:>12.0} frames/s   a8/a = {:.3}",
        med(&|r| r.bare8),
        med(&|r| r.bare8 / r.bare)
    );
    println!(
        "  (b8) Rollout, 8 envs, 1 thread       {:>12.0} frames/s   b8/a8 = {:.3}",
        med(&|r| r.rollout8),
        med(&|r| r.rollout8 / r.bare8)
    );
    println!(
        "  (p8) bare 8-env loop on {cores} threads    {:>12.0} frames/s   p8/({cores}a8) = {:.3}",
        med(&|r| r.parallel8),
        med(&|r| r.parallel8 / (n * r.bare8))
    );
}

/// `ROLLOUT_BENCH_ONLY=pair`: the bare loop and `Rollout` alternate batch by batch for
/// 3 s and each batch is timed; the fastest batch of each is what the core can do when
/// nobody else runs on it, so their ratio holds even on a busy machine.
fn pair(mode: ExplorationType) {
    let mut bare = Bare::new(mode, 1);
    let mut ro = rollout(mode, 1);
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
        batch_frames() as f64 / b,
        batch_frames() as f64 / r,
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
                    let mut bare = Bare::new(mode, 1);
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
        (self.done.swap(0, Ordering::Relaxed) * batch_frames()) as f64 / elapsed
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
        col.push((PULLS * batch_frames()) as f64 / t.elapsed().as_secs_f64());
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

/// Async collection with 2 nodes pulled as an embedded run does it
/// ([`CollectorBuilder::start_embedded`]): the consumer is a task on the trainer's own
/// thread (an actix `System` on a thread of its own here), so no thread wake-up lies
/// between the trainer and the consumer, as it does for the blocking
/// [`DistributedCollector`] called from another thread.
struct EmbeddedPull {
    /// The seconds of the next window, to the system's thread.
    windows: tokio::sync::mpsc::UnboundedSender<f64>,
    /// Frames per second of each window, back.
    rates: std::sync::mpsc::Receiver<f64>,
    thread: std::thread::JoinHandle<()>,
}

impl EmbeddedPull {
    fn new(mode: ExplorationType) -> EmbeddedPull {
        let (windows, mut window) = tokio::sync::mpsc::unbounded_channel::<f64>();
        let (rate, rates) = std::sync::mpsc::channel();
        let thread = std::thread::spawn(move || {
            actix::System::new().block_on(async move {
                let run = settings(false, mode).start_embedded().await.expect("embedded run");
                let pull = || rollout_benches::pull_embedded(&run.trainer);
                while let Some(secs) = window.recv().await {
                    // As `rate`: one untimed call, then calls for `secs`.
                    pull().await;
                    let start = Instant::now();
                    let mut calls = 0u64;
                    while start.elapsed() < Duration::from_secs_f64(secs) {
                        pull().await;
                        calls += 1;
                    }
                    let r = (calls * batch_frames() as u64) as f64 / start.elapsed().as_secs_f64();
                    if rate.send(r).is_err() {
                        break;
                    }
                }
                run.trainer.send(StopNodes).await.expect("mailbox").expect("stop");
                for a in &run.arbiters {
                    a.stop();
                }
                for a in run.arbiters {
                    a.join().expect("an env worker's thread");
                }
            });
        });
        EmbeddedPull { windows, rates, thread }
    }

    /// Frames per second pulled for about `secs`.
    fn rate(&self, secs: f64) -> f64 {
        self.windows.send(secs).expect("embedded run");
        // Bounded: a run that stops answering fails the bench instead of hanging it.
        let bound = Duration::from_secs_f64(secs + 60.0);
        self.rates
            .recv_timeout(bound)
            .expect("the embedded run measured its window in time")
    }

    fn stop(self) {
        drop(self.windows);
        self.thread.join().expect("embedded run's thread");
    }
}

fn main() {
    // Profiling aid: `ROLLOUT_BENCH_ONLY=bare|rollout|bare8|rollout8|parallel|async|sync|independent_loop` runs that one
    // for 3 s (or `ROLLOUT_BENCH_CALLS` batches); `ROLLOUT_BENCH_MODE=deterministic` picks
    // the argmax policy (default: sampling); `ROLLOUT_BENCH_NODES` and
    // `ROLLOUT_BENCH_NICE` set the collectors' nodes (2) and worker nice (10), `ROLLOUT_BENCH_FRAMES` the frames per batch (10,000);
    // `ROLLOUT_BENCH_ONLY=pair|cpair`: see `pair` and `cpair`; `embedded`: (ce) for 3 s, then (p);
    // `independent`, `independent_best`, `prefetch`: see those.
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
        if which == "independent" {
            independent();
            return;
        }
        if which == "independent_best" {
            independent_best();
            return;
        }
        if which == "prefetch" {
            prefetch();
            return;
        }
        if which == "embedded" {
            let e = EmbeddedPull::new(mode);
            let c = e.rate(3.0);
            e.stop();
            let p = parallel_bare(3.0, mode, 1);
            println!("embedded ({mode:?}): c {c:.0}, p {p:.0} frames/s, c/p {:.3}", c / p);
            return;
        }
        let rate = match which.as_str() {
            "bare" | "bare8" => {
                let mut bare = Bare::new(mode, if which == "bare8" { 8 } else { 1 });
                rate(3.0, batch_frames(), || bare.run())
            }
            "rollout8" => {
                let mut ro = rollout(mode, 8);
                rate(3.0, batch_frames(), || {
                    let batch = ro.collect().expect("collect");
                    ro.recycle(batch);
                })
            }
            "parallel" => parallel_bare(3.0, mode, 1),
            "independent_loop" => {
                let p = linear(&CartPole::new(CartPoleConfig::default()).expect("cartpole"), mode);
                let (wt, bt) = (
                    p.weights().f32_slice("weight").expect("weight").to_vec(),
                    p.weights().f32_slice("bias").expect("bias").to_vec(),
                );
                let row = |j: usize| [wt[j * 4], wt[j * 4 + 1], wt[j * 4 + 2], wt[j * 4 + 3]];
                let mut ind =
                    rollout_benches::independent::Independent::new(batch_frames(), [row(0), row(1)], [bt[0], bt[1]]);
                rate(3.0, batch_frames(), || ind.run())
            }
            "async" | "sync" => {
                let mut c = collector(which == "sync", mode);
                let r = rate(3.0, batch_frames(), || {
                    let batch = c.next_batch().expect("batch").expect("endless");
                    c.recycle(batch);
                });
                c.shutdown().expect("shutdown");
                r
            }
            _ => {
                let mut ro = rollout(mode, 1);
                rate(3.0, batch_frames(), || {
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
    println!(
        "median of {rounds} interleaved rounds, CartPole-v1 + linear policy, {} frames per batch, {cores} cores",
        batch_frames()
    );
    for ((_, name), r) in MODES.iter().zip(&results) {
        report(name, r, cores);
    }
}

/// `ROLLOUT_BENCH_ONLY=independent`: `Rollout` (b) and the collector as `rollout collect
/// --nodes 1` builds it (c1: one node, one env, async, the CLI's worker nice, pulled and
/// recycled as the CLI does) against a bare CartPole loop that shares no code with the
/// project (`rollout_benches::independent`: gymnasium's dynamics and a two-logit linear
/// policy written out, the same columns written per frame), one env, the linear
/// policy's own weights, windows of `ROLLOUT_BENCH_SECS` (1) seconds alternating,
/// `ROLLOUT_BENCH_ROUNDS` (7) rounds; prints each round's b/i and c1/i and their
/// medians. c1 is frames/s of wall time with two threads (the node's worker stepping,
/// the trainer taking the batches), i of one thread: the collector is as fast as the
/// loop when its one stepping thread is. Deterministic (the argmax) whatever
/// `ROLLOUT_BENCH_MODE`: the independent loop does not sample.
fn independent() {
    let mode = ExplorationType::Deterministic;
    let mut three = OneNode::new(batch_frames());
    let secs = std::env::var("ROLLOUT_BENCH_SECS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1.0);
    let (mut rb, mut rc) = (Vec::new(), Vec::new());
    for round in 0..knob("ROLLOUT_BENCH_ROUNDS", 7) {
        let i = rate(secs, batch_frames(), || three.run_i());
        let b = rate(secs, batch_frames(), || three.run_b());
        let c = rate(secs, batch_frames(), || three.pull_c1());
        println!(
            "round {round} ({mode:?}, {} frames per batch): independent bare loop (i) {i:.0}, Rollout (b) {b:.0}, \
             collector 1 node (c1) {c:.0} frames/s, b/i {:.3}, c1/i {:.3}",
            batch_frames(),
            b / i,
            c / i
        );
        rb.push(b / i);
        rc.push(c / i);
    }
    three.shutdown();
    println!("b/i median {:.3}, c1/i median {:.3}", median(rb), median(rc));
}

/// `ROLLOUT_BENCH_ONLY=independent_best`: the same three as `independent` (i, b, c1),
/// for a busy machine: the fastest of `ROLLOUT_BENCH_ROUNDS` (40) alternating windows of
/// `ROLLOUT_BENCH_WINDOW` (20) batches each ([`best_of_windows`]).
fn independent_best() {
    let mut three = OneNode::new(batch_frames());
    let window = knob("ROLLOUT_BENCH_WINDOW", 20);
    let best = best_of_windows(&mut three, window, knob("ROLLOUT_BENCH_ROUNDS", 40));
    three.shutdown();
    println!(
        "fastest windows of {window} x {} frames: i {:.0}, b {:.0}, c1 {:.0} frames/s; b/i {:.3}, c1/i {:.3}; \
         medians of the rounds' ratios: b/i {:.3}, c1/i {:.3}",
        batch_frames(),
        best.i,
        best.b,
        best.c1,
        best.b / best.i,
        best.c1 / best.i,
        best.median_b,
        best.median_c1
    );
}

/// `ROLLOUT_BENCH_ONLY=prefetch` (issue 39): the one-node async collector as `rollout
/// collect --nodes 1` builds it (c1, torchrl's semantics: the node goes on once its batch
/// is taken) and the same with `prefetch(1)` (c1p: it collects the next batch while the
/// last waits), against `Rollout` alone (b, the node's own loop: what c1 would be if the
/// hand-over cost nothing), deterministic CartPole, `ROLLOUT_BENCH_FRAMES` (10,000) frames
/// per batch; the fastest of `ROLLOUT_BENCH_ROUNDS` (40) alternating windows of
/// `ROLLOUT_BENCH_WINDOW` (20) batches each (after two untimed ones), and the medians of
/// the rounds' ratios.
fn prefetch() {
    let frames = batch_frames();
    let mut three = OneNode::new(frames);
    let mut ahead = rollout_benches::one_node::one_node_collector(frames, 1);
    let window = knob("ROLLOUT_BENCH_WINDOW", 20);
    let pull = |c: &mut DistributedCollector| {
        let batch = c.next_batch().expect("batch").expect("endless");
        black_box(batch.data.numel());
        c.recycle(batch);
    };
    // Each window first takes what the collectors finished while the others ran (one
    // batch for c1, two for c1p): then each is timed in its steady state.
    let time = |f: &mut dyn FnMut()| {
        f();
        f();
        let t = Instant::now();
        for _ in 0..window {
            f();
        }
        (window * frames) as f64 / t.elapsed().as_secs_f64()
    };
    let (mut b, mut c1, mut c1p) = (0f64, 0f64, 0f64);
    let (mut r1, mut rp) = (Vec::new(), Vec::new());
    for _ in 0..knob("ROLLOUT_BENCH_ROUNDS", 40) {
        let rb = time(&mut || three.run_b());
        let rc = time(&mut || three.pull_c1());
        let rcp = time(&mut || pull(&mut ahead));
        b = b.max(rb);
        c1 = c1.max(rc);
        c1p = c1p.max(rcp);
        r1.push(rc / rb);
        rp.push(rcp / rb);
    }
    three.shutdown();
    ahead.shutdown().expect("shutdown");
    println!(
        "fastest windows of {window} x {frames} frames: b {b:.0}, c1 {c1:.0}, c1 prefetch=1 {c1p:.0} frames/s; \
         c1/b {:.3}, c1p/b {:.3}, c1p/c1 {:.3}; medians of the rounds' ratios: c1/b {:.3}, c1p/b {:.3}",
        c1 / b,
        c1p / b,
        c1p / c1,
        median(r1),
        median(rp)
    );
}
