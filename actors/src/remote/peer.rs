//! The trainer's side of a remote node: the actor that keeps its connection alive.
//!
//! It fires the heartbeat timer and stops when the connection closes. What goes
//! through the connection each round (batches in, `continue` out, spent batches
//! back to their storage) does not pass through it: the trainer's actor uses the
//! [`Connection`] directly and reads its frames in its [`Inbox`](super::inbox::Inbox)
//! (why: see [`super::connection`]). When a heartbeat is due and when the node is
//! gone is decided by the connection's `TrainerSession` (the protocol's rules, in
//! the core); silence becomes a logged reason and the node's `Failed`.

use std::rc::Rc;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use actix::prelude::*;
use rollout::wire::NodeFrame;

use super::arrival::ArrivalNotice;
use super::connection::{Connection, Disconnect, WeightsCache};
use super::frames::FrameStream;
use super::inbox::Inbox;
use super::link::spawn_writer;
use super::listener::Joined;

/// Settings of a peer connection.
#[derive(Clone, Copy, Debug)]
pub struct PeerTiming {
    /// How often a heartbeat goes out.
    pub heartbeat: Duration,
    /// Silence after which the peer is gone.
    pub timeout: Duration,
    /// Largest frame body.
    pub max_frame: usize,
}

/// Opens the connection of node `j`, which passed the handshake (`early`: its bytes
/// read past the handshake): its frames are read in `inbox`, its actor keeps it
/// alive and calls `on_stop` once it stopped. What the trainer uses to reach it is
/// returned.
pub fn open(
    j: Joined,
    early: Vec<u8>,
    inbox: &Inbox,
    cache: &WeightsCache,
    timing: PeerTiming,
    on_stop: Option<Box<dyn FnOnce()>>,
) -> Rc<Connection> {
    let (read, write) = j.stream.into_split();
    let ctx = Context::<RemoteNode>::new();
    let me = ctx.address();
    let actor = me.downgrade().recipient();
    let (out, _writer) = spawn_writer(write, move |reason| me.do_send(Disconnect(reason)));
    let conn = Rc::new(Connection::new(
        j.index,
        j.name,
        out,
        cache.clone(),
        timing,
        inbox.clone(),
        actor,
    ));
    // A node goes on while its batch travels, when the trainer lets it.
    let arriving = ArrivalNotice::new();
    let frames = FrameStream::<NodeFrame>::new(read, timing.max_frame, conn.pool())
        .on_batch(arriving.clone())
        .with_prefill(early);
    inbox.read(Rc::clone(&conn), frames, arriving);
    ctx.run(RemoteNode {
        conn: Rc::clone(&conn),
        on_stop,
    });
    conn
}

/// A remote node's connection actor: heartbeats and silence.
pub struct RemoteNode {
    conn: Rc<Connection>,
    /// Called once the actor stopped (an elastic run frees the node's slot): after the
    /// connection closed and the trainer was told, so a node joining the slot next is
    /// heard after it.
    on_stop: Option<Box<dyn FnOnce()>>,
}

impl RemoteNode {
    /// Schedules the next heartbeat (and silence check) on the next beat of the
    /// shared clock ([`until_next_beat`]).
    fn next_beat(&self, ctx: &mut Context<Self>) {
        let every = self.conn.heartbeat_interval();
        ctx.run_later(until_next_beat(Instant::now(), every), |act, ctx| {
            if act.conn.beat(Instant::now()) {
                act.next_beat(ctx);
            } else {
                ctx.stop();
            }
        });
    }
}

impl Actor for RemoteNode {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Self::Context) {
        if self.conn.is_closed() {
            return ctx.stop();
        }
        self.next_beat(ctx);
    }

    fn stopped(&mut self, _ctx: &mut Self::Context) {
        // Stopped with its connection open (the actor system shutting down, say):
        // the connection closes with it.
        self.conn.close("the connection's actor stopped".into());
        if let Some(f) = self.on_stop.take() {
            f();
        }
    }
}

/// How long from `now` to the next multiple of `every` on one clock shared by every
/// connection of the process: the trainer's heartbeats to all its nodes fall on the
/// same beats, so one wakeup sends them all (a timer per connection, each on its own
/// phase, woke the trainer, and every node behind it, once per node and interval).
/// Each connection still hears a heartbeat every `every`.
pub(super) fn until_next_beat(now: Instant, every: Duration) -> Duration {
    static EPOCH: OnceLock<Instant> = OnceLock::new();
    beat_delay(*EPOCH.get_or_init(Instant::now), now, every)
}

/// From `now` to the next `epoch + k * every`.
fn beat_delay(epoch: Instant, now: Instant, every: Duration) -> Duration {
    let every_ns = every.as_nanos().max(1);
    let phase = now.saturating_duration_since(epoch).as_nanos() % every_ns;
    Duration::from_nanos(u64::try_from(every_ns - phase).unwrap_or(u64::MAX))
}

impl Handler<Disconnect> for RemoteNode {
    type Result = ();

    /// Closes the connection (if it is not yet) and stops.
    fn handle(&mut self, msg: Disconnect, ctx: &mut Self::Context) {
        self.conn.close(msg.0);
        ctx.stop();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn heartbeats_fall_on_the_beats_of_one_clock_an_interval_apart() {
        let every = Duration::from_millis(1000);
        let epoch = Instant::now();
        let ms = Duration::from_millis;
        assert_eq!(
            beat_delay(epoch, epoch, every),
            every,
            "on a beat: the next is a whole interval away"
        );
        assert_eq!(
            beat_delay(epoch, epoch + ms(300), every),
            ms(700),
            "a connection started later: the same beat"
        );
        assert_eq!(
            beat_delay(epoch, epoch + ms(1002), every),
            ms(998),
            "a timer fired late does not drift"
        );
        assert_eq!(
            beat_delay(epoch + ms(5), epoch, every),
            every,
            "before the epoch: one interval"
        );
        let first = until_next_beat(Instant::now(), every);
        assert!(first > Duration::ZERO && first <= every, "{first:?}");
    }
}
