//! Hostile batches and layouts over real loopback sockets: a run of two legitimate
//! nodes and one scripted node (the wire encoder and the token on a raw `TcpStream`)
//! that announces a wrong `ready` or answers with a wrong `batch`. Each run must end
//! exact with every frame from the legitimate nodes and none from the hostile one,
//! whose connection is closed with the reason logged.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use rollout::message::{Batch, Continue, FromNode, ToNode};
use rollout::rollout::{keys, BatchLayout};
use rollout::wire::{self, NodeFrame, TrainerFrame, Welcome, PROTOCOL_VERSION};
use rollout::{DType, PolicyConfig, Registry, Tensor, TensorDict};
use rollout_actors::remote::{run_node, NodeOptions};
use rollout_actors::{DistributedCollector, Launcher};
use rollout_tests::free_addr;

const TOKEN: &[u8] = b"hostile-batches-token-0123456789";
const DEADLINE: Duration = Duration::from_secs(30);
/// Frames per batch, over [`ENVS`] envs per node: the issue's `--envs-per-node 2` run.
const FPB: usize = 1000;
const ENVS: usize = 2;
const TOTAL: usize = 4000;
/// The hostile node's index; the legitimate ones are 0 and 1.
const HOSTILE: usize = 2;

/// Every log line of this process, so a test can find the reason its connection got.
fn logs() -> &'static Arc<Mutex<Vec<u8>>> {
    static LOGS: OnceLock<Arc<Mutex<Vec<u8>>>> = OnceLock::new();
    LOGS.get_or_init(|| {
        let buf = Arc::new(Mutex::new(Vec::new()));
        let w = buf.clone();
        let _ = tracing_subscriber::fmt()
            .with_env_filter("info")
            .with_ansi(false)
            .with_writer(move || LogWriter(w.clone()))
            .try_init();
        buf
    })
}

struct LogWriter(Arc<Mutex<Vec<u8>>>);

