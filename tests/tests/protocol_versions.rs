//! A node per protocol version the trainer admits (3, 4, 5, 6), each written from its
//! own text (PROTOCOL.md, Changelog) on a raw loopback socket: version 3 sends no
//! `specs` in `ready` and no recorded keys, version 4 sends `specs` and no recorded keys,
//! version 5 both, version 6 also runs a recurrent policy (its `is_init` and state keys). A run whose nodes need nothing newer admits all three and collects
//! their exact frames; a run that needs what an older version lacks (a policy that
//! records log-probabilities: 5; an env only the nodes know: 4) refuses that version
//! at `hello`, before the challenge, with a `reject` naming the versions, and is served
//! by the newer ones. A prefetching run (version 11) sends a node its next `continue`
//! while it collects one: version 10 is refused, and a version-11 node that holds its
//! first `continue` until the second came is served exactly. A run whose episodes end
//! once any agent is done (`done_on_any`, version 12) refuses version 11 and tells a
//! version-12 node so in `welcome.spec.env`.

use std::net::{Shutdown, SocketAddr, TcpStream};
use std::thread::{self, JoinHandle};
use std::time::Duration;

use rollout::env::{Counting, CountingConfig};
use rollout::message::{Batch, FromNode, ToNode};
use rollout::rollout::{keys, Rollout};
use rollout::wire::{self, Auth, NodeFrame, TrainerFrame, Welcome};
use rollout::{Env, ExplorationType, PolicyConfig, Registry, TensorDict};
use rollout_actors::{CollectorBuilder, DistributedCollector, Launcher};
use rollout_tests::{built_on_a_thread, connect, hello, recv, send, unique_name};

const TOKEN: &[u8] = b"protocol-versions-token-0123456789";
const DEADLINE: Duration = Duration::from_secs(60);
/// Envs of every node.
const ENVS: usize = 2;
/// Frames each node collects per batch (a sync round's share).
const SHARE: usize = 20;
/// Sync rounds in every run.
const ROUNDS: usize = 3;
/// The env of the runs where the trainer cannot build it (its nodes can).
const CUSTOM: &str = "Custom-v0";

/// A sync trainer of `nodes` external nodes of `env` acting with `policy`
/// (deterministic, recording what it records), built on a thread (build waits for the
/// joins), and the address it listens on.
fn trainer(nodes: usize, env: &str, policy: PolicyConfig) -> (JoinHandle<DistributedCollector>, SocketAddr) {
    trainer_recording(nodes, env, policy, true)
}

/// [`trainer`], recording or not.
fn trainer_recording(
    nodes: usize,
    env: &str,
    policy: PolicyConfig,
    record: bool,
) -> (JoinHandle<DistributedCollector>, SocketAddr) {
    built_on_a_thread(run_of(nodes, env, policy).record(record).sync(true))
}

/// The runs' builder: `nodes` external nodes of `env` acting with `policy`
/// (deterministic), `ROUNDS` batches of `SHARE` frames a node.
fn run_of(nodes: usize, env: &str, policy: PolicyConfig) -> CollectorBuilder {
    DistributedCollector::builder()
        .env(env)
        .policy(policy)
        .exploration_type(ExplorationType::Deterministic)
        .nodes(nodes)
        .envs_per_node(ENVS)
        .frames_per_batch(SHARE * nodes)
        .total_frames((SHARE * nodes * ROUNDS) as i64)
        .seed(5)
        .launcher(Launcher::External)
        .token(TOKEN)
        .heartbeat(Duration::from_millis(200), Duration::from_secs(10))
        .join_timeout(DEADLINE)
        .batch_timeout(DEADLINE)
}

/// The nodes' registry: the built-ins, and [`CUSTOM`] as a Counting env.
fn node_registry() -> Registry {
    let mut r = Registry::with_builtins();
    r.register(CUSTOM, |_c| {
        Ok(Box::new(Counting::new(CountingConfig::default())?) as Box<dyn Env>)
    });
    r
}

/// How a login by a node of some version ended.
enum Login {
    /// Admitted: the stream and its `welcome`.
    Welcome(TcpStream, Box<Welcome>),
    /// Refused with this reason, before any `challenge`, and the connection closed.
    RejectedAtHello(String),
}

