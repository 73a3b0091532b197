//! Property-based fuzzing of the wire layer: random bytes and mutated valid frames go through
//! `FrameDecoder`, `decode::<NodeFrame>` / `decode::<TrainerFrame>` (plain, into pooled storage,
//! and by a `FrameReader` reading tensors aside) and the trainer's handshake.
//!
//! Nothing may panic, every failure must be an error value, and whatever does decode must be
//! consistent: a batch's TensorDict respects its batch shape, every tensor holds as many elements
//! as its shape says, and re-encoding a decoded frame is stable. The handshake never admits a
//! node whose proof was not made with the token for the name it said hello with.

use std::collections::BTreeMap;
use std::sync::Arc;

use ndarray::{ArrayD, IxDyn};
use proptest::prelude::*;
use rollout::checkpoint::NodeState;
use rollout::connection::{HandshakeStep, TrainerHandshake};
use rollout::frame_decode::{decode_pooled, Frame};
use rollout::frame_reader::FrameReader;
use rollout::message::{Batch, Continue, FromNode, Seed, ToNode, UpdateWeights};
use rollout::node_spec::NodeSpec;
use rollout::pool::TensorPool;
use rollout::wire::{
    auth_proof, body_len, decode, decode_login, encode, verify_proof, Auth, BatchFrame, Ends, FrameDecoder, Hello,
    LoginFrame, NodeFrame, TrainerFrame, Welcome, WireError, LOGIN_MAX_FRAME, NONCE_LEN, PREFIX_LEN, PROTOCOL_VERSION,
};
use rollout::{EnvSpec, PolicyConfig, Registry, Tensor, TensorDict, Weights};
use rollout_actors::testkit::NodeHarness;

/// Small enough that random prefixes often fit, large enough for every sample frame.
const MAX: usize = 4096;
const TOKEN: &[u8] = b"fuzz-token";
const CASES: u32 = 4000;

fn nonce() -> Vec<u8> {
    (100..100 + NONCE_LEN as u8).collect()
}

fn f32s(shape: &[usize]) -> Tensor {
    let n: usize = shape.iter().product();
    Tensor::F32(ArrayD::from_shape_vec(IxDyn(shape), (0..n).map(|i| i as f32 - 1.5).collect()).unwrap())
}

fn batch() -> Batch {
    let data = TensorDict::from_entries(
        &[2, 3],
        [
            ("observation".to_string(), f32s(&[2, 3, 2])),
            (
                "action".to_string(),
                Tensor::I64(ArrayD::from_shape_vec(IxDyn(&[2, 3]), vec![0, 1, 2, 3, 4, 5]).unwrap()),
            ),
            (
                "next.done".to_string(),
                Tensor::Bool(
                    ArrayD::from_shape_vec(IxDyn(&[2, 3, 1]), vec![true, false, true, false, false, true]).unwrap(),
                ),
            ),
            (
                "pixels".to_string(),
                Tensor::U8(ArrayD::from_shape_vec(IxDyn(&[2, 3, 1]), vec![9; 6]).unwrap()),
            ),
        ],
    )
    .unwrap();
    Batch {
        node: 0,
        seq: 5,
        weights_version: 2,
        data,
    }
}

/// [`batch`] with `next.observation`, which a version-9 node sends once: as the
/// observation one step later, but for the rows in `ends` (here env 0's first frame
/// and each env's last).
fn compact_batch() -> Batch {
    let mut b = batch();
    let obs = b.data.get("observation").unwrap().as_f32().unwrap().clone();
    let mut next = obs.clone();
    for lane in 0..2 {
        for step in 0..2 {
            let after = obs.slice(ndarray::s![lane, step + 1, ..]).to_owned();
            next.slice_mut(ndarray::s![lane, step, ..]).assign(&after);
        }
    }
    next[[0, 0, 1]] = 7.0;
    b.data.set("next.observation", Tensor::F32(next)).unwrap();
    b
}

/// [`compact_batch`] as a version-9 node sends it.
fn compact_frame() -> Vec<u8> {
    let b = compact_batch();
    let frame = BatchFrame {
        batch: &b,
        ends: Ends::saving(&b.data, 0),
    };
    assert_eq!(frame.ends.as_ref().map(|e| e.rows.clone()), Some(vec![0, 2, 5]));
    encode(&frame, MAX).unwrap()
}

