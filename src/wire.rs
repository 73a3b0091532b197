//! Frames on a byte stream: a `u32` big-endian length, then one MessagePack value.
//!
//! Everything here is pure: encoding, incremental decoding that refuses an
//! oversized frame before reading it, the handshake's messages and its decisions,
//! and the HMAC proof that a node holds the shared token (the token itself never
//! crosses the wire). PROTOCOL.md describes the same thing for other languages.

use hmac::{Hmac, Mac};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use sha2::Sha256;

use crate::message::{Batch, Continue, FromNode, Seed, ToNode, UpdateWeights};
use crate::node_spec::NodeSpec;
use crate::policy::Weights;

/// Version of this protocol; a node speaking another one is rejected.
pub const PROTOCOL_VERSION: u32 = 1;
/// Default largest frame body accepted, in bytes (256 MiB).
pub const DEFAULT_MAX_FRAME: usize = 256 << 20;
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

/// Node → trainer frames.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum NodeFrame {
    /// First frame of a connection.
    Hello {
        /// Must equal [`PROTOCOL_VERSION`].
        protocol_version: u32,
        /// A name for logs (host, job id, ...).
        node_name: String,
        /// Ask for this node index (a node rejoining its slot); `None` for any free one.
        #[serde(default)]
        node_index: Option<usize>,
    },
    /// Answer to the challenge: HMAC-SHA256 proof of the token, see [`auth_proof`].
    Auth {
        /// 32 bytes.
        #[serde(with = "serde_bytes")]
        proof: Vec<u8>,
    },
    /// Liveness, both ways, every heartbeat interval.
    Heartbeat,
    /// See [`FromNode::Batch`].
    Batch(Batch),
    /// See [`FromNode::WeightsUpdated`].
    WeightsUpdated {
        /// The node.
        node: usize,
        /// The version in use.
        version: u64,
    },
    /// See [`FromNode::Seeded`].
    Seeded {
        /// The node.
        node: usize,
        /// The first unused seed.
        next_seed: u64,
    },
    /// See [`FromNode::Down`].
    Down {
        /// The node.
        node: usize,
    },
    /// See [`FromNode::Failed`].
    Failed {
        /// The node.
        node: usize,
        /// What happened.
        reason: String,
    },
}

/// What the trainer tells a node it admitted.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Welcome {
    /// The node's index, `0..nodes`.
    pub node_index: usize,
    /// How to build its env workers.
    pub spec: NodeSpec,
    /// The current weights, if the trainer has set any (else the policy's initial ones).
    pub weights: Option<Weights>,
    /// Heartbeat interval in milliseconds; a peer silent for `heartbeat_timeout_ms` is gone.
    pub heartbeat_ms: u64,
    /// Silence after which a peer is treated as gone, in milliseconds.
    pub heartbeat_timeout_ms: u64,
    /// Largest frame body either side sends or accepts.
    pub max_frame: u64,
}

/// Trainer → node frames.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum TrainerFrame {
    /// Answer to `Hello`: prove you hold the token.
    Challenge {
        /// [`NONCE_LEN`] random bytes.
        #[serde(with = "serde_bytes")]
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
    /// See [`ToNode::Continue`].
    Continue(Continue),
    /// See [`ToNode::UpdateWeights`].
    UpdateWeights(UpdateWeights),
    /// See [`ToNode::Seed`].
    Seed(Seed),
    /// See [`ToNode::Shutdown`].
    Shutdown,
}

impl From<ToNode> for TrainerFrame {
    fn from(m: ToNode) -> TrainerFrame {
        match m {
            ToNode::Continue(c) => TrainerFrame::Continue(c),
            ToNode::UpdateWeights(u) => TrainerFrame::UpdateWeights(u),
            ToNode::Seed(s) => TrainerFrame::Seed(s),
            ToNode::Shutdown => TrainerFrame::Shutdown,
        }
    }
}

impl TrainerFrame {
    /// The in-process message this frame carries, if it is one.
    pub fn into_to_node(self) -> Option<ToNode> {
        match self {
            TrainerFrame::Continue(c) => Some(ToNode::Continue(c)),
            TrainerFrame::UpdateWeights(u) => Some(ToNode::UpdateWeights(u)),
            TrainerFrame::Seed(s) => Some(ToNode::Seed(s)),
            TrainerFrame::Shutdown => Some(ToNode::Shutdown),
            _ => None,
        }
    }
}

impl From<FromNode> for NodeFrame {
    fn from(m: FromNode) -> NodeFrame {
        match m {
            FromNode::Batch(b) => NodeFrame::Batch(b),
            FromNode::WeightsUpdated { node, version } => NodeFrame::WeightsUpdated { node, version },
            FromNode::Seeded { node, next_seed } => NodeFrame::Seeded { node, next_seed },
            FromNode::Down { node } => NodeFrame::Down { node },
            FromNode::Failed { node, reason } => NodeFrame::Failed { node, reason },
        }
    }
}

