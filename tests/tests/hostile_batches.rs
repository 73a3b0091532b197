//! Hostile batches and layouts over real loopback sockets: a run of two legitimate
//! nodes and one scripted node (the wire encoder and the token on a raw `TcpStream`)
//! that announces a wrong `ready` or answers with a wrong `batch`. Each run must end
//! exact with every frame from the legitimate nodes and none from the hostile one,
//! whose connection is closed with the reason logged. Each runs over plain TCP, then
//! over TLS.

use std::io::Write;
use std::net::{SocketAddr, TcpStream};
use std::sync::Arc;
use std::thread::{self, JoinHandle};
use std::time::Duration;

use rollout::message::{Batch, Continue, FromNode, ToNode};
use rollout::rollout::{keys, BatchLayout};
use rollout::wire::{self, Auth, Hello, NodeFrame, TrainerFrame, Welcome, PROTOCOL_VERSION};
use rollout::{DType, Registry, Tensor, TensorDict};
use rollout_actors::remote::NodeTls;
use rollout_actors::DistributedCollector;
use rollout_tests::{
    built_on_a_thread, connect, external_counting_builder, good_node_over, real_data, recv, send, test_certs,
    unique_name, OwnLog, TestCerts, TlsFront,
};

const TOKEN: &[u8] = b"hostile-batches-token-0123456789";
const DEADLINE: Duration = Duration::from_secs(30);
/// Frames per batch, over [`ENVS`] envs per node: the issue's `--envs-per-node 2` run.
const FPB: usize = 1000;
const ENVS: usize = 2;
const TOTAL: usize = 4000;
/// The hostile node's index; the legitimate ones are 0 and 1.
const HOSTILE: usize = 2;