fn weights() -> Weights {
    let mut tensors = BTreeMap::new();
    tensors.insert("weight".to_string(), f32s(&[2, 2]));
    tensors.insert(
        "bias".to_string(),
        Tensor::F64(ArrayD::from_shape_vec(IxDyn(&[2]), vec![0.5, -0.5]).unwrap()),
    );
    Weights { version: 2, tensors }
}

/// The node a decoded `restore` is applied to: one CartPole env, sampling linear policy.
fn restore_spec() -> NodeSpec {
    NodeSpec::new("CartPole-v1", PolicyConfig::Linear, 1).with_env_share(4)
}

/// A real state of that node, after two batches.
fn node_state() -> Box<NodeState> {
    let mut h = NodeHarness::new(&restore_spec(), &Registry::with_builtins()).unwrap();
    h.send(ToNode::Continue(Continue { seq: 0, frames: 4 }));
    h.send(ToNode::Continue(Continue { seq: 1, frames: 4 }));
    match h.send(ToNode::Snapshot { id: 1 }).pop() {
        Some(FromNode::Snapshot { state, .. }) => state,
        other => panic!("no snapshot: {other:?}"),
    }
}

/// Applies a decoded state to a fresh node: refused or restored, never a panic, and a
/// restored node still collects (or fails as a node, with a reason).
fn check_restore(state: &NodeState) {
    let Ok(mut h) = NodeHarness::new(&restore_spec(), &Registry::with_builtins()) else {
        return;
    };
    match h.send(ToNode::Restore(Box::new(state.clone()))).as_slice() {
        [FromNode::Restored { node: 0 }] => {
            let after = h.send(ToNode::Continue(Continue { seq: 0, frames: 4 }));
            assert!(
                matches!(after.as_slice(), [FromNode::Batch(_)] | [FromNode::Failed { .. }]),
                "{after:?}"
            );
        }
        [FromNode::CheckpointFailed { .. }] => {}
        other => panic!("a restore is answered once: {other:?}"),
    }
}

fn node_samples() -> Vec<NodeFrame> {
    vec![
        NodeFrame::Hello(Hello {
            protocol_version: PROTOCOL_VERSION,
            node_name: "node-0".into(),
            node_index: Some(0),
        }),
        NodeFrame::Auth(Auth {
            proof: auth_proof(TOKEN, &nonce(), "node-0"),
        }),
        NodeFrame::Heartbeat,
        NodeFrame::Message(FromNode::Batch(batch())),
        NodeFrame::Message(FromNode::WeightsUpdated { node: 0, version: 2 }),
        NodeFrame::Message(FromNode::Seeded { node: 0, next_seed: 8 }),
        NodeFrame::Message(FromNode::Down { node: 0 }),
        NodeFrame::Message(FromNode::Failed {
            node: 0,
            reason: "boom".into(),
        }),
        NodeFrame::Message(FromNode::Snapshot {
            node: 0,
            id: 1,
            state: node_state(),
        }),
    ]
}

fn trainer_samples() -> Vec<TrainerFrame> {
    vec![
        TrainerFrame::Challenge { nonce: nonce() },
        TrainerFrame::Welcome(Box::new(Welcome {
            node_index: 0,
            spec: NodeSpec::new(
                EnvSpec::new("Counting").with_config(serde_json::json!({"max_steps": 5})),
                PolicyConfig::Mlp { hidden: vec![4] },
                2,
            ),
            weights: Some(weights()),
            heartbeat_ms: 100,
            heartbeat_timeout_ms: 1000,
            max_frame: MAX as u64,
        })),
        TrainerFrame::Reject { reason: "no".into() },
        TrainerFrame::Heartbeat,
        TrainerFrame::Message(ToNode::Continue(Continue { seq: 5, frames: 6 })),
        TrainerFrame::Message(ToNode::UpdateWeights(UpdateWeights {
            weights: Arc::new(weights()),
        })),
        TrainerFrame::Message(ToNode::Seed(Seed { seed: 1 })),
        TrainerFrame::Message(ToNode::Shutdown),
        TrainerFrame::Message(ToNode::Restore(node_state())),
    ]
}

