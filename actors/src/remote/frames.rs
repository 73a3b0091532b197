//! The read side of a connection: a stream of decoded frames, each tensor of a
//! batch or a weight update read from the socket straight into its storage
//! (see [`rollout::frame_reader`]).

use std::cell::{Cell, RefCell};
use std::fmt;
use std::io;
use std::marker::PhantomData;
use std::pin::Pin;
use std::rc::Rc;
use std::task::{Context, Poll};

use futures_util::Stream;
use rollout::frame_decode::Frame;
use rollout::frame_reader::FrameReader;
use rollout::pool::TensorPool;
use rollout::wire::{WireError, PREFIX_LEN};

use super::arrival::ArrivalNotice;
use super::stream::ReadSide;
use tokio::io::{AsyncRead, ReadBuf};

/// Buffers shorter than this are read into through a read-ahead stage of this size
/// (the bytes copied on from it), longer ones straight from the socket: small frames
/// cost one read each, and a tensor's storage is still read into directly but for
/// at most this many of its bytes.
pub(crate) const READ_AHEAD: usize = 4096;

/// Storage shared by a connection's reader and its actor: the actor puts back what
/// is done with (a recycled batch, retired weights), the reader reads into it.
pub(crate) type SharedPool = Rc<RefCell<TensorPool>>;

/// Why a connection's frames stopped, or one of them was refused.
#[derive(Debug)]
pub(crate) enum FrameError {
    /// The socket failed, or closed inside a frame; the stream ends.
    Io(io::Error),
    /// A length prefix over the maximum (or zero); the stream ends, as nothing
    /// after it can be framed.
    Prefix(WireError),
    /// A whole frame that is not the expected message; the stream goes on.
    Decode(WireError),
}

impl fmt::Display for FrameError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            FrameError::Io(e) => write!(f, "{e}"),
            FrameError::Prefix(e) => write!(f, "{e}"),
            FrameError::Decode(e) => write!(f, "bad frame: {e}"),
        }
    }
}

/// Called when a frame's body starts to arrive, before any of its tensors is
/// read: the moment to put storage that became free into the pool.
pub(crate) type OnFrame = Box<dyn FnMut(&mut TensorPool)>;

/// Frames of type `T` read from a socket, tensors straight into storage from a
/// shared pool.
pub(crate) struct FrameStream<T> {
    read: ReadSide,
    reader: FrameReader,
    pool: SharedPool,
    on_frame: Option<OnFrame>,
    /// Early release: told when a `batch` frame begins to arrive.
    on_batch: Option<ArrivalNotice>,
    /// `on_batch` was told of the frame being read.
    announced: bool,
    done: bool,
    /// Bytes read off the socket and not handed to the reader yet,
    /// `stage[stage_at..stage_end]`: those the lobby read before this stream took the
    /// socket, then each read ahead of a short buffer (see [`READ_AHEAD`]).
    stage: Vec<u8>,
    stage_at: usize,
    stage_end: usize,
    /// Where the bytes read off the socket are counted, if anywhere.
    counted: Option<Rc<Cell<u64>>>,
    _frames: PhantomData<fn() -> T>,
}

impl<T> FrameStream<T> {
    /// Frames of at most `max` bytes from `read`, reading into `pool`.
    pub(crate) fn new(read: ReadSide, max: usize, pool: SharedPool) -> FrameStream<T> {
        FrameStream {
            read,
            reader: FrameReader::new(max),
            pool,
            on_frame: None,
            on_batch: None,
            announced: false,
            done: false,
            stage: Vec::new(),
            stage_at: 0,
            stage_end: 0,
            counted: None,
            _frames: PhantomData,
        }
    }

    /// Reads `bytes` (taken off the socket earlier, by the join phase's lobby) before
    /// anything from the socket.
    pub(crate) fn with_prefill(mut self, bytes: Vec<u8>) -> FrameStream<T> {
        self.stage_end = bytes.len();
        self.stage = bytes;
        self.stage_at = 0;
        self
    }

    /// Runs `f` on the pool whenever a frame's body starts to arrive.
    pub(crate) fn on_frame(mut self, f: OnFrame) -> FrameStream<T> {
        self.on_frame = Some(f);
        self
    }

    /// Adds every byte read off the socket to `counter`.
    pub(crate) fn count_into(mut self, counter: Rc<Cell<u64>>) -> FrameStream<T> {
        self.counted = Some(counter);
        self
    }