/// An async trainer expecting three external nodes of [`ENVS`] Counting envs each,
/// built on a thread (build waits for the joins).
fn trainer(certs: Option<&TestCerts>) -> (JoinHandle<DistributedCollector>, SocketAddr) {
    let b = external_counting_builder(TOKEN, 3, ENVS)
        .frames_per_batch(FPB)
        .total_frames(TOTAL as i64)
        .sync(false);
    built_on_a_thread(match certs {
        Some(c) => b.tls_cert(&c.trainer_cert).tls_key(&c.trainer_key),
        None => b,
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
        let mut s = connect(addr, DEADLINE);
        send(
            &mut s,
            &NodeFrame::Hello(Hello {
                protocol_version: PROTOCOL_VERSION,
                node_name: name.into(),
                node_index: Some(HOSTILE),
            }),
        );
        let Some(TrainerFrame::Challenge { nonce }) = recv(&mut s) else {
            panic!("expected a challenge");
        };
        let proof = wire::auth_proof(TOKEN, &nonce, name);
        send(&mut s, &NodeFrame::Auth(Auth { proof }));
        let Some(TrainerFrame::Welcome(welcome)) = recv(&mut s) else {
            panic!("the scripted node was not admitted");
        };
        Scripted { s, welcome: *welcome }
    }

    fn ready(&mut self, layout: BatchLayout) {
        let node = self.welcome.node_index;
        send(
            &mut self.s,
            &NodeFrame::Message(FromNode::Ready {
                node,
                layout,
                specs: None,
            }),
        );
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
///
/// Over plain TCP, then over TLS (issue 41): the legitimate nodes join over TLS, the
/// hostile node's frames reach the trainer through a `TlsFront`, inside TLS.
fn hostile_run(
    layout: BatchLayout,
    answer: impl Fn(&Welcome, Continue) -> TensorDict + Send + Sync + 'static,
    reason: &str,
) {
    let answer = Arc::new(answer);
    for certs in [None, Some(test_certs())] {
        let answer = Arc::clone(&answer);
        hostile_run_over(layout.clone(), move |w, c| answer(w, c), reason, certs.as_ref());
    }
}

/// [`hostile_run`] over TLS with `certs`, or plain TCP.
fn hostile_run_over(
    layout: BatchLayout,
    answer: impl Fn(&Welcome, Continue) -> TensorDict + Send + 'static,
    reason: &str,
    certs: Option<&TestCerts>,
) {
    let (t, addr) = trainer(certs);
    let name = unique_name("hostile");
    let log = OwnLog::node(&name);
    let hostile_addr = certs.map_or(addr, |c| TlsFront::start(addr, &c.ca).addr());
    let mut h = Scripted::join(hostile_addr, &name);
    h.ready(layout);
    let hostile = thread::spawn(move || h.serve(&answer));
    let tls = certs.map(|c| NodeTls {
        ca: c.ca.clone(),
        ..NodeTls::default()
    });
    let good = [
        good_node_over(addr, TOKEN, Some(0), unique_name("good"), tls.clone()),
        good_node_over(addr, TOKEN, Some(1), unique_name("good"), tls),
    ];
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
    log.assert_logged("closing connection to node");
    log.assert_logged(reason);
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
fn wrong_batch(answer: impl Fn(&Welcome, Continue) -> TensorDict + Send + Sync + 'static, reason: &str) {
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
            let mut d = real_data(w, c);
            let bs = d.batch_size().to_vec();
            d.remove(keys::STEP_COUNT);
            d.set(keys::STEP_COUNT, Tensor::zeros(DType::F32, &[bs[0], bs[1], 1]))
                .expect("set");
            d
        },
        "`step_count` must be i64, got f32",
    );
}

// ---------------------------------------------------------------- property: any batch, any layout

mod property {
    use proptest::prelude::*;
    use rollout::machine::trainer::LayoutSource;
    use rollout::machine::{Output, TrainerConfig, TrainerError, TrainerMachine};
    use rollout::message::{Batch, FromNode};
    use rollout::rollout::{batch_layout, BatchLayout};
    use rollout::shares::Shares;
    use rollout::wire::{self, NodeFrame};
    use rollout::{DType, Spec, Tensor, TensorDict};

    /// A size from outside: small, zero, or near the end of `usize` (the ones that wrap).
    fn dim() -> impl Strategy<Value = usize> {
        prop_oneof![
            6 => 0usize..6,
            1 => Just(1usize << 61),
            1 => Just(1usize << 62),
            1 => Just((1usize << 63) + 500),
            1 => Just(usize::MAX),
            1 => (0usize..8).prop_map(|d| (1usize << 63).wrapping_add(d)),
        ]
    }

    fn dtype() -> impl Strategy<Value = DType> {
        prop_oneof![
            Just(DType::F32),
            Just(DType::F64),
            Just(DType::I64),
            Just(DType::Bool),
            Just(DType::U8)
        ]
    }

    /// A feature shape: mostly small, sometimes with a zero (no element, any batch).
    fn feature() -> impl Strategy<Value = Vec<usize>> {
        prop::collection::vec(prop_oneof![4 => 0usize..4, 1 => dim()], 0..3)
    }

    /// What a hostile node does to a layout's entries.
    #[derive(Clone, Debug)]
    enum Change {
        Drop(usize),
        Retype(usize, DType),
        Reshape(usize, Vec<usize>),
        Add(String, DType, Vec<usize>),
    }

    fn change() -> impl Strategy<Value = Change> {
        let key = prop_oneof![
            Just("extra".to_string()),
            Just("next.extra".to_string()),
            Just("observation".to_string()),
            Just("collector.traj_ids".to_string()),
        ];
        prop_oneof![
            (0usize..16).prop_map(Change::Drop),
            (0usize..16, dtype()).prop_map(|(i, d)| Change::Retype(i, d)),
            (0usize..16, feature()).prop_map(|(i, f)| Change::Reshape(i, f)),
            (key, dtype(), feature()).prop_map(|(k, d, f)| Change::Add(k, d, f)),
        ]
    }

    fn apply(layout: &BatchLayout, changes: &[Change]) -> BatchLayout {
        let mut l = layout.clone();
        for c in changes {
            let nth = |l: &BatchLayout, i: usize| l.keys().nth(i % l.len().max(1)).cloned();
            match c {
                Change::Drop(i) => {
                    if let Some(k) = nth(&l, *i) {
                        l.remove(&k);
                    }
                }
                Change::Retype(i, d) => {
                    if let Some(k) = nth(&l, *i) {
                        l.entry(k).and_modify(|e| e.0 = *d);
                    }
                }
                Change::Reshape(i, f) => {
                    if let Some(k) = nth(&l, *i) {
                        l.entry(k).and_modify(|e| e.1 = f.clone());
                    }
                }
                Change::Add(k, d, f) => {
                    l.insert(k.clone(), (*d, f.clone()));
                }
            }
        }
        l
    }

    /// The run: one node of `envs` envs, batches of `envs × steps` frames, the env's
    /// observation `obs` wide and its action discrete or `act` wide; or, with `empty`,
    /// a trainer whose layout has no entry at all (a machine driven by hand can have
    /// one): then only the frame count stands between a hostile batch and the consumer.
    #[derive(Clone, Debug)]
    struct Run {
        envs: usize,
        steps: usize,
        obs: usize,
        act: Option<usize>,
        empty: bool,
    }

    fn run() -> impl Strategy<Value = Run> {
        (
            1usize..4,
            1usize..5,
            1usize..4,
            prop::option::of(1usize..3),
            prop::bool::weighted(0.2),
        )
            .prop_map(|(envs, steps, obs, act, empty)| Run {
                envs,
                steps,
                obs,
                act,
                empty,
            })
    }

    impl Run {
        fn layout(&self) -> BatchLayout {
            if self.empty {
                return BatchLayout::new();
            }
            let action = match self.act {
                Some(a) => Spec::uniform_box(a, -1.0, 1.0),
                None => Spec::Discrete { n: 2 },
            };
            batch_layout(&Spec::uniform_box(self.obs, -1.0, 1.0), &action)
        }

        fn frames(&self) -> usize {
            self.envs * self.steps
        }

        /// An async machine whose node 0 is asked for a batch, its layout `source`.
        fn machine(&self, source: LayoutSource) -> TrainerMachine {
            let cfg =
                TrainerConfig::new(Shares::new(self.frames(), vec![self.envs], 1, false, None).expect("valid shares"));
            let mut m = TrainerMachine::new(cfg)
                .expect("valid config")
                .with_layout_sources(vec![source]);
            m.request(&mut Vec::new()).expect("request");
            m
        }
    }

    /// The batch of `batch_size` holding `layout`'s entries as zeros: those whose
    /// tensor cannot exist in memory (too many elements, or a shape ndarray refuses)
    /// are left out, which is a hostile batch of its own.
    fn batch(batch_size: &[usize], layout: &BatchLayout) -> TensorDict {
        let mut d = TensorDict::new(batch_size);
        for (k, (dtype, feature)) in layout {
            let shape: Vec<usize> = batch_size.iter().chain(feature).copied().collect();
            let nonzero = shape
                .iter()
                .filter(|&&x| x != 0)
                .try_fold(1usize, |a, &x| a.checked_mul(x));
            let elems = shape.iter().try_fold(1usize, |a, &x| a.checked_mul(x));
            let fits = nonzero.is_some_and(|n| n <= isize::MAX as usize) && elems.is_some_and(|e| e <= 4096);
            if fits {
                d.set(k, Tensor::zeros(*dtype, &shape))
                    .expect("shape starts with the batch");
            }
        }
        d
    }

    /// What the batch holds, as a layout: each entry's dtype and shape past the batch dims.
    fn layout_of(d: &TensorDict) -> BatchLayout {
        let nb = d.batch_size().len();
        d.iter()
            .map(|(k, t)| (k.to_string(), (t.dtype(), t.shape()[nb..].to_vec())))
            .collect()
    }

    /// Feeds `data` to `m` as node 0's answer to its `Continue`: `Ok(frames yielded)`
    /// or the refusal.
    fn feed(m: &mut TrainerMachine, data: TensorDict) -> Result<usize, TrainerError> {
        let mut out = Vec::new();
        let msg = FromNode::Batch(Batch {
            node: 0,
            seq: 0,
            weights_version: 0,
            data,
        });
        m.on_node(msg, &mut out)?;
        let yielded: Vec<usize> = out
            .iter()
            .filter_map(|o| match o {
                Output::Yield(c) => Some(c.data.numel()),
                _ => None,
            })
            .collect();
        assert_eq!(yielded.len(), 1, "an accepted batch is yielded to the waiting consumer");
        assert_eq!(m.frames_yielded() as usize, yielded[0]);
        Ok(yielded[0])
    }

    /// The same batch through the wire: encoded, decoded as the trainer decodes it.
    fn through_the_wire(data: &TensorDict) -> Option<TensorDict> {
        let frame = NodeFrame::Message(FromNode::Batch(Batch {
            node: 0,
            seq: 0,
            weights_version: 0,
            data: data.clone(),
        }));
        let bytes = wire::encode(&frame, usize::MAX).ok()?;
        match wire::decode::<NodeFrame>(&bytes[wire::PREFIX_LEN..]) {
            Ok(NodeFrame::Message(FromNode::Batch(b))) => Some(b.data),
            Ok(other) => panic!("a batch decoded as {}", other.name()),
            Err(_) => None,
        }
    }

    fn batch_size(r: &Run) -> impl Strategy<Value = Vec<usize>> {
        let exact = Just(vec![r.envs, r.steps]);
        // The frames asked once the product wraps: envs × (steps + 2^63) for even envs.
        let wrapping = Just(vec![r.envs, r.steps.wrapping_add(1 << 63)]);
        let swapped = Just(vec![r.steps, r.envs]);
        prop_oneof![
            3 => exact,
            1 => wrapping,
            1 => swapped,
            2 => prop::collection::vec(dim(), 0..4),
        ]
    }

    fn case() -> impl Strategy<Value = (Run, Vec<usize>, Vec<Change>)> {
        run().prop_flat_map(|r| {
            let bs = batch_size(&r);
            let changes = prop_oneof![
                2 => Just(Vec::new()),
                3 => prop::collection::vec(change(), 1..4),
            ];
            (Just(r), bs, changes)
        })
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

        /// A batch of any shape and entries is accepted exactly when its batch shape is
        /// `[envs, frames / envs]` and its entries are the trainer's layout, and then
        /// counts exactly the frames asked; otherwise it is refused, never a panic.
        /// In memory and through the wire's decode alike.
        #[test]
        fn a_batch_is_accepted_exactly_when_it_matches_the_trainers_layout_and_count(
            (r, bs, changes) in case()
        ) {
            let layout = r.layout();
            let data = batch(&bs, &apply(&layout, &changes));
            let matches = bs == [r.envs, r.steps] && layout_of(&data) == layout;
            let known = || LayoutSource::Known { of: "env E".into(), layout: layout.clone() };
            let in_memory = feed(&mut r.machine(known()), data.clone());
            match &in_memory {
                Ok(frames) => prop_assert!(matches && *frames == r.frames(), "accepted {bs:?} as {frames} frames"),
                Err(e) => prop_assert!(!matches, "refused a matching batch: {e}"),
            }
            if let Some(decoded) = through_the_wire(&data) {
                let r2 = feed(&mut r.machine(known()), decoded);
                prop_assert_eq!(r2, in_memory);
            } else {
                prop_assert!(in_memory.is_err(), "the wire refused a batch the machine accepts");
            }
        }

        /// A `ready` of any layout: against the trainer's own layout it is accepted
        /// exactly when equal; with nothing known, when it is a rollout's layout. Either
        /// way a batch is then accepted exactly when it holds the layout in force, and
        /// after a refused `ready` no batch is.
        #[test]
        fn a_ready_is_held_to_the_trainers_layout_and_a_refused_one_takes_no_batch(
            (r, _bs, changes) in case(),
            known in any::<bool>(),
        ) {
            let layout = r.layout();
            let announced = apply(&layout, &changes);
            let source = if known {
                LayoutSource::Known { of: "env E".into(), layout: layout.clone() }
            } else {
                LayoutSource::Announced
            };
            let mut m = r.machine(source);
            let ready = m.on_node(FromNode::Ready { node: 0, layout: announced.clone(), specs: None }, &mut Vec::new());
            if known {
                prop_assert_eq!(ready.is_ok(), announced == layout, "{:?}", ready);
            } else if announced == layout && !r.empty {
                prop_assert!(ready.is_ok(), "a rollout's own layout refused: {ready:?}");
            }
            let data = batch(&[r.envs, r.steps], &announced);
            let holds_it = layout_of(&data) == announced;
            match feed(&mut m, data) {
                Ok(frames) => {
                    prop_assert!(ready.is_ok() && holds_it);
                    prop_assert_eq!(frames, r.frames());
                }
                Err(_) => prop_assert!(ready.is_err() || !holds_it),
            }
        }
    }
}
