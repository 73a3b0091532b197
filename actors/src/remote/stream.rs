//! A trainer–node connection's byte stream: plain TCP, or TLS over TCP. Everything
//! above it (the login, the lobby, frames in and out) reads and writes through
//! [`PeerStream`] and its halves and does not care which.
//!
//! Under TLS, rustls reads the socket 4 KiB at a time; a read buffer below it
//! ([`TLS_READ_BUFFER`]) lets one system call bring in many records of a large batch.
//! A plain stream splits into the socket's own halves (the writer's small frames go
//! straight to the socket, see `link`); a TLS stream into tokio's shared halves (one
//! TLS session, read and written from the same thread).
//!
//! A TLS peer that closes its socket without `close_notify` (Python's `ssl` after the
//! node's last frame, a killed process) ends the stream as a plain close does: the frame
//! layer above tells a close between frames from one inside a frame, so a truncation
//! is still an error there.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, BufReader, ReadBuf, ReadHalf, WriteHalf};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::TcpStream;
use tokio_rustls::TlsStream;

/// The read buffer under a TLS session: 64 KiB, four full TLS records a read (rustls
/// alone reads 4 KiB at a time), at a memory cost per connection a thousand nodes can
/// afford (64 MiB for 1,024).
pub(crate) const TLS_READ_BUFFER: usize = 64 << 10;

/// The socket under a TLS session: TCP with a read buffer.
pub(crate) type TlsSocket = BufReader<TcpStream>;

/// A TLS session over its socket.
pub(crate) type Tls = TlsStream<TlsSocket>;

/// One connection's stream, plain or TLS.
pub(crate) enum PeerStream {
    /// Plain TCP.
    Plain(TcpStream),
    /// TLS over TCP (the handshake done).
    Tls(Box<Tls>),
}

/// The read half of a [`PeerStream`].
pub(crate) enum ReadSide {
    /// The socket's own read half.
    Plain(OwnedReadHalf),
    /// The TLS session's read half.
    Tls(ReadHalf<Tls>),
}

/// The write half of a [`PeerStream`].
pub(crate) enum WriteSide {
    /// The socket's own write half (dropping it shuts the socket's write side).
    Plain(OwnedWriteHalf),
    /// The TLS session's write half (its owner shuts it down: `close_notify`, then the
    /// socket's write side).
    Tls(WriteHalf<Tls>),
}

/// A TCP socket ready for a TLS session: with its read buffer.
pub(crate) fn tls_socket(s: TcpStream) -> TlsSocket {
    BufReader::with_capacity(TLS_READ_BUFFER, s)
}

impl PeerStream {
    /// The TCP socket under the stream.
    pub(crate) fn tcp(&self) -> &TcpStream {
        match self {
            PeerStream::Plain(s) => s,
            PeerStream::Tls(t) => t.get_ref().0.get_ref(),
        }
    }

    /// The stream's two halves, for a reader and a writer on one thread.
    pub(crate) fn into_split(self) -> (ReadSide, WriteSide) {
        match self {
            PeerStream::Plain(s) => {
                let (r, w) = s.into_split();
                (ReadSide::Plain(r), WriteSide::Plain(w))
            }
            PeerStream::Tls(t) => {
                let (r, w) = tokio::io::split(*t);
                (ReadSide::Tls(r), WriteSide::Tls(w))
            }
        }
    }
}

/// A TLS read that found the socket closed without `close_notify`: the end of the stream.
fn end_without_close_notify(r: Poll<io::Result<()>>) -> Poll<io::Result<()>> {
    match r {
        Poll::Ready(Err(e)) if e.kind() == io::ErrorKind::UnexpectedEof => Poll::Ready(Ok(())),
        r => r,
    }
}

impl AsyncRead for PeerStream {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            PeerStream::Plain(s) => Pin::new(s).poll_read(cx, buf),
            PeerStream::Tls(t) => end_without_close_notify(Pin::new(t.as_mut()).poll_read(cx, buf)),
        }
    }
}

impl AsyncWrite for PeerStream {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            PeerStream::Plain(s) => Pin::new(s).poll_write(cx, buf),
            PeerStream::Tls(t) => Pin::new(t.as_mut()).poll_write(cx, buf),
        }
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            PeerStream::Plain(s) => Pin::new(s).poll_write_vectored(cx, bufs),
            PeerStream::Tls(t) => Pin::new(t.as_mut()).poll_write_vectored(cx, bufs),
        }
    }

    fn is_write_vectored(&self) -> bool {
        match self {
            PeerStream::Plain(s) => s.is_write_vectored(),
            PeerStream::Tls(t) => t.is_write_vectored(),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            PeerStream::Plain(s) => Pin::new(s).poll_flush(cx),
            PeerStream::Tls(t) => Pin::new(t.as_mut()).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            PeerStream::Plain(s) => Pin::new(s).poll_shutdown(cx),
            PeerStream::Tls(t) => Pin::new(t.as_mut()).poll_shutdown(cx),
        }
    }
}

impl AsyncRead for ReadSide {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            ReadSide::Plain(r) => Pin::new(r).poll_read(cx, buf),
            ReadSide::Tls(r) => end_without_close_notify(Pin::new(r).poll_read(cx, buf)),
        }
    }
}