    /// Tells `notice` when a `batch` frame begins to arrive (its first bytes, long
    /// before it is whole), once per frame, unless the frame came whole in one read;
    /// the stream then yields to the other tasks of its thread once before it reads
    /// on, so the trainer can send the node its next `continue` first.
    pub(crate) fn on_batch(mut self, notice: ArrivalNotice) -> FrameStream<T> {
        self.on_batch = Some(notice);
        self
    }
}

/// One read into `dst`: the bytes read, 0 at the end of the stream.
fn read_once(read: &mut ReadSide, cx: &mut Context<'_>, dst: &mut [u8]) -> Poll<io::Result<usize>> {
    let mut buf = ReadBuf::new(dst);
    Pin::new(read).poll_read(cx, &mut buf).map_ok(|()| buf.filled().len())
}

impl<T> FrameStream<T> {
    /// Adds `n` bytes read to the counter, if any.
    fn count(&self, n: usize) {
        if let Some(c) = &self.counted {
            c.set(c.get() + n as u64);
        }
    }

    /// The socket failed: the stream ends with that error.
    fn fail(&mut self, e: io::Error) -> Poll<Option<Result<T, FrameError>>> {
        self.done = true;
        Poll::Ready(Some(Err(FrameError::Io(e))))
    }
}

impl<T: Frame> Stream for FrameStream<T> {
    type Item = Result<T, FrameError>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = self.get_mut();
        while !this.done {
            let dst = this.reader.buf();
            if this.stage_at == this.stage_end && !dst.is_empty() && dst.len() < READ_AHEAD {
                // A short buffer (a prefix, a small frame's body): read ahead into the
                // stage, so a small frame costs one read, not one per part of it plus
                // one to find the socket empty (a read short of its buffer tells the
                // runtime the socket is drained).
                if this.stage.len() != READ_AHEAD {
                    // Made once; a larger prefill's memory is given back.
                    this.stage = vec![0; READ_AHEAD];
                }
                match read_once(&mut this.read, cx, &mut this.stage[..READ_AHEAD]) {
                    Poll::Pending => return Poll::Pending,
                    Poll::Ready(Err(e)) => return this.fail(e),
                    Poll::Ready(Ok(n)) => {
                        this.count(n);
                        (this.stage_at, this.stage_end) = (0, n)
                    }
                }
            }
            let dst = this.reader.buf();
            let staged = this.stage_end - this.stage_at;
            let n = if staged > 0 && !dst.is_empty() {
                let k = dst.len().min(staged);
                dst[..k].copy_from_slice(&this.stage[this.stage_at..this.stage_at + k]);
                this.stage_at += k;
                k
            } else if this.stage_at == this.stage_end && dst.len() < READ_AHEAD {
                // The read ahead just now found the end of the stream.
                0
            } else {
                match read_once(&mut this.read, cx, dst) {
                    Poll::Pending => return Poll::Pending,
                    Poll::Ready(Err(e)) => return this.fail(e),
                    Poll::Ready(Ok(n)) => {
                        this.count(n);
                        n
                    }
                }
            };
            if n == 0 {
                this.done = true;
                if this.reader.is_idle() {
                    return Poll::Ready(None);
                }
                let got = this.reader.partial();
                return Poll::Ready(Some(Err(FrameError::Io(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    format!("connection closed inside a frame ({got} bytes of it received)"),
                )))));
            }
            let in_prefix = this.reader.partial() < PREFIX_LEN;
            let mut pool = this.pool.borrow_mut();
            match this.reader.filled(n, &mut pool) {
                Err(e) => {
                    this.done = true;
                    return Poll::Ready(Some(Err(FrameError::Prefix(e))));
                }
                Ok(true) => {
                    this.announced = false;
                    return Poll::Ready(Some(this.reader.decode(&mut pool).map_err(FrameError::Decode)));
                }
                Ok(false) => {
                    if !this.announced && this.reader.reading_batch() {
                        this.announced = true;
                        if let Some(notice) = &this.on_batch {
                            notice.batch_arriving();
                            // Let the trainer act on the notice (a trainer sends the node
                            // its next `continue`) before the rest of the batch is read.
                            cx.waker().wake_by_ref();
                            return Poll::Pending;
                        }
                    }
                    // The prefix is in and the body is next (a prefix's reads never
                    // take body bytes).
                    if in_prefix && this.reader.partial() == PREFIX_LEN {
                        if let Some(f) = &mut this.on_frame {
                            f(&mut pool);
                        }
                    }
                }
            }
        }
        Poll::Ready(None)
    }
}

