//! Checkpoints: the whole state of a collection run, so a new collector can go on
//! exactly where an old one stopped (torchrl leaves `state_dict` unimplemented on
//! its distributed collectors).
//!
//! A checkpoint is taken between batches, when no node has work in flight: each
//! node reports a [`NodeState`] (every env's state and generator, the episodes in
//! progress, the weights it uses) and the trainer adds its own [`TrainerState`]
//! (frames and batches yielded, the stored weights, batches received and not yet
//! yielded). In sync mode with a seed, a run resumed from the checkpoint of batch k
//! yields batches k+1, k+2, ... bit for bit as the run that was never stopped.
//!
//! On disk: the 8 bytes `ROLLCKPT`, a big-endian `u32` format version, then one
//! MessagePack map (named fields) of [`Checkpoint`].

use std::sync::Arc;

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use crate::message::Batch;
use crate::policy::Weights;
// A node's state is what its `Snapshot` reply carries (crate::node_state); a
// checkpoint holds one per node, so the names are reachable from here too.
pub use crate::node_state::{NodeState, WorkerState};

/// First bytes of a checkpoint file.
pub const MAGIC: &[u8; 8] = b"ROLLCKPT";

/// Version of the checkpoint format this build writes and reads.
pub const FORMAT_VERSION: u32 = 1;

/// What the trainer keeps per node.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct NodeBook {
    /// Weights version last pushed to the node.
    pub pushed_version: u64,
    /// Batches the node produced since its last weight update.
    pub since_update: u64,
    /// Offset added to its trajectory ids (after restarts).
    pub traj_offset: u64,
    /// Highest trajectory id it delivered (after the offset).
    pub max_traj: Option<u64>,
}

/// The trainer's state between two batches.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TrainerState {
    /// Sync or async collection (a checkpoint resumes only in the same mode).
    pub sync: bool,
    /// Frames per batch of the run.
    pub frames_per_batch: usize,
    /// Env workers of each node.
    pub envs_per_node: Vec<usize>,
    /// Frames yielded so far.
    pub frames_yielded: u64,
    /// Batches yielded so far.
    pub batches_yielded: u64,
    /// The next `Continue` seq.
    pub next_seq: u64,
    /// Version of the stored weights.
    pub weights_version: u64,
    /// The stored weights, if any were set.
    pub weights: Option<Arc<Weights>>,
    /// Node 0's seed of the last seeding chain.
    pub chain_seed: u64,
    /// Async: every node had been sent its first `Continue`.
    pub started: bool,
    /// Async: batches received from nodes and not yet yielded, oldest first.
    pub ready: Vec<Batch>,
    /// Frames in batches accepted from nodes.
    pub frames_collected: u64,
    /// One entry per node.
    pub nodes: Vec<NodeBook>,
}

/// A whole run's state: the trainer's and every node's.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Checkpoint {
    /// The trainer.
    pub trainer: TrainerState,
    /// Every node, by index.
    pub nodes: Vec<NodeState>,
}

/// A checkpoint that cannot be read or does not fit the collector it is loaded into.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum CheckpointError {
    /// Not a checkpoint file of this kind.
    #[error("not a rollout checkpoint of this kind (the file does not start with `{expected}`)")]
    Magic {
        /// The magic bytes expected, as text.
        expected: String,
    },
    /// Written by another format version.
    #[error("checkpoint format version {found}, this build reads version {reads}")]
    Version {
        /// The version in the file.
        found: u32,
        /// The version this build reads.
        reads: u32,
    },
    /// The body does not decode.
    #[error("the checkpoint does not decode: {0}")]
    Decode(String),
    /// The body does not encode.
    #[error("the checkpoint does not encode: {0}")]
    Encode(String),
    /// It was taken from a run configured otherwise; names the setting.
    #[error("the checkpoint does not fit this collector: `{field}` {reason}")]
    Mismatch {
        /// The builder setting that differs.
        field: &'static str,
        /// How.
        reason: String,
    },
}

/// The bytes of a checkpoint-like file: 8 `magic` bytes, `version` as a big-endian `u32`,
/// then `value` as one MessagePack map (named fields). Shared by every checkpoint file kind
/// (`rollout train` and `rollout collect` wrap a [`Checkpoint`] in their own).
pub fn encode_file<T: Serialize>(magic: &[u8; 8], version: u32, value: &T) -> Result<Vec<u8>, CheckpointError> {
    let mut out = Vec::with_capacity(4096);
    out.extend_from_slice(magic);
    out.extend_from_slice(&version.to_be_bytes());
    rmp_serde::encode::write_named(&mut out, value).map_err(|e| CheckpointError::Encode(e.to_string()))?;
    Ok(out)
}

