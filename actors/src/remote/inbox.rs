//! The trainer's inbox from its remote nodes: one stream, polled by the trainer's
//! actor, of every connection's messages, batch arrivals, failures, joins and
//! restarts.
//!
//! Why one stream: the trainer's actor reads each connection's frames itself, from
//! whichever sockets are ready (a [`SelectAll`] wakes only the readers whose socket
//! woke), instead of one actor per connection reading and passing each message on
//! through the trainer's mailbox (see [`super::connection`]). And one order: a
//! slot's failure is queued here when its connection closes, before its slot can be
//! taken again, so the trainer hears a slot's old node before its next.

use std::cell::RefCell;
use std::collections::VecDeque;
use std::pin::Pin;
use std::rc::Rc;
use std::task::{Context, Poll, Waker};
use std::time::Instant;

use futures_util::stream::{SelectAll, Stream, StreamExt};
use rollout::connection::Inbound;
use rollout::message::FromNode;
use rollout::wire::NodeFrame;

use super::arrival::ArrivalNotice;
use super::connection::Connection;
use super::frames::FrameStream;

/// What the trainer hears from its remote nodes.
pub(crate) enum InboxItem {
    /// A node's message (a node whose connection closed: its `Failed`).
    Message(FromNode),
    /// Node `0`'s batch has begun to arrive (early release).
    Arriving(usize),
    /// Elastic runs: a node joined free slot `0` while the run goes on.
    Joined(usize, Rc<Connection>),
    /// A node joined as slot `0` to replace the one a restart gave up.
    Restarted(usize, Rc<Connection>),
}

/// Where the launcher and the connections queue what the trainer hears; the
/// trainer's actor polls its [`InboxStream`]. Cloned handles share one queue; all on
/// the trainer's thread.
#[derive(Clone, Default)]
pub(crate) struct Inbox(Rc<Queue>);

#[derive(Default)]
struct Queue {
    /// Failures, joins and restarts, in the order they happened.
    events: RefCell<VecDeque<InboxItem>>,
    /// Readers of connections opened since the stream last looked.
    readers: RefCell<Vec<ConnReader>>,
    /// The stream's task.
    waker: RefCell<Option<Waker>>,
}

impl Inbox {
    /// An empty inbox.
    pub(crate) fn new() -> Inbox {
        Inbox::default()
    }

    /// Queues `item` for the trainer.
    pub(crate) fn push(&self, item: InboxItem) {
        self.0.events.borrow_mut().push_back(item);
        self.wake();
    }

    /// Reads `conn`'s frames from `frames`, which raises `arriving` when a batch
    /// begins to arrive.
    pub(crate) fn read(&self, conn: Rc<Connection>, frames: FrameStream<NodeFrame>, arriving: ArrivalNotice) {
        self.0.readers.borrow_mut().push(ConnReader {
            conn,
            frames,
            arriving,
            done: false,
        });
        self.wake();
    }

    fn wake(&self) {
        let w = self.0.waker.borrow().clone();
        if let Some(w) = w {
            w.wake();
        }
    }

    /// The stream for the trainer's actor (one per inbox: it owns the readers).
    pub(crate) fn stream(&self) -> InboxStream {
        InboxStream {
            inbox: self.clone(),
            readers: SelectAll::new(),
        }
    }
}

/// The trainer's side of an [`Inbox`]: queued events first, then whatever a ready
/// connection has. It never ends (a run without remote nodes left waits for joins).
pub(crate) struct InboxStream {
    inbox: Inbox,
    readers: SelectAll<ConnReader>,
}