/// Every sample frame of both directions, encoded (prefix + body).
fn samples() -> Vec<Vec<u8>> {
    let mut out: Vec<Vec<u8>> = node_samples().iter().map(|f| encode(f, MAX).unwrap()).collect();
    out.extend(trainer_samples().iter().map(|f| encode(f, MAX).unwrap()));
    out.push(compact_frame());
    out
}

/// Checks a tensor's own invariant: as many elements as its shape says.
fn check_tensor(t: &Tensor) {
    assert_eq!(t.len(), t.shape().iter().product::<usize>());
    assert_eq!(t.to_le_bytes().len(), t.len() * t.dtype().size());
}

/// A pool holding storage of every tensor of the sample batch and weights, so that
/// mutated frames decode partly into it.
fn sample_pool() -> TensorPool {
    let mut pool = TensorPool::new(usize::MAX);
    pool.put_dict(batch().data);
    pool.put_weights(weights());
    pool
}

/// What a `FrameReader` makes of `body` (framed), fed in pieces of at most `chunk`
/// bytes, reading every tensor blob it may straight into storage of its own.
fn read_with_reader<T: Frame>(body: &[u8], chunk: usize) -> Result<T, WireError> {
    let mut frame = (body.len() as u32).to_be_bytes().to_vec();
    frame.extend_from_slice(body);
    let mut r = FrameReader::new(usize::MAX).with_min_blob(1);
    let mut pool = sample_pool();
    let mut pos = 0;
    while pos < frame.len() {
        let buf = r.buf();
        assert!(!buf.is_empty());
        let n = buf.len().min(chunk).min(frame.len() - pos);
        buf[..n].copy_from_slice(&frame[pos..pos + n]);
        pos += n;
        if r.filled(n, &mut pool)? {
            assert_eq!(pos, frame.len(), "the frame ends where its prefix says");
            return r.decode(&mut pool);
        }
    }
    panic!("the whole frame was read but not completed");
}

/// A decode into pooled storage, and one by a `FrameReader` reading tensors aside
/// (what every connection does), agree with the plain one on any input: the same
/// frame, or an error every way.
fn check_pooled<T: Frame + serde::Serialize + std::fmt::Debug>(body: &[u8]) {
    // Compared by their encodings: bit for bit, and a NaN (which a mutated float
    // may well be) equals itself.
    let same = |a: &T, b: &T| encode(a, usize::MAX).ok() == encode(b, usize::MAX).ok();
    let mut pool = sample_pool();
    let plain = decode::<T>(body);
    match (&plain, decode_pooled::<T>(body, &mut pool)) {
        (Ok(a), Ok(b)) => assert!(same(a, &b), "pooled decode differs: {a:?} vs {b:?}"),
        (Err(_), Err(_)) => {}
        (a, b) => panic!("plain {a:?} but pooled {b:?}"),
    }
    for chunk in [1, 5, usize::MAX] {
        match (&plain, read_with_reader::<T>(body, chunk)) {
            (Ok(a), Ok(b)) => assert!(
                same(a, &b),
                "the frame reader's decode (pieces of {chunk}) differs: {a:?} vs {b:?}"
            ),
            (Err(_), Err(_)) => {}
            (a, b) => panic!("plain {a:?} but the frame reader's (pieces of {chunk}) {b:?}"),
        }
    }
}