/// Logs in as `name` speaking protocol `version`, asking for slot `index`.
fn login(addr: SocketAddr, version: u32, name: &str, index: usize) -> Login {
    let mut s = connect(addr, DEADLINE);
    hello(&mut s, version, name, Some(index));
    match recv(&mut s) {
        Some(TrainerFrame::Challenge { nonce }) => {
            let proof = wire::auth_proof(TOKEN, &nonce, name);
            send(&mut s, &NodeFrame::Auth(Auth { proof }));
            match recv(&mut s) {
                Some(TrainerFrame::Welcome(w)) => Login::Welcome(s, w),
                other => panic!("version {version} passed hello and was then refused: {other:?}"),
            }
        }
        Some(TrainerFrame::Reject { reason }) => {
            assert!(recv(&mut s).is_none(), "the trainer closes after the reject");
            Login::RejectedAtHello(reason)
        }
        other => panic!("expected a challenge or a reject to hello, got {other:?}"),
    }
}

/// The reject a node of `version` gets at `hello`; panics if it is admitted.
fn rejected_at_hello(addr: SocketAddr, version: u32, index: usize) -> String {
    match login(addr, version, &unique_name(&format!("v{version}")), index) {
        Login::RejectedAtHello(reason) => reason,
        Login::Welcome(..) => panic!("a version-{version} node was admitted"),
    }
}

/// A node of protocol `version` written from that version's text: what it sends.
struct TextNode {
    version: u32,
    s: TcpStream,
    welcome: Welcome,
    workers: Vec<Rollout>,
    /// Holds its first `continue` unanswered until a second one came (version 11: a
    /// prefetching trainer sends it ahead), then answers both in order; a trainer that
    /// never sends one ahead leaves the run to fail at its deadline.
    awaits_ahead: bool,
}

impl TextNode {
    /// Joins slot `index` speaking `version` (panics if refused) and builds its envs.
    fn join(addr: SocketAddr, version: u32, index: usize) -> TextNode {
        let Login::Welcome(s, welcome) = login(addr, version, &unique_name(&format!("v{version}")), index) else {
            panic!("a version-{version} node was refused");
        };
        let workers = welcome.spec.build_workers(&node_registry()).expect("workers");
        TextNode {
            version,
            s,
            welcome: *welcome,
            workers,
            awaits_ahead: false,
        }
    }

    /// Its `ready`: the layout of its batches and, from version 4, the env's specs.
    /// Before version 5 neither names a recorded key.
    fn ready(&mut self) {
        let w = &self.workers[0];
        let layout = if self.version >= 5 {
            w.batch_layout()
        } else {
            w.env_specs().batch_layout()
        };
        let specs = (self.version >= 4).then(|| Box::new(w.env_specs()));
        let node = self.welcome.node_index;
        send(
            &mut self.s,
            &NodeFrame::Message(FromNode::Ready { node, layout, specs }),
        );
    }

    /// `frames` frames of its envs, as this version's batch holds them: before
    /// version 5, without the recorded keys.
    fn collect(&mut self, frames: usize) -> TensorDict {
        let per_worker = frames / self.workers.len();
        let shares: Vec<TensorDict> = self
            .workers
            .iter_mut()
            .map(|r| r.collect_frames(per_worker).expect("collect"))
            .collect();
        let mut data = TensorDict::cat(&shares).expect("cat");
        if self.version < 5 {
            for key in [keys::ACTION_LOG_PROB, keys::LOGITS, keys::LOC, keys::SCALE] {
                data.remove(key);
            }
        }
        data
    }

    /// Sends `ready`, then serves the trainer until `shutdown` (answered `down`) or
    /// the connection's end: the batches it sent, in order.
    fn serve(mut self) -> Vec<TensorDict> {
        self.ready();
        let node = self.welcome.node_index;
        let mut sent = Vec::new();
        let mut held: Option<rollout::message::Continue> = None;
        while let Some(frame) = recv(&mut self.s) {
            let reply = match frame {
                TrainerFrame::Message(ToNode::Continue(c)) if self.awaits_ahead => {
                    self.awaits_ahead = false;
                    held = Some(c);
                    continue;
                }
                TrainerFrame::Heartbeat => NodeFrame::Heartbeat,
                TrainerFrame::Message(ToNode::Seed(seed)) => NodeFrame::Message(FromNode::Seeded {
                    node,
                    next_seed: seed.seed.wrapping_add(ENVS as u64),
                }),
                TrainerFrame::Message(ToNode::UpdateWeights(u)) => NodeFrame::Message(FromNode::WeightsUpdated {
                    node,
                    version: u.weights.version,
                }),
                TrainerFrame::Message(ToNode::Continue(c)) => {
                    // Answered in order: the one held first.
                    if let Some(first) = held.take() {
                        let data = self.collect(first.frames);
                        sent.push(data.clone());
                        let b = FromNode::Batch(Batch {
                            node,
                            seq: first.seq,
                            weights_version: 0,
                            data,
                        });
                        send(&mut self.s, &NodeFrame::Message(b));
                    }
                    let data = self.collect(c.frames);
                    sent.push(data.clone());
                    NodeFrame::Message(FromNode::Batch(Batch {
                        node,
                        seq: c.seq,
                        weights_version: 0,
                        data,
                    }))
                }
                TrainerFrame::Message(ToNode::Shutdown) => {
                    send(&mut self.s, &NodeFrame::Message(FromNode::Down { node }));
                    // PROTOCOL.md §5: shut the write side, read until the trainer closes.
                    let _ = self.s.shutdown(Shutdown::Write);
                    while recv(&mut self.s).is_some() {}
                    break;
                }
                other => panic!("a version-{} node got {other:?}", self.version),
            };
            send(&mut self.s, &reply);
        }
        sent
    }