impl Stream for InboxStream {
    type Item = InboxItem;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<InboxItem>> {
        let this = self.get_mut();
        let q = &this.inbox.0;
        {
            let mut w = q.waker.borrow_mut();
            if !w.as_ref().is_some_and(|w| w.will_wake(cx.waker())) {
                *w = Some(cx.waker().clone());
            }
        }
        let event = q.events.borrow_mut().pop_front();
        if let Some(e) = event {
            return Poll::Ready(Some(e));
        }
        let new: Vec<ConnReader> = q.readers.borrow_mut().drain(..).collect();
        for r in new {
            this.readers.push(r);
        }
        match this.readers.poll_next_unpin(cx) {
            Poll::Ready(Some(item)) => Poll::Ready(Some(item)),
            // No connection now: the stream waits for the next (`read` wakes it).
            Poll::Ready(None) | Poll::Pending => Poll::Pending,
        }
    }
}

/// One connection's frames, under its session's rules: a stream of what the
/// trainer hears from it, which ends when the connection closes.
struct ConnReader {
    conn: Rc<Connection>,
    frames: FrameStream<NodeFrame>,
    arriving: ArrivalNotice,
    done: bool,
}

impl ConnReader {
    /// The connection closes for `reason`; this reader ends.
    fn close(&mut self, reason: String) -> Poll<Option<InboxItem>> {
        self.done = true;
        self.conn.close(reason);
        Poll::Ready(None)
    }
}

