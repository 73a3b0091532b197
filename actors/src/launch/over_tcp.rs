//! Starts a trainer whose nodes join over TCP (`Process` and `External` launchers).

use std::cell::RefCell;
use std::rc::Rc;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use actix::prelude::*;
use rollout::connection::Admission;
use tokio::net::TcpListener;

use super::local::Started;
use super::process::Children;
use super::NodePlan;
use crate::error::CollectError;
use crate::remote::connection::WeightsCache;
use crate::remote::inbox::{Inbox, InboxItem};
use crate::remote::listener::{self, DoorConfig, Joined};
use crate::remote::lobby::{self, Waiting};
use crate::remote::peer;
use crate::trainer::{NodeRestartFailed, Restarter, Trainer};

/// Watches the nodes a launcher started while the trainer waits for them to join
/// (the `Slurm` launcher reads its tasks' states). Both calls may block (they run on a
/// blocking thread) and must be bounded.
pub(crate) trait JoinWatch: Send + Sync {
    /// Called about once a second with the node indices not joined yet: `Some(reason)`
    /// when some of them never will (ends the wait at once with that reason).
    fn hopeless(&self, missing: &[usize]) -> Option<String>;
    /// Called at the join deadline: what is known of the missing nodes, for the error.
    fn describe(&self, missing: &[usize]) -> String;
}

impl JoinWatch for super::slurm::SlurmQuery {
    fn hopeless(&self, missing: &[usize]) -> Option<String> {
        super::slurm::SlurmQuery::hopeless(self, missing)
    }
    fn describe(&self, missing: &[usize]) -> String {
        super::slurm::SlurmQuery::describe(self, missing)
    }
}

/// The `Process` launcher's children while they join: one that exited will not join.
pub(crate) struct ProcessWatch(pub(crate) Arc<Mutex<Children>>);

impl ProcessWatch {
    fn exited(&self, missing: &[usize]) -> Vec<String> {
        match self.0.lock() {
            Ok(mut c) => c.exited(missing),
            Err(poisoned) => poisoned.into_inner().exited(missing),
        }
    }
}

impl JoinWatch for ProcessWatch {
    fn hopeless(&self, missing: &[usize]) -> Option<String> {
        let exited = self.exited(missing);
        (!exited.is_empty()).then(|| format!("{} before joining (its stderr is above)", exited.join("; ")))
    }
    fn describe(&self, missing: &[usize]) -> String {
        let exited = self.exited(missing);
        if exited.is_empty() {
            "their processes are running".into()
        } else {
            exited.join("; ")
        }
    }
}

/// How a launcher that started its nodes starts one again.
#[derive(Clone)]
pub(crate) enum Respawn {
    /// `Process`: kill the old child (also when stopped), spawn a new one.
    Process(Arc<Mutex<Children>>),
    /// `Slurm`: cancel the old task, resubmit the batch script as that single array task.
    Slurm(super::slurm::SlurmResubmit),
}

/// Restarts remote nodes: frees the node's slot, starts a new node for it when this
/// trainer started the old one ([`Respawn`]), and waits (bounded by the join timeout)
/// for a node to join under the same index.
struct RemoteRestarter {
    admission: Rc<RefCell<Admission>>,
    respawn: Option<Respawn>,
    join_timeout: Duration,
    /// The restart in progress of each node.
    pending: Rc<RefCell<Vec<Option<u32>>>>,
}

