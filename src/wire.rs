//! Frames on a byte stream: a `u32` big-endian length, then one MessagePack value.
//!
//! Everything here is pure: the two frame types (the session messages of
//! [`crate::message`] plus the wire's own handshake and heartbeat frames),
//! encoding, incremental decoding that refuses an oversized frame before reading
//! it, and the HMAC proof that a node holds the shared token (the token itself
//! never crosses the wire). What a connection does with its frames is decided in
//! [`crate::connection`]. PROTOCOL.md describes the same thing for other languages.

use hmac::{Hmac, Mac};
use serde::{Deserialize, Serialize};
use sha2::Sha256;

mod continue_frame;
pub(crate) mod cursor;
mod ends;
mod login;
mod read;
mod read_specs;
mod tagged;
mod versions;

pub use continue_frame::encode_continue;
/// The batches of `ends`' tests, for the decoders' own.
#[cfg(test)]
pub(crate) use ends::tests as ends_tests;
pub use ends::{BatchFrame, Ends, MIN_SAVED};
pub use login::{decode_login, LoginFrame};
pub use read::Frame;
pub(crate) use read::{decode_into, Storage};
pub use versions::{AdmitVersions, Need};

use crate::message::{names, FromNode, ToNode};
use crate::node_spec::NodeSpec;
use crate::policy::Weights;

/// Version of this protocol, the one nodes of this crate speak (13: a multi-agent env's
/// policy may run epsilon-greedy exploration per agent; 12: a multi-agent env's
/// episodes end once any agent is done where `welcome.spec.env.done_on_any` says so;
/// 11: a node queues a second `continue` while it collects; 10: multi-agent envs; 9: `ends` and runs that
/// record nothing; 8: the `onnx` `qvalue`
/// head and epsilon-greedy; 7: Ornstein–Uhlenbeck exploration; 6: a node runs recurrent
/// `onnx` policies; 5: a node records what its policy records in every batch; 4:
/// `ready` carries the env's specs). A trainer
/// admits [`OLDEST_PROTOCOL_VERSION`] up to this one, less those a run cannot be served
/// by ([`AdmitVersions`]).
pub const PROTOCOL_VERSION: u32 = 13;
/// The oldest version a trainer admits: a version-3 node sends no specs in `ready` and
/// no recorded keys in its batches, so it can only serve envs the trainer builds itself
/// under a policy that records nothing; a version-4 node, any env under such a policy.
pub const OLDEST_PROTOCOL_VERSION: u32 = 3;
/// Default largest frame body accepted, in bytes (256 MiB).
pub const DEFAULT_MAX_FRAME: usize = 256 << 20;
/// Room a `welcome` needs beside its policy's model and weights (the node spec, env
/// config, timings): what the trainer allows for when it checks that an ONNX model's
/// `welcome` fits the node's read limit (PROTOCOL.md §4).
pub const WELCOME_SLACK: usize = 64 << 10;
/// Largest frame body the trainer accepts before `welcome` (4 KiB): `hello` and
/// `auth` are a few dozen bytes, and anyone who can reach the port may send them,
/// so nothing before login costs more than this (PROTOCOL.md §1, §4).
pub const LOGIN_MAX_FRAME: usize = 4 << 10;
/// Shortest shared token accepted, in bytes: a shorter one is guessable, and the
/// proof of a guessable token proves nothing.
pub const MIN_TOKEN_LEN: usize = 16;
/// Length of the trainer's challenge nonce.
pub const NONCE_LEN: usize = 32;
/// Bytes of the length prefix.
pub const PREFIX_LEN: usize = 4;
/// Domain separation for the HMAC, so a proof is good for this protocol only.
const AUTH_CONTEXT: &[u8] = b"rollout-join-v1";

/// What can go wrong with a frame.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum WireError {
    /// The length prefix announces more than the maximum; nothing of it was read.
    #[error("frame of {len} bytes exceeds the maximum of {max}")]
    TooLarge {
        /// Announced body length.
        len: usize,
        /// The maximum.
        max: usize,
    },
    /// A zero-length frame (never valid: every message is a map).
    #[error("empty frame")]
    Empty,
    /// The body is not the MessagePack of the expected message.
    #[error("cannot decode frame: {0}")]
    Decode(String),
    /// A message could not be encoded.
    #[error("cannot encode frame: {0}")]
    Encode(String),
}

/// Node → trainer: every frame a node sends. The handshake and liveness frames are
/// the wire's own; everything else is a session message, the same [`FromNode`] the
/// trainer gets from an in-process node, on the wire as it is (its `type` and fields
/// side by side in one map, see PROTOCOL.md).
#[derive(Clone, Debug, PartialEq)]
pub enum NodeFrame {
    /// First frame of a connection.
    Hello(Hello),
    /// Answer to the challenge.
    Auth(Auth),
    /// Liveness, both ways, every heartbeat interval.
    Heartbeat,
    /// A session message. The first after the handshake is [`FromNode::Ready`]
    /// (protocol version 2).
    Message(FromNode),
}

/// `hello`: the first frame of a connection. One type for the session's decoder
/// ([`NodeFrame::Hello`]) and the strict login decoder ([`LoginFrame::Hello`]).
#[derive(Clone, Debug, PartialEq)]
pub struct Hello {
    /// [`OLDEST_PROTOCOL_VERSION`] to [`PROTOCOL_VERSION`].
    pub protocol_version: u32,
    /// A name for logs (host, job id, ...).
    pub node_name: String,
    /// Ask for this node index (a node rejoining its slot); `None` for any free one.
    pub node_index: Option<usize>,
}

/// `auth`: the answer to the challenge, an HMAC-SHA256 proof of the token (see
/// [`auth_proof`]). One type for [`NodeFrame::Auth`] and [`LoginFrame::Auth`].
#[derive(Clone, Debug, PartialEq)]
pub struct Auth {
    /// 32 bytes.
    pub proof: Vec<u8>,
}

