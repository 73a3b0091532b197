//! Collection rounds: sync rounds stacked from every node's share, async batches
//! first ready first served, early release of a node whose batch is arriving, and
//! the acceptance of a node's batch.

use super::node_state::{Asked, NodeState};
use super::output::node_batch;
use super::{Collected, Output, TrainerError, TrainerMachine};
use crate::message::{Batch, Continue, ToNode};
use crate::schema::keys;
use crate::tensor::{Tensor, TensorDict};

/// Sync: the shares of the round in flight, in node order, and how many are still to
/// come, so that a share's arrival does not scan the round (with a thousand nodes that
/// scan made each round O(N²)).
#[derive(Debug)]
pub(super) struct Round {
    shares: Vec<Option<Batch>>,
    missing: usize,
}

impl TrainerMachine {
    /// A stacked sync round (a batch yielded with no node) the consumer is done with:
    /// its storage takes the next round, so a round allocates nothing (a round of
    /// a thousand nodes' shares is megabytes of fresh pages each time otherwise).
    /// Only the latest is kept; one whose tensors fit no later round is dropped by
    /// the next.
    pub fn recycle_round(&mut self, data: TensorDict) {
        if self.cfg.sync() {
            self.stacked = crate::pool::TensorPool::new(usize::MAX);
            self.stacked.put_dict(data);
        }
    }

    /// Counts a batch the consumer handed back
    /// ([`SupervisionStats::batches_recycled`](super::SupervisionStats::batches_recycled)):
    /// a stacked round (see [`Self::recycle_round`]) or a node's batch, which goes
    /// back to its node.
    pub fn count_recycled(&mut self) {
        self.recycled += 1;
    }

    /// Asks node `node` for `frames` frames under the next seq. A restarting node
    /// holds them until it is back (then they are sent under a new seq); a node that
    /// is down gets nothing; a node waiting for its version 0 gets it once it has it.
    pub(super) fn continue_node(&mut self, node: usize, frames: usize, out: &mut Vec<Output>) {
        if self.nodes[node].state.hold(frames) {
            return;
        }
        let seq = self.next_seq;
        self.next_seq += 1;
        let version = self.nodes[node].book.pushed_version;
        self.nodes[node].state.asked(Asked {
            seq,
            frames,
            version,
            since: self.now,
        });
        if self.awaits_weights(node) {
            // Sent once the node has its version 0 (specs.rs).
            self.hold_continue(node, seq, frames);
            return;
        }
        out.push(Output::Send {
            node,
            msg: ToNode::Continue(Continue { seq, frames }),
        });
    }

    /// Frames still to yield, when the run has a `total_frames`.
    pub(super) fn remaining(&self) -> Option<u64> {
        self.cfg.total_frames().map(|t| t.saturating_sub(self.frames_yielded))
    }

    /// The consumer wants the next batch. Yields at once if one is ready, else
    /// sends what is needed and yields when the nodes have answered.
    pub fn request(&mut self, out: &mut Vec<Output>) -> Result<(), TrainerError> {
        if self.finished {
            out.push(Output::Finished);
            return Ok(());
        }
        self.wanted = true;
        if self.chain.at.is_some() || self.checkpointing() {
            self.deferred = true;
            return Ok(());
        }
        if self.cfg.sync() {
            if self.round.is_none() {
                if self.cfg.update_after_each_batch {
                    self.push_weights(None, out)?;
                }
                self.push_stale(out);
                let share = self
                    .cfg
                    .shares
                    .node_share_of(self.cfg.shares.batch_frames(self.remaining()));
                for i in 0..self.cfg.nodes() {
                    self.continue_node(i, share, out);
                }
                self.round = Some(Round {
                    shares: vec![None; self.cfg.nodes()],
                    missing: self.cfg.nodes(),
                });
            }
        } else {
            self.push_stale(out);
            // Every live node with nothing in flight and nothing waiting to be yielded
            // gets work: all of them at the start, and after a resume those whose batch
            // is not among the kept ones (a run resumed with a larger `total_frames`).
            self.started = true;
            // Which nodes have a batch waiting, marked once per request (not a scan of
            // the queue per idle node: a thousand of each made every request O(N²)).
            let mut waiting: Option<Vec<bool>> = None;
            let mut asked = Vec::new();
            for i in 0..self.cfg.nodes() {
                if !self.nodes[i].state.is_idle() {
                    continue;
                }
                let waiting = waiting.get_or_insert_with(|| self.nodes_with_ready_batch());
                if !waiting[i] {
                    self.continue_node(i, self.cfg.shares.node_share(), out);
                    asked.push(i);
                }
            }
            // With `prefetch`, their next ones too, sent ahead: once every node was asked,
            // so that none is asked ahead for frames another is asked for.
            for i in asked {
                self.prefetch(i, out)?;
            }
            self.try_yield_async(out)?;
        }
        Ok(())
    }

