//! The trainer's side of a remote node: an actor that is, to the trainer, just
//! another recipient of `ToNode` messages.
//!
//! It moves bytes and fires the heartbeat timer: what the node's frames mean, when
//! a heartbeat is due and when the node is gone is decided by its
//! [`TrainerSession`] (the protocol's rules, in the core), and any violation,
//! silence or disconnect becomes a logged reason and a `Failed` message.

use std::cell::RefCell;
use std::rc::Rc;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use actix::prelude::*;
use bytes::Bytes;
use rollout::connection::{Inbound, TrainerSession};
use rollout::message::{FromNode, ToNode};
use rollout::pool::TensorPool;
use rollout::wire::{self, NodeFrame};

use super::frames::{FrameError, SharedPool};
use super::link::FrameSender;
use super::parts;
use crate::messages::{Deliver, Recycle};

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
        // A session message is its own frame (`TrainerFrame::Message` encodes as
        // the message): encoded as it is, nothing cloned.
        let u = match msg {
            ToNode::UpdateWeights(u) => u,
            // One per node per round: encoded without serde.
            ToNode::Continue(c) => return Ok(vec![Bytes::from(wire::encode_continue(c, max)?)]),
            _ => return Ok(vec![Bytes::from(wire::encode(msg, max)?)]),
        };
        let version = u.weights.version;
        let mut slot = self.0.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((v, parts)) = slot.as_ref() {
            if *v == version {
                return Ok(parts.clone());
            }
        }
        let (keys, blobs) = parts::blobs(u.weights.tensors.iter().map(|(k, t)| (k.as_str(), t)));
        let encoded = wire::encode_parts(msg, max, &blobs)?;
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
    name: String,
    out: FrameSender,
    trainer: Recipient<Deliver<FromNode>>,
    weights: WeightsCache,
    max_frame: usize,
    /// The protocol's state and rules for this connection.
    session: TrainerSession,
    heartbeat: Bytes,
    /// Storage of this node's recycled batches, which its next batches are read into.
    pool: SharedPool,
    /// Called once the actor stopped (an elastic run frees the node's slot): after its
    /// last message to the trainer, so a node joining the slot next is heard after it.
    on_stop: Option<Box<dyn FnOnce()>>,
}

impl RemoteNode {
    /// A peer for node `index` writing through `out`.
    pub fn new(
        index: usize,
        name: String,
        out: FrameSender,
        trainer: Recipient<Deliver<FromNode>>,
        weights: WeightsCache,
        timing: PeerTiming,
    ) -> RemoteNode {
        RemoteNode {
            session: TrainerSession::new(index, name.clone(), timing.heartbeat, timing.timeout, Instant::now()),
            name,
            out,
            trainer,
            weights,
            max_frame: timing.max_frame,
            heartbeat: super::listener::heartbeat_frame(),
            pool: Rc::new(RefCell::new(TensorPool::new(timing.max_frame))),
            on_stop: None,
        }
    }

    /// Calls `f` once this actor stopped, its connection closed and its last message
    /// to the trainer sent.
    pub fn on_stop(mut self, f: impl FnOnce() + 'static) -> RemoteNode {
        self.on_stop = Some(Box::new(f));
        self
    }

    fn close(&mut self, ctx: &mut Context<Self>, reason: String) {
        let Some(closing) = self.session.close(reason) else {
            return;
        };
        let (node, reason) = (self.session.index(), &closing.reason);
        match closing.failed {
            None => tracing::debug!(node, name = %self.name, %reason, "connection closed after Down or Leave"),
            Some(failed) => {
                tracing::warn!(node, name = %self.name, %reason, "closing connection to node");
                self.trainer.do_send(Deliver(failed));
            }
        }
        ctx.stop();
    }

    /// The storage this node's frames are read into, for its
    /// [`FrameStream`](super::frames::FrameStream).
    pub fn pool(&self) -> SharedPool {
        Rc::clone(&self.pool)
    }
}

impl Actor for RemoteNode {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Self::Context) {
        self.next_beat(ctx);
    }

    fn stopped(&mut self, _ctx: &mut Self::Context) {
        if let Some(f) = self.on_stop.take() {
            f();
        }
    }
}

