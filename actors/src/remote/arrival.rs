//! Early release, seen from a connection: the first bytes of a node's batch are in.

use actix::Recipient;

use crate::messages::BatchArriving;

/// Tells the trainer that node `node`'s batch has begun to arrive, long before it is
/// whole.
///
/// Why it exists: a large batch takes a while on the wire, and the node sits idle
/// until the trainer's next `Continue` reaches it. With early release the trainer
/// may send that `Continue` as soon as the batch is on its way (see
/// `TrainerMachine::batch_arriving`, reached through the trainer actor's
/// `Handler<BatchArriving>`), so the node collects while its last batch travels.
/// The connection's [`FrameStream`](super::frames::FrameStream) holds one and fires it
/// once per batch frame ([`FrameStream::on_batch`](super::frames::FrameStream::on_batch)).
pub struct ArrivalNotice {
    node: usize,
    trainer: Recipient<BatchArriving>,
}

impl ArrivalNotice {
    /// Notices of node `node`'s batches, for `trainer`.
    pub fn new(node: usize, trainer: Recipient<BatchArriving>) -> ArrivalNotice {
        ArrivalNotice { node, trainer }
    }

    /// A batch of the node's has begun to arrive.
    pub fn batch_arriving(&self) {
        self.trainer.do_send(BatchArriving { node: self.node });
    }
}
