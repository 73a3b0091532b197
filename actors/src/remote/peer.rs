//! The trainer's side of a remote node: an actor that is, to the trainer, just
//! another recipient of `ToNode` messages.
//!
//! It encodes what the trainer sends, decodes what the node sends, checks that the
//! node speaks only for itself, keeps the heartbeat, and turns any protocol
//! violation, silence or disconnect into a logged reason and a `Failed` message.

use std::io;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use actix::prelude::*;
use bytes::{Bytes, BytesMut};
use rollout::message::{FromNode, ToNode};
use rollout::policy::Weights;
use rollout::pool::TensorPool;
use rollout::wire::{self, NodeFrame, TrainerFrame};
use tokio::sync::mpsc::UnboundedSender;

use crate::messages::{FromNodeMsg, Recycle, ToNodeMsg};

/// Encoded `UpdateWeights` frames by version, shared by every peer: one version is
/// encoded once and the same bytes go to every node.
#[derive(Clone, Default)]
pub struct WeightsCache(Arc<Mutex<Option<(u64, Bytes)>>>);

impl WeightsCache {
    /// The frame for `msg` (an `UpdateWeights`), encoding it only if this version is new.
    ///
    /// A new version is encoded into the previous version's buffer when no writer
    /// holds that any more, sized up front otherwise: tens of megabytes written into
    /// memory already mapped, instead of into a vector grown by doubling.
    pub fn frame(&self, msg: &ToNode, max: usize) -> Result<Bytes, wire::WireError> {
        let ToNode::UpdateWeights(u) = msg else {
            return wire::encode(&TrainerFrame::from(msg.clone()), max).map(Bytes::from);
        };
        let version = u.weights.version;
        let mut slot = self.0.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((v, bytes)) = slot.as_ref() {
            if *v == version {
                return Ok(bytes.clone());
            }
        }
        let mut buf = match slot.take().map(|(_, old)| old.try_into_mut()) {
            Some(Ok(unique)) => Vec::from(unique),
            _ => Vec::new(),
        };
        buf.clear();
        buf.reserve(encoded_len_hint(&u.weights));
        wire::encode_into(&TrainerFrame::from(msg.clone()), max, &mut buf)?;
        let bytes = Bytes::from(buf);
        *slot = Some((version, bytes.clone()));
        Ok(bytes)
    }
}

/// About the encoded size of `weights`: every tensor's data plus room for its
/// name and header. Only a capacity hint; the encoder grows the buffer if short.
fn encoded_len_hint(weights: &Weights) -> usize {
    let header = 64;
    weights
        .tensors
        .iter()
        .map(|(name, t)| name.len() + t.len() * t.dtype().size() + header)
        .sum::<usize>()
        + header
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
    out: UnboundedSender<Bytes>,
    trainer: Recipient<FromNodeMsg>,
    weights: WeightsCache,
    timing: PeerTiming,
    last_seen: Instant,
    heartbeat: Bytes,
    closed: bool,
    down: bool,
    /// The node sent its `Ready` (its batch layout).
    ready: bool,
    /// Storage of this node's recycled batches, which its next batches decode into.
    pool: TensorPool,
}

impl RemoteNode {
    /// A peer for node `index` writing through `out`.
    pub fn new(
        index: usize,
        name: String,
        out: UnboundedSender<Bytes>,
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
            pool: TensorPool::new(timing.max_frame),
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

    fn on_frame(&mut self, body: &[u8], ctx: &mut Context<Self>) {
        let frame: NodeFrame = match wire::decode_pooled(body, &mut self.pool) {
            Ok(f) => f,
            Err(e) => return self.close(ctx, format!("bad frame: {e}")),
        };
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

impl StreamHandler<Result<BytesMut, io::Error>> for RemoteNode {
    fn handle(&mut self, item: Result<BytesMut, io::Error>, ctx: &mut Self::Context) {
        self.last_seen = Instant::now();
        match item {
            Ok(body) => self.on_frame(&body, ctx),
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
        self.pool.put_dict(msg.data);
    }
}

impl Handler<ToNodeMsg> for RemoteNode {
    type Result = ();

    fn handle(&mut self, msg: ToNodeMsg, ctx: &mut Self::Context) {
        if self.closed {
            return;
        }
        match self.weights.frame(&msg.0, self.timing.max_frame) {
            Ok(frame) => {
                if self.out.send(frame).is_err() {
                    self.close(ctx, "the connection's writer is gone".into());
                }
            }
            Err(e) => tracing::error!(node = self.index, error = %e, "cannot encode a message for the node"),
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
    use rollout::Tensor;

    use super::*;

    fn update(version: u64, value: f32) -> ToNode {
        let mut tensors = BTreeMap::new();
        tensors.insert("w".to_string(), Tensor::F32(ArrayD::from_elem(vec![1000], value)));
        ToNode::UpdateWeights(UpdateWeights {
            weights: Arc::new(Weights::new(tensors).with_version(version)),
        })
    }

    fn decoded(frame: &Bytes) -> ToNode {
        let f: TrainerFrame = wire::decode(&frame[PREFIX_LEN..]).expect("decodes");
        f.into_to_node().expect("a node message")
    }

    #[test]
    fn one_encoding_per_version_and_a_held_frame_is_never_overwritten() {
        let cache = WeightsCache::default();
        let v1 = cache.frame(&update(1, 1.0), DEFAULT_MAX_FRAME).unwrap();
        let again = cache.frame(&update(1, 1.0), DEFAULT_MAX_FRAME).unwrap();
        assert_eq!(v1.as_ptr(), again.as_ptr(), "the same bytes for every node");
        drop(again);
        // v1 still held (a writer has it queued): v2 goes into new memory.
        let v2 = cache.frame(&update(2, 2.0), DEFAULT_MAX_FRAME).unwrap();
        assert_ne!(v1.as_ptr(), v2.as_ptr());
        assert_eq!(decoded(&v1), update(1, 1.0));
        assert_eq!(decoded(&v2), update(2, 2.0));
        // Nobody holds v2 any more: v3 reuses its buffer.
        let v2_at = v2.as_ptr();
        drop(v2);
        let v3 = cache.frame(&update(3, 3.0), DEFAULT_MAX_FRAME).unwrap();
        assert_eq!(v3.as_ptr(), v2_at, "encoded into the released buffer");
        assert_eq!(decoded(&v3), update(3, 3.0));
        assert_eq!(decoded(&v1), update(1, 1.0));
    }
}