/// Decodes a body both ways; checks whatever decodes.
fn check_body(body: &[u8]) {
    check_pooled::<NodeFrame>(body);
    check_pooled::<TrainerFrame>(body);
    match decode::<NodeFrame>(body) {
        Ok(f) => {
            if let NodeFrame::Message(FromNode::Batch(b)) = &f {
                b.data.validate().expect("a decoded batch respects its batch shape");
                b.data.iter().for_each(|(_, t)| check_tensor(t));
            }
            let again = encode(&f, usize::MAX).expect("a decoded frame encodes");
            let f2: NodeFrame = decode(&again[PREFIX_LEN..]).expect("a re-encoded frame decodes");
            assert_eq!(encode(&f2, usize::MAX).unwrap(), again, "re-encoding is stable");
        }
        Err(e) => assert!(matches!(e, WireError::Decode(_) | WireError::Empty), "{e:?}"),
    }
    match decode::<TrainerFrame>(body) {
        Ok(f) => {
            let w = match &f {
                TrainerFrame::Welcome(w) => w.weights.as_ref(),
                TrainerFrame::Message(ToNode::UpdateWeights(u)) => Some(&*u.weights),
                TrainerFrame::Message(ToNode::Restore(st)) => {
                    check_restore(st);
                    st.weights.as_deref()
                }
                _ => None,
            };
            w.iter().flat_map(|w| w.tensors.values()).for_each(check_tensor);
            let again = encode(&f, usize::MAX).expect("a decoded frame encodes");
            let f2: TrainerFrame = decode(&again[PREFIX_LEN..]).expect("a re-encoded frame decodes");
            assert_eq!(encode(&f2, usize::MAX).unwrap(), again, "re-encoding is stable");
        }
        Err(e) => assert!(matches!(e, WireError::Decode(_) | WireError::Empty), "{e:?}"),
    }
}

/// Runs a stream through a decoder in `chunk`-sized pieces, checking every body and the
/// decoder's accounting; stops at the first framing error, as a connection would.
fn check_stream(bytes: &[u8], chunk: usize) -> Vec<Vec<u8>> {
    let mut d = FrameDecoder::new(MAX);
    let mut bodies = Vec::new();
    let mut consumed = 0;
    let mut pushed = 0;
    for c in bytes.chunks(chunk.max(1)) {
        d.push(c);
        pushed += c.len();
        loop {
            match d.next_frame() {
                Ok(Some(body)) => {
                    assert!(!body.is_empty() && body.len() <= MAX);
                    consumed += PREFIX_LEN + body.len();
                    check_body(&body);
                    bodies.push(body);
                }
                Ok(None) => break,
                Err(WireError::TooLarge { len, max }) => {
                    assert!(len > max && max == MAX);
                    return bodies;
                }
                Err(WireError::Empty) => return bodies,
                Err(e) => panic!("framing can only fail on the prefix: {e:?}"),
            }
        }
        assert_eq!(consumed + d.buffered(), pushed);
    }
    bodies
}

/// Runs bodies through a fresh handshake; returns the outcome of each step.
/// The strict pre-login decoder on `body`: never panics, and what it accepts the
/// session's decoder reads the same (it is only stricter, never different).
fn check_login(body: &[u8]) {
    match decode_login(body) {
        Ok(LoginFrame::Hello(Hello {
            protocol_version,
            node_name,
            node_index,
        })) => match decode::<NodeFrame>(body) {
            Ok(NodeFrame::Hello(Hello {
                protocol_version: v,
                node_name: n,
                node_index: i,
            })) => {
                assert_eq!((v, &n, i), (protocol_version, &node_name, node_index));
            }
            // A version past u32 is read as u32::MAX by the login decoder, refused by the other.
            other => assert!(
                protocol_version == u32::MAX,
                "login read a hello, the decoder {other:?}"
            ),
        },
        Ok(LoginFrame::Auth(Auth { proof })) => match decode::<NodeFrame>(body) {
            Ok(NodeFrame::Auth(Auth { proof: p })) => assert_eq!(p, proof),
            other => panic!("login read an auth, the decoder {other:?}"),
        },
        Ok(LoginFrame::Other(_)) | Err(_) => {}
    }
}