    /// [`Self::serve`] on a thread.
    fn serve_on_thread(self) -> JoinHandle<Vec<TensorDict>> {
        thread::spawn(move || self.serve())
    }
}

/// Runs `c` to its end: every round stacks one share of each node, in node order, so
/// round `r` must be exactly the `r`-th batch each node sent.
fn assert_exact(mut c: DistributedCollector, nodes: Vec<JoinHandle<Vec<TensorDict>>>) {
    let mut rounds = Vec::new();
    while let Some(b) = c.next_batch().expect("batch") {
        rounds.push(b.data);
    }
    c.shutdown().expect("shutdown");
    let sent: Vec<Vec<TensorDict>> = nodes.into_iter().map(|n| n.join().expect("node thread")).collect();
    assert_eq!(rounds.len(), ROUNDS, "the run ends exact");
    for (r, round) in rounds.iter().enumerate() {
        assert_eq!(round.numel(), SHARE * sent.len(), "round {r}'s frames");
        let shares: Vec<TensorDict> = sent.iter().map(|s| s[r].clone()).collect();
        let expected = TensorDict::stack(&shares).expect("stack");
        assert!(
            *round == expected,
            "round {r} is not the nodes' shares stacked in node order"
        );
    }
}

#[test]
fn a_run_whose_policy_records_nothing_is_served_by_every_admitted_version() {
    let (t, addr) = trainer(3, "Counting", PolicyConfig::Constant { value: 1.0 });
    // Node i speaks version 3 + i, each from its own text.
    let nodes: Vec<JoinHandle<Vec<TensorDict>>> = (0..3)
        .map(|i| TextNode::join(addr, 3 + i as u32, i).serve_on_thread())
        .collect();
    let c = t.join().expect("trainer thread");
    assert_exact(c, nodes);
}

#[test]
fn a_policy_that_records_refuses_versions_3_and_4_at_hello_and_version_5_serves_it() {
    let (t, addr) = trainer(1, "Counting", PolicyConfig::Mlp { hidden: vec![4] });
    for v in [3, 4] {
        let reason = rejected_at_hello(addr, v, 0);
        assert_eq!(
            reason,
            format!(
                "protocol version {v} cannot serve this run: its policy (mlp) records action_log_prob and its \
                 distribution's parameters in every batch (version 5); this run admits 5 to 13 (this trainer \
                 speaks 3 to 13, the older ones for runs that need less)"
            )
        );
    }
    // The slot they asked for is still free: a version-5 node takes it and collects.
    let node = TextNode::join(addr, 5, 0);
    assert!(
        node.workers[0].batch_layout().contains_key(keys::ACTION_LOG_PROB),
        "the run's batches carry the recorded keys"
    );
    let c = t.join().expect("trainer thread");
    assert_exact(c, vec![node.serve_on_thread()]);
}

#[test]
fn a_run_that_records_nothing_refuses_versions_5_to_8_at_hello_and_version_9_serves_it() {
    let (t, addr) = trainer_recording(1, "Counting", PolicyConfig::Mlp { hidden: vec![4] }, false);
    for v in [5, 8] {
        let reason = rejected_at_hello(addr, v, 0);
        assert_eq!(
            reason,
            format!(
                "protocol version {v} cannot serve this run: its policy (mlp) records nothing in this run (record \
                 off, as in a deterministic run): its batches leave out action_log_prob and the distribution's \
                 parameters (version 9); this run admits 9 to 13 (this trainer speaks 3 to 13, the older ones for runs \
                 that need less)"
            )
        );
    }
    let node = TextNode::join(addr, 9, 0);
    let layout = node.workers[0].batch_layout();
    for key in keys::RECORDED {
        assert!(!layout.contains_key(key), "the run's batches leave out {key}");
    }
    let c = t.join().expect("trainer thread");
    assert_exact(c, vec![node.serve_on_thread()]);
}

