//! The trainer's side of a remote node: an actor that is, to the trainer, just
//! another recipient of `ToNode` messages.
//!
//! It encodes what the trainer sends, decodes what the node sends, checks that the
//! node speaks only for itself, keeps the heartbeat, and turns any protocol
//! violation, silence or disconnect into a logged reason and a `Failed` message.

use std::cell::RefCell;
use std::rc::Rc;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use actix::prelude::*;
use bytes::Bytes;
use rollout::message::{FromNode, ToNode};
use rollout::pool::TensorPool;
use rollout::wire::{self, NodeFrame, TrainerFrame};

use super::frames::{FrameError, SharedPool};
use super::link::FrameSender;
use super::parts;
use crate::messages::{FromNodeMsg, Recycle, ToNodeMsg};

/// Encoded `UpdateWeights` frames by version, shared by every peer: one version is
/// encoded once and the same bytes go to every node.
#[derive(Clone, Default)]
pub struct WeightsCache(Arc<Mutex<Option<Encoded>>>);

/// A version and its frame's parts.
type Encoded = (u64, Vec<Bytes>);

impl WeightsCache {
    /// The frame for `msg`, in parts to be written one after the other; an
    /// `UpdateWeights` is encoded only if its version is new.
    ///
    /// The tensors of an update are not copied into the frame: their parts are
    /// their own memory (kept alive by the shared `Arc<Weights>`), between small
    /// parts holding the frame's prefix and MessagePack headers.
    pub fn frame(&self, msg: &ToNode, max: usize) -> Result<Vec<Bytes>, wire::WireError> {
        let ToNode::UpdateWeights(u) = msg else {
            return Ok(vec![Bytes::from(wire::encode(&TrainerFrame::from(msg.clone()), max)?)]);
        };
        let version = u.weights.version;
        let mut slot = self.0.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((v, parts)) = slot.as_ref() {
            if *v == version {
                return Ok(parts.clone());
            }
        }
        let (keys, blobs) = parts::blobs(u.weights.tensors.iter().map(|(k, t)| (k.as_str(), t)));
        let encoded = wire::encode_parts(&TrainerFrame::from(msg.clone()), max, &blobs)?;
        let parts = parts::to_bytes(encoded, &keys, &u.weights);
        *slot = Some((version, parts.clone()));
        Ok(parts)
    }
}

/// Close this connection, logging `reason`.
#[derive(Message, Debug)]
#[rtype(result = "()")]
pub struct Disconnect(pub String);

/// Settings of a peer connection.
#[derive(Clone, Copy, Debug)]
pub struct PeerTiming {
    /// How often a heartbeat goes out.
    pub heartbeat: Duration,
    /// Silence after which the peer is gone.
    pub timeout: Duration,
    /// Largest frame body.
    pub max_frame: usize,
}

/// A remote node, seen from the trainer.
pub struct RemoteNode {
    index: usize,
    name: String,
    out: FrameSender,
    trainer: Recipient<FromNodeMsg>,
    weights: WeightsCache,
    timing: PeerTiming,
    last_seen: Instant,
    heartbeat: Bytes,
    closed: bool,
    down: bool,
    /// The node sent its `Ready` (its batch layout).
    ready: bool,
    /// Storage of this node's recycled batches, which its next batches are read into.
    pool: SharedPool,
}

impl RemoteNode {
    /// A peer for node `index` writing through `out`.
    pub fn new(
        index: usize,
        name: String,
        out: FrameSender,
        trainer: Recipient<FromNodeMsg>,
        weights: WeightsCache,
        timing: PeerTiming,
    ) -> RemoteNode {
        let heartbeat = Bytes::from(wire::encode(&TrainerFrame::Heartbeat, usize::MAX).unwrap_or_default());
        RemoteNode {
            index,
            name,
            out,
            trainer,
            weights,
            timing,
            last_seen: Instant::now(),
            heartbeat,
            closed: false,
            down: false,
            ready: false,
            pool: Rc::new(RefCell::new(TensorPool::new(timing.max_frame))),
        }
    }

    fn close(&mut self, ctx: &mut Context<Self>, reason: String) {
        if self.closed {
            return;
        }
        self.closed = true;
        if self.down {
            tracing::debug!(node = self.index, name = %self.name, %reason, "connection closed after Down");
        } else {
            tracing::warn!(node = self.index, name = %self.name, %reason, "closing connection to node");
            self.trainer.do_send(FromNodeMsg(FromNode::Failed {
                node: self.index,
                reason: format!("connection to {}: {reason}", self.name),
            }));
        }
        ctx.stop();
    }

    /// The storage this node's frames are read into, for its
    /// [`FrameStream`](super::frames::FrameStream).
    pub fn pool(&self) -> SharedPool {
        Rc::clone(&self.pool)
    }

    fn on_frame(&mut self, frame: NodeFrame, ctx: &mut Context<Self>) {
        if let NodeFrame::Heartbeat = frame {
            return;
        }
        let Some(msg) = frame.into_from_node() else {
            return self.close(ctx, "handshake frame after the handshake".into());
        };
        if msg.node() != self.index {
            return self.close(
                ctx,
                format!("node {} sent a message as node {}", self.index, msg.node()),
            );
        }
        match &msg {
            FromNode::Down { .. } => self.down = true,
            FromNode::Ready { .. } if self.ready => return self.close(ctx, "a second Ready".into()),
            FromNode::Ready { .. } => self.ready = true,
            FromNode::Batch(_) if !self.ready => {
                return self.close(ctx, "a Batch before Ready (the node's batch layout)".into())
            }
            _ => {}
        }
        self.trainer.do_send(FromNodeMsg(msg));
    }
}