fn check_handshake(bodies: &[Vec<u8>]) {
    for b in bodies {
        check_login(b);
    }
    let mut hs = TrainerHandshake::new(TOKEN, nonce());
    let mut hello_name = None;
    for b in bodies {
        let step = hs.on_frame(b);
        match &step {
            HandshakeStep::Send(TrainerFrame::Challenge { nonce: n }) => {
                assert_eq!(n, &nonce());
                match decode::<NodeFrame>(b) {
                    Ok(NodeFrame::Hello(Hello { node_name, .. })) => hello_name = Some(node_name),
                    other => panic!("challenged after {other:?}"),
                }
            }
            HandshakeStep::Send(other) => panic!("the handshake only ever sends a challenge, got {other:?}"),
            HandshakeStep::Authenticated { node_name, .. } => {
                assert_eq!(
                    Some(node_name),
                    hello_name.as_ref(),
                    "admitted under the name of its hello"
                );
                match decode::<NodeFrame>(b) {
                    Ok(NodeFrame::Auth(Auth { proof })) => {
                        assert!(
                            verify_proof(TOKEN, &nonce(), node_name, &proof),
                            "admitted without a proof"
                        );
                    }
                    other => panic!("authenticated by {other:?}"),
                }
            }
            HandshakeStep::Reject(reason) => assert!(!reason.is_empty()),
        }
    }
}

#[derive(Clone, Debug)]
enum Mutation {
    /// Flip one bit anywhere (prefix included).
    BitFlip(usize, u8),
    /// Flip one bit of the body and keep the prefix right, so the body decoder sees it.
    BodyBitFlip(usize, u8),
    /// Overwrite one body byte, keeping the prefix right.
    BodyByte(usize, u8),
    /// Cut the frame short (the prefix still announces the full length).
    Truncate(usize),
    /// Cut the body short and fix the prefix.
    TruncateBody(usize),
    /// Insert bytes somewhere in the body and fix the prefix.
    Insert(usize, Vec<u8>),
    /// Replace the length prefix.
    Prefix(u32),
}

fn mutation() -> impl Strategy<Value = Mutation> {
    prop_oneof![
        (any::<usize>(), 0u8..8).prop_map(|(i, b)| Mutation::BitFlip(i, b)),
        (any::<usize>(), 0u8..8).prop_map(|(i, b)| Mutation::BodyBitFlip(i, b)),
        (any::<usize>(), any::<u8>()).prop_map(|(i, b)| Mutation::BodyByte(i, b)),
        any::<usize>().prop_map(Mutation::Truncate),
        any::<usize>().prop_map(Mutation::TruncateBody),
        (any::<usize>(), proptest::collection::vec(any::<u8>(), 1..8)).prop_map(|(i, v)| Mutation::Insert(i, v)),
        prop_oneof![
            Just(0u32),
            1u32..64,
            any::<u32>(),
            Just(MAX as u32),
            Just(MAX as u32 + 1)
        ]
        .prop_map(Mutation::Prefix),
    ]
}

fn fix_prefix(frame: &mut [u8]) {
    let len = (frame.len() - PREFIX_LEN) as u32;
    frame[..PREFIX_LEN].copy_from_slice(&len.to_be_bytes());
}

fn apply(frame: &mut Vec<u8>, m: &Mutation) {
    let body_len = frame.len() - PREFIX_LEN;
    match m {
        Mutation::BitFlip(i, b) => {
            let i = i % frame.len();
            frame[i] ^= 1 << b;
        }
        Mutation::BodyBitFlip(i, b) if body_len > 0 => frame[PREFIX_LEN + i % body_len] ^= 1 << b,
        Mutation::BodyByte(i, v) if body_len > 0 => frame[PREFIX_LEN + i % body_len] = *v,
        Mutation::Truncate(n) => frame.truncate(n % frame.len()),
        Mutation::TruncateBody(n) => {
            frame.truncate(PREFIX_LEN + n % (body_len + 1));
            fix_prefix(frame);
        }
        Mutation::Insert(i, v) => {
            let at = PREFIX_LEN + i % (body_len + 1);
            frame.splice(at..at, v.iter().copied());
            fix_prefix(frame);
        }
        Mutation::Prefix(p) => frame[..PREFIX_LEN].copy_from_slice(&p.to_be_bytes()),
        _ => {}
    }
}

/// A mutation of the MessagePack tree of a body (the frame is re-encoded around it), so that
/// decoding gets past the syntax to the meaning: shapes, lengths, batch sizes, missing fields.
#[derive(Clone, Debug)]
enum TreeMutation {
    /// The `n`-th integer becomes `v`.
    SetInt(usize, i64),
    /// The `n`-th integer becomes a huge unsigned one.
    SetBigUint(usize, u64),
    /// The `n`-th node becomes nil.
    Nil(usize),
    /// The `n`-th non-empty array or map loses element `i`.
    Remove(usize, usize),
    /// The `n`-th non-empty array or map gets a copy of element `i` appended (maps: a duplicate key).
    Duplicate(usize, usize),
    /// The `n`-th binary blob gets `len` bytes.
    ResizeBin(usize, usize),
}

