//! The consumer's side of the trainer: batches pulled or pushed, weights stored
//! and pushed, seeds, checkpoints, shutdown, recycled batches and overdue waits.

use actix::prelude::*;
use rollout::checkpoint::Checkpoint;
use rollout::machine::Collected;
use tokio::sync::oneshot;

use super::{GetStats, Overdue, Trainer};
use crate::error::CollectError;
use crate::messages::{
    CancelNext, GetWeights, NextBatch, PushWeights, Recycle, ResetEnvs, SetSeed, StopNodes, StoreWeights, Subscribe,
    TakeCheckpoint, TrainerEvent,
};

impl Handler<GetStats> for Trainer {
    type Result = MessageResult<GetStats>;

    fn handle(&mut self, _msg: GetStats, _ctx: &mut Self::Context) -> Self::Result {
        MessageResult(self.machine.stats())
    }
}

impl Handler<NextBatch> for Trainer {
    type Result = ResponseFuture<Result<Option<Collected>, CollectError>>;

    fn handle(&mut self, _msg: NextBatch, _ctx: &mut Self::Context) -> Self::Result {
        if let Some(e) = self.failure.clone() {
            return Box::pin(async move { Err(e) });
        }
        let (tx, rx) = oneshot::channel();
        self.next = Some(tx);
        self.begin_wait();
        self.tick();
        if let Err(e) = self.machine.request(&mut self.out) {
            self.fail(e.into());
        }
        self.dispatch();
        Box::pin(async move {
            rx.await
                .unwrap_or_else(|_| Err(CollectError::Stopped("the trainer dropped the request".into())))
        })
    }
}

impl Handler<StoreWeights> for Trainer {
    type Result = Result<u64, CollectError>;

    fn handle(&mut self, msg: StoreWeights, _ctx: &mut Self::Context) -> Self::Result {
        self.machine.check_weights(&msg.0)?;
        let version = self.machine.set_weights(msg.0);
        if let Some(m) = &self.metrics {
            m.stored(version);
        }
        Ok(version)
    }
}

impl Handler<CancelNext> for Trainer {
    type Result = ();

    fn handle(&mut self, _msg: CancelNext, _ctx: &mut Self::Context) {
        if let Some(tx) = self.next.take() {
            let _ = tx.send(Ok(None));
        }
    }
}

impl Handler<GetWeights> for Trainer {
    type Result = Option<std::sync::Arc<rollout::Weights>>;

    fn handle(&mut self, msg: GetWeights, _ctx: &mut Self::Context) -> Self::Result {
        self.machine.current_weights(msg.0).cloned()
    }
}

impl Handler<PushWeights> for Trainer {
    type Result = Result<(), CollectError>;

    fn handle(&mut self, msg: PushWeights, _ctx: &mut Self::Context) -> Self::Result {
        self.tick();
        let r = self.machine.push_weights(msg.0.as_deref(), &mut self.out);
        self.dispatch();
        Ok(r?)
    }
}

impl Handler<SetSeed> for Trainer {
    type Result = ResponseFuture<Result<u64, CollectError>>;

    fn handle(&mut self, msg: SetSeed, _ctx: &mut Self::Context) -> Self::Result {
        let (tx, rx) = oneshot::channel();
        self.seed = Some(tx);
        self.tick();
        self.machine.set_seed(msg.0, &mut self.out);
        self.dispatch();
        Box::pin(async move {
            rx.await
                .unwrap_or_else(|_| Err(CollectError::Stopped("the trainer dropped the request".into())))
        })
    }
}

impl Handler<ResetEnvs> for Trainer {
    type Result = ResponseFuture<Result<u64, CollectError>>;

    fn handle(&mut self, _msg: ResetEnvs, _ctx: &mut Self::Context) -> Self::Result {
        // The chain answers as `SetSeed`'s does (`Output::Seeded`).
        let (tx, rx) = oneshot::channel();
        self.seed = Some(tx);
        self.tick();
        self.machine.reset_envs(&mut self.out);
        self.dispatch();
        Box::pin(async move {
            rx.await
                .unwrap_or_else(|_| Err(CollectError::Stopped("the trainer dropped the request".into())))
        })
    }
}

impl Handler<TakeCheckpoint> for Trainer {
    type Result = ResponseFuture<Result<Box<Checkpoint>, CollectError>>;

    fn handle(&mut self, msg: TakeCheckpoint, ctx: &mut Self::Context) -> Self::Result {
        if let Some(e) = self.failure.clone() {
            return Box::pin(async move { Err(e) });
        }
        let (tx, rx) = oneshot::channel();
        self.tick();
        let id = match self.machine.begin_checkpoint(&mut self.out) {
            Ok(id) => id,
            Err(e) => return Box::pin(async move { Err(e.into()) }),
        };
        self.checkpoint = Some(tx);
        self.dispatch();
        // A node that never answers must not hold collection back: past the deadline
        // the checkpoint is given up and the waiting requests are served.
        let timeout = msg.timeout;
        ctx.run_later(timeout, move |act, _ctx| {
            let reason = format!(
                "not every node reported its state within {:.1} s",
                timeout.as_secs_f64()
            );
            let r = act.machine.cancel_checkpoint(id, reason, &mut act.out);
            act.on_result(r);
            act.dispatch();
        });
        Box::pin(async move {
            rx.await
                .unwrap_or_else(|_| Err(CollectError::Stopped("the trainer dropped the request".into())))
        })
    }
}

impl Handler<StopNodes> for Trainer {
    type Result = ResponseFuture<Result<(), CollectError>>;

    fn handle(&mut self, _msg: StopNodes, _ctx: &mut Self::Context) -> Self::Result {
        let (tx, rx) = oneshot::channel();
        self.stop = Some(tx);
        if let Some(tx) = self.next.take() {
            let _ = tx.send(Ok(None));
        }
        self.tick();
        self.machine.shutdown(&mut self.out);
        self.dispatch();
        Box::pin(async move {
            rx.await
                .unwrap_or_else(|_| Err(CollectError::Stopped("the trainer dropped the request".into())))
        })
    }
}

impl Handler<Subscribe> for Trainer {
    type Result = ();

    fn handle(&mut self, msg: Subscribe, _ctx: &mut Self::Context) {
        self.sink = Some(msg.0);
        self.begin_wait();
        if let Err(e) = self.machine.request(&mut self.out) {
            self.fail(e.into());
        }
        self.dispatch();
    }
}

impl Handler<Recycle> for Trainer {
    type Result = ();

    fn handle(&mut self, msg: Recycle, _ctx: &mut Self::Context) {
        // A split, transformed or emptied batch is no node's storage any more.
        if self.delivery.keeps_storage() {
            self.machine.count_recycled();
            self.recycle(msg.node, msg.data);
        }
    }
}

impl Handler<Overdue> for Trainer {
    type Result = ();

    fn handle(&mut self, msg: Overdue, _ctx: &mut Self::Context) {
        if msg.0 != self.wait {
            return;
        }
        let Some(limit) = self.delivery.batch_timeout else {
            return;
        };
        // The consumer hears of it; collection goes on, and the batch that comes late
        // is yielded to the next wait (push mode) or dropped with its reply (pull).
        self.wait += 1;
        let e = self.late("collecting a batch", limit.as_secs_f64());
        if let Some(sink) = &self.sink {
            sink.do_send(TrainerEvent::Failed(e));
        } else if let Some(tx) = self.next.take() {
            let _ = tx.send(Err(e));
        }
    }
}