impl Actor for RemoteNode {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Self::Context) {
        ctx.run_interval(self.timing.heartbeat, |act, ctx| {
            if act.last_seen.elapsed() > act.timeout() {
                let secs = act.timeout().as_secs_f64();
                act.close(ctx, format!("no frame for {secs:.1} s (heartbeat timeout)"));
                return;
            }
            let _ = act.out.send(act.heartbeat.clone());
        });
    }
}

impl RemoteNode {
    fn timeout(&self) -> Duration {
        self.timing.timeout
    }
}

impl StreamHandler<Result<NodeFrame, FrameError>> for RemoteNode {
    fn handle(&mut self, item: Result<NodeFrame, FrameError>, ctx: &mut Self::Context) {
        self.last_seen = Instant::now();
        match item {
            Ok(frame) => self.on_frame(frame, ctx),
            Err(e) => self.close(ctx, e.to_string()),
        }
    }

    fn finished(&mut self, ctx: &mut Self::Context) {
        self.close(ctx, "the node closed the connection".into());
    }
}

impl Handler<Recycle> for RemoteNode {
    type Result = ();

    /// A batch of this node the consumer is done with: its storage takes the next one.
    fn handle(&mut self, msg: Recycle, _ctx: &mut Self::Context) {
        self.pool.borrow_mut().put_dict(msg.data);
    }
}

impl Handler<ToNodeMsg> for RemoteNode {
    type Result = ();

    fn handle(&mut self, msg: ToNodeMsg, ctx: &mut Self::Context) {
        if self.closed {
            return;
        }
        match self.weights.frame(&msg.0, self.timing.max_frame) {
            Ok(parts) => {
                // One after the other through the one sender only this actor uses:
                // they reach the socket back to back.
                for part in parts {
                    if self.out.send(part).is_err() {
                        return self.close(ctx, "the connection's writer is gone".into());
                    }
                }
            }
            // The node would go on without what it was sent (say, weights over the
            // maximum frame size): it fails instead, with the reason.
            Err(e) => self.close(ctx, format!("cannot send it {}: {e}", msg.0.name())),
        }
    }
}

impl Handler<Disconnect> for RemoteNode {
    type Result = ();

    fn handle(&mut self, msg: Disconnect, ctx: &mut Self::Context) {
        self.close(ctx, msg.0);
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use ndarray::ArrayD;
    use rollout::message::UpdateWeights;
    use rollout::wire::{DEFAULT_MAX_FRAME, PREFIX_LEN};
    use rollout::{Tensor, Weights};

    use super::*;

    fn update(version: u64, value: f32) -> ToNode {
        let mut tensors = BTreeMap::new();
        tensors.insert("w".to_string(), Tensor::F32(ArrayD::from_elem(vec![2000], value)));
        ToNode::UpdateWeights(UpdateWeights {
            weights: Arc::new(Weights::new(tensors).with_version(version)),
        })
    }

    fn decoded(parts: &[Bytes]) -> ToNode {
        let frame: Vec<u8> = parts.iter().flat_map(|p| p.iter().copied()).collect();
        let f: TrainerFrame = wire::decode(&frame[PREFIX_LEN..]).expect("decodes");
        f.into_to_node().expect("a node message")
    }

    #[test]
    fn one_encoding_per_version_with_the_tensors_memory_not_copied() {
        let cache = WeightsCache::default();
        let msg = update(1, 1.0);
        let parts = cache.frame(&msg, DEFAULT_MAX_FRAME).unwrap();
        let again = cache.frame(&msg, DEFAULT_MAX_FRAME).unwrap();
        assert_eq!(parts, again);
        assert!(
            parts.iter().zip(&again).all(|(a, b)| a.as_ptr() == b.as_ptr()),
            "the same bytes for every node"
        );
        let ToNode::UpdateWeights(u) = &msg else {
            panic!("an update")
        };
        let memory = u.weights.tensors["w"].le_bytes_in_place().unwrap();
        assert!(
            parts
                .iter()
                .any(|p| p.as_ptr() == memory.as_ptr() && p.len() == memory.len()),
            "the tensor goes out from its own memory"
        );
        let plain = wire::encode(&TrainerFrame::from(msg.clone()), DEFAULT_MAX_FRAME).unwrap();
        assert_eq!(parts.concat(), plain, "byte for byte the plain encoding");
        assert_eq!(decoded(&parts), msg);
        // A new version is encoded anew; a frame still held keeps its bytes.
        let v2 = cache.frame(&update(2, 2.0), DEFAULT_MAX_FRAME).unwrap();
        assert_eq!(decoded(&v2), update(2, 2.0));
        assert_eq!(decoded(&parts), update(1, 1.0));
        // Other messages: one part.
        let seed = cache
            .frame(&ToNode::Seed(rollout::message::Seed { seed: 3 }), DEFAULT_MAX_FRAME)
            .unwrap();
        assert_eq!(seed.len(), 1);
    }
}