fn tree_mutation() -> impl Strategy<Value = TreeMutation> {
    let small = prop_oneof![0i64..8, -2i64..0, any::<i64>()];
    prop_oneof![
        4 => (any::<usize>(), small).prop_map(|(n, v)| TreeMutation::SetInt(n, v)),
        1 => (any::<usize>(), prop_oneof![Just(u64::MAX), Just(1u64 << 62), Just(1u64 << 32)])
            .prop_map(|(n, v)| TreeMutation::SetBigUint(n, v)),
        1 => any::<usize>().prop_map(TreeMutation::Nil),
        2 => (any::<usize>(), any::<usize>()).prop_map(|(n, i)| TreeMutation::Remove(n, i)),
        1 => (any::<usize>(), any::<usize>()).prop_map(|(n, i)| TreeMutation::Duplicate(n, i)),
        1 => (any::<usize>(), 0usize..64).prop_map(|(n, l)| TreeMutation::ResizeBin(n, l)),
    ]
}

fn count(v: &rmpv::Value, pred: fn(&rmpv::Value) -> bool) -> usize {
    let here = usize::from(pred(v));
    here + match v {
        rmpv::Value::Array(a) => a.iter().map(|x| count(x, pred)).sum(),
        rmpv::Value::Map(m) => m.iter().map(|(k, x)| count(k, pred) + count(x, pred)).sum(),
        _ => 0,
    }
}

/// The `k`-th node (preorder) satisfying `pred`.
fn nth_mut<'a>(v: &'a mut rmpv::Value, pred: fn(&rmpv::Value) -> bool, k: &mut usize) -> Option<&'a mut rmpv::Value> {
    if pred(v) {
        if *k == 0 {
            return Some(v);
        }
        *k -= 1;
    }
    match v {
        rmpv::Value::Array(a) => a.iter_mut().find_map(|x| nth_mut(x, pred, k)),
        rmpv::Value::Map(m) => m
            .iter_mut()
            .find_map(|(key, x)| nth_mut(key, pred, k).or_else(|| nth_mut(x, pred, k))),
        _ => None,
    }
}

fn container(v: &rmpv::Value) -> bool {
    match v {
        rmpv::Value::Array(a) => !a.is_empty(),
        rmpv::Value::Map(m) => !m.is_empty(),
        _ => false,
    }
}

/// Applies a tree mutation to a frame (prefix + body); false when it did not apply.
fn apply_tree(frame: &mut Vec<u8>, m: &TreeMutation) -> bool {
    let Ok(mut root) = rmpv::decode::read_value(&mut &frame[PREFIX_LEN..]) else {
        return false;
    };
    let target =
        |root: &mut rmpv::Value, pred: fn(&rmpv::Value) -> bool, n: usize, f: &mut dyn FnMut(&mut rmpv::Value)| {
            let c = count(root, pred);
            if c == 0 {
                return false;
            }
            match nth_mut(root, pred, &mut (n % c)) {
                Some(node) => {
                    f(node);
                    true
                }
                None => false,
            }
        };
    let applied = match m {
        TreeMutation::SetInt(n, v) => target(&mut root, rmpv::Value::is_number, *n, &mut |x| {
            *x = rmpv::Value::from(*v)
        }),
        TreeMutation::SetBigUint(n, v) => target(&mut root, rmpv::Value::is_number, *n, &mut |x| {
            *x = rmpv::Value::from(*v)
        }),
        TreeMutation::Nil(n) => target(&mut root, |_| true, *n, &mut |x| *x = rmpv::Value::Nil),
        TreeMutation::Remove(n, i) => target(&mut root, container, *n, &mut |x| match x {
            rmpv::Value::Array(a) => {
                a.remove(i % a.len());
            }
            rmpv::Value::Map(m) => {
                m.remove(i % m.len());
            }
            _ => {}
        }),
        TreeMutation::Duplicate(n, i) => target(&mut root, container, *n, &mut |x| match x {
            rmpv::Value::Array(a) => a.push(a[i % a.len()].clone()),
            rmpv::Value::Map(m) => m.push(m[i % m.len()].clone()),
            _ => {}
        }),
        TreeMutation::ResizeBin(n, len) => target(&mut root, rmpv::Value::is_bin, *n, &mut |x| {
            if let rmpv::Value::Binary(b) = x {
                b.resize(*len, 1);
            }
        }),
    };
    let mut body = Vec::new();
    rmpv::encode::write_value(&mut body, &root).expect("encode to a vector");
    frame.truncate(PREFIX_LEN);
    frame.extend_from_slice(&body);
    fix_prefix(frame);
    applied
}

