//! The start of an elastic run's trainer (`min_nodes` joined): the nodes in hold their
//! slots, every other slot is free, and each node admitted later is handed to the
//! trainer through its inbox ([`InboxItem::Joined`]). A node's slot is free again once
//! its connection actor stopped, after its close was queued in the same inbox, so the
//! trainer always hears a slot's old node before the next one.

use std::cell::RefCell;
use std::rc::Rc;

use actix::prelude::*;
use rollout::connection::Admission;
use rollout::machine::TrainerMachine;
use tokio::sync::mpsc::UnboundedReceiver;

use super::local::Started;
use crate::delivery::Delivery;
use crate::remote::connection::WeightsCache;
use crate::remote::inbox::{Inbox, InboxItem};
use crate::remote::listener::Joined;
use crate::remote::peer;
use crate::remote::timing::PeerTiming;
use crate::trainer::Trainer;

/// What an elastic run's trainer starts with, beside its machine.
pub(super) struct ElasticStart {
    /// The slots taken (the door admits into it).
    pub(super) admission: Rc<RefCell<Admission>>,
    /// Weight frames encoded once for every node.
    pub(super) cache: WeightsCache,
    /// Where the trainer hears its nodes.
    pub(super) inbox: Inbox,
    /// Heartbeat and frame limits of every connection.
    pub(super) timing: PeerTiming,
    /// The run's seed (the seed chain starts from it).
    pub(super) seed: u64,
    /// What each yielded batch goes through before its consumer sees it.
    pub(super) delivery: Delivery,
}

impl ElasticStart {
    /// Runs the trainer over `slots` slots, the `joined` nodes in theirs, and hands it
    /// every node admitted from `joined_rx` on.
    pub(super) fn start(
        self,
        mut machine: TrainerMachine,
        slots: usize,
        joined: Vec<(Joined, Vec<u8>)>,
        mut joined_rx: UnboundedReceiver<Joined>,
        trainer_ctx: Context<Trainer>,
    ) -> Started {
        let trainer = trainer_ctx.address();
        let ElasticStart {
            admission,
            cache,
            inbox,
            timing,
            seed,
            delivery,
        } = self;
        let members: Vec<usize> = joined.iter().map(|(j, _)| j.index).collect();
        machine.start_with(&members);
        let mut t = Trainer::remote(machine, Vec::new(), inbox.clone())
            .with_slots(slots)
            .with_initial_seed(seed)
            .with_delivery(delivery);
        for (j, early) in joined {
            let node = j.index;
            let conn = peer::open_in_slot(j, early, &inbox, &cache, timing, Some(admission.clone()));
            t = t.with_member(node, conn);
        }
        tracing::info!(members = ?members, max = slots, "elastic run started");
        actix_rt::spawn(async move {
            while let Some(j) = joined_rx.recv().await {
                let node = j.index;
                tracing::info!(node, name = %j.name, "node joined the running elastic run");
                let conn = peer::open_in_slot(j, Vec::new(), &inbox, &cache, timing, Some(admission.clone()));
                inbox.push(InboxItem::Joined(node, conn));
            }
        });
        trainer_ctx.run(t);
        Started {
            trainer,
            arbiters: Vec::new(),
        }
    }
}