    /// Async: by node, whether a batch of it waits to be yielded.
    fn nodes_with_ready_batch(&self) -> Vec<bool> {
        let mut waiting = vec![false; self.cfg.nodes()];
        for b in &self.ready {
            if let Some(w) = waiting.get_mut(b.node) {
                *w = true;
            }
        }
        waiting
    }

    /// Async: yields the oldest ready batch if the consumer waits, and sends its
    /// node on to the next one.
    pub(super) fn try_yield_async(&mut self, out: &mut Vec<Output>) -> Result<(), TrainerError> {
        // While a checkpoint is taken or restored no node may be sent new work.
        if !self.wanted || self.finished || self.checkpointing() {
            return Ok(());
        }
        let b = loop {
            let Some(b) = self.ready.pop_front() else {
                return Ok(());
            };
            let lag = self.version.saturating_sub(b.weights_version);
            if self.cfg.max_policy_lag.is_some_and(|max| lag > max) && !self.cfg.deliver_lagging {
                self.drop_lagging(b, lag, out)?;
                continue;
            }
            break b;
        };
        let node = b.node;
        let mut data = b.data;
        if let Some(r) = self.remaining() {
            let n = data.numel() as u64;
            if n > r {
                let envs = data.batch_size()[0];
                let steps = r as usize / envs;
                data = data.slice(1, 0..steps)?;
            }
        }
        // The node whose batch is yielded goes on at once (after its weight update,
        // if any), so it never idles while the consumer works on the batch; unless the
        // frames yielded and waiting (prefetched) are all the run still needs.
        let waiting: u64 = if self.cfg.prefetch > 0 {
            self.ready.iter().map(|b| b.data.numel() as u64).sum()
        } else {
            0
        };
        let more = self
            .remaining()
            .is_none_or(|r| r > (data.numel() as u64).saturating_add(waiting));
        // Periodic pushes go out before the node continues, so its next batch has them.
        self.interval_push(self.batches_yielded + 1, out);
        // A node released while its batch was on its way has its next batch asked already.
        let released = self.nodes[node].state.has_work();
        if more && !released {
            self.release(node, out)?;
        }
        self.emit(node_batch(Some(node), vec![b.weights_version], data), false, out);
        // With `prefetch`, its next one too, sent ahead.
        self.prefetch(node, out)
    }

    /// `max_policy_lag`: batch `b`, `lag` versions behind the stored weights, is not
    /// yielded. Its storage goes back to its node, which gets the stored weights (else
    /// its next batches would lag as far: with `prefetch` every one of them, the node
    /// never idle to be pushed to) and is asked again, unless it already was (its next
    /// batch, prefetched or released early, then lags or not on its own) or the run is
    /// shutting down.
    fn drop_lagging(&mut self, b: Batch, lag: u64, out: &mut Vec<Output>) -> Result<(), TrainerError> {
        let node = b.node;
        let frames = b.data.numel() as u64;
        self.lagging_dropped.0 += 1;
        self.lagging_dropped.1 += frames;
        tracing::debug!(node, seq = b.seq, lag, frames, "dropped a batch past max_policy_lag");
        out.push(Output::DroppedLagging {
            node,
            frames,
            policy_lag: lag,
        });
        out.push(Output::Recycle { node, data: b.data });
        // Not at the shutdown. (During a seed chain it may: its `seed` went out first.)
        if self.shutting_down {
            return Ok(());
        }
        self.push_to(node, out);
        if !self.nodes[node].state.has_work() && self.remaining().is_none_or(|r| r > 0) {
            self.continue_node(node, self.cfg.shares.node_share(), out);
        }
        Ok(())
    }

