//! How the trainer reaches one node: an in-process node's actor or a remote node's
//! connection, behind one interface.

use std::rc::Rc;

use actix::prelude::*;
use rollout::message::ToNode;

use crate::messages::{Deliver, Recycle};
use crate::remote::connection::Connection;
#[cfg(doc)]
use crate::remote::inbox::Inbox;

/// How the trainer reaches one node.
pub(crate) enum NodeLink {
    /// An in-process node: its actor, and where its spent batches go.
    Local {
        /// Where its messages go.
        node: Recipient<Deliver<ToNode>>,
        /// Where its spent batches go, if anywhere.
        recycler: Option<Recipient<Recycle>>,
    },
    /// A remote node: its connection, used directly on the trainer's thread (its
    /// frames come in through the trainer's [`Inbox`]).
    Remote(Rc<Connection>),
}

impl NodeLink {
    pub(super) fn send(&self, msg: ToNode) {
        match self {
            NodeLink::Local { node, .. } => node.do_send(Deliver(msg)),
            NodeLink::Remote(c) => c.send(&msg),
        }
    }

    pub(super) fn recycle(&self, node: usize, data: rollout::TensorDict) {
        match self {
            NodeLink::Local { recycler: Some(r), .. } => r.do_send(Recycle { node: Some(node), data }),
            NodeLink::Local { recycler: None, .. } => {}
            NodeLink::Remote(c) => c.recycle(data),
        }
    }

    /// Bytes a remote node's connection moved since the last call, `(in, out)`.
    pub(super) fn take_traffic(&self) -> (u64, u64) {
        match self {
            NodeLink::Remote(c) => c.take_traffic(),
            NodeLink::Local { .. } => (0, 0),
        }
    }

    /// Cuts a remote node's connection for `reason` (an in-process node has none).
    pub(super) fn close(&self, reason: String) {
        if let NodeLink::Remote(c) = self {
            c.close(reason);
        }
    }
}
