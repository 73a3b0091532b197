//! Early release, seen from a connection: the first bytes of a node's batch are in.

use std::cell::Cell;
use std::rc::Rc;

/// Raised when a node's batch has begun to arrive, long before it is whole.
///
/// Why it exists: a large batch takes a while on the wire, and the node sits idle
/// until the trainer's next `Continue` reaches it. With early release the trainer
/// may send that `Continue` as soon as the batch is on its way (see
/// `TrainerMachine::batch_arriving`), so the node collects while its last batch
/// travels. The connection's [`FrameStream`](super::frames::FrameStream) raises it
/// once per batch frame ([`FrameStream::on_batch`](super::frames::FrameStream::on_batch));
/// the connection's reader in the trainer's [`Inbox`](super::inbox::Inbox) lowers it
/// and tells the trainer (`InboxItem::Arriving`) before the rest is read.
#[derive(Clone, Debug, Default)]
pub(crate) struct ArrivalNotice(Rc<Cell<bool>>);

impl ArrivalNotice {
    /// A notice not raised.
    pub(crate) fn new() -> ArrivalNotice {
        ArrivalNotice::default()
    }

    /// A batch has begun to arrive.
    pub(crate) fn batch_arriving(&self) {
        self.0.set(true);
    }

    /// Whether a batch began to arrive since the last call (lowers the notice).
    pub(crate) fn take(&self) -> bool {
        self.0.replace(false)
    }
}