/// What the trainer tells a node it admitted.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Welcome {
    /// The node's index, `0..nodes`.
    pub node_index: usize,
    /// How to build its env workers.
    pub spec: NodeSpec,
    /// The trainer's weights for this node (its version 0, which the trainer builds); `nil`
    /// only for a policy without weights. A node never builds weights of its own.
    pub weights: Option<Weights>,
    /// Heartbeat interval in milliseconds; a peer silent for `heartbeat_timeout_ms` is gone.
    pub heartbeat_ms: u64,
    /// Silence after which a peer is treated as gone, in milliseconds.
    pub heartbeat_timeout_ms: u64,
    /// Largest frame body either side sends or accepts.
    pub max_frame: u64,
}

/// Trainer → node: every frame a trainer sends. The handshake and liveness frames
/// are the wire's own; everything else is a session message, the same [`ToNode`] an
/// in-process node gets.
#[derive(Clone, Debug, PartialEq)]
pub enum TrainerFrame {
    /// Answer to `Hello`: prove you hold the token.
    Challenge {
        /// [`NONCE_LEN`] random bytes.
        nonce: Vec<u8>,
    },
    /// The node is admitted.
    Welcome(Box<Welcome>),
    /// The node is refused; the trainer closes the connection after this frame.
    Reject {
        /// Why, for the node to print.
        reason: String,
    },
    /// Liveness.
    Heartbeat,
    /// A session message.
    Message(ToNode),
}

impl NodeFrame {
    /// The frame's name on the wire (its `type`), for logs and errors.
    pub fn name(&self) -> &'static str {
        match self {
            NodeFrame::Hello(_) => names::HELLO,
            NodeFrame::Auth(_) => names::AUTH,
            NodeFrame::Heartbeat => names::HEARTBEAT,
            NodeFrame::Message(m) => m.name(),
        }
    }
}

impl TrainerFrame {
    /// The frame's name on the wire (its `type`), for logs and errors.
    pub fn name(&self) -> &'static str {
        match self {
            TrainerFrame::Challenge { .. } => names::CHALLENGE,
            TrainerFrame::Welcome(_) => names::WELCOME,
            TrainerFrame::Reject { .. } => names::REJECT,
            TrainerFrame::Heartbeat => names::HEARTBEAT,
            TrainerFrame::Message(m) => m.name(),
        }
    }
}

/// Appends one frame (prefix + MessagePack body with named fields) to `out`.
pub fn encode_into<T: Serialize>(msg: &T, max: usize, out: &mut Vec<u8>) -> Result<(), WireError> {
    let start = out.len();
    out.extend_from_slice(&[0; PREFIX_LEN]);
    if let Err(e) = rmp_serde::encode::write_named(out, msg) {
        out.truncate(start);
        return Err(WireError::Encode(e.to_string()));
    }
    let len = out.len() - start - PREFIX_LEN;
    if len > max || len > u32::MAX as usize {
        out.truncate(start);
        return Err(WireError::TooLarge { len, max });
    }
    out[start..start + PREFIX_LEN].copy_from_slice(&(len as u32).to_be_bytes());
    Ok(())
}

/// One frame (prefix + body) as a new buffer.
pub fn encode<T: Serialize>(msg: &T, max: usize) -> Result<Vec<u8>, WireError> {
    let mut out = Vec::new();
    encode_into(msg, max, &mut out)?;
    Ok(out)
}

/// The body length of the `update_weights` frame carrying `weights`, without encoding
/// it: what a sender checks against the maximum frame before it tries (a policy too
/// big for the wire is a configuration error, found before any node is started).
pub fn update_weights_len(weights: &Weights) -> usize {
    /// The same map as `TrainerFrame::UpdateWeights`, borrowing the weights.
    #[derive(Serialize)]
    #[serde(tag = "type", rename_all = "snake_case")]
    enum Frame<'a> {
        UpdateWeights { weights: &'a Weights },
    }
    /// Counts bytes; tensor blobs are never copied.
    struct Count(usize);
    impl std::io::Write for Count {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0 += buf.len();
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let mut n = Count(0);
    // Writing into a counter cannot fail, and a tensor always serializes.
    let _ = rmp_serde::encode::write_named(&mut n, &Frame::UpdateWeights { weights });
    n.0
}

/// A piece of a frame encoded by [`encode_parts`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum FramePart {
    /// Bytes of the frame's own (the prefix, MessagePack headers, small values).
    Own(Vec<u8>),
    /// The whole of `blobs[i]`, at this place in the frame, not copied.
    Blob(usize),
}

/// Blobs shorter than this are copied anyway: a part of their own costs more.
const MIN_BLOB: usize = 4096;

/// [`encode`], except that wherever the encoder writes one of `blobs` whole (the
/// memory of a tensor, see [`Tensor::le_bytes_in_place`](crate::tensor::Tensor::le_bytes_in_place)),
/// the result names it instead of copying it: a sender writes the parts one after
/// the other (vectored) and a 40 MB weight update is never copied into a frame. The
/// concatenated parts are exactly what [`encode`] returns.
pub fn encode_parts<T: Serialize>(msg: &T, max: usize, blobs: &[&[u8]]) -> Result<Vec<FramePart>, WireError> {
    let mut w = PartsWriter {
        cur: vec![0; PREFIX_LEN],
        parts: Vec::new(),
        blobs,
        len: PREFIX_LEN,
    };
    rmp_serde::encode::write_named(&mut w, msg).map_err(|e| WireError::Encode(e.to_string()))?;
    w.cut();
    let len = w.len - PREFIX_LEN;
    if len > max || len > u32::MAX as usize {
        return Err(WireError::TooLarge { len, max });
    }
    match w.parts.first_mut() {
        Some(FramePart::Own(first)) if first.len() >= PREFIX_LEN => {
            first[..PREFIX_LEN].copy_from_slice(&(len as u32).to_be_bytes());
        }
        _ => return Err(WireError::Encode("a frame must start with its own bytes".into())),
    }
    Ok(w.parts)
}

/// The sink of [`encode_parts`]: copies small writes, names whole blobs.
struct PartsWriter<'a> {
    cur: Vec<u8>,
    parts: Vec<FramePart>,
    blobs: &'a [&'a [u8]],
    /// Bytes written so far, prefix included.
    len: usize,
}

impl PartsWriter<'_> {
    fn cut(&mut self) {
        if !self.cur.is_empty() {
            self.parts.push(FramePart::Own(std::mem::take(&mut self.cur)));
        }
    }
}

