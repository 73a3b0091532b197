//! The nodes' side of the trainer: their messages (from an in-process actor or a
//! remote connection through the inbox), joins, restarts and their failure, and the
//! metrics read off their links.

use actix::prelude::*;
use rollout::machine::{TrainerError, Verdict};
use rollout::message::FromNode;

use super::{NodeLink, NodeRestartFailed, NodeRestarted, Trainer};
use crate::messages::Deliver;
use crate::metrics::FailureReason;
use crate::remote::inbox::InboxItem;

impl Trainer {
    /// A node's message, from its actor or its connection.
    pub(super) fn on_node(&mut self, msg: FromNode) {
        if let Some(m) = &mut self.metrics {
            m.on_node(&msg);
        }
        // The machine's clock follows the actor's, so failures are recorded when they happen.
        self.tick();
        let node = msg.node();
        let r = self.machine.on_node(msg, &mut self.out);
        match self.machine.verdict(r) {
            // Refused and dropped, the node kept: a line a remote node can repeat at
            // will, so it is logged within its connection's budget.
            Verdict::Dropped(e) => self.log_dropped(node, &e),
            verdict => self.carry_out(verdict),
        }
        self.dispatch();
    }

    /// Logs that node `node`'s message was dropped for `e`; for a remote node, within
    /// its connection's log budget (past it, the lines are counted, told at the close).
    pub(super) fn log_dropped(&self, node: usize, e: &TrainerError) {
        let error = e.to_string();
        match self.nodes.get(node) {
            Some(Some(NodeLink::Remote(c))) => {
                if c.may_log(error.len()) {
                    tracing::warn!(node, name = %c.name(), %error, "trainer dropped a node message");
                }
            }
            _ => tracing::warn!(node, %error, "trainer dropped a node message"),
        }
    }

    /// Node `node` is back, reached through `link` now.
    pub(super) fn node_restarted(&mut self, node: usize, link: NodeLink) {
        if node >= self.nodes.len() {
            tracing::error!(node, "restarted an unknown node");
            return link.close(format!("node {node} does not exist"));
        }
        // The bytes of the incarnation replaced are counted before it goes.
        self.count_periodic();
        self.nodes[node] = Some(link);
        // The re-sent Continue's deadline counts from now, not from the last tick.
        self.tick();
        let r = self.machine.node_restarted(node, &mut self.out);
        self.on_result(r);
        self.dispatch();
    }

    /// Elastic runs: a node joined free slot `node` mid-run.
    pub(super) fn node_joined(&mut self, node: usize, link: NodeLink) {
        if node >= self.nodes.len() {
            tracing::error!(node, "a node joined an unknown slot");
            return link.close(format!("slot {node} does not exist"));
        }
        // The slot's previous node, if any, is gone: the machine refuses a held slot.
        self.tick();
        let mut out = Vec::new();
        if let Err(e) = self.machine.node_joined(node, &mut out) {
            tracing::warn!(error = %e, "node refused");
            self.count_refusal();
            return link.close(e.to_string());
        }
        if let Some(m) = &self.metrics {
            m.joined();
        }
        self.count_periodic();
        self.nodes[node] = Some(link);
        self.out.extend(out);
        self.dispatch();
    }

    /// Metrics read by looking rather than on events: nodes up, bytes moved.
    pub(super) fn count_periodic(&mut self) {
        let Some(m) = &self.metrics else {
            return;
        };
        let (mut bytes_in, mut bytes_out) = (0, 0);
        for link in self.nodes.iter().flatten() {
            let (i, o) = link.take_traffic();
            bytes_in += i;
            bytes_out += o;
        }
        m.on_tick(self.machine.nodes_up().len(), bytes_in, bytes_out);
    }
}

impl Handler<Deliver<FromNode>> for Trainer {
    type Result = ();

    /// An in-process node's message.
    fn handle(&mut self, msg: Deliver<FromNode>, _ctx: &mut Self::Context) {
        self.on_node(msg.0);
    }
}

impl StreamHandler<InboxItem> for Trainer {
    /// What remote nodes send, read by this actor from their connections.
    fn handle(&mut self, item: InboxItem, _ctx: &mut Self::Context) {
        match item {
            InboxItem::Message(msg) => self.on_node(msg),
            InboxItem::Arriving(node) => {
                let r = self.machine.batch_arriving(node, &mut self.out);
                self.on_result(r);
                self.dispatch();
            }
            InboxItem::Joined(node, conn) => self.node_joined(node, NodeLink::Remote(conn)),
            InboxItem::Restarted(node, conn) => self.node_restarted(node, NodeLink::Remote(conn)),
        }
    }

    /// The inbox never ends; should it, the trainer goes on with its other nodes.
    fn finished(&mut self, _ctx: &mut Self::Context) {}
}

impl Handler<NodeRestarted> for Trainer {
    type Result = ();

    fn handle(&mut self, msg: NodeRestarted, _ctx: &mut Self::Context) {
        let link = NodeLink::Local {
            node: msg.recipient,
            recycler: msg.recycler,
        };
        self.node_restarted(msg.node, link);
    }
}

impl Handler<NodeRestartFailed> for Trainer {
    type Result = ();

    fn handle(&mut self, msg: NodeRestartFailed, _ctx: &mut Self::Context) {
        // The failure says how long the node was waited for: the clock moves to now.
        self.tick();
        self.count_failure(msg.node, FailureReason::RestartFailed);
        let r = self.machine.node_restart_failed(msg.node, msg.reason, &mut self.out);
        self.on_result(r);
        self.dispatch();
    }
}