#[test]
fn an_env_only_the_nodes_know_refuses_version_3_at_hello_and_versions_4_and_5_serve_it() {
    let (t, addr) = trainer(2, CUSTOM, PolicyConfig::Constant { value: 1.0 });
    let reason = rejected_at_hello(addr, 3, 0);
    assert_eq!(
        reason,
        format!(
            "protocol version 3 cannot serve this run: its env {CUSTOM} is known only to its nodes, which report \
             its spaces in ready's specs (version 4); this run admits 4 to 13 (this trainer speaks 3 to 13, the \
             older ones for runs that need less)"
        )
    );
    let nodes = vec![
        TextNode::join(addr, 4, 0).serve_on_thread(),
        TextNode::join(addr, 5, 1).serve_on_thread(),
    ];
    let c = t.join().expect("trainer thread");
    assert_exact(c, nodes);
}

#[test]
fn a_recurrent_policy_refuses_versions_3_to_5_at_hello_and_version_6_serves_it() {
    let file = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/onnx/cartpole_lstm.onnx");
    let model = rollout::policy::OnnxModel::parse(std::fs::read(file).expect("model")).expect("parse");
    let state = model.declared_state().expect("its state");
    let policy = PolicyConfig::Onnx {
        model,
        head: rollout::policy::OnnxHead::Categorical,
        state,
        exploration: None,
    };
    let (t, addr) = trainer(1, "CartPole-v1", policy);
    for v in [3, 4, 5] {
        let reason = rejected_at_hello(addr, v, 0);
        assert_eq!(
            reason,
            format!(
                "protocol version {v} cannot serve this run: its policy is a recurrent onnx model, whose state the \
                 node keeps per env and records with is_init in every batch (version 6); this run admits 6 to 13 (this \
                 trainer speaks 3 to 13, the older ones for runs that need less)"
            )
        );
    }
    let node = TextNode::join(addr, 6, 0);
    let layout = node.workers[0].batch_layout();
    for key in [keys::IS_INIT, "recurrent_state_h", "next.recurrent_state_c"] {
        assert!(layout.contains_key(key), "the run's batches carry `{key}`");
    }
    let c = t.join().expect("trainer thread");
    assert_exact(c, vec![node.serve_on_thread()]);
}

#[test]
fn a_prefetching_run_refuses_version_10_at_hello_and_version_11_takes_its_continues_ahead() {
    let (t, addr) = built_on_a_thread(run_of(1, "Counting", PolicyConfig::Constant { value: 1.0 }).prefetch(1));
    let reason = rejected_at_hello(addr, 10, 0);
    assert_eq!(
        reason,
        "protocol version 10 cannot serve this run: it prefetches: a node is sent its next continue while it \
         collects one, and queues it (version 11); this run admits 11 to 13 (this trainer speaks 3 to 13, the older ones \
         for runs that need less)"
    );
    let mut node = TextNode::join(addr, 11, 0);
    node.awaits_ahead = true;
    let node = node.serve_on_thread();
    let mut c = t.join().expect("trainer thread");
    let mut got = Vec::new();
    while let Some(b) = c.next_batch().expect("batch") {
        got.push(b.data);
    }
    c.shutdown().expect("shutdown");
    let sent = node.join().expect("node thread");
    assert_eq!(got.len(), ROUNDS, "total_frames exact");
    assert!(
        got.iter().zip(&sent).all(|(g, s)| g == s),
        "the batches in the order the node answered its continues"
    );
}

#[test]
fn a_run_ending_episodes_at_any_agent_refuses_version_11_and_tells_version_12_in_its_welcome() {
    let (t, addr) = trainer(1, "Counting", PolicyConfig::Constant { value: 1.0 });
    // The same run without the rule admits 11 (and so asks nothing of the welcome).
    let node = TextNode::join(addr, 11, 0);
    assert!(!node.welcome.spec.env.done_on_any);
    assert_exact(t.join().expect("trainer thread"), vec![node.serve_on_thread()]);

    let run = run_of(1, "Counting", PolicyConfig::Constant { value: 1.0 })
        .sync(true)
        .done_on_any(true);
    let (t, addr) = built_on_a_thread(run);
    let reason = rejected_at_hello(addr, 11, 0);
    assert_eq!(
        reason,
        "protocol version 11 cannot serve this run: its env's episodes end once any agent is done (done_on_any), \
         where older nodes end them once every agent is (version 12); this run admits 12 to 13 (this trainer speaks 3 to \
         13, the older ones for runs that need less)"
    );
    let node = TextNode::join(addr, 12, 0);
    assert!(node.welcome.spec.env.done_on_any, "welcome.spec.env says so");
    assert_exact(t.join().expect("trainer thread"), vec![node.serve_on_thread()]);
}
