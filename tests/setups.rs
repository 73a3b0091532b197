//! Configurations several scenario files run: collectors, trainer configs, weights.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::mpsc::{self, RecvTimeoutError};
use std::thread::{self, JoinHandle};
use std::time::Duration;

use ndarray::ArrayD;
use rollout::machine::TrainerConfig;
use rollout::shares::Shares;
use rollout::{PolicyConfig, Tensor, Weights};
use rollout_actors::{CollectorBuilder, DistributedCollector, Launcher};

/// Weights of the `Constant` policy: its action becomes `v` (version 0: the trainer
/// numbers what it is given).
pub fn value_weights(v: f32) -> Weights {
    let mut t = BTreeMap::new();
    t.insert("value".to_string(), Tensor::F32(ArrayD::from_elem(vec![1], v)));
    Weights::new(t)
}

/// A trainer config of `nodes` nodes of `envs` envs each, no automatic weight pushes.
pub fn trainer_config(nodes: usize, envs: usize, fpb: usize, total: Option<u64>, sync: bool) -> TrainerConfig {
    TrainerConfig::new(Shares::new(fpb, vec![envs; nodes], 1, sync, total).expect("valid shares"))
}

/// Two process nodes (the `rollout` binary of [`crate::rollout_bin`]) of `Counting`
/// with a constant action 1.0, seed 0; joins and batches bounded by 20 s.
pub fn counting_process_builder(sync: bool, fpb: usize, total: i64) -> CollectorBuilder {
    DistributedCollector::builder()
        .env("Counting")
        .policy(PolicyConfig::Constant { value: 1.0 })
        .nodes(2)
        .frames_per_batch(fpb)
        .total_frames(total)
        .sync(sync)
        .seed(0)
        .launcher(Launcher::Process)
        .node_program(crate::rollout_bin())
        .join_timeout(Duration::from_secs(20))
        .batch_timeout(Duration::from_secs(20))
}

/// The trainer of the scenarios where raw peers join over loopback: `nodes` external
/// nodes of `envs` `Counting` envs each with a constant action 1.0, seed 0, listening
/// on a free loopback port (see [`built_on_a_thread`]) for nodes that hold `token`;
/// heartbeats every 200 ms (10 s timeout), joins and batches bounded by 30 s.
pub fn external_counting_builder(token: &[u8], nodes: usize, envs: usize) -> CollectorBuilder {
    DistributedCollector::builder()
        .env("Counting")
        .policy(PolicyConfig::Constant { value: 1.0 })
        .nodes(nodes)
        .envs_per_node(envs)
        .seed(0)
        .launcher(Launcher::External)
        .listen("127.0.0.1:0")
        .token(token)
        .heartbeat(Duration::from_millis(200), Duration::from_secs(10))
        .join_timeout(Duration::from_secs(30))
        .batch_timeout(Duration::from_secs(30))
}

/// Longest wait for a trainer being built to bind its listening socket.
const BIND_DEADLINE: Duration = Duration::from_secs(60);

/// `b` handed to `build` on a thread of its own (a run of remote nodes waits for their
/// joins in `build`), and the address its listening socket is bound to, returned as
/// soon as it is: before any node joins. A run listens on `127.0.0.1:0` unless `b` says
/// otherwise, so the port is one the kernel picked and held from then on (no other
/// test can take it between choosing and binding). Panics, with the thread's own panic
/// when it had one, if nothing was bound within 60 s.
pub fn listening_on_a_thread<T: Send + 'static>(
    b: CollectorBuilder,
    build: impl FnOnce(CollectorBuilder) -> T + Send + 'static,
) -> (JoinHandle<T>, SocketAddr) {
    let (bound, addr) = mpsc::channel();
    let b = b.on_listening(move |a| {
        // Only the first bind counts; the test may have stopped listening already.
        let _ = bound.send(a);
    });
    let t = thread::spawn(move || build(b));
    match addr.recv_timeout(BIND_DEADLINE) {
        Ok(a) => (t, a),
        Err(RecvTimeoutError::Timeout) => panic!("the trainer bound no socket within {BIND_DEADLINE:?}"),
        // The builder (and the hook with it) is gone: the build ended before binding.
        Err(RecvTimeoutError::Disconnected) => match t.join() {
            Err(panic) => std::panic::resume_unwind(panic),
            Ok(_) => panic!("the trainer's build ended before it bound a socket"),
        },
    }
}

/// `b` built on a thread of its own, with the captured log on, and the address it
/// listens on (see [`listening_on_a_thread`]).
pub fn built_on_a_thread(b: CollectorBuilder) -> (JoinHandle<DistributedCollector>, SocketAddr) {
    crate::logs();
    listening_on_a_thread(b, |b| b.build().expect("collector"))
}

/// Sync CartPole with a linear policy: 2 nodes of 2 envs, 5 batches of 400 frames.
pub fn cartpole_sync_builder(seed: u64) -> CollectorBuilder {
    DistributedCollector::builder()
        .env("CartPole-v1")
        .policy(PolicyConfig::Linear)
        .nodes(2)
        .envs_per_node(2)
        .frames_per_batch(400)
        .total_frames(2000)
        .sync(true)
        .seed(seed)
}

/// Two nodes (in process unless a launcher is set) of `Panicky` envs from `registry`
/// (see [`crate::panicky_registry`]), a constant action 1.0, seed 0; batches bounded by 20 s.
pub fn panicky_builder(registry: rollout::Registry) -> CollectorBuilder {
    DistributedCollector::builder()
        .env("Panicky")
        .registry(registry)
        .policy(PolicyConfig::Constant { value: 1.0 })
        .nodes(2)
        .seed(0)
        .batch_timeout(Duration::from_secs(20))
}