#[cfg(test)]
mod tests {

    use futures_util::StreamExt;
    use ndarray::{ArrayD, IxDyn};
    use rollout::message::{Batch, FromNode};
    use rollout::wire::{encode, NodeFrame};
    use rollout::{Tensor, TensorDict};
    use tokio::io::AsyncWriteExt;
    use tokio::net::TcpStream;

    use super::*;

    /// A connected loopback pair: the client's stream, and the server's read half.
    async fn loopback() -> (TcpStream, ReadSide) {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = l.local_addr().expect("addr");
        let client = TcpStream::connect(addr).await.expect("connect");
        let (server, _) = l.accept().await.expect("accept");
        let (read, _write) = server.into_split();
        (client, ReadSide::Plain(read))
    }

    /// A batch whose observations (8,000 f32, 32 KB) are read straight into storage.
    fn batch() -> NodeFrame {
        let obs =
            Tensor::F32(ArrayD::from_shape_vec(IxDyn(&[1, 2000, 4]), (0..8000).map(|i| i as f32).collect()).unwrap());
        NodeFrame::Message(FromNode::Batch(Batch {
            node: 0,
            seq: 1,
            weights_version: 0,
            data: TensorDict::from_entries(&[1, 2000], [("observation".to_string(), obs)]).unwrap(),
        }))
    }

    /// The stream's next item, within a deadline (a hung stream fails the test).
    async fn next(frames: &mut FrameStream<NodeFrame>) -> Option<Result<NodeFrame, FrameError>> {
        tokio::time::timeout(std::time::Duration::from_secs(10), frames.next())
            .await
            .expect("the stream answered within 10 s")
    }

    fn pool() -> SharedPool {
        Rc::new(RefCell::new(TensorPool::new(usize::MAX)))
    }

    #[test]
    fn prefilled_bytes_past_the_read_ahead_then_the_socket_give_every_frame_in_order() {
        actix_rt::System::new().block_on(async {
            let (mut client, read) = loopback().await;
            // Early bytes longer than the read-ahead, ending inside a batch; then the
            // rest of it and many small frames, one write: read ahead of short buffers.
            let mut bytes = Vec::new();
            for _ in 0..300 {
                bytes.extend(encode(&NodeFrame::Heartbeat, usize::MAX).unwrap());
            }
            bytes.extend(encode(&batch(), usize::MAX).unwrap());
            for _ in 0..300 {
                bytes.extend(encode(&NodeFrame::Heartbeat, usize::MAX).unwrap());
            }
            let split = READ_AHEAD + 7_000;
            let mut frames =
                FrameStream::<NodeFrame>::new(read, usize::MAX, pool()).with_prefill(bytes[..split].to_vec());
            client.write_all(&bytes[split..]).await.unwrap();
            drop(client);
            for i in 0..601 {
                let want = if i == 300 { batch() } else { NodeFrame::Heartbeat };
                assert_eq!(next(&mut frames).await.unwrap().unwrap(), want, "frame {i}");
            }
            assert!(next(&mut frames).await.is_none(), "then the clean close");
        });
    }

    #[test]
    fn frames_arrive_decoded_in_order_and_a_clean_close_ends_the_stream() {
        actix_rt::System::new().block_on(async {
            let (mut client, read) = loopback().await;
            let mut frames = FrameStream::<NodeFrame>::new(read, usize::MAX, pool());
            let mut bytes = encode(&batch(), usize::MAX).unwrap();
            bytes.extend(encode(&NodeFrame::Heartbeat, usize::MAX).unwrap());
            // Written in two pieces that split the batch's tensor.
            client.write_all(&bytes[..20_000]).await.unwrap();
            client.write_all(&bytes[20_000..]).await.unwrap();
            drop(client);
            assert_eq!(next(&mut frames).await.unwrap().unwrap(), batch());
            assert_eq!(next(&mut frames).await.unwrap().unwrap(), NodeFrame::Heartbeat);
            assert!(
                next(&mut frames).await.is_none(),
                "a close between frames ends the stream"
            );
        });
    }