impl RemoteNode {
    /// Schedules the next heartbeat (and silence check) on the next beat of the
    /// shared clock ([`until_next_beat`]).
    fn next_beat(&self, ctx: &mut Context<Self>) {
        let every = self.session.heartbeat();
        ctx.run_later(until_next_beat(Instant::now(), every), |act, ctx| {
            match act.session.on_tick(Instant::now()) {
                Ok(()) => {
                    let _ = act.out.send(act.heartbeat.clone());
                    act.next_beat(ctx);
                }
                Err(reason) => act.close(ctx, reason),
            }
        });
    }
}

/// How long from `now` to the next multiple of `every` on one clock shared by every
/// connection of the process: the trainer's heartbeats to all its nodes fall on the
/// same beats, so one wakeup sends them all (a timer per connection, each on its own
/// phase, woke the trainer, and every node behind it, once per node and interval).
/// Each connection still hears a heartbeat every `every`.
pub(super) fn until_next_beat(now: Instant, every: Duration) -> Duration {
    static EPOCH: OnceLock<Instant> = OnceLock::new();
    beat_delay(*EPOCH.get_or_init(Instant::now), now, every)
}

/// From `now` to the next `epoch + k * every`.
fn beat_delay(epoch: Instant, now: Instant, every: Duration) -> Duration {
    let every_ns = every.as_nanos().max(1);
    let phase = now.saturating_duration_since(epoch).as_nanos() % every_ns;
    Duration::from_nanos(u64::try_from(every_ns - phase).unwrap_or(u64::MAX))
}

impl StreamHandler<Result<NodeFrame, FrameError>> for RemoteNode {
    fn handle(&mut self, item: Result<NodeFrame, FrameError>, ctx: &mut Self::Context) {
        let frame = match item {
            Ok(frame) => frame,
            Err(e) => return self.close(ctx, e.to_string()),
        };
        match self.session.on_frame(frame, Instant::now()) {
            Inbound::Deliver(msg @ FromNode::Leave { .. }) => {
                // The node left: the trainer hears it, then the connection is closed.
                tracing::info!(node = self.session.index(), name = %self.name, "node left");
                self.trainer.do_send(Deliver(msg));
                self.close(ctx, "the node left".into());
            }
            Inbound::Deliver(msg) => self.trainer.do_send(Deliver(msg)),
            // A trainer's session never asks it to answer a heartbeat.
            Inbound::Nothing | Inbound::Answer => {}
            Inbound::Close(reason) => self.close(ctx, reason),
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

impl Handler<Deliver<ToNode>> for RemoteNode {
    type Result = ();

    fn handle(&mut self, msg: Deliver<ToNode>, ctx: &mut Self::Context) {
        if self.session.is_closed() {
            return;
        }
        match self.weights.frame(&msg.0, self.max_frame) {
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
    use rollout::wire::TrainerFrame;

    fn update(version: u64, value: f32) -> ToNode {
        let mut tensors = BTreeMap::new();
        tensors.insert("w".to_string(), Tensor::F32(ArrayD::from_elem(vec![2000], value)));
        ToNode::UpdateWeights(UpdateWeights {
            weights: Arc::new(Weights::new(tensors).with_version(version)),
        })
    }

    fn decoded(parts: &[Bytes]) -> ToNode {
        let frame: Vec<u8> = parts.iter().flat_map(|p| p.iter().copied()).collect();
        match wire::decode(&frame[PREFIX_LEN..]).expect("decodes") {
            TrainerFrame::Message(m) => m,
            other => panic!("a session message, not {}", other.name()),
        }
    }

    #[test]
    fn heartbeats_fall_on_the_beats_of_one_clock_an_interval_apart() {
        let every = Duration::from_millis(1000);
        let epoch = Instant::now();
        let ms = Duration::from_millis;
        assert_eq!(
            beat_delay(epoch, epoch, every),
            every,
            "on a beat: the next is a whole interval away"
        );
        assert_eq!(
            beat_delay(epoch, epoch + ms(300), every),
            ms(700),
            "a connection started later: the same beat"
        );
        assert_eq!(
            beat_delay(epoch, epoch + ms(1002), every),
            ms(998),
            "a timer fired late does not drift"
        );
        assert_eq!(
            beat_delay(epoch + ms(5), epoch, every),
            every,
            "before the epoch: one interval"
        );
        let first = until_next_beat(Instant::now(), every);
        assert!(first > Duration::ZERO && first <= every, "{first:?}");
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
        let plain = wire::encode(&TrainerFrame::Message(msg.clone()), DEFAULT_MAX_FRAME).unwrap();
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