proptest! {
    #![proptest_config(ProptestConfig { cases: CASES, ..ProptestConfig::default() })]

    /// Tree-level mutations of every sample frame: the body stays valid MessagePack, so the
    /// decoder's checks of meaning (shapes, blob lengths, batch shapes, fields) are what is tested.
    #[test]
    fn tree_mutated_frames_decode_consistently(
        which in any::<prop::sample::Index>(),
        mutations in proptest::collection::vec(tree_mutation(), 1..4),
    ) {
        let samples = samples();
        let mut frame = which.get(&samples).clone();
        for m in &mutations {
            apply_tree(&mut frame, m);
        }
        let bodies = check_stream(&frame, frame.len());
        prop_assert!(bodies.len() == 1 || frame.len() - PREFIX_LEN > MAX);
        check_handshake(&bodies);
    }

    /// The same, on the batch frame only: a decoded batch must respect its batch shape.
    #[test]
    fn tree_mutated_batches_respect_their_batch_shape(
        mutations in proptest::collection::vec(tree_mutation(), 1..3),
        compact in any::<bool>(),
    ) {
        let mut frame = if compact {
            compact_frame()
        } else {
            encode(&NodeFrame::Message(FromNode::Batch(batch())), MAX).unwrap()
        };
        for m in &mutations {
            apply_tree(&mut frame, m);
        }
        let bodies = check_stream(&frame, frame.len());
        prop_assert_eq!(bodies.len(), 1);
    }

    /// Pure noise, in random chunks.
    #[test]
    fn random_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..600), chunk in 1usize..80) {
        let bodies = check_stream(&bytes, chunk);
        check_handshake(&bodies);
        // The same bytes as bodies directly (no framing in the way).
        check_body(&bytes);
        check_handshake(std::slice::from_ref(&bytes));
    }

    /// Noise that parses as MessagePack more often: a map header and a plausible `type`.
    #[test]
    fn random_maps_never_panic(
        n in 0u8..16,
        tag in prop_oneof![
            Just("batch"), Just("hello"), Just("auth"), Just("welcome"), Just("update_weights"),
            Just("continue"), Just("seeded"), Just("failed"), Just("heartbeat")
        ],
        rest in proptest::collection::vec(any::<u8>(), 0..200),
    ) {
        let mut body = vec![0x80 | n, 0xa4];
        body.extend_from_slice(b"type");
        body.push(0xa0 | tag.len() as u8);
        body.extend_from_slice(tag.as_bytes());
        body.extend_from_slice(&rest);
        check_body(&body);
        check_handshake(&[body]);
    }

    /// Pre-login frames: a hello or auth with random extra entries (unknown keys, repeated
    /// keys, nested values) and random trailing bytes is refused unless it is exactly one
    /// well-formed map of known fields, and a prefix over the login limit is refused from
    /// its four bytes.
    #[test]
    fn pre_login_frames_are_strict_and_bounded(
        auth in any::<bool>(),
        extra in proptest::collection::vec((prop_oneof![
            Just("type"), Just("node_name"), Just("proof"), Just("x"), Just("node_index")
        ], proptest::collection::vec(any::<u8>(), 1..12)), 0..3),
        trailing in proptest::collection::vec(any::<u8>(), 0..3),
        prefix in any::<u32>(),
    ) {
        let base = if auth { &node_samples()[1] } else { &node_samples()[0] };
        let mut body = encode(base, MAX).unwrap()[PREFIX_LEN..].to_vec();
        let n = body[0] & 0x0f;
        body[0] = 0x80 | (n + extra.len() as u8);
        for (k, v) in &extra {
            body.push(0xa0 | k.len() as u8);
            body.extend_from_slice(k.as_bytes());
            body.extend_from_slice(v);
        }
        body.extend_from_slice(&trailing);
        check_login(&body);
        if !extra.is_empty() || !trailing.is_empty() {
            prop_assert!(
                !matches!(decode_login(&body), Ok(LoginFrame::Hello(_) | LoginFrame::Auth(_))),
                "accepted with extra entries or trailing bytes"
            );
        }
        check_handshake(&[body]);
        let len = body_len(prefix.to_be_bytes(), LOGIN_MAX_FRAME);
        prop_assert_eq!(len.is_ok(), prefix > 0 && prefix as usize <= LOGIN_MAX_FRAME);
    }

    /// Valid frames, mutated, followed by a valid frame (which must still decode when framing held).
    #[test]
    fn mutated_frames_never_panic(
        which in any::<prop::sample::Index>(),
        mutations in proptest::collection::vec(mutation(), 1..4),
        chunk in 1usize..300,
    ) {
        let samples = samples();
        let mut frame = which.get(&samples).clone();
        for m in &mutations {
            apply(&mut frame, m);
            if frame.len() < PREFIX_LEN {
                break;
            }
        }
        let mut stream = frame.clone();
        stream.extend_from_slice(&samples[0]);
        let bodies = check_stream(&stream, chunk);
        check_handshake(&bodies);
    }

    /// A handshake fed a mutated hello and a mutated auth (or the intact ones) never admits a
    /// node without a proof for the name it said hello with.
    #[test]
    fn mutated_handshakes_never_admit_without_proof(
        name in "[a-z0-9-]{0,12}",
        hello_mut in proptest::option::of(mutation()),
        auth_mut in proptest::option::of(mutation()),
        proof_name in prop_oneof![Just(None), "[a-z0-9-]{0,12}".prop_map(Some)],
    ) {
        let mut hello = encode(&NodeFrame::Hello(Hello { protocol_version: PROTOCOL_VERSION, node_name: name.clone(), node_index: None }), MAX).unwrap();
        let signed = proof_name.clone().unwrap_or_else(|| name.clone());
        let mut auth = encode(&NodeFrame::Auth(Auth { proof: auth_proof(TOKEN, &nonce(), &signed) }), MAX).unwrap();
        if let Some(m) = &hello_mut {
            apply(&mut hello, m);
        }
        if let Some(m) = &auth_mut {
            apply(&mut auth, m);
        }
        let mut stream = hello;
        stream.extend_from_slice(&auth);
        let bodies = check_stream(&stream, 7);
        check_handshake(&bodies);
        if hello_mut.is_none() && auth_mut.is_none() {
            let mut hs = TrainerHandshake::new(TOKEN, nonce());
            prop_assert!(matches!(hs.on_frame(&bodies[0]), HandshakeStep::Send(_)));
            let admitted = matches!(hs.on_frame(&bodies[1]), HandshakeStep::Authenticated { .. });
            prop_assert_eq!(admitted, signed == name);
        }
    }
}

/// Every sample is a valid frame to begin with (else the mutations test little).
#[test]
fn the_compact_sample_decodes_to_its_batch() {
    let f = compact_frame();
    let got = decode::<NodeFrame>(&f[PREFIX_LEN..]).unwrap();
    assert_eq!(got, NodeFrame::Message(FromNode::Batch(compact_batch())));
}

#[test]
fn samples_decode() {
    for (i, f) in samples().iter().enumerate() {
        let bodies = check_stream(f, f.len());
        assert_eq!(bodies.len(), 1, "sample {i}");
        let node = decode::<NodeFrame>(&bodies[0]).is_ok();
        let trainer = decode::<TrainerFrame>(&bodies[0]).is_ok();
        // Heartbeat is the one frame of both directions.
        assert!(node || trainer, "sample {i}");
    }
}