impl Restarter for RemoteRestarter {
    fn restart(&mut self, node: usize, restart: u32, cause: &str, trainer: Addr<Trainer>) {
        self.admission.borrow_mut().release(node);
        if let Some(p) = self.pending.borrow_mut().get_mut(node) {
            *p = Some(restart);
        }
        let pending = PendingRestart {
            pending: self.pending.clone(),
            node,
            restart,
            trainer,
        };
        match &self.respawn {
            Some(Respawn::Process(children)) => {
                let r = match children.lock() {
                    Ok(mut c) => c.respawn(node),
                    Err(_) => Err(std::io::Error::other("the process table is poisoned")),
                };
                match r {
                    Ok(pid) => tracing::warn!(node, restart, pid, %cause, "node process replaced"),
                    Err(e) => return pending.give_up(format!("cannot start node process {node} again: {e}")),
                }
            }
            Some(Respawn::Slurm(slurm)) => {
                // sbatch blocks (bounded): off the trainer's thread.
                tracing::warn!(node, restart, %cause, "resubmitting the node's SLURM task");
                let slurm = slurm.clone();
                let pending = pending.clone();
                actix_rt::spawn(async move {
                    let error = match actix_rt::task::spawn_blocking(move || slurm.resubmit(node)).await {
                        Ok(Ok(_)) => return,
                        Ok(Err(e)) => e.to_string(),
                        Err(e) => e.to_string(),
                    };
                    pending.give_up(format!("cannot resubmit node {node}'s SLURM task: {error}"));
                });
            }
            None => tracing::warn!(node, restart, %cause, "waiting for node to rejoin"),
        }
        let wait = self.join_timeout;
        actix_rt::spawn(async move {
            tokio::time::sleep(wait).await;
            pending.give_up(format!(
                "no node rejoined as index {node} within {:.1} s",
                wait.as_secs_f64()
            ));
        });
    }
}

/// Restart number `restart` of node `node`, waiting for its node to join.
#[derive(Clone)]
struct PendingRestart {
    /// The restart in progress of each node.
    pending: Rc<RefCell<Vec<Option<u32>>>>,
    node: usize,
    restart: u32,
    trainer: Addr<Trainer>,
}

impl PendingRestart {
    /// The restart failed for `reason`: the trainer hears it, unless a node joined
    /// for it or a later restart replaced it meanwhile.
    fn give_up(&self, reason: String) {
        let mut pending = self.pending.borrow_mut();
        let Some(slot) = pending.get_mut(self.node) else {
            return;
        };
        if *slot == Some(self.restart) {
            *slot = None;
            self.trainer.do_send(NodeRestartFailed {
                node: self.node,
                reason,
            });
        }
    }
}

