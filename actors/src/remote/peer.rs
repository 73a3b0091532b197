//! The trainer's side of a remote node: the actor that keeps its connection alive.
//!
//! It fires the heartbeat timer and stops when the connection closes. What goes
//! through the connection each round (batches in, `continue` out, spent batches
//! back to their storage) does not pass through it: the trainer's actor uses the
//! [`Connection`] directly and reads its frames in its [`Inbox`](super::inbox::Inbox)
//! (why: see [`super::connection`]). When a heartbeat is due and when the node is
//! gone is decided by the connection's `TrainerSession` (the protocol's rules, in
//! the core); silence becomes a logged reason and the node's `Failed`.

use std::cell::RefCell;
use std::rc::Rc;
use std::time::Instant;

use actix::prelude::*;
use rollout::connection::Admission;
use rollout::wire::NodeFrame;

use super::arrival::ArrivalNotice;
use super::connection::{Connection, Disconnect, WeightsCache};
use super::frames::FrameStream;
use super::inbox::{Inbox, InboxItem};
use super::link::spawn_writer;
use super::listener::Joined;
use super::timing::{until_next_beat, PeerTiming};

/// Opens the connection of node `j`, which passed the handshake (`early`: its bytes
/// read past the handshake): its frames are read in `inbox`, its actor keeps it
/// alive and calls `on_stop` once it stopped. What the trainer uses to reach it is
/// returned.
pub(crate) fn open(
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
        {
            let inbox = inbox.clone();
            Box::new(move |failed| inbox.push(InboxItem::Message(failed)))
        },
        actor,
    ));
    // A node goes on while its batch travels, when the trainer lets it.
    let arriving = ArrivalNotice::new();
    let frames = FrameStream::<NodeFrame>::new(read, timing.max_frame, conn.pool())
        .on_batch(arriving.clone())
        .count_into(conn.bytes_in_counter())
        .with_prefill(early);
    inbox.read(Rc::clone(&conn), frames, arriving);
    ctx.run(RemoteNode {
        conn: Rc::clone(&conn),
        on_stop,
    });
    conn
}

/// [`open`] for a node admitted into a slot of `frees` (elastic runs): its slot is
/// free again once its actor stopped, after the trainer was told of its close.
pub(crate) fn open_in_slot(
    j: Joined,
    early: Vec<u8>,
    inbox: &Inbox,
    cache: &WeightsCache,
    timing: PeerTiming,
    frees: Option<Rc<RefCell<Admission>>>,
) -> Rc<Connection> {
    let slot = j.index;
    let on_stop =
        frees.map(|admission| -> Box<dyn FnOnce()> { Box::new(move || admission.borrow_mut().release(slot)) });
    open(j, early, inbox, cache, timing, on_stop)
}

/// A remote node's connection actor: heartbeats and silence.
pub(crate) struct RemoteNode {
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

impl Handler<Disconnect> for RemoteNode {
    type Result = ();

    /// Closes the connection (if it is not yet) and stops.
    fn handle(&mut self, msg: Disconnect, ctx: &mut Self::Context) {
        self.conn.close(msg.0);
        ctx.stop();
    }
}
