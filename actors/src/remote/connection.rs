//! One remote node's connection as the trainer uses it: where its frames go out,
//! the storage its batches are read into, and the protocol state its reader and its
//! actor share.
//!
//! Why shared and not behind an actor's mailbox: a small node-batch crosses the
//! connection three times a round (the batch in, the next `continue` out, the spent
//! batch back to its storage). As messages to a connection actor each crossing cost
//! a mailbox push, a task wake-up and a poll of that actor's context, whose state is
//! cold when a thousand connections are visited once a round: the largest
//! per-connection cost of the trainer's thread. The trainer's actor now calls the
//! connection directly, on its own thread, and reads every connection's frames
//! itself (the `Inbox`); the connection's actor ([`RemoteNode`](super::peer::RemoteNode))
//! keeps what is not per batch: heartbeats, silence, and stopping.

use std::cell::{Cell, RefCell};
use std::rc::Rc;
use std::sync::{Arc, Mutex};
use std::task::Waker;
use std::time::Instant;

use actix::prelude::*;
use actix::WeakRecipient;
use bytes::Bytes;
use rollout::connection::{Inbound, LogBudget, TrainerSession};
use rollout::message::{FromNode, ToNode};
use rollout::pool::TensorPool;
use rollout::wire::{self, NodeFrame};
use rollout::TensorDict;

use super::frames::SharedPool;
use super::link::FrameSender;
use super::parts;
use super::timing::{heartbeat_frame, PeerTiming};

/// Close this connection, logging `reason` (to its actor: it stops).
#[derive(Message, Debug)]
#[rtype(result = "()")]
pub(crate) struct Disconnect(pub String);

/// Encoded `UpdateWeights` frames by version, shared by every connection: one
/// version is encoded once and the same bytes go to every node.
#[derive(Clone, Default)]
pub(crate) struct WeightsCache(Arc<Mutex<Option<Encoded>>>);

/// A version and its frame's parts.
type Encoded = (u64, Vec<Bytes>);