impl std::io::Write for PartsWriter<'_> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let blob = (buf.len() >= MIN_BLOB)
            .then(|| {
                self.blobs
                    .iter()
                    .position(|b| std::ptr::eq(b.as_ptr(), buf.as_ptr()) && b.len() == buf.len())
            })
            .flatten();
        match blob {
            Some(i) => {
                self.cut();
                self.parts.push(FramePart::Blob(i));
            }
            None => self.cur.extend_from_slice(buf),
        }
        self.len += buf.len();
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Decodes a frame body (without its prefix), its tensors into fresh memory
/// ([`crate::frame_decode::decode_pooled`] gives them memory to go to).
pub fn decode<T: Frame>(body: &[u8]) -> Result<T, WireError> {
    let mut pool = crate::pool::TensorPool::new(0);
    let mut storage = Storage {
        read: Default::default(),
        pool: &mut pool,
    };
    read::decode_into(body, &mut storage)
}

/// The body length a prefix announces, refused if over `max`.
pub fn body_len(prefix: [u8; PREFIX_LEN], max: usize) -> Result<usize, WireError> {
    let len = u32::from_be_bytes(prefix) as usize;
    if len > max {
        return Err(WireError::TooLarge { len, max });
    }
    if len == 0 {
        return Err(WireError::Empty);
    }
    Ok(len)
}

/// Splits a byte stream into frame bodies, whatever chunks it arrives in.
///
/// A prefix over the maximum is an error as soon as its 4 bytes are in, before
/// any of the body is buffered. After an error the stream is unusable: close it.
#[derive(Debug)]
pub struct FrameDecoder {
    max: usize,
    buf: Vec<u8>,
    start: usize,
}

impl FrameDecoder {
    /// A decoder refusing bodies over `max` bytes.
    pub fn new(max: usize) -> FrameDecoder {
        FrameDecoder {
            max,
            buf: Vec::new(),
            start: 0,
        }
    }

    /// Appends received bytes.
    pub fn push(&mut self, bytes: &[u8]) {
        if self.start > 0 && self.start == self.buf.len() {
            self.buf.clear();
            self.start = 0;
        }
        self.buf.extend_from_slice(bytes);
    }

    /// Bytes received and not yet returned as a frame.
    pub fn buffered(&self) -> usize {
        self.buf.len() - self.start
    }

    /// The next complete frame body, `None` if more bytes are needed.
    pub fn next_frame(&mut self) -> Result<Option<Vec<u8>>, WireError> {
        let avail = &self.buf[self.start..];
        if avail.len() < PREFIX_LEN {
            return Ok(None);
        }
        let mut prefix = [0u8; PREFIX_LEN];
        prefix.copy_from_slice(&avail[..PREFIX_LEN]);
        let len = body_len(prefix, self.max)?;
        if avail.len() < PREFIX_LEN + len {
            return Ok(None);
        }
        let body = avail[PREFIX_LEN..PREFIX_LEN + len].to_vec();
        self.start += PREFIX_LEN + len;
        if self.start == self.buf.len() {
            self.buf.clear();
            self.start = 0;
        } else if self.start > self.buf.len() / 2 {
            self.buf.drain(..self.start);
            self.start = 0;
        }
        Ok(Some(body))
    }
}

/// The node's proof that it holds `token`: HMAC-SHA256 keyed by the token over a
/// context string, the trainer's nonce and the node's name.
pub fn auth_proof(token: &[u8], nonce: &[u8], node_name: &str) -> Vec<u8> {
    let mut mac = <Hmac<Sha256> as Mac>::new_from_slice(token).expect("HMAC takes keys of any length");
    mac.update(AUTH_CONTEXT);
    mac.update(nonce);
    mac.update(node_name.as_bytes());
    mac.finalize().into_bytes().to_vec()
}