    /// `prefetch`: node `node` is asked for more while the batches it has waiting to
    /// be yielded and the `Continue`s it has to answer are at most `prefetch` (so at
    /// most `prefetch + 1` once asked), it answers at most two at once (the second
    /// queues at the node behind the first, so its workers never wait for the trainer
    /// between batches: protocol version 11), and more frames are wanted than wait
    /// already or are asked of any node; not during a seed chain, a checkpoint or the
    /// shutdown, and not before the node has its weights.
    fn prefetch(&mut self, node: usize, out: &mut Vec<Output>) -> Result<(), TrainerError> {
        if self.cfg.prefetch == 0 {
            return Ok(());
        }
        let quiet = self.chain.at.is_none() && !self.checkpointing() && !self.shutting_down;
        if !quiet || self.finished || !self.started || !self.wants_ahead(node) {
            return Ok(());
        }
        let asks = self.nodes[node].state.asks();
        let (mut waiting, mut frames) = (0usize, 0u64);
        for b in &self.ready {
            frames += b.data.numel() as u64;
            waiting += usize::from(b.node == node);
        }
        if waiting + asks > self.cfg.prefetch {
            return Ok(());
        }
        if let Some(r) = self.remaining() {
            // Frames waiting and asked of every node, this one's included: enough for the
            // run already, and no node is asked ahead (the first request asks every node
            // once whatever `total_frames` is; ahead of that, only what the run needs).
            // A scan of the nodes, O(N) a call and only in runs of a finite length: a
            // microsecond at a thousand nodes, against a count kept through every state
            // change of every node.
            for n in &self.nodes {
                if frames >= r {
                    break;
                }
                frames = frames.saturating_add(n.state.asked_frames());
            }
            if frames >= r {
                return Ok(());
            }
        }
        self.release(node, out)
    }

    /// Whether node `node` may be sent a `Continue` by `prefetch` now: up, answering
    /// fewer than two, and (for a second one) collecting the first with weights it has.
    fn wants_ahead(&self, node: usize) -> bool {
        match self.nodes[node].state {
            NodeState::Idle => true,
            NodeState::Collecting { .. } => !self.awaits_weights(node),
            _ => false,
        }
    }

    /// `prefetch`: every node with room to collect ahead goes on (after a checkpoint,
    /// during which none could).
    pub(super) fn prefetch_idle(&mut self, out: &mut Vec<Output>) -> Result<(), TrainerError> {
        if self.cfg.prefetch == 0 {
            return Ok(());
        }
        for node in 0..self.nodes.len() {
            self.prefetch(node, out)?;
        }
        Ok(())
    }

    /// Node `node` goes on to its next batch, after its weight update if any.
    fn release(&mut self, node: usize, out: &mut Vec<Output>) -> Result<(), TrainerError> {
        if self.cfg.update_after_each_batch {
            self.push_weights(Some(&[node]), out)?;
        }
        self.continue_node(node, self.cfg.shares.node_share(), out);
        Ok(())
    }

