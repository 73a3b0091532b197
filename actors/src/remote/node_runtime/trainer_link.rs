//! The node's connection to the trainer once it serves: frames in to the node, the
//! node's messages out as frames (batches without a copy), heartbeats, leaving.

use std::cell::RefCell;
use std::collections::VecDeque;
use std::rc::Rc;
use std::sync::Arc;
use std::time::Instant;

use actix::prelude::*;
use bytes::Bytes;
use rollout::connection::{Inbound, NodeSession};
use rollout::message::{Batch, FromNode, ToNode};
use rollout::policy::Weights;
use rollout::pool::TensorPool;
use rollout::wire::{self, BatchFrame, NodeFrame, TrainerFrame};
use rollout::TensorDict;
use tokio::sync::oneshot;

use super::JoinError;
use crate::messages::{Deliver, Recycle};
use crate::node::Node;
use crate::remote::frames::{FrameError, FrameStream};
use crate::remote::link::FrameSender;
use crate::remote::parts;

/// The link died.
#[derive(Message)]
#[rtype(result = "()")]
pub(super) struct Lost(pub(super) String);

/// The node leaves the run (the reason, for the log): `leave`, then the link ends.
#[derive(Message)]
#[rtype(result = "()")]
pub(super) struct LeaveRun(pub(super) &'static str);

/// The node's connection to the trainer: frames in → node, node's messages → frames out.
pub(super) struct TrainerLink {
    pub(super) index: usize,
    pub(super) node: Addr<Node>,
    pub(super) out: FrameSender,
    pub(super) max: usize,
    /// The protocol's state and rules for this connection.
    pub(super) session: NodeSession,
    pub(super) done: Option<oneshot::Sender<Result<(), JoinError>>>,
    pub(super) stream: Option<FrameStream<TrainerFrame>>,
    /// Weight versions received here, oldest first, until nobody else holds them.
    pub(super) retired: Retired,
    /// The pending heartbeat timer: moved on whenever the trainer's beat is answered.
    pub(super) beat: Option<SpawnHandle>,
}

/// Weight versions a node received, oldest first, until nobody else holds them.
pub(super) type Retired = Rc<RefCell<VecDeque<Arc<Weights>>>>;

/// Moves the storage of weight versions nobody holds any more into `pool`. A
/// version stays while the node or a worker uses it, so an update is read into
/// the one before the current one: double buffering, at the cost of keeping one
/// spare copy of the weights.
pub(super) fn reclaim_weights(retired: &Retired, pool: &mut TensorPool) {
    let mut retired = retired.borrow_mut();
    let mut kept = VecDeque::with_capacity(retired.len());
    while let Some(w) = retired.pop_front() {
        match Arc::try_unwrap(w) {
            Ok(free) => pool.put_weights(free),
            Err(held) => kept.push_back(held),
        }
    }
    *retired = kept;
}

impl TrainerLink {
    fn finish(&mut self, ctx: &mut Context<Self>, r: Result<(), JoinError>) {
        if let Some(tx) = self.done.take() {
            if let Err(e) = &r {
                tracing::warn!(node = self.index, error = %e, "leaving");
            }
            let _ = tx.send(r);
        }
        ctx.stop();
    }

    fn send(&mut self, f: &NodeFrame, ctx: &mut Context<Self>) {
        match wire::encode(f, self.max) {
            Ok(b) => self.send_parts(vec![Bytes::from(b)], ctx),
            Err(e) => tracing::error!(node = self.index, error = %e, "cannot encode a frame"),
        }
    }

    /// Sends a batch without copying its tensors into a frame: the frame's parts are
    /// its MessagePack headers and the tensors' own memory. Once the writer has put
    /// the last part on the socket, the storage goes back to the worker.
    fn send_batch(&mut self, batch: Batch, ctx: &mut Context<Self>) {
        // The batch frame (PROTOCOL.md §3): its observations once, the `next.` rows
        // that differ at episode ends in `ends`.
        let (keys, blobs) = parts::blobs(batch.data.iter());
        let encoded = wire::encode_parts(&BatchFrame::new(&batch), self.max, &blobs);
        drop(blobs);
        let b = batch;
        let outgoing = Arc::new(OutgoingBatch {
            data: b.data,
            node: self.index,
            back: self.node.clone().recipient(),
        });
        match encoded {
            Ok(encoded) => {
                let bytes = parts::to_bytes(encoded, &keys, &outgoing);
                self.send_parts(bytes, ctx);
            }
            Err(e) => {
                // The trainer waits for this batch: tell it the node cannot deliver it
                // (a batch over the maximum frame size), rather than leave it to time out.
                tracing::error!(node = self.index, error = %e, "cannot encode a batch");
                let reason = format!("cannot send its batch: {e}");
                self.send(
                    &NodeFrame::Message(FromNode::Failed {
                        node: self.index,
                        reason,
                    }),
                    ctx,
                );
            }
        }
    }

    /// Queues a frame's parts back to back: only this actor writes to `out`, so no
    /// other frame comes between them.
    fn send_parts(&mut self, parts: Vec<Bytes>, ctx: &mut Context<Self>) {
        for part in parts {
            if self.out.send(part).is_err() {
                return self.finish(ctx, Err(JoinError::Lost("writer gone".into())));
            }
        }
    }
}

/// A batch on its way out, shared by the frame parts that are its tensors; when the
/// last part is dropped (written, or the connection gone) its storage goes back to
/// the node, whose worker collects its next batch into it.
struct OutgoingBatch {
    data: TensorDict,
    node: usize,
    back: Recipient<Recycle>,
}

impl Drop for OutgoingBatch {
    fn drop(&mut self) {
        let data = std::mem::take(&mut self.data);
        self.back.do_send(Recycle {
            node: Some(self.node),
            data,
        });
    }
}

impl parts::TensorHolder for OutgoingBatch {
    fn tensor(&self, key: &str) -> Option<&rollout::Tensor> {
        self.data.get(key).ok()
    }
}

impl Actor for TrainerLink {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Self::Context) {
        if let Some(s) = self.stream.take() {
            ctx.add_stream(s);
        }
        self.schedule_beat(ctx);
    }
}