    #[test]
    fn the_frame_hook_runs_before_the_tensors_so_they_land_in_what_it_freed() {
        actix_rt::System::new().block_on(async {
            let (mut client, read) = loopback().await;
            let freed = ArrayD::<f32>::zeros(IxDyn(&[1, 2000, 4]));
            let ptr = freed.as_ptr();
            let mut spare = Some(Tensor::F32(freed));
            let mut frames = FrameStream::<NodeFrame>::new(read, usize::MAX, pool()).on_frame(Box::new(move |pool| {
                if let Some(t) = spare.take() {
                    pool.put(t);
                }
            }));
            client.write_all(&encode(&batch(), usize::MAX).unwrap()).await.unwrap();
            let Some(Ok(NodeFrame::Message(FromNode::Batch(b)))) = next(&mut frames).await else {
                panic!("a batch");
            };
            let obs = b.data.get("observation").unwrap().as_f32().unwrap();
            assert_eq!(obs.as_ptr(), ptr, "read into the storage the hook put back");
            assert_eq!(NodeFrame::Message(FromNode::Batch(b.clone())), batch());
        });
    }

    #[test]
    fn the_arrival_notice_comes_once_as_a_batch_begins_to_arrive_long_before_it_is_whole() {
        actix_rt::System::new().block_on(async {
            let (mut client, read) = loopback().await;
            let notice = ArrivalNotice::new();
            let mut frames = FrameStream::<NodeFrame>::new(read, usize::MAX, pool()).on_batch(notice.clone());
            let bytes = encode(&batch(), usize::MAX).unwrap();
            client
                .write_all(&encode(&NodeFrame::Heartbeat, usize::MAX).unwrap())
                .await
                .unwrap();
            client.write_all(&bytes[..1000]).await.unwrap();
            assert_eq!(next(&mut frames).await.unwrap().unwrap(), NodeFrame::Heartbeat);
            assert!(!notice.take(), "a heartbeat is no batch");
            // 1,000 of the batch's 32 KB are in: the notice is raised, no frame comes out.
            let raised = std::future::poll_fn(|cx| match frames.poll_next_unpin(cx) {
                Poll::Ready(item) => panic!("nothing before the batch is whole: {item:?}"),
                Poll::Pending if notice.take() => Poll::Ready(()),
                Poll::Pending => Poll::Pending,
            });
            tokio::time::timeout(std::time::Duration::from_secs(10), raised)
                .await
                .expect("the notice came within 10 s");
            client.write_all(&bytes[1000..]).await.unwrap();
            assert_eq!(next(&mut frames).await.unwrap().unwrap(), batch());
            assert!(!notice.take(), "once per batch");
        });
    }

    #[test]
    fn a_bad_frame_is_an_error_the_stream_survives_and_a_close_inside_a_frame_ends_it() {
        actix_rt::System::new().block_on(async {
            let (mut client, read) = loopback().await;
            let mut frames = FrameStream::<NodeFrame>::new(read, 1 << 20, pool());
            client.write_all(&[0, 0, 0, 3, 0xc1, 0xc1, 0xc1]).await.unwrap();
            client
                .write_all(&encode(&NodeFrame::Heartbeat, usize::MAX).unwrap())
                .await
                .unwrap();
            let half = encode(&batch(), usize::MAX).unwrap();
            client.write_all(&half[..1000]).await.unwrap();
            drop(client);
            assert!(matches!(next(&mut frames).await, Some(Err(FrameError::Decode(_)))));
            assert_eq!(next(&mut frames).await.unwrap().unwrap(), NodeFrame::Heartbeat);
            match next(&mut frames).await {
                Some(Err(e @ FrameError::Io(_))) => {
                    assert!(e.to_string().contains("closed inside a frame (1000 bytes"), "{e}")
                }
                other => panic!("{other:?}"),
            }
            assert!(next(&mut frames).await.is_none());
        });
    }

    #[test]
    fn a_prefix_over_the_maximum_ends_the_stream_before_its_body() {
        actix_rt::System::new().block_on(async {
            let (mut client, read) = loopback().await;
            let mut frames = FrameStream::<NodeFrame>::new(read, 100, pool());
            client.write_all(&1000u32.to_be_bytes()).await.unwrap();
            match next(&mut frames).await {
                Some(Err(e @ FrameError::Prefix(_))) => assert!(e.to_string().contains("exceeds the maximum"), "{e}"),
                other => panic!("{other:?}"),
            }
            assert!(next(&mut frames).await.is_none());
        });
    }
}