/// Reads what [`encode_file`] wrote with the same `magic` and `version`.
pub fn decode_file<T: DeserializeOwned>(magic: &[u8; 8], version: u32, bytes: &[u8]) -> Result<T, CheckpointError> {
    let not_it = || CheckpointError::Magic {
        expected: String::from_utf8_lossy(magic).into_owned(),
    };
    let rest = bytes.strip_prefix(magic.as_slice()).ok_or_else(not_it)?;
    let (found, body) = rest.split_first_chunk::<4>().ok_or_else(not_it)?;
    let found = u32::from_be_bytes(*found);
    if found != version {
        return Err(CheckpointError::Version { found, reads: version });
    }
    rmp_serde::from_slice(body).map_err(|e| CheckpointError::Decode(e.to_string()))
}

impl Checkpoint {
    /// The file's bytes: magic, format version, MessagePack body.
    pub fn to_bytes(&self) -> Result<Vec<u8>, CheckpointError> {
        encode_file(MAGIC, FORMAT_VERSION, self)
    }

    /// Reads what [`Self::to_bytes`] wrote, checking magic, version and structure.
    pub fn from_bytes(bytes: &[u8]) -> Result<Checkpoint, CheckpointError> {
        let c: Checkpoint = decode_file(MAGIC, FORMAT_VERSION, bytes)?;
        c.check_shape()?;
        Ok(c)
    }

    /// Internal consistency: one node state per node, in order, its workers' envs the node's.
    fn check_shape(&self) -> Result<(), CheckpointError> {
        let t = &self.trainer;
        let n = t.envs_per_node.len();
        let bad = |field, reason: String| Err(CheckpointError::Mismatch { field, reason });
        if self.nodes.len() != n || t.nodes.len() != n {
            return bad(
                "nodes",
                format!(
                    "is inconsistent inside the checkpoint: {n} env counts, {} node states, {} node books",
                    self.nodes.len(),
                    t.nodes.len()
                ),
            );
        }
        for (i, s) in self.nodes.iter().enumerate() {
            if s.node != i {
                return bad("nodes", format!("entry {i} holds node {}", s.node));
            }
            if s.workers.is_empty() || s.num_envs() != t.envs_per_node[i] {
                return bad(
                    "envs_per_node",
                    format!(
                        "node {i} has {} worker states of {} envs in all for {} envs",
                        s.workers.len(),
                        s.num_envs(),
                        t.envs_per_node[i]
                    ),
                );
            }
        }
        // Counters of a real run stay far below 2^63; beyond, arithmetic would overflow.
        let limit = i64::MAX as u64;
        let counters = [
            ("frames_yielded", t.frames_yielded),
            ("batches_yielded", t.batches_yielded),
            ("next_seq", t.next_seq),
            ("weights_version", t.weights_version),
            ("frames_collected", t.frames_collected),
        ];
        if let Some((name, v)) = counters.iter().find(|(_, v)| *v > limit) {
            return bad("resume", format!("holds {name} = {v}, out of range"));
        }
        for (i, b) in t.nodes.iter().enumerate() {
            if b.traj_offset > limit || b.max_traj.is_some_and(|m| m > limit) || b.since_update > limit {
                return bad("resume", format!("holds out-of-range counters for node {i}"));
            }
        }
        for b in &t.ready {
            if b.node >= n {
                return bad("nodes", format!("a pending batch names node {}", b.node));
            }
            let bs = b.data.batch_size();
            if bs.len() != 2 || bs[0] != t.envs_per_node[b.node] || bs[0].checked_mul(bs[1]) != Some(t.frames_per_batch)
            {
                return bad(
                    "frames_per_batch",
                    format!("a pending batch of node {} has batch shape {bs:?}", b.node),
                );
            }
        }
        Ok(())
    }

    /// Checks that this checkpoint is whole (one state per node and per env, pending
    /// batches of the right nodes and shapes) and can resume a collector of
    /// `envs_per_node.len()` nodes with `envs_per_node`, `frames_per_batch` and `sync`,
    /// that has not yielded more than `total_frames`. Names the first setting that differs.
    pub fn check_fits(
        &self,
        sync: bool,
        frames_per_batch: usize,
        envs_per_node: &[usize],
        total_frames: Option<u64>,
    ) -> Result<(), CheckpointError> {
        self.check_shape()?;
        let t = &self.trainer;
        let bad = |field, reason: String| Err(CheckpointError::Mismatch { field, reason });
        if t.envs_per_node.len() != envs_per_node.len() {
            return bad(
                "nodes",
                format!(
                    "is {}, the checkpoint has {}",
                    envs_per_node.len(),
                    t.envs_per_node.len()
                ),
            );
        }
        if t.envs_per_node != envs_per_node {
            return bad(
                "envs_per_node",
                format!("is {envs_per_node:?}, the checkpoint has {:?}", t.envs_per_node),
            );
        }
        if t.sync != sync {
            return bad("sync", format!("is {sync}, the checkpoint was taken with {}", t.sync));
        }
        if t.frames_per_batch != frames_per_batch {
            return bad(
                "frames_per_batch",
                format!("is {frames_per_batch}, the checkpoint has {}", t.frames_per_batch),
            );
        }
        if let Some(total) = total_frames {
            if total < t.frames_yielded {
                return bad(
                    "total_frames",
                    format!("is {total}, but the checkpoint already yielded {}", t.frames_yielded),
                );
            }
        }
        Ok(())
    }
}