impl TrainerLink {
    /// Sends a heartbeat now and moves the timer to the session's next beat.
    fn beat(&mut self, ctx: &mut Context<Self>) {
        self.send(&NodeFrame::Heartbeat, ctx);
        self.session.beat_sent(Instant::now());
        self.schedule_beat(ctx);
    }

    /// Sets the heartbeat timer to [`NodeSession::next_beat`], replacing any pending one.
    fn schedule_beat(&mut self, ctx: &mut Context<Self>) {
        if let Some(h) = self.beat.take() {
            ctx.cancel_future(h);
        }
        let wait = self.session.next_beat().saturating_duration_since(Instant::now());
        self.beat = Some(ctx.run_later(wait, |act, ctx| {
            act.beat = None;
            match act.session.on_tick(Instant::now()) {
                Ok(()) => act.beat(ctx),
                Err(reason) => act.finish(ctx, Err(JoinError::Lost(reason))),
            }
        }));
    }
}

impl StreamHandler<Result<TrainerFrame, FrameError>> for TrainerLink {
    fn handle(&mut self, item: Result<TrainerFrame, FrameError>, ctx: &mut Self::Context) {
        let frame = match item {
            Ok(f) => f,
            Err(FrameError::Decode(e)) => return self.finish(ctx, Err(JoinError::Protocol(e.to_string()))),
            Err(e) => return self.finish(ctx, Err(JoinError::Lost(e.to_string()))),
        };
        match self.session.on_frame(frame, Instant::now()) {
            Inbound::Deliver(m) => {
                if let ToNode::UpdateWeights(u) = &m {
                    self.retired.borrow_mut().push_back(Arc::clone(&u.weights));
                }
                self.node.do_send(Deliver(m));
            }
            Inbound::Answer => self.beat(ctx),
            Inbound::Nothing => {}
            Inbound::Close(reason) => self.finish(ctx, Err(JoinError::Protocol(reason))),
        }
    }

    fn finished(&mut self, ctx: &mut Self::Context) {
        self.finish(ctx, Err(JoinError::Lost("the trainer closed the connection".into())));
    }
}

impl Handler<Deliver<FromNode>> for TrainerLink {
    type Result = ();

    fn handle(&mut self, msg: Deliver<FromNode>, ctx: &mut Self::Context) {
        let ends = NodeSession::ends(&msg.0);
        match msg.0 {
            FromNode::Batch(b) => self.send_batch(b, ctx),
            other => self.send(&NodeFrame::Message(other), ctx),
        }
        if ends {
            self.finish(ctx, Ok(()));
        }
    }
}

impl Handler<LeaveRun> for TrainerLink {
    type Result = ();

    fn handle(&mut self, msg: LeaveRun, ctx: &mut Self::Context) {
        tracing::info!(node = self.index, why = msg.0, "leaving the run");
        // Whatever the workers collect now is not sent: the trainer asks others for it.
        self.send(&NodeFrame::Message(FromNode::Leave { node: self.index }), ctx);
        self.finish(ctx, Ok(()));
    }
}

impl Handler<Lost> for TrainerLink {
    type Result = ();

    fn handle(&mut self, msg: Lost, ctx: &mut Self::Context) {
        self.finish(ctx, Err(JoinError::Lost(msg.0)));
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use ndarray::{ArrayD, IxDyn};
    use rollout::Tensor;

    use super::*;

    fn version(v: u64) -> Arc<Weights> {
        let mut tensors = BTreeMap::new();
        tensors.insert("w".to_string(), Tensor::F32(ArrayD::zeros(IxDyn(&[64]))));
        Arc::new(Weights { version: v, tensors })
    }

    #[test]
    fn only_versions_nobody_holds_are_reclaimed_and_the_rest_wait() {
        let retired: Retired = Rc::new(RefCell::new(VecDeque::new()));
        let (old, current) = (version(1), version(2));
        retired.borrow_mut().push_back(old);
        retired.borrow_mut().push_back(Arc::clone(&current)); // a worker still holds it
        let mut pool = TensorPool::new(usize::MAX);
        reclaim_weights(&retired, &mut pool);
        assert_eq!(pool.bytes(), 64 * 4, "version 1's storage is back");
        assert_eq!(retired.borrow().len(), 1);
        drop(current);
        reclaim_weights(&retired, &mut pool);
        assert_eq!(pool.bytes(), 2 * 64 * 4, "version 2's once its holder let go");
        assert!(retired.borrow().is_empty());
    }
}