    /// Node `node`'s batch began to arrive (a remote node's first bytes of it; a
    /// batch over a socket takes a while to be whole). In async mode, when the
    /// consumer waits, nothing is ready, no other node's batch is on its way and more
    /// frames are wanted than this batch holds, this batch is the next one yielded:
    /// the node is released now, as it would be once the batch is whole and yielded,
    /// so it collects while the batch travels. Anything else: nothing happens, and
    /// the node goes on when its batch is yielded. A batch that then fails to arrive
    /// is handled as any lost work.
    pub fn batch_arriving(&mut self, node: usize, out: &mut Vec<Output>) -> Result<(), TrainerError> {
        if node >= self.nodes.len() {
            return Err(TrainerError::UnknownNode(node));
        }
        let others = self
            .nodes
            .iter()
            .enumerate()
            .any(|(i, m)| i != node && m.state.in_transit());
        // Only an answer to the outstanding `Continue` can be on its way (anything
        // else is refused once whole), and not while a released batch still travels.
        let Some(Asked { frames, .. }) = self.nodes[node].state.begin_arriving() else {
            return Ok(());
        };
        let quiet = self.chain.at.is_none() && !self.checkpointing() && !self.shutting_down;
        if self.cfg.sync() || !self.wanted || self.finished || !quiet || others || !self.ready.is_empty() {
            return Ok(());
        }
        if self.remaining().is_some_and(|r| r <= frames as u64) {
            return Ok(());
        }
        // The `Continue` that `release` sends makes the node `Released`.
        self.interval_push(self.batches_yielded + 1, out);
        self.release(node, out)
    }

    /// Hands `c` to the consumer as the next batch of the run.
    fn emit(&mut self, mut c: Collected, push: bool, out: &mut Vec<Output>) {
        c.index = self.batches_yielded;
        c.policy_lag = self.version.saturating_sub(c.weights_version);
        c.lagging = self.cfg.max_policy_lag.is_some_and(|max| c.policy_lag > max);
        self.wanted = false;
        self.batches_yielded += 1;
        self.frames_yielded += c.data.numel() as u64;
        out.push(Output::Yield(c));
        if push {
            self.interval_push(self.batches_yielded, out);
        }
        if self.remaining() == Some(0) {
            self.finished = true;
        }
    }

