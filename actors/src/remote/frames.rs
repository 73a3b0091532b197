//! The read side of a connection: a stream of decoded frames, each tensor of a
//! batch or a weight update read from the socket straight into its storage
//! (see [`rollout::frame_reader`]).

use std::cell::RefCell;
use std::fmt;
use std::io;
use std::marker::PhantomData;
use std::pin::Pin;
use std::rc::Rc;
use std::task::{Context, Poll};

use futures_util::Stream;
use rollout::frame_reader::{Frame, FrameReader};
use rollout::pool::TensorPool;
use rollout::wire::{WireError, PREFIX_LEN};
use tokio::io::{AsyncRead, ReadBuf};
use tokio::net::tcp::OwnedReadHalf;

/// Storage shared by a connection's reader and its actor: the actor puts back what
/// is done with (a recycled batch, retired weights), the reader reads into it.
pub type SharedPool = Rc<RefCell<TensorPool>>;

/// Why a connection's frames stopped, or one of them was refused.
#[derive(Debug)]
pub enum FrameError {
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
pub type OnFrame = Box<dyn FnMut(&mut TensorPool)>;

/// Frames of type `T` read from a socket, tensors straight into storage from a
/// shared pool.
pub struct FrameStream<T> {
    read: OwnedReadHalf,
    reader: FrameReader,
    pool: SharedPool,
    on_frame: Option<OnFrame>,
    done: bool,
    _frames: PhantomData<fn() -> T>,
}

impl<T> FrameStream<T> {
    /// Frames of at most `max` bytes from `read`, reading into `pool`.
    pub fn new(read: OwnedReadHalf, max: usize, pool: SharedPool) -> FrameStream<T> {
        FrameStream {
            read,
            reader: FrameReader::new(max),
            pool,
            on_frame: None,
            done: false,
            _frames: PhantomData,
        }
    }

    /// Runs `f` on the pool whenever a frame's body starts to arrive.
    pub fn on_frame(mut self, f: OnFrame) -> FrameStream<T> {
        self.on_frame = Some(f);
        self
    }
}

impl<T: Frame> Stream for FrameStream<T> {
    type Item = Result<T, FrameError>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = self.get_mut();
        while !this.done {
            let mut buf = ReadBuf::new(this.reader.buf());
            match Pin::new(&mut this.read).poll_read(cx, &mut buf) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(Err(e)) => {
                    this.done = true;
                    return Poll::Ready(Some(Err(FrameError::Io(e))));
                }
                Poll::Ready(Ok(())) => {}
            }
            let n = buf.filled().len();
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
                Ok(true) => return Poll::Ready(Some(this.reader.decode(&mut pool).map_err(FrameError::Decode))),
                Ok(false) => {
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