impl Write for LogWriter {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).extend_from_slice(b);
        Ok(b.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Waits until a log line naming the node `name` (as `name=…`) holds `needle`, or
/// fails after the deadline. Names are unique per test ([`unique_name`]), so tests
/// running side by side in one process cannot see each other's lines.
fn assert_logged(name: &str, needle: &str) {
    let field = format!("name={name}");
    let end = Instant::now() + DEADLINE;
    loop {
        let text = String::from_utf8_lossy(&logs().lock().unwrap_or_else(|p| p.into_inner())).into_owned();
        let own = |line: &&str| line.split_whitespace().any(|w| w == field);
        if text.lines().filter(own).any(|line| line.contains(needle)) {
            return;
        }
        let mine: Vec<&str> = text.lines().filter(own).collect();
        assert!(
            Instant::now() < end,
            "`{needle}` was never logged about {name}; its lines:\n{}",
            mine.join("\n")
        );
        thread::sleep(Duration::from_millis(10));
    }
}

/// `kind-N`, a node name no other test of this process uses.
fn unique_name(kind: &str) -> String {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    format!("{kind}-{}", NEXT.fetch_add(1, Ordering::Relaxed))
}

/// An async trainer expecting three external nodes of [`ENVS`] Counting envs each,
/// built on a thread (build waits for the joins).
fn trainer(addr: SocketAddr) -> JoinHandle<DistributedCollector> {
    logs();
    thread::spawn(move || {
        DistributedCollector::builder()
            .env("Counting")
            .policy(PolicyConfig::Constant { value: 1.0 })
            .nodes(3)
            .envs_per_node(ENVS)
            .frames_per_batch(FPB)
            .total_frames(TOTAL as i64)
            .sync(false)
            .seed(0)
            .launcher(Launcher::External)
            .listen(addr.to_string())
            .token(TOKEN)
            .heartbeat(Duration::from_millis(200), Duration::from_secs(10))
            .join_timeout(DEADLINE)
            .batch_timeout(DEADLINE)
            .build()
            .expect("collector")
    })
}

/// A legitimate node, the library's own, as node `index`.
fn good_node(addr: SocketAddr, index: usize) -> JoinHandle<Result<(), String>> {
    thread::spawn(move || {
        let opts = NodeOptions {
            name: unique_name("good"),
            index: Some(index),
            connect_timeout: DEADLINE,
            ..NodeOptions::default()
        };
        run_node(&addr.to_string(), TOKEN, opts).map_err(|e| e.to_string())
    })
}

/// The scripted node's side of its connection.
struct Scripted {
    s: TcpStream,
    welcome: Welcome,
}

impl Scripted {
    /// Connects and logs in as node [`HOSTILE`] under `name`.
    fn join(addr: SocketAddr, name: &str) -> Scripted {
        let end = Instant::now() + DEADLINE;
        let mut s = loop {
            match TcpStream::connect(addr) {
                Ok(s) => break s,
                Err(e) => {
                    assert!(Instant::now() < end, "cannot connect to {addr}: {e}");
                    thread::sleep(Duration::from_millis(10));
                }
            }
        };
        s.set_read_timeout(Some(DEADLINE)).expect("timeout");
        send(
            &mut s,
            &NodeFrame::Hello {
                protocol_version: PROTOCOL_VERSION,
                node_name: name.into(),
                node_index: Some(HOSTILE),
            },
        );
        let Some(TrainerFrame::Challenge { nonce }) = recv(&mut s) else {
            panic!("expected a challenge");
        };
        let proof = wire::auth_proof(TOKEN, &nonce, name);
        send(&mut s, &NodeFrame::Auth { proof });
        let Some(TrainerFrame::Welcome(welcome)) = recv(&mut s) else {
            panic!("the scripted node was not admitted");
        };
        Scripted { s, welcome: *welcome }
    }

    fn ready(&mut self, layout: BatchLayout) {
        let node = self.welcome.node_index;
        send(&mut self.s, &NodeFrame::Message(FromNode::Ready { node, layout }));
    }

    /// Serves the trainer until it closes the connection: answers the seeding chain,
    /// every `Continue` with the batch `answer` makes, `Shutdown` with `Down`.
    /// Returns how many batches it sent.
    fn serve(&mut self, answer: &dyn Fn(&Welcome, Continue) -> TensorDict) -> usize {
        let node = self.welcome.node_index;
        let mut sent = 0;
        loop {
            let Some(frame) = recv(&mut self.s) else {
                return sent;
            };
            let reply = match frame {
                TrainerFrame::Message(ToNode::Seed(seed)) => FromNode::Seeded {
                    node,
                    next_seed: seed.seed.wrapping_add(ENVS as u64),
                },
                TrainerFrame::Message(ToNode::Continue(c)) => {
                    sent += 1;
                    FromNode::Batch(Batch {
                        node,
                        seq: c.seq,
                        weights_version: 0,
                        data: answer(&self.welcome, c),
                    })
                }
                TrainerFrame::Message(ToNode::Shutdown) => FromNode::Down { node },
                TrainerFrame::Heartbeat => {
                    send(&mut self.s, &NodeFrame::Heartbeat);
                    continue;
                }
                _ => continue,
            };
            // The trainer may have closed already: then the next read ends the loop.
            let bytes = wire::encode(&NodeFrame::Message(reply), usize::MAX).expect("encode");
            let _ = self.s.write_all(&bytes);
        }
    }
}

fn send(s: &mut TcpStream, f: &NodeFrame) {
    let bytes = wire::encode(f, wire::DEFAULT_MAX_FRAME).expect("encode");
    s.write_all(&bytes).expect("write");
}

/// The next frame, or `None` once the trainer closed the connection.
fn recv(s: &mut TcpStream) -> Option<TrainerFrame> {
    let mut prefix = [0u8; 4];
    s.read_exact(&mut prefix).ok()?;
    let mut body = vec![0u8; u32::from_be_bytes(prefix) as usize];
    s.read_exact(&mut body).ok()?;
    Some(wire::decode(&body).expect("the trainer sends valid frames"))
}

/// A correct answer to `c`: every worker of the spec collects its share, joined as a
/// node joins them.
fn real_batch(w: &Welcome, c: Continue) -> TensorDict {
    let shares: Vec<TensorDict> = w
        .spec
        .build_workers(&Registry::with_builtins())
        .expect("workers")
        .iter_mut()
        .map(|r| r.collect_frames(c.frames / ENVS).expect("collect"))
        .collect();
    TensorDict::cat(&shares).expect("cat")
}

/// A batch of `batch_size` whose every entry of `layout` is zeros.
fn zeros(batch_size: &[usize], layout: &BatchLayout) -> TensorDict {
    let entries = layout.iter().map(|(k, (dtype, feature))| {
        let mut shape = batch_size.to_vec();
        shape.extend_from_slice(feature);
        (k.clone(), Tensor::zeros(*dtype, &shape))
    });
    TensorDict::from_entries(batch_size, entries).expect("dict")
}

/// A run with the hostile node announcing `layout` and answering every `Continue`
/// with `answer`: it ends exact, every frame from nodes 0 and 1, and the hostile
/// connection is closed with `reason` logged.
fn hostile_run(layout: BatchLayout, answer: impl Fn(&Welcome, Continue) -> TensorDict + Send + 'static, reason: &str) {
    let addr = free_addr();
    let t = trainer(addr);
    let name = unique_name("hostile");
    let mut h = Scripted::join(addr, &name);
    h.ready(layout);
    let hostile = thread::spawn(move || h.serve(&answer));
    let good = [good_node(addr, 0), good_node(addr, 1)];
    let mut c = t.join().expect("trainer thread");
    let mut frames = 0;
    let mut from = Vec::new();
    while let Some(b) = c.next_batch().expect("batch") {
        frames += b.data.numel();
        from.push(b.node);
    }
    c.shutdown().expect("shutdown");
    assert_eq!(frames, TOTAL, "the run ends exact");
    assert!(
        from.iter().all(|n| matches!(n, Some(0 | 1))),
        "every batch from the legitimate nodes: {from:?}"
    );
    assert_logged(&name, "closing connection to node");
    assert_logged(&name, reason);
    hostile.join().expect("hostile thread");
    for g in good {
        assert_eq!(g.join().expect("node thread"), Ok(()));
    }
}

/// The layout of a Counting env's batches, as the trainer builds it from the env's specs.
fn counting() -> BatchLayout {
    let env = Registry::with_builtins().make(&"Counting".into()).expect("builtin env");
    rollout::rollout::batch_layout(env.observation_spec(), env.action_spec())
}

/// A wrong `ready` (Counting's layout changed by `change`), then batches that hold
/// what it announced.
fn wrong_ready(change: impl FnOnce(&mut BatchLayout), reason: &str) {
    let mut announced = counting();
    change(&mut announced);
    let l = announced.clone();
    hostile_run(announced, move |_, c| zeros(&[ENVS, c.frames / ENVS], &l), reason);
}

/// A correct `ready`, then every `Continue` answered with `answer`.
fn wrong_batch(answer: impl Fn(&Welcome, Continue) -> TensorDict + Send + 'static, reason: &str) {
    hostile_run(counting(), answer, reason);
}

// ---------------------------------------------------------------- wrong `ready`

#[test]
fn an_empty_layout_is_refused_and_its_empty_batches_are_no_frames() {
    wrong_ready(
        |l| l.clear(),
        "node 2's observation is absent, env Counting's is f32 [1]",
    );
}

#[test]
fn a_layout_with_another_observation_shape_is_refused() {
    wrong_ready(
        |l| {
            l.insert(keys::OBSERVATION.into(), (DType::F32, vec![3]));
            l.insert(keys::NEXT_OBSERVATION.into(), (DType::F32, vec![3]));
        },
        "node 2's observation is f32 [3], env Counting's is f32 [1]",
    );
}

#[test]
fn a_layout_with_another_action_dtype_is_refused() {
    wrong_ready(
        |l| {
            l.insert(keys::ACTION.into(), (DType::F64, vec![1]));
        },
        "node 2's action is f64 [1], env Counting's is f32 [1]",
    );
}

#[test]
fn a_layout_missing_an_entry_is_refused() {
    wrong_ready(
        |l| {
            l.remove(keys::STEP_COUNT);
        },
        "node 2's step_count is absent, env Counting's is i64 [1]",
    );
}

#[test]
fn a_layout_with_an_extra_entry_is_refused() {
    wrong_ready(
        |l| {
            l.insert("extra".into(), (DType::U8, vec![]));
        },
        "node 2's extra is u8 [], env Counting's is absent",
    );
}

// ---------------------------------------------------------------- wrong `batch`

#[test]
fn a_batch_whose_frame_count_wraps_is_refused() {
    // 2 × (2^63 + 500) wraps to 1000 in a usize: the frames asked.
    wrong_batch(|_, _| TensorDict::new(&[ENVS, (1usize << 63) + 500]), "overflows");
}

#[test]
fn a_batch_of_zero_steps_is_refused() {
    wrong_batch(
        |_, _| zeros(&[ENVS, 0], &counting()),
        "asked for 1000 frames over 2 envs, got batch shape [2, 0]",
    );
}

#[test]
fn a_batch_of_the_right_count_over_the_wrong_envs_is_refused() {
    wrong_batch(
        |_, c| zeros(&[1, c.frames], &counting()),
        "asked for 1000 frames over 2 envs, got batch shape [1, 1000]",
    );
}

#[test]
fn a_huge_batch_of_empty_tensors_is_refused() {
    // Zero-width entries: 2^61 steps hold no byte, and ndarray accepts the shape.
    wrong_batch(
        |_, _| {
            let steps = 1usize << 61;
            let mut d = TensorDict::new(&[ENVS, steps]);
            d.set(keys::TRAJ_IDS, Tensor::zeros(DType::I64, &[ENVS, steps, 0]))
                .expect("set");
            d
        },
        "got batch shape [2, 2305843009213693952]",
    );
}

#[test]
fn a_batch_without_its_entries_is_refused() {
    wrong_batch(
        |_, c| TensorDict::new(&[ENVS, c.frames / ENVS]),
        "no tensor under key `action`",
    );
}

#[test]
fn a_correct_batch_of_another_dtype_is_refused() {
    wrong_batch(
        |w, c| {
            let mut d = real_batch(w, c);
            let bs = d.batch_size().to_vec();
            d.remove(keys::STEP_COUNT);
            d.set(keys::STEP_COUNT, Tensor::zeros(DType::F32, &[bs[0], bs[1], 1]))
                .expect("set");
            d
        },
        "`step_count` must be i64, got f32",
    );
}