/// Waits (bounded) for every node to join, then starts the trainer over them, with a
/// [`JoinWatch`] on the nodes while they join. Must run inside a running actix
/// `System`. With supervision on in the plan's machine, a failed node's slot is freed and a node joining under its index replaces
/// it; a node this trainer started is started again by `respawn`.
pub(crate) async fn start(
    plan: NodePlan,
    listener: std::net::TcpListener,
    door: DoorConfig,
    join_timeout: Duration,
    watch: Option<Arc<dyn JoinWatch>>,
    respawn: Option<Respawn>,
) -> Result<Started, CollectError> {
    let NodePlan {
        machine,
        specs,
        seed,
        delivery,
        ..
    } = plan;
    let n = specs.len();
    // An elastic run starts with its minimum; the others may join while it runs.
    let elastic = machine.membership().is_some();
    let need = machine.membership().map_or(n, |m| m.min_nodes.min(n));
    listener
        .set_nonblocking(true)
        .map_err(|e| CollectError::Join(format!("cannot use the listening socket: {e}")))?;
    let listener = TcpListener::from_std(listener)
        .map_err(|e| CollectError::Join(format!("cannot use the listening socket: {e}")))?;
    let timing = door.timing;
    let admission = Rc::new(RefCell::new(Admission::new(n)));
    // Every node is welcomed with the trainer's version 0 of its weights.
    let welcome_weights = Rc::new((0..n).map(|i| machine.initial_weights(i).cloned()).collect());
    let mut joined_rx = listener::open_with(listener, specs, door, welcome_weights, admission.clone());
    // Nodes wait in the lobby until all have joined: one that drops meanwhile frees its slot.
    let (gone_tx, mut gone_rx) = tokio::sync::mpsc::unbounded_channel();
    let mut waiting: Vec<Waiting> = Vec::with_capacity(need);
    // Why each node that left before the run started left, for the join error.
    let mut left: std::collections::BTreeMap<usize, String> = std::collections::BTreeMap::new();
    let why_left = |left: &std::collections::BTreeMap<usize, String>| -> String {
        left.iter()
            .map(|(node, reason)| format!("; node {node} left before the run started: {reason}"))
            .collect()
    };
    let deadline = tokio::time::Instant::now() + join_timeout;
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let missing =
        |waiting: &[Waiting]| -> Vec<usize> { (0..n).filter(|i| !waiting.iter().any(|w| w.index == *i)).collect() };
    let mut joined: Vec<(Joined, Vec<u8>)> = loop {
        while waiting.len() < need {
            tokio::select! {
                r = tokio::time::timeout_at(deadline, joined_rx.recv()) => match r {
                    Ok(Some(j)) => waiting.push(lobby::wait_in_lobby(j, Vec::new(), timing.heartbeat, gone_tx.clone())),
                    Ok(None) => return Err(CollectError::Join("the listener stopped".into())),
                    Err(_) => {
                        let missing = missing(&waiting);
                        let mut msg = if elastic {
                            format!(
                                "{} of the {need} nodes an elastic run needs to start (min_nodes) joined within {:.1} s",
                                waiting.len(),
                                join_timeout.as_secs_f64()
                            )
                        } else {
                            format!(
                                "{} of {n} nodes joined within {:.1} s; missing node indices {missing:?}",
                                waiting.len(),
                                join_timeout.as_secs_f64()
                            )
                        };
                        if let Some(w) = watch.clone() {
                            let m = missing.clone();
                            if let Ok(detail) = tokio::task::spawn_blocking(move || w.describe(&m)).await {
                                msg = format!("{msg}; {detail}");
                            }
                        }
                        return Err(CollectError::Join(format!("{msg}{}", why_left(&left))));
                    }
                },
                Some((node, reason)) = gone_rx.recv() => {
                    waiting.retain(|w| w.index != node);
                    admission.borrow_mut().release(node);
                    tracing::warn!(node, %reason, "node left before the run started; its slot is free again");
                    left.insert(node, reason);
                }
                _ = tick.tick(), if watch.is_some() => {
                    let missing = missing(&waiting);
                    let w = watch.clone().expect("checked");
                    let m = missing.clone();
                    if let Ok(Some(reason)) = tokio::task::spawn_blocking(move || w.hopeless(&m)).await {
                        return Err(CollectError::Join(format!(
                            "{} of {n} nodes joined; missing node indices {missing:?}: {reason}{}",
                            waiting.len(),
                            why_left(&left)
                        )));
                    }
                }
            }
        }
        let mut back = Vec::with_capacity(need);
        for w in waiting.drain(..) {
            // `None`: it closed just now; its `gone` message frees the slot in the loop.
            if let Some(b) = w.start().await {
                back.push(b);
            }
        }
        if back.len() == need {
            break back;
        }
        for (j, early) in back {
            waiting.push(lobby::wait_in_lobby(j, early, timing.heartbeat, gone_tx.clone()));
        }
    };
    joined.sort_by_key(|(j, _)| j.index);
    let trainer_ctx = Context::<Trainer>::new();
    let trainer = trainer_ctx.address();
    let cache = WeightsCache::default();
    let inbox = Inbox::new();
    if elastic {
        let run = super::elastic::ElasticStart {
            admission,
            cache,
            inbox,
            timing,
            seed,
            delivery,
        };
        return Ok(run.start(machine, n, joined, joined_rx, trainer_ctx));
    }
    let nodes = joined
        .into_iter()
        .map(|(j, early)| peer::open_in_slot(j, early, &inbox, &cache, timing, None))
        .collect();
    let supervised = machine.supervision().is_some();
    let mut t = Trainer::remote(machine, nodes, inbox.clone())
        .with_initial_seed(seed)
        .with_delivery(delivery);
    if supervised {
        let pending = Rc::new(RefCell::new(vec![None; n]));
        t = t.with_restarter(Box::new(RemoteRestarter {
            admission: admission.clone(),
            respawn,
            join_timeout,
            pending: pending.clone(),
        }));
        actix_rt::spawn(async move {
            while let Some(j) = joined_rx.recv().await {
                let node = j.index;
                let restart = pending.borrow_mut().get_mut(node).and_then(Option::take);
                let Some(restart) = restart else {
                    // Admitted into a slot freed by a restart that already gave up.
                    tracing::warn!(node, "a node joined with no restart waiting for it; closing it");
                    admission.borrow_mut().release(node);
                    continue;
                };
                tracing::info!(node, restart, name = %j.name, "node rejoined");
                let conn = peer::open_in_slot(j, Vec::new(), &inbox, &cache, timing, None);
                inbox.push(InboxItem::Restarted(node, conn));
            }
        });
    }
    trainer_ctx.run(t);
    Ok(Started {
        trainer,
        arbiters: Vec::new(),
    })
}