    /// A node's batch: accepted if it answers the `Continue` expected of the node
    /// and holds what was asked; then stacked into the sync round or queued to yield.
    pub(super) fn on_batch(&mut self, mut b: Batch, out: &mut Vec<Output>) -> Result<(), TrainerError> {
        let node = b.node;
        // Whatever it turns out to be, the node's frame on its way is whole.
        self.nodes[node].state.batch_whole();
        let st = &self.nodes[node];
        // A node answers in order: the batch on its way first, then the outstanding one.
        let expected = st.state.expected();
        let Some(Asked { frames, version, .. }) = expected.filter(|a| a.seq == b.seq) else {
            let replaced = self.supervision.is_some() || self.elastic.is_some();
            if replaced && (st.state.is_restarting() || b.seq < st.incarnation_seq) {
                self.dropped_late += 1;
                tracing::info!(node, seq = b.seq, "dropped a late batch of a replaced node incarnation");
                return Ok(());
            }
            return Err(TrainerError::UnexpectedBatch {
                node,
                seq: b.seq,
                expected: match expected {
                    Some(a) => format!("seq {}", a.seq),
                    None => "nothing".into(),
                },
            });
        };
        if b.weights_version != version {
            // A node applies updates between batches, in order: its batch is collected
            // with the last weights sent before its `Continue`, which the trainer knows.
            return Err(TrainerError::BadBatch {
                node,
                reason: format!(
                    "claims weights version {}, but the last weights sent to it before its continue (seq {}) \
                     were version {version}",
                    b.weights_version, b.seq
                ),
            });
        }
        let envs = self.cfg.envs(node);
        let bs = b.data.batch_size();
        // Sizes from outside: their product is checked, never wrapped.
        let count = match bs {
            [e, steps] => e.checked_mul(*steps),
            _ => None,
        };
        if bs.len() != 2 || bs[0] != envs || count != Some(frames) {
            return Err(TrainerError::BadBatch {
                node,
                reason: format!("asked for {frames} frames over {envs} envs, got batch shape {bs:?}"),
            });
        }
        b.data.validate().map_err(|e| TrainerError::BadBatch {
            node,
            reason: e.to_string(),
        })?;
        self.layouts
            .check(node, &b.data)
            .map_err(|reason| TrainerError::BadBatch { node, reason })?;
        let st = &mut self.nodes[node];
        // A slot's later holders (a restarted node, an elastic joiner) have their ids
        // shifted past the earlier ones'.
        if self.supervision.is_some() || self.elastic.is_some() {
            if let Ok(Tensor::I64(ids)) = b.data.get_mut(keys::TRAJ_IDS) {
                let off = st.book.traj_offset;
                if off > 0 {
                    shift_traj_ids(ids, off).map_err(|reason| TrainerError::BadBatch { node, reason })?;
                }
                if let Some(m) = crate::tensor::max_i64(ids).and_then(|m| u64::try_from(m).ok()) {
                    st.book.max_traj = Some(st.book.max_traj.map_or(m, |p| p.max(m)));
                }
            }
        }
        st.state.answered(self.now);
        st.book.since_update += 1;
        self.frames_collected += frames as u64;
        self.slot_delivered(node);
        if self.cfg.sync() {
            if !self.finished {
                if let Some(round) = self.round.as_mut() {
                    if round.shares[node].replace(b).is_none() {
                        round.missing -= 1;
                    }
                    if round.missing == 0 {
                        let shares: Vec<Batch> =
                            self.round.take().into_iter().flat_map(|r| r.shares).flatten().collect();
                        let versions: Vec<u64> = shares.iter().map(|s| s.weights_version).collect();
                        let data: Vec<TensorDict> = shares.into_iter().map(|s| s.data).collect();
                        let pool = &mut self.stacked;
                        let stacked = TensorDict::stack_into(&data, |dtype, n| pool.take(dtype, n));
                        pool.end_decode();
                        let stacked = stacked?;
                        for (node, data) in data.into_iter().enumerate() {
                            out.push(Output::Recycle { node, data });
                        }
                        self.emit(node_batch(None, versions, stacked), true, out);
                    }
                }
            }
        } else {
            // Kept even once the run is finished: a checkpoint then holds these frames,
            // and a run resumed with a larger `total_frames` yields them first.
            self.ready.push_back(b);
            self.try_yield_async(out)?;
            self.prefetch(node, out)?;
        }
        self.advance_checkpoint(out);
        Ok(())
    }
}