impl Stream for ConnReader {
    type Item = InboxItem;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<InboxItem>> {
        let this = self.get_mut();
        loop {
            if this.done || this.conn.is_closed() {
                // Closed elsewhere (silence, the trainer, a restart): the read side drops.
                this.done = true;
                return Poll::Ready(None);
            }
            this.conn.watch(cx.waker());
            let frame = match Pin::new(&mut this.frames).poll_next(cx) {
                Poll::Pending => {
                    return match this.arriving.take() {
                        true => Poll::Ready(Some(InboxItem::Arriving(this.conn.index()))),
                        false => Poll::Pending,
                    }
                }
                Poll::Ready(None) => return this.close("the node closed the connection".into()),
                Poll::Ready(Some(Err(e))) => return this.close(e.to_string()),
                Poll::Ready(Some(Ok(frame))) => frame,
            };
            match this.conn.on_frame(frame, Instant::now()) {
                Inbound::Deliver(msg @ FromNode::Leave { .. }) => {
                    // The node left: the trainer hears it, the connection closes (no
                    // failure: the node said so).
                    tracing::info!(node = this.conn.index(), "node left");
                    let _ = this.close("the node left".into());
                    return Poll::Ready(Some(InboxItem::Message(msg)));
                }
                Inbound::Deliver(msg) => return Poll::Ready(Some(InboxItem::Message(msg))),
                // A trainer's session never asks it to answer a heartbeat.
                Inbound::Nothing | Inbound::Answer => {}
                Inbound::Close(reason) => return this.close(reason),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use ndarray::{ArrayD, IxDyn};
    use rollout::message::Batch;
    use rollout::wire::{encode, DEFAULT_MAX_FRAME};
    use rollout::{Tensor, TensorDict};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::{TcpListener, TcpStream};

    use super::*;
    use crate::remote::connection::WeightsCache;
    use crate::remote::listener::Joined;
    use crate::remote::peer;
    use crate::remote::timing::PeerTiming;

    const TIMING: PeerTiming = PeerTiming {
        heartbeat: Duration::from_secs(30),
        timeout: Duration::from_secs(90),
        max_frame: DEFAULT_MAX_FRAME,
    };

    /// Node `index`'s side of a connection opened into `inbox` as the trainer opens one.
    async fn connect(inbox: &Inbox, index: usize) -> (TcpStream, Rc<Connection>) {
        let l = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = l.local_addr().expect("addr");
        let node = TcpStream::connect(addr).await.expect("connect");
        let (stream, _) = l.accept().await.expect("accept");
        let j = Joined {
            index,
            name: format!("node-{index}"),
            stream: crate::remote::stream::PeerStream::Plain(stream),
        };
        let conn = peer::open(j, Vec::new(), inbox, &WeightsCache::default(), TIMING, None);
        (node, conn)
    }

    async fn send(node: &mut TcpStream, msg: FromNode) {
        let bytes = encode(&NodeFrame::Message(msg), DEFAULT_MAX_FRAME).expect("encodes");
        node.write_all(&bytes).await.expect("written");
    }

    fn ready(node: usize) -> FromNode {
        FromNode::Ready {
            node,
            layout: Default::default(),
            specs: None,
        }
    }

    /// A batch whose observations (8,000 f32, 32 KB) take more than one read.
    fn batch(node: usize) -> FromNode {
        let obs =
            Tensor::F32(ArrayD::from_shape_vec(IxDyn(&[1, 2000, 4]), (0..8000).map(|i| i as f32).collect()).unwrap());
        FromNode::Batch(Batch {
            node,
            seq: 1,
            weights_version: 0,
            data: TensorDict::from_entries(&[1, 2000], [("observation".to_string(), obs)]).unwrap(),
        })
    }

    /// The inbox's next item, within a deadline (a hung inbox fails the test).
    async fn next(s: &mut InboxStream) -> InboxItem {
        tokio::time::timeout(Duration::from_secs(10), s.next())
            .await
            .expect("the inbox answered within 10 s")
            .expect("the inbox never ends")
    }

    fn message(item: InboxItem) -> FromNode {
        match item {
            InboxItem::Message(m) => m,
            InboxItem::Arriving(n) => panic!("a message, not node {n}'s arrival"),
            InboxItem::Joined(n, _) | InboxItem::Restarted(n, _) => panic!("a message, not node {n} joining"),
        }
    }

    /// The next message, past arrival notices (a 32 KB batch may come in pieces).
    async fn next_message(s: &mut InboxStream) -> FromNode {
        loop {
            match next(s).await {
                InboxItem::Arriving(_) => continue,
                item => return message(item),
            }
        }
    }

    /// The trainer closed its side: the node reads to the end, within a deadline.
    async fn closed_by_trainer(node: &mut TcpStream) {
        let mut rest = Vec::new();
        tokio::time::timeout(Duration::from_secs(10), node.read_to_end(&mut rest))
            .await
            .expect("the trainer closed within 10 s")
            .expect("a clean close");
    }

    /// Nothing is queued or ready: the stream, polled now, has nothing.
    fn nothing_more(s: &mut InboxStream) {
        let waker = futures_util::task::noop_waker();
        let mut cx = Context::from_waker(&waker);
        assert!(Pin::new(s).poll_next(&mut cx).is_pending(), "nothing more");
    }

    #[test]
    fn two_connections_messages_come_in_each_one_s_order() {
        actix_rt::System::new().block_on(async {
            let inbox = Inbox::new();
            let mut s = inbox.stream();
            let (mut a, _ca) = connect(&inbox, 0).await;
            let (mut b, _cb) = connect(&inbox, 1).await;
            send(&mut a, ready(0)).await;
            send(&mut b, ready(1)).await;
            send(&mut a, batch(0)).await;
            send(&mut b, FromNode::Seeded { node: 1, next_seed: 7 }).await;
            let mut got = Vec::new();
            for _ in 0..4 {
                got.push(next_message(&mut s).await);
            }
            let of = |n: usize| got.iter().filter(|m| m.node() == n).cloned().collect::<Vec<_>>();
            assert_eq!(of(0), vec![ready(0), batch(0)]);
            assert_eq!(of(1), vec![ready(1), FromNode::Seeded { node: 1, next_seed: 7 }]);
            nothing_more(&mut s);
        });
    }

    #[test]
    fn a_bad_frame_closes_the_connection_and_its_failure_comes_after_its_last_message() {
        actix_rt::System::new().block_on(async {
            let inbox = Inbox::new();
            let mut s = inbox.stream();
            let (mut node, conn) = connect(&inbox, 0).await;
            send(&mut node, ready(0)).await;
            send(&mut node, batch(0)).await;
            node.write_all(&[0, 0, 0, 3, 0xc1, 0xc1, 0xc1]).await.expect("written");
            // Sent after the bad frame: never heard.
            send(&mut node, FromNode::Seeded { node: 0, next_seed: 1 }).await;
            assert_eq!(next_message(&mut s).await, ready(0));
            assert_eq!(next_message(&mut s).await, batch(0));
            match next_message(&mut s).await {
                FromNode::Failed { node: 0, reason } => assert!(reason.contains("bad frame"), "{reason}"),
                other => panic!("node 0's failure, not {other:?}"),
            }
            assert!(conn.is_closed());
            closed_by_trainer(&mut node).await;
            nothing_more(&mut s);
            assert_eq!(s.readers.len(), 0, "the reader ended");
        });
    }

    #[test]
    fn a_node_that_leaves_is_heard_then_closed_without_a_failure() {
        actix_rt::System::new().block_on(async {
            let inbox = Inbox::new();
            let mut s = inbox.stream();
            let (mut node, conn) = connect(&inbox, 2).await;
            send(&mut node, ready(2)).await;
            send(&mut node, FromNode::Leave { node: 2 }).await;
            assert_eq!(next_message(&mut s).await, ready(2));
            assert_eq!(next_message(&mut s).await, FromNode::Leave { node: 2 });
            assert!(conn.is_closed());
            closed_by_trainer(&mut node).await;
            nothing_more(&mut s);
        });
    }

    #[test]
    fn a_connection_the_trainer_closes_ends_its_reader_and_reports_the_reason() {
        actix_rt::System::new().block_on(async {
            let inbox = Inbox::new();
            let mut s = inbox.stream();
            let (mut node, conn) = connect(&inbox, 0).await;
            send(&mut node, ready(0)).await;
            assert_eq!(next_message(&mut s).await, ready(0));
            // The reader is waiting on the socket when the trainer cuts the connection.
            nothing_more(&mut s);
            conn.close("replaced by restart 1".into());
            match next_message(&mut s).await {
                FromNode::Failed { node: 0, reason } => assert!(reason.contains("replaced by restart 1"), "{reason}"),
                other => panic!("node 0's failure, not {other:?}"),
            }
            closed_by_trainer(&mut node).await;
            // Anything the node still sends is not heard.
            send(&mut node, batch(0)).await;
            nothing_more(&mut s);
            assert_eq!(s.readers.len(), 0, "the reader ended");
        });
    }

    #[test]
    fn a_batch_s_arrival_comes_before_the_batch_and_once() {
        actix_rt::System::new().block_on(async {
            let inbox = Inbox::new();
            let mut s = inbox.stream();
            let (mut node, _conn) = connect(&inbox, 3).await;
            send(&mut node, ready(3)).await;
            assert_eq!(next_message(&mut s).await, ready(3));
            let bytes = encode(&NodeFrame::Message(batch(3)), DEFAULT_MAX_FRAME).expect("encodes");
            node.write_all(&bytes[..1000]).await.expect("written");
            assert!(matches!(next(&mut s).await, InboxItem::Arriving(3)));
            node.write_all(&bytes[1000..]).await.expect("written");
            assert_eq!(message(next(&mut s).await), batch(3), "the batch, no second notice");
            nothing_more(&mut s);
        });
    }

    #[test]
    fn queued_events_come_before_what_connections_have() {
        actix_rt::System::new().block_on(async {
            let inbox = Inbox::new();
            let mut s = inbox.stream();
            let (mut node, _conn) = connect(&inbox, 0).await;
            send(&mut node, ready(0)).await;
            // The ready is on its way (or in) when the event is queued: the event first.
            inbox.push(InboxItem::Message(FromNode::Down { node: 5 }));
            assert_eq!(next_message(&mut s).await, FromNode::Down { node: 5 });
            assert_eq!(next_message(&mut s).await, ready(0));
        });
    }
}