/// Checks a proof in constant time.
pub fn verify_proof(token: &[u8], nonce: &[u8], node_name: &str, proof: &[u8]) -> bool {
    let mut mac = <Hmac<Sha256> as Mac>::new_from_slice(token).expect("HMAC takes keys of any length");
    mac.update(AUTH_CONTEXT);
    mac.update(nonce);
    mac.update(node_name.as_bytes());
    mac.verify_slice(proof).is_ok()
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;
    use std::sync::Arc;

    use ndarray::{ArrayD, IxDyn};
    use serde::de::IgnoredAny;

    use super::*;
    use crate::checkpoint::NodeState;
    use crate::env::EnvSpec;
    use crate::message::{Batch, Continue, FromNode, Seed, ToNode, UpdateWeights};
    use crate::policy::{PolicyConfig, PolicySpec};
    use crate::rollout::{BatchLayout, RolloutConfig};
    use crate::tensor::{DType, Tensor, TensorDict};

    const TOKEN: &[u8] = b"secret";

    fn hex(bytes: &[u8]) -> String {
        bytes.iter().map(|b| format!("{b:02x}")).collect()
    }

    fn nonce() -> Vec<u8> {
        (0..NONCE_LEN as u8).collect()
    }

    fn f32s(shape: &[usize], start: f32) -> Tensor {
        let n: usize = shape.iter().product();
        Tensor::F32(ArrayD::from_shape_vec(IxDyn(shape), (0..n).map(|i| start + i as f32 * 0.25).collect()).unwrap())
    }

    fn spec() -> NodeSpec {
        NodeSpec::new("CartPole-v1", PolicyConfig::Mlp { hidden: vec![8] }, 2)
            .with_index(1)
            .with_lanes(2, 4)
            .with_max_frames_per_traj(200)
    }

    fn weights() -> Weights {
        Weights {
            version: 3,
            tensors: [
                ("weight".to_string(), f32s(&[2, 4], -1.0)),
                ("bias".to_string(), f32s(&[2], 0.5)),
            ]
            .into_iter()
            .collect(),
        }
    }

    fn batch() -> Batch {
        let data = TensorDict::from_entries(
            &[2, 3],
            [
                ("observation".to_string(), f32s(&[2, 3, 4], 0.0)),
                (
                    "action".to_string(),
                    Tensor::I64(ArrayD::from_shape_vec(IxDyn(&[2, 3]), vec![0, 1, 1, 0, 1, -1]).unwrap()),
                ),
                (
                    "next.done".to_string(),
                    Tensor::Bool(
                        ArrayD::from_shape_vec(IxDyn(&[2, 3, 1]), vec![false, false, true, false, true, false])
                            .unwrap(),
                    ),
                ),
            ],
        )
        .unwrap();
        Batch {
            node: 1,
            seq: 9,
            weights_version: 3,
            data,
        }
    }

    fn welcome(weights: Option<Weights>) -> TrainerFrame {
        TrainerFrame::Welcome(Box::new(Welcome {
            node_index: 1,
            spec: spec(),
            weights,
            heartbeat_ms: 1000,
            heartbeat_timeout_ms: 5000,
            max_frame: DEFAULT_MAX_FRAME as u64,
        }))
    }

    #[test]
    fn a_frame_in_parts_is_the_frame_with_the_blobs_not_copied() {
        let big = f32s(&[64, 100], 0.5); // 25,600 bytes: named
        let small = f32s(&[3], 1.0); // copied
        let w = Weights {
            version: 7,
            tensors: [("a".to_string(), big), ("b".to_string(), small)].into_iter().collect(),
        };
        let shared = Arc::new(w.clone());
        let blobs: Vec<&[u8]> = shared.tensors.values().filter_map(Tensor::le_bytes_in_place).collect();
        assert_eq!(blobs.len(), 2);
        let frame = TrainerFrame::Message(ToNode::UpdateWeights(UpdateWeights {
            weights: Arc::clone(&shared),
        }));
        let parts = encode_parts(&frame, DEFAULT_MAX_FRAME, &blobs).unwrap();
        assert_eq!(
            parts
                .iter()
                .filter(|p| matches!(p, FramePart::Blob(_)))
                .collect::<Vec<_>>(),
            [&FramePart::Blob(0)]
        );
        let mut joined = Vec::new();
        for p in &parts {
            match p {
                FramePart::Own(b) => joined.extend_from_slice(b),
                FramePart::Blob(i) => joined.extend_from_slice(blobs[*i]),
            }
        }
        assert_eq!(
            joined,
            encode(&frame, DEFAULT_MAX_FRAME).unwrap(),
            "byte for byte the plain encoding"
        );
        // No blob, or blobs the frame does not hold: one part of its own.
        let plain = encode_parts(&frame, DEFAULT_MAX_FRAME, &[]).unwrap();
        assert_eq!(plain, [FramePart::Own(encode(&frame, DEFAULT_MAX_FRAME).unwrap())]);
        let copy = w.tensors["a"].clone();
        let other = encode_parts(&frame, DEFAULT_MAX_FRAME, &[copy.le_bytes_in_place().unwrap()]).unwrap();
        assert_eq!(other.len(), 1, "same bytes elsewhere in memory are not the blob");
        // The maximum counts the blobs.
        assert!(matches!(
            encode_parts(&frame, 25_600, &blobs),
            Err(WireError::TooLarge { max: 25_600, .. })
        ));
    }

    /// A real node state: one CartPole env with a sampling linear policy, two batches in.
    fn node_state() -> Box<NodeState> {
        let registry = crate::env::Registry::with_builtins();
        let env = registry.make(&EnvSpec::new("CartPole-v1")).unwrap();
        let policy = PolicySpec::from(PolicyConfig::Linear)
            .build(env.observation_spec(), env.action_spec(), 0)
            .unwrap();
        let ids = vec![crate::rollout::TrajIds::new(0, 1).unwrap()];
        let cfg = RolloutConfig {
            frames_per_batch: 10,
            ..RolloutConfig::default()
        };
        let mut r = crate::rollout::Rollout::new(vec![env], policy, ids, cfg).unwrap();
        r.collect_frames(10).unwrap();
        r.collect_frames(10).unwrap();
        Box::new(NodeState {
            node: 1,
            base_seed: 9,
            weights: Some(Arc::new(weights())),
            workers: vec![crate::node_state::WorkerState {
                rollout: r.snapshot().unwrap(),
                next_traj_id: 3,
                frames: 20,
            }],
        })
    }

    fn node_frames() -> Vec<NodeFrame> {
        vec![
            NodeFrame::Hello(Hello {
                protocol_version: PROTOCOL_VERSION,
                node_name: "node-0".into(),
                node_index: Some(1),
            }),
            NodeFrame::Hello(Hello {
                protocol_version: PROTOCOL_VERSION,
                node_name: String::new(),
                node_index: None,
            }),
            NodeFrame::Auth(Auth {
                proof: auth_proof(TOKEN, &nonce(), "node-0"),
            }),
            NodeFrame::Heartbeat,
            NodeFrame::Message(FromNode::Batch(batch())),
            NodeFrame::Message(FromNode::WeightsUpdated { node: 1, version: 3 }),
            NodeFrame::Message(FromNode::Seeded {
                node: 1,
                next_seed: u64::MAX,
            }),
            NodeFrame::Message(FromNode::Down { node: 1 }),
            NodeFrame::Message(FromNode::Leave { node: 1 }),
            NodeFrame::Message(FromNode::Failed {
                node: 1,
                reason: "env 0 failed: boom ✗".into(),
            }),
            NodeFrame::Message(FromNode::Snapshot {
                node: 1,
                id: 4,
                state: node_state(),
            }),
            NodeFrame::Message(FromNode::Restored { node: 1 }),
            NodeFrame::Message(FromNode::CheckpointFailed {
                node: 1,
                id: 4,
                reason: "env `Mine` cannot be checkpointed".into(),
            }),
        ]
    }

    fn trainer_frames() -> Vec<TrainerFrame> {
        vec![
            TrainerFrame::Challenge { nonce: nonce() },
            welcome(Some(weights())),
            welcome(None),
            TrainerFrame::Reject {
                reason: "node index 7 does not exist".into(),
            },
            TrainerFrame::Heartbeat,
            TrainerFrame::Message(ToNode::Continue(Continue { seq: 7, frames: 1000 })),
            TrainerFrame::Message(ToNode::UpdateWeights(UpdateWeights {
                weights: Arc::new(weights()),
            })),
            TrainerFrame::Message(ToNode::Seed(Seed { seed: 42 })),
            TrainerFrame::Message(ToNode::Shutdown),
            TrainerFrame::Message(ToNode::Snapshot { id: 4 }),
            TrainerFrame::Message(ToNode::Restore(node_state())),
        ]
    }

    fn body<T: Serialize>(msg: &T) -> Vec<u8> {
        let mut f = encode(msg, DEFAULT_MAX_FRAME).unwrap();
        let len = u32::from_be_bytes(f[..4].try_into().unwrap()) as usize;
        assert_eq!(len, f.len() - PREFIX_LEN);
        f.drain(..PREFIX_LEN);
        f
    }

    /// The top-level keys of a body, as a generic MessagePack map.
    fn keys(body: &[u8]) -> Vec<String> {
        let m: BTreeMap<String, IgnoredAny> = rmp_serde::from_slice(body).unwrap();
        m.into_keys().collect()
    }

    /// The `type` field of a body.
    fn type_of(body: &[u8]) -> String {
        #[derive(Deserialize)]
        struct Tag {
            r#type: String,
        }
        rmp_serde::from_slice::<Tag>(body).unwrap().r#type
    }

    #[test]
    fn the_login_decoder_knows_every_node_frame_by_its_type() {
        for f in node_frames() {
            let name = match decode_login(&body(&f)).unwrap() {
                LoginFrame::Hello(_) => "hello",
                LoginFrame::Auth(_) => "auth",
                LoginFrame::Other(t) => t,
            };
            assert_eq!(name, f.name());
        }
    }

    #[test]
    fn every_frame_round_trips() {
        for f in node_frames() {
            let back: NodeFrame = decode(&body(&f)).unwrap();
            assert_eq!(back, f);
        }
        for f in trainer_frames() {
            let back: TrainerFrame = decode(&body(&f)).unwrap();
            assert_eq!(back, f);
        }
    }

    #[test]
    fn frames_are_tagged_maps_with_flattened_fields() {
        let sorted = |v: &[&str]| {
            let mut v: Vec<String> = v.iter().map(|s| s.to_string()).collect();
            v.sort();
            v
        };
        let node: Vec<(&str, Vec<&str>)> = vec![
            ("hello", vec!["type", "protocol_version", "node_name", "node_index"]),
            ("hello", vec!["type", "protocol_version", "node_name", "node_index"]),
            ("auth", vec!["type", "proof"]),
            ("heartbeat", vec!["type"]),
            ("batch", vec!["type", "node", "seq", "weights_version", "data"]),
            ("weights_updated", vec!["type", "node", "version"]),
            ("seeded", vec!["type", "node", "next_seed"]),
            ("down", vec!["type", "node"]),
            ("leave", vec!["type", "node"]),
            ("failed", vec!["type", "node", "reason"]),
        ];
        for (f, (tag, k)) in node_frames().iter().zip(&node) {
            let b = body(f);
            assert_eq!(type_of(&b), *tag);
            assert_eq!(f.name(), *tag);
            assert_eq!(keys(&b), sorted(k), "{tag}");
        }
        let welcome_keys = vec![
            "type",
            "node_index",
            "spec",
            "weights",
            "heartbeat_ms",
            "heartbeat_timeout_ms",
            "max_frame",
        ];
        let trainer: Vec<(&str, Vec<&str>)> = vec![
            ("challenge", vec!["type", "nonce"]),
            ("welcome", welcome_keys.clone()),
            ("welcome", welcome_keys),
            ("reject", vec!["type", "reason"]),
            ("heartbeat", vec!["type"]),
            ("continue", vec!["type", "seq", "frames"]),
            ("update_weights", vec!["type", "weights"]),
            ("seed", vec!["type", "seed"]),
            ("shutdown", vec!["type"]),
        ];
        for (f, (tag, k)) in trainer_frames().iter().zip(&trainer) {
            let b = body(f);
            assert_eq!(type_of(&b), *tag);
            assert_eq!(keys(&b), sorted(k), "{tag}");
        }

        // Nested layouts: the batch's TensorDict, a tensor, the weights, the spec.
        #[derive(Deserialize)]
        struct BatchData {
            data: BTreeMap<String, IgnoredAny>,
        }
        let d: BatchData = rmp_serde::from_slice(&body(&NodeFrame::Message(FromNode::Batch(batch())))).unwrap();
        assert_eq!(d.data.keys().collect::<Vec<_>>(), ["batch_size", "tensors"]);
        #[derive(Deserialize)]
        struct WelcomeParts {
            spec: BTreeMap<String, IgnoredAny>,
            weights: BTreeMap<String, IgnoredAny>,
        }
        let w: WelcomeParts = rmp_serde::from_slice(&body(&welcome(Some(weights())))).unwrap();
        assert_eq!(
            w.spec.keys().collect::<Vec<_>>(),
            [
                "env",
                "envs_per_node",
                "first_lane",
                "index",
                "lanes",
                "max_restarts",
                "policy",
                "restart_window_ms",
                "rollout",
                "worker_nice"
            ]
        );
        assert_eq!(w.weights.keys().collect::<Vec<_>>(), ["tensors", "version"]);
    }

    #[test]
    fn update_weights_len_is_the_encoded_body_length() {
        for version in [0, 200, u64::MAX] {
            let mut w = weights();
            w.version = version;
            let frame = encode(
                &TrainerFrame::Message(ToNode::UpdateWeights(UpdateWeights {
                    weights: Arc::new(w.clone()),
                })),
                usize::MAX,
            )
            .unwrap();
            assert_eq!(update_weights_len(&w), frame.len() - PREFIX_LEN, "version {version}");
        }
    }

    #[test]
    fn a_spec_without_supervision_or_priority_fields_decodes_with_the_defaults() {
        // A Welcome from a trainer that predates supervision and worker priority: no
        // max_restarts, no window, no worker_nice.
        let mut v: BTreeMap<String, serde_json::Value> =
            rmp_serde::from_slice(&rmp_serde::to_vec_named(&spec()).unwrap()).unwrap();
        v.remove("max_restarts");
        v.remove("restart_window_ms");
        v.remove("worker_nice");
        let old = rmp_serde::to_vec_named(&v).unwrap();
        let mut s = spec();
        s.max_restarts = 0;
        s.restart_window_ms = 1;
        s.worker_nice = 0;
        let back: NodeSpec = rmp_serde::from_slice(&old).unwrap();
        assert_eq!(back.max_restarts, 5);
        assert_eq!(back.restart_window_ms, 5000);
        assert_eq!(back.worker_nice, 10);
        assert_eq!(back.restart_intensity(), crate::supervisor::RestartIntensity::default());
        assert_eq!(
            NodeSpec {
                max_restarts: 5,
                restart_window_ms: 5000,
                worker_nice: crate::node_spec::DEFAULT_WORKER_NICE,
                ..s
            },
            back
        );
    }

    #[test]
    fn worked_examples_are_byte_exact() {
        // The example of PROTOCOL.md.
        let f = encode(
            &TrainerFrame::Message(ToNode::Continue(Continue { seq: 7, frames: 1000 })),
            DEFAULT_MAX_FRAME,
        )
        .unwrap();
        assert_eq!(
            hex(&f),
            concat!(
                "0000001e", // body length 30, big-endian
                "83",       // map of 3
                "a4",
                "74797065", // "type"
                "a8",
                "636f6e74696e7565", // "continue"
                "a3",
                "736571",
                "07", // "seq": 7
                "a6",
                "6672616d6573",
                "cd03e8", // "frames": 1000 (uint16)
            )
        );
        let f = encode(&NodeFrame::Heartbeat, DEFAULT_MAX_FRAME).unwrap();
        assert_eq!(hex(&f), "0000001081a474797065a9686561727462656174");
        // A tensor: {dtype, shape, data} with data one bin blob.
        let t = Tensor::F32(ArrayD::from_shape_vec(IxDyn(&[2]), vec![1.0f32, -2.0]).unwrap());
        assert_eq!(
            hex(&rmp_serde::to_vec_named(&t).unwrap()),
            concat!(
                "83",
                "a5",
                "6474797065",
                "a3",
                "663332", // "dtype": "f32"
                "a5",
                "7368617065",
                "91",
                "02", // "shape": [2]
                "a4",
                "64617461",
                "c408",
                "0000803f",
                "000000c0", // "data": bin8 of 8 bytes
            )
        );
        // Node names and unset optional fields: nil.
        let hello = NodeFrame::Hello(Hello {
            protocol_version: 3,
            node_name: "n".into(),
            node_index: None,
        });
        assert_eq!(
            hex(&body(&hello)),
            concat!(
                "84",
                "a4",
                "74797065",
                "a5",
                "68656c6c6f",
                "b0",
                "70726f746f636f6c5f76657273696f6e",
                "03",
                "a9",
                "6e6f64655f6e616d65",
                "a1",
                "6e",
                "aa",
                "6e6f64655f696e646578",
                "c0",
            )
        );
        // An absent optional `node_index` is accepted too.
        let no_index = "83a474797065a568656c6c6fb070726f746f636f6c5f76657273696f6e03a96e6f64655f6e616d65a16e";
        let bytes: Vec<u8> = (0..no_index.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&no_index[i..i + 2], 16).unwrap())
            .collect();
        assert_eq!(decode::<NodeFrame>(&bytes).unwrap(), hello);
    }

    #[test]
    fn auth_proof_matches_the_documented_vector() {
        let proof = auth_proof(TOKEN, &nonce(), "node-0");
        assert_eq!(
            hex(&proof),
            "80c3993cb8c48285d68f527efd0db4117095266e2a31ccc8a16541acba52e274"
        );
        assert!(verify_proof(TOKEN, &nonce(), "node-0", &proof));
        assert!(!verify_proof(b"other", &nonce(), "node-0", &proof));
        assert!(!verify_proof(TOKEN, &[0; NONCE_LEN], "node-0", &proof));
        assert!(!verify_proof(TOKEN, &nonce(), "node-1", &proof));
        assert!(!verify_proof(TOKEN, &nonce(), "node-0", &proof[..31]));
        assert!(!verify_proof(TOKEN, &nonce(), "node-0", &[]));
        // Long tokens are hashed first (HMAC), any length works.
        let long = vec![7u8; 1000];
        assert!(verify_proof(&long, &nonce(), "x", &auth_proof(&long, &nonce(), "x")));
    }

    #[test]
    fn a_message_on_the_wire_is_the_message_itself_named_by_its_type() {
        for m in [
            ToNode::Continue(Continue { seq: 1, frames: 2 }),
            ToNode::UpdateWeights(UpdateWeights {
                weights: Arc::new(weights()),
            }),
            ToNode::Seed(Seed { seed: 3 }),
            ToNode::Shutdown,
            ToNode::Snapshot { id: 1 },
            ToNode::Restore(node_state()),
        ] {
            let f = TrainerFrame::Message(m.clone());
            assert_eq!(body(&f), rmp_serde::to_vec_named(&m).unwrap(), "{}", m.name());
            assert_eq!(type_of(&body(&f)), m.name());
            assert_eq!(f.name(), m.name());
            assert_eq!(decode::<TrainerFrame>(&body(&f)), Ok(f));
        }
        for m in [
            FromNode::Batch(batch()),
            FromNode::WeightsUpdated { node: 0, version: 1 },
            FromNode::Seeded { node: 0, next_seed: 4 },
            FromNode::Down { node: 0 },
            FromNode::Leave { node: 0 },
            FromNode::Failed {
                node: 0,
                reason: "x".into(),
            },
            FromNode::Ready {
                node: 0,
                layout: BatchLayout::default(),
                specs: None,
            },
            FromNode::Ready {
                node: 0,
                layout: BatchLayout::default(),
                specs: Some(Box::new(crate::space::EnvSpecs::from_specs(
                    &crate::Spec::uniform_box(2, -1.0, 1.0),
                    &crate::Spec::Discrete { n: 3 },
                ))),
            },
            FromNode::Snapshot {
                node: 1,
                id: 2,
                state: node_state(),
            },
            FromNode::Restored { node: 1 },
            FromNode::CheckpointFailed {
                node: 0,
                id: 0,
                reason: "x".into(),
            },
        ] {
            let f = NodeFrame::Message(m.clone());
            assert_eq!(body(&f), rmp_serde::to_vec_named(&m).unwrap(), "{}", m.name());
            assert_eq!(type_of(&body(&f)), m.name());
            assert_eq!(f.name(), m.name());
            assert_eq!(decode::<NodeFrame>(&body(&f)), Ok(f));
        }
        // The wire's own frames are named by their `type` too.
        for f in node_frames() {
            assert_eq!(type_of(&body(&f)), f.name());
        }
        for f in trainer_frames() {
            assert_eq!(type_of(&body(&f)), f.name());
        }
    }

    #[test]
    fn a_type_written_after_the_fields_decodes_the_same() {
        // Re-encode every frame with its `type` moved to the end of its map.
        fn type_last(body: &[u8]) -> Vec<u8> {
            let Ok(rmpv::Value::Map(mut m)) = rmpv::decode::read_value(&mut &body[..]) else {
                panic!("a map")
            };
            let t = m.remove(0);
            assert_eq!(t.0.as_str(), Some("type"));
            m.push(t);
            let mut out = Vec::new();
            rmpv::encode::write_value(&mut out, &rmpv::Value::Map(m)).unwrap();
            out
        }
        for f in node_frames() {
            assert_eq!(decode::<NodeFrame>(&type_last(&body(&f))), Ok(f));
        }
        for f in trainer_frames() {
            assert_eq!(decode::<TrainerFrame>(&type_last(&body(&f))), Ok(f));
        }
        // A second `type` is refused, after the first or without one first.
        let encode_map = |m: Vec<(rmpv::Value, rmpv::Value)>| {
            let mut out = Vec::new();
            rmpv::encode::write_value(&mut out, &rmpv::Value::Map(m)).unwrap();
            out
        };
        let ty = |t: &str| (rmpv::Value::from("type"), rmpv::Value::from(t));
        let node = (rmpv::Value::from("node"), rmpv::Value::from(0));
        for m in [
            vec![ty("heartbeat"), ty("heartbeat")],
            vec![ty("down"), node.clone(), ty("down")],
            vec![node.clone(), ty("down"), ty("down")],
            vec![node, ty("heartbeat"), ty("heartbeat")],
        ] {
            let err = decode::<NodeFrame>(&encode_map(m.clone())).unwrap_err();
            assert!(
                matches!(&err, WireError::Decode(e) if e.contains("duplicate field `type`")),
                "{m:?}: {err}"
            );
        }
    }

    /// Every frame of both directions, back to back, and their bodies.
    fn stream() -> (Vec<u8>, Vec<Vec<u8>>) {
        let mut bytes = Vec::new();
        let mut bodies = Vec::new();
        for f in node_frames() {
            encode_into(&f, DEFAULT_MAX_FRAME, &mut bytes).unwrap();
            bodies.push(body(&f));
        }
        for f in trainer_frames() {
            encode_into(&f, DEFAULT_MAX_FRAME, &mut bytes).unwrap();
            bodies.push(body(&f));
        }
        (bytes, bodies)
    }

    fn drain(d: &mut FrameDecoder, out: &mut Vec<Vec<u8>>) {
        while let Some(b) = d.next_frame().unwrap() {
            out.push(b);
        }
    }

    #[test]
    fn decoder_splits_a_stream_cut_at_every_byte() {
        let (bytes, bodies) = stream();
        for cut in 0..=bytes.len() {
            let mut d = FrameDecoder::new(DEFAULT_MAX_FRAME);
            let mut got = Vec::new();
            d.push(&bytes[..cut]);
            drain(&mut d, &mut got);
            d.push(&bytes[cut..]);
            drain(&mut d, &mut got);
            assert_eq!(got, bodies, "cut at {cut}");
            assert_eq!(d.buffered(), 0);
        }
        // One byte at a time, and in uneven chunks.
        for chunk in [1, 3, 7, 64, 1000] {
            let mut d = FrameDecoder::new(DEFAULT_MAX_FRAME);
            let mut got = Vec::new();
            for c in bytes.chunks(chunk) {
                d.push(c);
                drain(&mut d, &mut got);
            }
            assert_eq!(got, bodies, "chunks of {chunk}");
            assert_eq!(d.buffered(), 0);
        }
        // Partial frame: nothing yet, and the bytes stay buffered.
        let mut d = FrameDecoder::new(DEFAULT_MAX_FRAME);
        d.push(&bytes[..PREFIX_LEN + 1]);
        assert_eq!(d.next_frame(), Ok(None));
        assert_eq!(d.buffered(), PREFIX_LEN + 1);
    }

    #[test]
    fn oversize_prefix_is_refused_from_its_four_bytes() {
        let mut d = FrameDecoder::new(100);
        d.push(&101u32.to_be_bytes());
        assert_eq!(d.next_frame(), Err(WireError::TooLarge { len: 101, max: 100 }));
        assert_eq!(d.buffered(), PREFIX_LEN);
        for len in [DEFAULT_MAX_FRAME as u32 + 1, u32::MAX] {
            let mut d = FrameDecoder::new(DEFAULT_MAX_FRAME);
            d.push(&len.to_be_bytes());
            assert_eq!(
                d.next_frame(),
                Err(WireError::TooLarge {
                    len: len as usize,
                    max: DEFAULT_MAX_FRAME
                })
            );
        }
        // Exactly the maximum is fine (the Continue example is 30 bytes).
        let f = encode(
            &TrainerFrame::Message(ToNode::Continue(Continue { seq: 7, frames: 1000 })),
            30,
        )
        .unwrap();
        let mut d = FrameDecoder::new(30);
        d.push(&f);
        assert_eq!(d.next_frame().unwrap().map(|b| b.len()), Some(30));
        let mut d = FrameDecoder::new(29);
        d.push(&f[..PREFIX_LEN]);
        assert_eq!(d.next_frame(), Err(WireError::TooLarge { len: 30, max: 29 }));
        // The sender refuses too, and leaves its buffer as it was.
        let mut out = vec![1, 2, 3];
        assert_eq!(
            encode_into(
                &TrainerFrame::Message(ToNode::Continue(Continue { seq: 7, frames: 1000 })),
                29,
                &mut out
            ),
            Err(WireError::TooLarge { len: 30, max: 29 })
        );
        assert_eq!(out, [1, 2, 3]);
        assert_eq!(
            body_len([0, 0, 0, 30], 29),
            Err(WireError::TooLarge { len: 30, max: 29 })
        );
        assert_eq!(body_len([0, 0, 1, 0], 1000), Ok(256));
    }

    #[test]
    fn empty_frames_and_garbage_bodies_are_errors() {
        let mut d = FrameDecoder::new(DEFAULT_MAX_FRAME);
        d.push(&[0, 0, 0, 0]);
        assert_eq!(d.next_frame(), Err(WireError::Empty));
        assert_eq!(decode::<NodeFrame>(&[]), Err(WireError::Empty));
        for garbage in [
            &[0xc1][..],                         // never-used marker
            &[0x81, 0xa4],                       // truncated
            b"\x91\x01",                         // an array, not a tagged map
            b"\x81\xa4type\xa4nope",             // unknown type
            b"\x81\xa3seq\x07",                  // no type
            b"\x82\xa4type\xa4down\xa4node\xff", // negative node
            b"hello world",
        ] {
            assert!(
                matches!(decode::<NodeFrame>(garbage), Err(WireError::Decode(_))),
                "{garbage:?}"
            );
            assert!(
                matches!(decode::<TrainerFrame>(garbage), Err(WireError::Decode(_))),
                "{garbage:?}"
            );
        }
        // Frames of the other direction do not decode.
        let cont = body(&TrainerFrame::Message(ToNode::Continue(Continue { seq: 1, frames: 2 })));
        assert!(matches!(decode::<NodeFrame>(&cont), Err(WireError::Decode(_))));
        let down = body(&NodeFrame::Message(FromNode::Down { node: 0 }));
        assert!(matches!(decode::<TrainerFrame>(&down), Err(WireError::Decode(_))));
        // A batch whose tensors do not start with the batch shape does not decode.
        let mut bad = body(&NodeFrame::Message(FromNode::Batch(batch())));
        let at = bad
            .windows(13)
            .position(|w| w == b"\xaabatch_size\x92\x02")
            .expect("batch_size [2, 3] in the body");
        bad[at + 12] = 0x03;
        let err = decode::<NodeFrame>(&bad).unwrap_err();
        assert!(matches!(&err, WireError::Decode(m) if m.contains("shape")), "{err}");
    }

    #[test]
    fn ready_round_trips_with_its_layout() {
        let obs = crate::Spec::uniform_box(4, -1.0, 1.0);
        let act = crate::Spec::Discrete { n: 2 };
        let f = NodeFrame::Message(FromNode::Ready {
            node: 3,
            layout: crate::schema::batch_layout(&obs, &act),
            specs: Some(Box::new(crate::space::EnvSpecs::from_specs(&obs, &act))),
        });
        let b = body(&f);
        let back: NodeFrame = decode(&b).unwrap();
        assert_eq!(back, f);
        let v: serde_json::Value = rmp_serde::from_slice(&b).unwrap();
        assert_eq!(v["type"], "ready");
        assert_eq!(v["layout"]["observation"], serde_json::json!(["f32", [4]]));
        assert_eq!(v["specs"]["action"], serde_json::json!({"kind": "discrete", "n": 2}));
        assert_eq!(v["specs"]["observation"]["shape"], serde_json::json!([4]));
        assert_eq!(back.name(), "ready");
    }

    #[test]
    fn a_ready_without_specs_or_with_nil_specs_decodes_as_none() {
        let ready = |specs: Option<rmpv::Value>| {
            let mut entries = vec![
                (rmpv::Value::from("type"), rmpv::Value::from("ready")),
                (rmpv::Value::from("node"), rmpv::Value::from(1)),
                (rmpv::Value::from("layout"), rmpv::Value::Map(vec![])),
            ];
            if let Some(s) = specs {
                entries.push((rmpv::Value::from("specs"), s));
            }
            let mut b = Vec::new();
            rmpv::encode::write_value(&mut b, &rmpv::Value::Map(entries)).unwrap();
            decode::<NodeFrame>(&b)
        };
        let none = NodeFrame::Message(FromNode::Ready {
            node: 1,
            layout: BatchLayout::default(),
            specs: None,
        });
        assert_eq!(ready(None), Ok(none.clone()), "absent (a version-3 node)");
        assert_eq!(ready(Some(rmpv::Value::Nil)), Ok(none), "nil");
        let e = ready(Some(rmpv::Value::from("box"))).unwrap_err();
        assert!(matches!(&e, WireError::Decode(m) if m.contains("`specs`")), "{e}");
        let e = ready(Some(rmpv::Value::Map(vec![(
            rmpv::Value::from("observation"),
            rmpv::Value::Map(vec![(rmpv::Value::from("kind"), rmpv::Value::from("tuple"))]),
        )])))
        .unwrap_err();
        assert!(matches!(&e, WireError::Decode(m) if m.contains("`specs`")), "{e}");
        // A kind of megabytes, echoed by serde's error: shown bounded.
        let e = ready(Some(rmpv::Value::Map(vec![(
            rmpv::Value::from("observation"),
            rmpv::Value::Map(vec![(
                rmpv::Value::from("kind"),
                rmpv::Value::from("\n".repeat(1 << 20)),
            )]),
        )])))
        .unwrap_err()
        .to_string();
        assert!(e.len() < 2 * crate::peer_text::MAX_PRINTED, "{} bytes", e.len());
        assert!(e.contains("`specs`") && !e.contains('\n'), "{e}");
    }

    #[test]
    fn a_peers_names_in_a_frame_are_shown_bounded_in_decode_errors() {
        let long = "\u{1b}".repeat(1 << 16);
        let mut b = Vec::new();
        let frame = rmpv::Value::Map(vec![(rmpv::Value::from("type"), rmpv::Value::from(long.as_str()))]);
        rmpv::encode::write_value(&mut b, &frame).unwrap();
        let e = decode::<NodeFrame>(&b).unwrap_err().to_string();
        assert!(e.ends_with(&format!(" … ({} bytes)`", long.len())), "{e}");
        assert!(
            e.len() < 2 * crate::peer_text::MAX_PRINTED && !e.contains('\u{1b}'),
            "{e}"
        );
    }

    #[test]
    fn tensor_dtypes_keep_their_names_on_the_wire() {
        for d in [DType::F32, DType::F64, DType::I64, DType::Bool, DType::U8] {
            let b = rmp_serde::to_vec_named(&d).unwrap();
            assert_eq!(rmp_serde::from_slice::<String>(&b).unwrap(), d.name());
        }
    }
}