impl WeightsCache {
    /// The frame for `msg`, in parts to be written one after the other; an
    /// `UpdateWeights` is encoded only if its version is new.
    ///
    /// The tensors of an update are not copied into the frame: their parts are
    /// their own memory (kept alive by the shared `Arc<Weights>`), between small
    /// parts holding the frame's prefix and MessagePack headers.
    pub(crate) fn frame(&self, msg: &ToNode, max: usize) -> Result<Vec<Bytes>, wire::WireError> {
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

/// How a connection tells the trainer it failed: called once, with the node's
/// `Failed`, at the close (the trainer's inbox queues it behind the node's frames).
pub(crate) type FailureReport = Box<dyn Fn(FromNode)>;

/// A remote node's connection, shared on the trainer's thread by the trainer's
/// actor (sends, recycles, closes), the connection's reader in the trainer's `Inbox` (frames
/// in) and the connection's actor (heartbeats, silence).
pub(crate) struct Connection {
    name: String,
    /// The protocol's state and rules for this connection.
    session: RefCell<TrainerSession>,
    /// Taken at the close: the writer task ends, the socket's write side shuts.
    out: RefCell<Option<FrameSender>>,
    weights: WeightsCache,
    max_frame: usize,
    heartbeat: Bytes,
    /// Storage of this node's recycled batches, which its next batches are read into.
    pool: SharedPool,
    /// How the trainer hears of the connection's failure (the node's `Failed`).
    report: FailureReport,
    /// The reader's waker: a close wakes it, and it ends (dropping the read side).
    reader: RefCell<Option<Waker>>,
    /// The connection's actor, told to stop at the close.
    actor: WeakRecipient<Disconnect>,
    /// Bytes read from the node (counted by its frame reader) not yet taken.
    bytes_in: Rc<Cell<u64>>,
    /// Bytes handed to the writer not yet taken.
    bytes_out: Cell<u64>,
    /// What this node may still make the trainer log (see [`Connection::may_log`]).
    log: RefCell<LogBudget>,
}

impl Connection {
    /// Node `index`'s connection, named `name`, writing through `out`; its failure is
    /// told to the trainer through `report`, and `actor` stops when it closes.
    pub(crate) fn new(
        index: usize,
        name: String,
        out: FrameSender,
        weights: WeightsCache,
        timing: PeerTiming,
        report: FailureReport,
        actor: WeakRecipient<Disconnect>,
    ) -> Connection {
        Connection {
            session: RefCell::new(TrainerSession::new(
                index,
                name.clone(),
                timing.heartbeat,
                timing.timeout,
                Instant::now(),
            )),
            name,
            out: RefCell::new(Some(out)),
            weights,
            max_frame: timing.max_frame,
            heartbeat: heartbeat_frame(),
            pool: Rc::new(RefCell::new(TensorPool::new(timing.max_frame))),
            report,
            reader: RefCell::new(None),
            actor,
            bytes_in: Rc::new(Cell::new(0)),
            bytes_out: Cell::new(0),
            log: RefCell::new(LogBudget::default()),
        }
    }

    /// The node's name, as shown (bounded and escaped at the door).
    pub(crate) fn name(&self) -> &str {
        &self.name
    }

    /// A line of `text_len` bytes about a message of this node's is to be logged:
    /// whether it may be, within the connection's budget
    /// ([`LogBudget::PER_CONNECTION`]); the lines held back are counted at the close.
    pub(crate) fn may_log(&self, text_len: usize) -> bool {
        self.log.borrow_mut().spend(text_len)
    }

    /// The node's index.
    pub(crate) fn index(&self) -> usize {
        self.session.borrow().index()
    }

    /// The connection was closed: nothing more goes out or comes in.
    pub(crate) fn is_closed(&self) -> bool {
        self.session.borrow().is_closed()
    }

    /// How often its heartbeat timer fires.
    pub(crate) fn heartbeat_interval(&self) -> std::time::Duration {
        self.session.borrow().heartbeat()
    }

    /// The storage this node's frames are read into, for its
    /// [`FrameStream`](super::frames::FrameStream).
    pub(crate) fn pool(&self) -> SharedPool {
        Rc::clone(&self.pool)
    }

    /// Where its frame reader counts the bytes it reads.
    pub(crate) fn bytes_in_counter(&self) -> Rc<Cell<u64>> {
        Rc::clone(&self.bytes_in)
    }

    /// Bytes read and written since the last call, `(in, out)`.
    pub(crate) fn take_traffic(&self) -> (u64, u64) {
        (self.bytes_in.take(), self.bytes_out.take())
    }

    /// Sends `msg` to the node, or closes the connection with the reason it cannot
    /// (its writer is gone; weights over the maximum frame size, say: the node would
    /// go on without them).
    pub(crate) fn send(&self, msg: &ToNode) {
        if self.is_closed() {
            return;
        }
        let failed = match self.weights.frame(msg, self.max_frame) {
            // One after the other through the one sender: they reach the socket back to back.
            Ok(parts) => self.write(parts),
            Err(e) => Some(format!("cannot send it {}: {e}", msg.name())),
        };
        if let Some(reason) = failed {
            self.close(reason);
        }
    }

    /// Writes `parts` in order: `Some(reason)` if the connection cannot take them.
    fn write(&self, parts: impl IntoIterator<Item = Bytes>) -> Option<String> {
        let out = self.out.borrow();
        let out = out.as_ref()?;
        for part in parts {
            self.bytes_out.set(self.bytes_out.get() + part.len() as u64);
            if out.send(part).is_err() {
                return Some("the connection's writer is gone".into());
            }
        }
        None
    }

    /// A batch of this node's the consumer is done with: its storage takes the next one.
    pub(crate) fn recycle(&self, data: TensorDict) {
        self.pool.borrow_mut().put_dict(data);
    }

    /// The heartbeat timer fired at `now`: a heartbeat goes out, or (silence) the
    /// connection closes. `false`: it is closed.
    pub(crate) fn beat(&self, now: Instant) -> bool {
        let tick = self.session.borrow().on_tick(now);
        match tick {
            Ok(()) => match self.write([self.heartbeat.clone()]) {
                None => !self.is_closed(),
                Some(reason) => {
                    self.close(reason);
                    false
                }
            },
            Err(reason) => {
                self.close(reason);
                false
            }
        }
    }

    /// A frame the node sent, at `now`, under the protocol's rules.
    pub(crate) fn on_frame(&self, frame: NodeFrame, now: Instant) -> Inbound<FromNode> {
        self.session.borrow_mut().on_frame(frame, now)
    }

    /// The reader waits on `waker`: a close wakes it.
    pub(crate) fn watch(&self, waker: &Waker) {
        let mut r = self.reader.borrow_mut();
        if !r.as_ref().is_some_and(|w| w.will_wake(waker)) {
            *r = Some(waker.clone());
        }
    }

    /// Closes the connection for `reason` (logged), the first time only: the trainer
    /// hears the node's failure unless it said `Down` or `Leave`, the writer finishes
    /// what is queued and shuts the socket's write side, the reader ends, the actor stops.
    pub(crate) fn close(&self, reason: String) {
        let closing = self.session.borrow_mut().close(reason);
        let Some(closing) = closing else {
            return;
        };
        let (node, reason) = (self.index(), &closing.reason);
        let held_back = self.log.borrow().held();
        match closing.failed {
            None if held_back > 0 => tracing::warn!(
                node,
                name = %self.name,
                %reason,
                held_back,
                "connection closed after Down, Leave or Failed; log lines about it were held back"
            ),
            None => tracing::debug!(node, name = %self.name, %reason, "connection closed after Down, Leave or Failed"),
            Some(failed) => {
                tracing::warn!(node, name = %self.name, %reason, held_back, "closing connection to node");
                (self.report)(failed);
            }
        }
        drop(self.out.borrow_mut().take());
        let reader = self.reader.borrow_mut().take();
        if let Some(w) = reader {
            w.wake();
        }
        if let Some(actor) = self.actor.upgrade() {
            actor.do_send(Disconnect(closing.reason));
        }
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