impl NodeFrame {
    /// The in-process message this frame carries, if it is one.
    pub fn into_from_node(self) -> Option<FromNode> {
        match self {
            NodeFrame::Batch(b) => Some(FromNode::Batch(b)),
            NodeFrame::WeightsUpdated { node, version } => Some(FromNode::WeightsUpdated { node, version }),
            NodeFrame::Seeded { node, next_seed } => Some(FromNode::Seeded { node, next_seed }),
            NodeFrame::Down { node } => Some(FromNode::Down { node }),
            NodeFrame::Failed { node, reason } => Some(FromNode::Failed { node, reason }),
            _ => None,
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

/// Decodes a frame body (without its prefix).
pub fn decode<T: DeserializeOwned>(body: &[u8]) -> Result<T, WireError> {
    if body.is_empty() {
        return Err(WireError::Empty);
    }
    rmp_serde::from_slice(body).map_err(|e| WireError::Decode(e.to_string()))
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

/// What the trainer does next in a handshake.
#[derive(Clone, Debug, PartialEq)]
pub enum HandshakeStep {
    /// Send this frame and wait for the next one.
    Send(TrainerFrame),
    /// The node proved the token; admit it (or not) by index.
    Authenticated {
        /// Its name.
        node_name: String,
        /// The index it asked for.
        node_index: Option<usize>,
    },
    /// Send `Reject { reason }` and close.
    Reject(String),
}

/// The trainer's side of one connection's handshake, as a state machine.
#[derive(Debug)]
pub struct TrainerHandshake {
    token: Vec<u8>,
    nonce: Vec<u8>,
    hello: Option<(String, Option<usize>)>,
    done: bool,
}

impl TrainerHandshake {
    /// A handshake that will challenge with `nonce` (random, [`NONCE_LEN`] bytes).
    pub fn new(token: &[u8], nonce: Vec<u8>) -> TrainerHandshake {
        TrainerHandshake {
            token: token.to_vec(),
            nonce,
            hello: None,
            done: false,
        }
    }

    /// Feeds the next frame body the node sent.
    pub fn on_frame(&mut self, body: &[u8]) -> HandshakeStep {
        if self.done {
            return HandshakeStep::Reject("handshake already finished".into());
        }
        let frame: NodeFrame = match decode(body) {
            Ok(f) => f,
            Err(e) => {
                self.done = true;
                return HandshakeStep::Reject(format!("malformed handshake frame: {e}"));
            }
        };
        match (&self.hello, frame) {
            (
                None,
                NodeFrame::Hello {
                    protocol_version,
                    node_name,
                    node_index,
                },
            ) => {
                if protocol_version != PROTOCOL_VERSION {
                    self.done = true;
                    return HandshakeStep::Reject(format!(
                        "protocol version {protocol_version} is not supported (this trainer speaks {PROTOCOL_VERSION})"
                    ));
                }
                if node_name.len() > 256 {
                    self.done = true;
                    return HandshakeStep::Reject("node name longer than 256 bytes".into());
                }
                self.hello = Some((node_name, node_index));
                HandshakeStep::Send(TrainerFrame::Challenge {
                    nonce: self.nonce.clone(),
                })
            }
            (Some((name, index)), NodeFrame::Auth { proof }) => {
                self.done = true;
                if verify_proof(&self.token, &self.nonce, name, &proof) {
                    HandshakeStep::Authenticated {
                        node_name: name.clone(),
                        node_index: *index,
                    }
                } else {
                    HandshakeStep::Reject("authentication failed: wrong token".into())
                }
            }
            (None, other) => {
                self.done = true;
                HandshakeStep::Reject(format!("expected hello, got {}", frame_name(&other)))
            }
            (Some(_), other) => {
                self.done = true;
                HandshakeStep::Reject(format!("expected auth, got {}", frame_name(&other)))
            }
        }
    }
}

fn frame_name(f: &NodeFrame) -> &'static str {
    match f {
        NodeFrame::Hello { .. } => "hello",
        NodeFrame::Auth { .. } => "auth",
        NodeFrame::Heartbeat => "heartbeat",
        NodeFrame::Batch(_) => "batch",
        NodeFrame::WeightsUpdated { .. } => "weights_updated",
        NodeFrame::Seeded { .. } => "seeded",
        NodeFrame::Down { .. } => "down",
        NodeFrame::Failed { .. } => "failed",
    }
}

/// Which node slots are taken; decides admission of authenticated nodes.
#[derive(Clone, Debug)]
pub struct Admission {
    taken: Vec<bool>,
}

impl Admission {
    /// Slots for `nodes` nodes, all free.
    pub fn new(nodes: usize) -> Admission {
        Admission {
            taken: vec![false; nodes],
        }
    }

    /// Gives the node its asked-for slot, or the lowest free one; or says why not.
    pub fn admit(&mut self, requested: Option<usize>) -> Result<usize, String> {
        let n = self.taken.len();
        let slot = match requested {
            Some(i) if i >= n => return Err(format!("node index {i} does not exist (the trainer expects {n} nodes)")),
            Some(i) if self.taken[i] => return Err(format!("node index {i} is already taken")),
            Some(i) => i,
            None => match self.taken.iter().position(|t| !t) {
                Some(i) => i,
                None => return Err(format!("all {n} node slots are taken")),
            },
        };
        self.taken[slot] = true;
        Ok(slot)
    }

    /// Frees a slot (its node left).
    pub fn release(&mut self, slot: usize) {
        if let Some(t) = self.taken.get_mut(slot) {
            *t = false;
        }
    }

    /// True when every slot is taken.
    pub fn full(&self) -> bool {
        self.taken.iter().all(|t| *t)
    }

    /// Number of slots taken.
    pub fn count(&self) -> usize {
        self.taken.iter().filter(|t| **t).count()
    }
}