/// Adds a restarted node's trajectory-id offset `off` to every id (negative ids, for
/// no trajectory, stay): ids unique across incarnations. Nothing is changed when an
/// id would leave the i64 range (ids are the node's, the offset follows from them).
fn shift_traj_ids(ids: &mut ndarray::ArrayD<i64>, off: u64) -> Result<(), String> {
    let Some(max) = ids.iter().copied().filter(|&x| x >= 0).max() else {
        return Ok(());
    };
    let shifted = i64::try_from(off).ok().and_then(|o| max.checked_add(o).map(|_| o));
    let Some(o) = shifted else {
        return Err(format!("trajectory id {max} plus the restart offset {off} overflows"));
    };
    ids.mapv_inplace(|x| if x >= 0 { x + o } else { x });
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::super::test_support::*;
    use super::*;
    use crate::message::FromNode;

    #[test]
    fn a_sync_round_yields_once_every_share_arrived_stacked_in_node_order() {
        let mut m = machine(config(2, 1, 8, None, true));
        let out = request(&mut m);
        assert_eq!(continues(&out), vec![(0, 0, 4), (1, 1, 4)]);
        let out = feed(&mut m, batch(1, 1, 1, 4));
        assert!(yields(&out).is_empty(), "one share of two is no batch");
        let out = feed(&mut m, batch(0, 0, 1, 4));
        let y = yields(&out);
        assert_eq!(y.len(), 1);
        assert_eq!(y[0].node, None);
        assert_eq!(y[0].index, 0);
        assert_eq!(y[0].data.batch_size(), &[2, 1, 4]);
        let Ok(Tensor::I64(ids)) = y[0].data.get(keys::TRAJ_IDS) else {
            panic!("no trajectory ids in the stacked batch");
        };
        assert!(
            ids.index_axis(ndarray::Axis(0), 0).iter().all(|&x| x == 0),
            "node 0's share first"
        );
        assert!(ids.index_axis(ndarray::Axis(0), 1).iter().all(|&x| x == 1));
        let recycled: Vec<usize> = out
            .iter()
            .filter_map(|o| match o {
                Output::Recycle { node, .. } => Some(*node),
                _ => None,
            })
            .collect();
        assert_eq!(recycled, vec![0, 1], "each share's storage goes back to its node");
        assert!(continues(&out).is_empty(), "a sync round starts at the next request");
        assert_eq!(continues(&request(&mut m)), vec![(0, 2, 4), (1, 3, 4)]);
    }

    #[test]
    fn a_recycled_sync_round_takes_the_next_round_in_its_own_storage() {
        let ptrs = |d: &TensorDict| -> Vec<*const u8> {
            d.iter()
                .map(|(_, t)| match t {
                    Tensor::F32(a) => a.as_ptr().cast(),
                    Tensor::I64(a) => a.as_ptr().cast(),
                    Tensor::Bool(a) => a.as_ptr().cast(),
                    Tensor::F64(a) => a.as_ptr().cast(),
                    Tensor::U8(a) => a.as_ptr(),
                })
                .collect()
        };
        let mut m = machine(config(2, 1, 8, None, true));
        let round = |m: &mut TrainerMachine, seq: u64| {
            request(m);
            feed(m, batch(0, seq, 1, 4));
            let out = feed(m, batch(1, seq + 1, 1, 4));
            out.into_iter()
                .find_map(|o| match o {
                    Output::Yield(c) => Some(c.data),
                    _ => None,
                })
                .expect("a round")
        };
        let first = round(&mut m, 0);
        let slots = ptrs(&first);
        let size = first.batch_size().to_vec();
        let keys = first.len();
        m.recycle_round(first);
        assert_eq!(m.stacked.len(), keys, "the round's storage is kept, one vector per key");
        let second = round(&mut m, 2);
        assert!(m.stacked.is_empty(), "and taken by the next round");
        assert_eq!(
            ptrs(&second),
            slots,
            "every tensor stacked into the recycled round's storage"
        );
        assert_eq!(second.batch_size(), &size[..]);
        let Ok(Tensor::I64(ids)) = second.get(keys::TRAJ_IDS) else {
            panic!("no trajectory ids");
        };
        assert!(
            ids.index_axis(ndarray::Axis(0), 1).iter().all(|&x| x == 1),
            "the new round's frames"
        );
        // Not recycled: the next round is stacked into fresh storage.
        let third = round(&mut m, 4);
        assert!(ptrs(&third).iter().all(|p| !slots.contains(p)));
        // A round of another size, recycled, is not used (and is dropped by the next).
        m.recycle_round(data(0, 1, 2));
        let fourth = round(&mut m, 6);
        assert_eq!(fourth.batch_size(), &[2, 1, 4]);
    }

    #[test]
    fn a_sync_run_asks_the_last_batch_for_the_frames_left_and_then_finishes() {
        let mut m = machine(config(2, 1, 8, Some(12), true));
        request(&mut m);
        feed(&mut m, batch(0, 0, 1, 4));
        feed(&mut m, batch(1, 1, 1, 4));
        assert_eq!(continues(&request(&mut m)), vec![(0, 2, 2), (1, 3, 2)]);
        feed(&mut m, batch(0, 2, 1, 2));
        let out = feed(&mut m, batch(1, 3, 1, 2));
        assert_eq!(yields(&out)[0].data.numel(), 4);
        assert!(m.is_finished());
        assert_eq!(request(&mut m), vec![Output::Finished]);
    }

    #[test]
    fn async_batches_are_yielded_in_arrival_order_and_the_yielded_node_goes_on() {
        let mut m = machine(config(2, 1, 4, None, false));
        assert_eq!(continues(&request(&mut m)), vec![(0, 0, 4), (1, 1, 4)]);
        // Node 1 first: yielded at once, and only node 1 is asked again.
        let out = feed(&mut m, batch(1, 1, 1, 4));
        assert_eq!(yields(&out)[0].node, Some(1));
        assert_eq!(continues(&out), vec![(1, 2, 4)]);
        // The consumer is busy: batches wait in arrival order and their nodes idle.
        let out = feed(&mut m, batch(0, 0, 1, 4));
        assert!(yields(&out).is_empty() && continues(&out).is_empty());
        feed(&mut m, batch(1, 2, 1, 4));
        let out = request(&mut m);
        assert_eq!(yields(&out)[0].node, Some(0));
        assert_eq!(continues(&out), vec![(0, 3, 4)]);
        let out = request(&mut m);
        assert_eq!(yields(&out)[0].node, Some(1));
        assert_eq!(yields(&out)[0].index, 2);
        assert_eq!(continues(&out), vec![(1, 4, 4)]);
    }

    #[test]
    fn async_trims_the_last_batch_to_total_frames_and_asks_no_more() {
        let mut m = machine(config(1, 2, 8, Some(12), false));
        request(&mut m);
        feed(&mut m, batch(0, 0, 2, 8));
        let out = request(&mut m);
        assert!(continues(&out).is_empty(), "the node's batch waiting is enough");
        let out = feed(&mut m, batch(0, 1, 2, 8));
        assert_eq!(yields(&out)[0].data.batch_size(), &[2, 2], "4 of 8 frames are left");
        assert!(continues(&out).is_empty());
        assert!(m.is_finished());
    }

    #[test]
    fn early_release_sends_the_next_continue_while_the_batch_travels() {
        let mut m = machine(config(2, 1, 4, None, false));
        request(&mut m);
        let mut out = Vec::new();
        m.batch_arriving(0, &mut out).unwrap();
        assert_eq!(continues(&out), vec![(0, 2, 4)]);
        assert_eq!(m.outstanding(0), Some((2, 4)), "the newest Continue is outstanding");
        // The batch answering seq 0 is still the one expected first.
        let out = feed(&mut m, batch(0, 0, 1, 4));
        assert_eq!(yields(&out)[0].node, Some(0));
        assert!(continues(&out).is_empty(), "a released node is not asked twice");
        assert_eq!(m.outstanding(0), Some((2, 4)));
        request(&mut m);
        let out = feed(&mut m, batch(0, 2, 1, 4));
        assert_eq!(yields(&out)[0].index, 1);
    }

    #[test]
    fn early_release_waits_when_another_nodes_batch_is_on_its_way() {
        let mut m = machine(config(2, 1, 4, None, false));
        request(&mut m);
        let mut out = Vec::new();
        m.batch_arriving(1, &mut out).unwrap();
        assert_eq!(continues(&out), vec![(1, 2, 4)]);
        let mut out = Vec::new();
        m.batch_arriving(0, &mut out).unwrap();
        assert!(
            out.is_empty(),
            "node 1's batch is yielded first, so node 0 is not released"
        );
        // Once node 1's batch is whole, nothing of it is on its way.
        feed(&mut m, batch(1, 1, 1, 4));
        assert_eq!(m.outstanding(0), Some((0, 4)));
    }

    #[test]
    fn early_release_waits_for_a_consumer() {
        let mut m = machine(config(2, 1, 4, None, false));
        request(&mut m);
        feed(&mut m, batch(1, 1, 1, 4));
        // The consumer got node 1's batch and has not asked again.
        let mut out = Vec::new();
        m.batch_arriving(0, &mut out).unwrap();
        assert!(out.is_empty(), "nobody waits for the batch");
        let out = feed(&mut m, batch(0, 0, 1, 4));
        assert!(continues(&out).is_empty(), "node 0 goes on when its batch is yielded");
        assert_eq!(continues(&request(&mut m)), vec![(0, 3, 4)]);
    }

    #[test]
    fn early_release_is_off_in_sync_mode_and_for_the_last_batch() {
        let mut m = machine(config(2, 1, 8, None, true));
        request(&mut m);
        let mut out = Vec::new();
        m.batch_arriving(0, &mut out).unwrap();
        assert!(out.is_empty(), "sync shares are asked per round");

        let mut m = machine(config(1, 1, 4, Some(4), false));
        request(&mut m);
        let mut out = Vec::new();
        m.batch_arriving(0, &mut out).unwrap();
        assert!(out.is_empty(), "the arriving batch holds every frame left");
    }

    #[test]
    fn a_batch_answering_no_outstanding_continue_is_refused() {
        let mut m = machine(config(1, 1, 4, None, false));
        request(&mut m);
        let mut out = Vec::new();
        let r = m.on_node(batch(0, 7, 1, 4), &mut out);
        assert_eq!(
            r,
            Err(TrainerError::UnexpectedBatch {
                node: 0,
                seq: 7,
                expected: "seq 0".into()
            })
        );
        assert_eq!(m.outstanding(0), Some((0, 4)), "still waiting for seq 0");
    }

    #[test]
    fn a_batch_of_the_wrong_size_is_refused_and_the_continue_stays_outstanding() {
        let mut m = machine(config(1, 1, 4, None, false));
        request(&mut m);
        let mut out = Vec::new();
        let r = m.on_node(batch(0, 0, 1, 2), &mut out);
        assert!(matches!(r, Err(TrainerError::BadBatch { node: 0, .. })), "{r:?}");
        assert_eq!(m.outstanding(0), Some((0, 4)));
    }

    #[test]
    fn a_batch_whose_frame_count_wraps_is_refused_not_counted() {
        // 2 × (2^63 + 500) is 1000 modulo 2^64: the frames asked.
        let mut m = machine(config(1, 2, 1000, None, false));
        request(&mut m);
        let data = TensorDict::new(&[2, (1usize << 63) + 500]);
        let b = FromNode::Batch(Batch {
            node: 0,
            seq: 0,
            weights_version: 0,
            data,
        });
        let r = m.on_node(b, &mut Vec::new());
        assert!(matches!(r, Err(TrainerError::BadBatch { node: 0, .. })), "{r:?}");
        assert_eq!(m.frames_yielded(), 0);
        assert_eq!(m.outstanding(0), Some((0, 1000)), "the Continue stays outstanding");
    }

    #[test]
    fn trajectory_ids_that_overflow_with_the_restart_offset_are_refused_unchanged() {
        let mut ids = ndarray::ArrayD::from_shape_vec(vec![3], vec![-1, 4, i64::MAX - 9]).unwrap();
        assert_eq!(
            shift_traj_ids(&mut ids, 10),
            Err(format!(
                "trajectory id {} plus the restart offset 10 overflows",
                i64::MAX - 9
            ))
        );
        assert_eq!(ids.as_slice().unwrap(), &[-1, 4, i64::MAX - 9], "nothing changed");
        assert!(shift_traj_ids(&mut ids, u64::MAX).is_err(), "an offset past i64");
        assert_eq!(shift_traj_ids(&mut ids, 9), Ok(()));
        assert_eq!(ids.as_slice().unwrap(), &[-1, 13, i64::MAX]);
        let mut none = ndarray::ArrayD::from_shape_vec(vec![2], vec![-1, -1]).unwrap();
        assert_eq!(
            shift_traj_ids(&mut none, u64::MAX),
            Ok(()),
            "no trajectory, nothing to shift"
        );
    }
}
