//! Reading frames off a byte stream with each tensor of a batch or a weight update
//! landing straight in its own storage.
//!
//! A connection that reads a frame whole and then decodes it moves every byte
//! twice: from the socket into the frame buffer, then from there into the
//! tensors. A [`FrameReader`] follows the MessagePack structure as the bytes come
//! in; when it reaches the data blob of a tensor of a `batch` (under
//! `data.tensors`) or an `update_weights` (under `weights.tensors`), it hands out
//! that tensor's storage — taken from a [`TensorPool`] when one of the right
//! dtype and length is there — as the place the next bytes are read into. The
//! rest of the frame (its headers, small values) goes to a buffer as before,
//! with an empty blob standing in for each tensor read this way; the frame's
//! decode ([`crate::frame_decode`]) is then handed those tensors, in order, and
//! builds the frame around them instead of copying.
//!
//! The result is exactly what [`crate::wire::decode`] gives for the same bytes, for
//! the two frame types (see [`Frame`]; the wire fuzz tests check it on random and
//! mutated frames): only tensors in the two places above, in their canonical
//! encoding (a map of `dtype`, `shape` and `data`, in that order, with a frame
//! whose `type` comes first) are read aside, and the decode hands them, in the
//! order they were read, to the tensors whose blob came empty. The scan follows
//! the bytes with the wire's one MessagePack reader ([`header`]).
//! Bool tensors are not read aside: their bytes must be checked before they are bools.
//!
//! Pure: the caller reads from its socket into [`FrameReader::buf`] and reports
//! how much with [`FrameReader::filled`]. It never reads past the frame it is in.

use std::collections::VecDeque;

use crate::frame_decode::{self, Frame};
use crate::message::names;
use crate::pool::TensorPool;
use crate::tensor::{DType, Elements};
use crate::wire::cursor::{header, Token};
use crate::wire::{self, WireError, PREFIX_LEN};

/// Smallest blob read straight into a tensor: below this, copying it out of the
/// header buffer costs less than the extra read a blob of its own takes.
pub const MIN_BLOB: usize = 16 << 10;

/// Most bytes read at once while between blobs. Smaller than [`MIN_BLOB`], so the
/// header buffer never takes in a whole blob meant for a tensor.
const HEAD_WINDOW: usize = 8 << 10;

/// Containers deeper than this stop the scan (the decoder has its own limit).
const MAX_DEPTH: usize = 32;

/// A header buffer grown past this by one large frame is given back afterwards.
const KEEP_HEAD: usize = 4 << 20;

/// What the reader is reading.
#[derive(Debug)]
enum State {
    /// The length prefix; this many of its bytes are in.
    Prefix(usize),
    /// Headers and small values, into the header buffer.
    Head,
    /// A tensor's blob, into its storage; this many bytes are in.
    Blob(Elements, usize),
}

/// What a container is, as far as reading tensors aside goes.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Role {
    /// The frame's map, its `type` not seen yet (only as its first key counts).
    Root(Tag),
    /// A batch's `data` or an update's `weights`: holds `tensors`.
    Holder,
    /// The `tensors` map: every value may be a tensor.
    Tensors,
    /// A map of three entries under `tensors`, so far in the canonical tensor form.
    Tensor(TensorForm),
    /// The `shape` array of such a map: the product of its elements so far.
    Shape(usize),
    /// Anything else.
    Other,
}

/// The frame's `type`, as far as it matters here.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Tag {
    Unknown,
    Batch,
    Update,
    Neither,
}

/// How far a tensor map has matched `{dtype, shape, data}`.
#[derive(Clone, Copy, Debug, PartialEq)]
struct TensorForm {
    dtype: Option<DType>,
    elems: Option<usize>,
}

/// One open container.
#[derive(Debug)]
struct Level {
    role: Role,
    is_map: bool,
    /// Items seen (a map's keys and values each count).
    seen: u64,
    /// Items it holds.
    len: u64,
    /// The key of the current entry, if short and a string.
    key: Option<Vec<u8>>,
}

/// A completed item, as the scan tells its container.
enum Item<'a> {
    Str(&'a [u8]),
    Uint(u64),
    /// A container that closed: for a `shape` array, the product of its elements.
    Closed(Option<usize>),
    Other,
}

/// Reads frames from a byte stream, tensors straight into their storage.
#[derive(Debug)]
pub struct FrameReader {
    max: usize,
    min_blob: usize,
    state: State,
    prefix: [u8; PREFIX_LEN],
    /// Body length of the frame being read, and how many of its bytes are in.
    body_len: usize,
    body_got: usize,
    /// The frame without the blobs read aside: `head[..head_len]` (the vector's
    /// length past that is spare room, zeroed once when it grew).
    head: Vec<u8>,
    head_len: usize,
    /// Bytes of `head` the scan has gone through.
    scanned: usize,
    /// Open containers, outermost first.
    stack: Vec<Level>,
    /// The scan stopped (the frame's value ended, or it is no MessagePack it
    /// follows): the rest of the frame goes to the header buffer as it is.
    stopped: bool,
    /// Bytes the scan needs in the header buffer before it can go on.
    need: usize,
    /// Tensors read aside so far, in order.
    filled: VecDeque<Elements>,
    /// A frame is complete and waits for [`FrameReader::decode`].
    complete: bool,
    /// Length of the buffer last handed out by [`FrameReader::buf`].
    offered: usize,
    /// The frame being read is a `batch` (its `type` came first and said so).
    batch: bool,
}

impl FrameReader {
    /// A reader refusing frames over `max` bytes.
    pub fn new(max: usize) -> FrameReader {
        FrameReader {
            max,
            // Read aside only where the elements' memory is their encoding.
            min_blob: if cfg!(target_endian = "little") {
                MIN_BLOB
            } else {
                usize::MAX
            },
            state: State::Prefix(0),
            prefix: [0; PREFIX_LEN],
            body_len: 0,
            body_got: 0,
            head: Vec::new(),
            head_len: 0,
            scanned: 0,
            stack: Vec::new(),
            stopped: false,
            need: 1,
            filled: VecDeque::new(),
            complete: false,
            offered: 0,
            batch: false,
        }
    }

    /// Reads blobs of `min_blob` bytes or more aside instead of [`MIN_BLOB`]
    /// (tests use small ones, to exercise the machinery on small frames).
    pub fn with_min_blob(mut self, min_blob: usize) -> FrameReader {
        if cfg!(target_endian = "little") {
            self.min_blob = min_blob.max(1);
        }
        self
    }

    /// Whether no byte of a frame has been read (a stream may end here cleanly).
    pub fn is_idle(&self) -> bool {
        matches!(self.state, State::Prefix(0)) && !self.complete
    }

    /// Bytes of the current frame read so far, prefix included.
    pub fn partial(&self) -> usize {
        match self.state {
            State::Prefix(n) => n,
            _ => PREFIX_LEN + self.body_got,
        }
    }

    /// Whether the frame being read is a `batch`: known from its first bytes (its
    /// `type`, the first key), long before it is whole, so a trainer can let the node
    /// that sent it go on collecting while the batch is still on its way.
    pub fn reading_batch(&self) -> bool {
        self.batch && !matches!(self.state, State::Prefix(_))
    }

    /// Where the next bytes from the stream go: never past the current frame, and
    /// never empty unless a frame is complete (then [`FrameReader::decode`] it first).
    pub fn buf(&mut self) -> &mut [u8] {
        if self.complete {
            self.offered = 0;
            return &mut [];
        }
        let b: &mut [u8] = match &mut self.state {
            State::Prefix(n) => &mut self.prefix[*n..],
            // Only storage whose bytes are its encoding is read into (see `read_aside`).
            State::Blob(f, got) => f.le_bytes_mut().map_or(&mut [][..], |b| &mut b[*got..]),
            State::Head => {
                let left = self.body_len - self.body_got;
                // What the scan needs, but the buffer at most doubles per read: a peer
                // announcing a large frame and sending nothing more holds no memory.
                let grow = self.need.min(HEAD_WINDOW.max(2 * self.head_len));
                let window = left.min(HEAD_WINDOW.max(grow)).max(1);
                if self.head.len() < self.head_len + window {
                    self.head.resize(self.head_len + window, 0);
                }
                &mut self.head[self.head_len..self.head_len + window]
            }
        };
        self.offered = b.len();
        b
    }

    /// `n` bytes were written at the start of [`FrameReader::buf`]. `Ok(true)` when
    /// that completed a frame, for [`FrameReader::decode`]. Storage for tensors is
    /// taken from `pool`. An error (a prefix over the maximum, or zero) leaves the
    /// stream unusable: close it.
    pub fn filled(&mut self, n: usize, pool: &mut TensorPool) -> Result<bool, WireError> {
        if n == 0 {
            return Ok(self.complete);
        }
        if n > std::mem::take(&mut self.offered) {
            return Err(WireError::Decode(format!(
                "{n} bytes reported, more than the buffer offered"
            )));
        }
        match &mut self.state {
            State::Prefix(got) => {
                *got += n;
                if *got < PREFIX_LEN {
                    return Ok(false);
                }
                self.body_len = wire::body_len(self.prefix, self.max)?;
                self.begin_body();
            }
            State::Blob(f, got) => {
                *got += n;
                self.body_got += n;
                if *got == f.len() * f.dtype().size() {
                    if let State::Blob(f, _) = std::mem::replace(&mut self.state, State::Head) {
                        self.filled.push_back(f);
                    }
                    self.scan(pool);
                }
            }
            State::Head => {
                self.head_len += n;
                self.body_got += n;
                self.scan(pool);
            }
        }
        if matches!(self.state, State::Head) && self.body_got == self.body_len {
            self.complete = true;
        }
        Ok(self.complete)
    }

    /// Decodes the complete frame as a `T` (tensors read aside are handed to the
    /// decode, the others decoded into storage from `pool`) and makes ready for the
    /// next one. The same frame as [`crate::wire::decode`] of the frame's bytes.
    pub fn decode<T: Frame>(&mut self, pool: &mut TensorPool) -> Result<T, WireError> {
        if !self.complete {
            return Err(WireError::Decode("no complete frame to decode".into()));
        }
        let read = std::mem::take(&mut self.filled);
        let r = frame_decode::decode_read(&self.head[..self.head_len], read, pool);
        self.reset();
        r
    }

    fn begin_body(&mut self) {
        self.state = State::Head;
        self.body_got = 0;
        self.head_len = 0;
        self.scanned = 0;
        self.stack.clear();
        self.stopped = false;
        self.need = 1;
        self.batch = false;
    }

    fn reset(&mut self) {
        self.complete = false;
        self.state = State::Prefix(0);
        self.head_len = 0;
        if self.head.capacity() > KEEP_HEAD {
            self.head = Vec::new();
        }
    }

    /// Goes through the header buffer's new bytes, token by token, until it needs
    /// more or reaches a tensor's blob (which it then reads aside).
    fn scan(&mut self, pool: &mut TensorPool) {
        loop {
            if self.stopped {
                // Nothing more to look for: the rest of the frame in as few reads as may be.
                self.scanned = self.head_len;
                self.need = usize::MAX;
                return;
            }
            let avail = &self.head[self.scanned..self.head_len];
            let Some((h, tok)) = header(avail) else {
                self.need = 9usize.saturating_sub(avail.len()).max(1);
                return;
            };
            let whole = |payload: usize| h.checked_add(payload);
            let aside = match tok {
                Token::Bin(len) => self.takes_blob(len, h).map(|(dtype, elems)| (len, dtype, elems)),
                _ => None,
            };
            if let Some((len, dtype, elems)) = aside {
                let start = self.scanned;
                self.read_aside(start, h, len, dtype, elems, pool);
                if !matches!(self.state, State::Head) {
                    return;
                }
                continue;
            }
            match tok {
                Token::Invalid => self.stopped = true,
                Token::Str(len) | Token::Bin(len) | Token::Ext(len) => {
                    let Some(total) = whole(len) else {
                        self.stopped = true;
                        continue;
                    };
                    if avail.len() < total {
                        self.need = total - avail.len();
                        return;
                    }
                    // Keys and dtype names are short: longer strings matter to no role.
                    let mut short = [0u8; 16];
                    let is_short = matches!(tok, Token::Str(l) if l <= short.len());
                    if is_short {
                        short[..len].copy_from_slice(&avail[h..total]);
                    }
                    self.scanned += total;
                    self.item(if is_short {
                        Item::Str(&short[..len])
                    } else {
                        Item::Other
                    });
                }
                Token::Uint(v) => {
                    self.scanned += h;
                    self.item(Item::Uint(v));
                }
                Token::Scalar => {
                    self.scanned += h;
                    self.item(Item::Other);
                }
                Token::Array(n) | Token::Map(n) => {
                    self.scanned += h;
                    self.open(matches!(tok, Token::Map(_)), n);
                }
            }
        }
    }

    /// Whether the blob whose header (of `h` bytes) starts the unscanned bytes is
    /// a tensor's data to read aside: its dtype and element count if so.
    fn takes_blob(&self, len: usize, h: usize) -> Option<(DType, usize)> {
        let Some(Level {
            role: Role::Tensor(form),
            seen: 5,
            ..
        }) = self.stack.last()
        else {
            return None;
        };
        let (dtype, elems) = (form.dtype?, form.elems?);
        // The blob lies within the frame: its bytes start this far into the body.
        let start = self.body_got - (self.head_len - self.scanned) + h;
        let fits = start.checked_add(len).is_some_and(|end| end <= self.body_len);
        (len >= self.min_blob && dtype != DType::Bool && elems.checked_mul(dtype.size()) == Some(len) && fits)
            .then_some((dtype, elems))
    }

    /// Reads the blob at `head[start..]` (header of `h` bytes, `len` payload bytes)
    /// into storage for `elems` elements of `dtype`: what of it is in the header buffer is copied there,
    /// the header buffer keeps an empty blob in its place, and the rest of it will
    /// be read straight into the storage.
    fn read_aside(&mut self, start: usize, h: usize, len: usize, dtype: DType, elems: usize, pool: &mut TensorPool) {
        let mut f = pool
            .take(dtype, elems)
            .unwrap_or_else(|| Elements::zeroed(dtype, elems));
        let payload = start + h;
        let have = (self.head_len - payload).min(len);
        let Some(bytes) = f.le_bytes_mut() else {
            // Not a dtype read aside (`takes_blob` said it was): buffer the rest.
            pool.put_elements(f);
            self.stopped = true;
            return;
        };
        bytes[..have].copy_from_slice(&self.head[payload..payload + have]);
        // An empty bin (0xc4 0x00) where the blob was; bytes after the blob that
        // were read already move up behind it.
        self.head[start] = 0xc4;
        self.head[start + 1] = 0;
        self.head.copy_within(payload + have..self.head_len, start + 2);
        self.head_len = start + 2 + (self.head_len - payload - have);
        self.scanned = start + 2;
        self.item(Item::Other);
        if have == len {
            self.filled.push_back(f);
        } else {
            self.state = State::Blob(f, have);
        }
    }

    fn open(&mut self, is_map: bool, n: u64) {
        let role = match self.stack.last() {
            None if is_map => Role::Root(Tag::Unknown),
            None => Role::Other,
            Some(top) => {
                let value = top.is_map && top.seen % 2 == 1;
                let key = top.key.as_deref();
                match (top.role, value) {
                    (Role::Root(Tag::Batch), true) if is_map && key == Some(b"data") => Role::Holder,
                    (Role::Root(Tag::Update), true) if is_map && key == Some(b"weights") => Role::Holder,
                    (Role::Holder, true) if is_map && key == Some(b"tensors") => Role::Tensors,
                    (Role::Tensors, true) if is_map && n == 3 => Role::Tensor(TensorForm {
                        dtype: None,
                        elems: None,
                    }),
                    (Role::Tensor(f), true)
                        if !is_map && top.seen == 3 && key == Some(b"shape") && f.dtype.is_some() =>
                    {
                        Role::Shape(1)
                    }
                    _ => Role::Other,
                }
            }
        };
        let len = if is_map { n.saturating_mul(2) } else { n };
        if self.stack.len() >= MAX_DEPTH {
            self.stopped = true;
            return;
        }
        self.stack.push(Level {
            role,
            is_map,
            seen: 0,
            len,
            key: None,
        });
        self.close_full();
    }

    /// Pops containers that hold all their items, telling each parent.
    fn close_full(&mut self) {
        while let Some(top) = self.stack.last() {
            if top.seen < top.len {
                return;
            }
            let shape = match top.role {
                Role::Shape(p) => Some(p),
                _ => None,
            };
            self.stack.pop();
            if self.stack.is_empty() {
                // The frame's value is whole; anything after it is the decoder's to refuse.
                self.stopped = true;
                return;
            }
            self.tell(Item::Closed(shape));
        }
    }

    /// A scalar or string item completed in the innermost container.
    fn item(&mut self, item: Item<'_>) {
        if self.stack.is_empty() {
            self.stopped = true;
            return;
        }
        self.tell(item);
        self.close_full();
    }

    /// Records `item` as the next item of the innermost container.
    fn tell(&mut self, item: Item<'_>) {
        let Some(top) = self.stack.last_mut() else {
            return;
        };
        let i = top.seen;
        top.seen += 1;
        let is_key = top.is_map && i % 2 == 0;
        if is_key {
            top.key = match item {
                Item::Str(s) if s.len() <= 16 => Some(s.to_vec()),
                _ => None,
            };
        }
        let key = top.key.as_deref();
        top.role = match (top.role, &item) {
            // Only a `type` first counts: serde reads it wherever it is, the scan
            // only where the encoder puts it.
            (Role::Root(Tag::Unknown), _) if i == 0 => Role::Root(Tag::Unknown),
            (Role::Root(Tag::Unknown), Item::Str(s)) if i == 1 && key == Some(names::TYPE.as_bytes()) => {
                Role::Root(if *s == names::BATCH.as_bytes() {
                    self.batch = true;
                    Tag::Batch
                } else if *s == names::UPDATE_WEIGHTS.as_bytes() {
                    Tag::Update
                } else {
                    Tag::Neither
                })
            }
            (Role::Root(Tag::Unknown), _) => Role::Root(Tag::Neither),
            (Role::Tensor(f), _) => match (i, &item) {
                (0, Item::Str(b"dtype")) | (2, Item::Str(b"shape")) | (4, Item::Str(b"data")) => Role::Tensor(f),
                (1, Item::Str(s)) => match dtype_named(s) {
                    Some(d) => Role::Tensor(TensorForm { dtype: Some(d), ..f }),
                    None => Role::Other,
                },
                (3, Item::Closed(Some(p))) => Role::Tensor(TensorForm { elems: Some(*p), ..f }),
                _ => Role::Other,
            },
            (Role::Shape(p), Item::Uint(d)) => match usize::try_from(*d).ok().and_then(|d| p.checked_mul(d)) {
                Some(p) => Role::Shape(p),
                None => Role::Other,
            },
            (Role::Shape(_), _) => Role::Other,
            (role, _) => role,
        };
        // The frame's type is known: in a frame of neither type, or one too short
        // for any blob read aside (each is `min_blob` bytes or more), there is
        // nothing left to look for, and the rest is read as headers.
        if matches!(top.role, Role::Root(t) if t == Tag::Neither || t != Tag::Unknown && self.body_len < self.min_blob)
        {
            self.stopped = true;
        }
    }
}

/// The dtype a tensor map names, if its data may be read aside.
fn dtype_named(s: &[u8]) -> Option<DType> {
    [DType::F32, DType::F64, DType::I64, DType::U8]
        .into_iter()
        .find(|d| d.name().as_bytes() == s)
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;
    use std::sync::Arc;

    use ndarray::{ArrayD, IxDyn};

    use super::*;
    use crate::message::{Batch, FromNode, ToNode, UpdateWeights};
    use crate::policy::Weights;
    use crate::tensor::{Tensor, TensorDict};
    use crate::wire::{encode, NodeFrame, TrainerFrame};

    fn batch(steps: usize) -> NodeFrame {
        let f = |n: usize, v: f32| ArrayD::from_shape_vec(IxDyn(&[1, steps, n]), vec![v; steps * n]).unwrap();
        let data = TensorDict::from_entries(
            &[1, steps],
            [
                ("observation".to_string(), Tensor::F32(f(4, 0.5))),
                (
                    "action".to_string(),
                    Tensor::I64(ArrayD::from_shape_vec(IxDyn(&[1, steps]), (0..steps as i64).collect()).unwrap()),
                ),
                (
                    "next.done".to_string(),
                    Tensor::Bool(ArrayD::from_elem(IxDyn(&[1, steps, 1]), true)),
                ),
                ("next.reward".to_string(), Tensor::F32(f(1, -1.0))),
            ],
        )
        .unwrap();
        NodeFrame::Message(FromNode::Batch(Batch {
            node: 1,
            seq: 7,
            weights_version: 3,
            data,
        }))
    }

    /// Feeds `stream` to `r` in pieces of at most `chunk` bytes; the frames it decoded.
    fn read_all<T: Frame>(r: &mut FrameReader, stream: &[u8], chunk: usize, pool: &mut TensorPool) -> Vec<T> {
        let mut out = Vec::new();
        let mut pos = 0;
        while pos < stream.len() {
            let buf = r.buf();
            let n = buf.len().min(chunk).min(stream.len() - pos);
            buf[..n].copy_from_slice(&stream[pos..pos + n]);
            pos += n;
            if r.filled(n, pool).unwrap() {
                out.push(r.decode::<T>(pool).unwrap());
            }
        }
        assert!(r.is_idle(), "stopped inside a frame");
        out
    }

    /// Feeds one whole frame to `r`, whole reads, until it completes; checks that the
    /// reader never offers room past the frame. How many reads went straight into a
    /// tensor's storage.
    fn feed_frame(r: &mut FrameReader, frame: &[u8], pool: &mut TensorPool) -> usize {
        let (mut pos, mut aside) = (0, 0);
        loop {
            aside += usize::from(matches!(r.state, State::Blob(..)));
            let buf = r.buf();
            assert!(buf.len() <= frame.len() - pos, "no buffer beyond the frame");
            let n = buf.len();
            buf.copy_from_slice(&frame[pos..pos + n]);
            pos += n;
            if r.filled(n, pool).unwrap() {
                return aside;
            }
        }
    }

    #[test]
    fn frames_read_in_any_pieces_decode_as_the_plain_decoder_does() {
        let a = batch(5000);
        let b = batch(3);
        let mut stream = encode(&a, usize::MAX).unwrap();
        stream.extend(encode(&b, usize::MAX).unwrap());
        for chunk in [1, 7, 4096, 100_000, usize::MAX] {
            let mut r = FrameReader::new(usize::MAX);
            let mut pool = TensorPool::new(usize::MAX);
            let got: Vec<NodeFrame> = read_all(&mut r, &stream, chunk, &mut pool);
            assert_eq!(got, vec![a.clone(), b.clone()], "pieces of {chunk}");
        }
    }

    #[test]
    fn large_tensors_are_read_straight_into_pooled_storage() {
        let frame = batch(5000);
        let bytes = encode(&frame, usize::MAX).unwrap();
        let mut pool = TensorPool::new(usize::MAX);
        let NodeFrame::Message(FromNode::Batch(old)) = batch(5000) else {
            unreachable!()
        };
        let obs_ptr = old.data.get("observation").unwrap().as_f32().unwrap().as_ptr();
        pool.put_dict(old.data);
        let mut r = FrameReader::new(usize::MAX);
        // Whole reads: how many bytes went to the header buffer, and how many straight
        // into tensors.
        let (mut head_bytes, mut blob_bytes) = (0, 0);
        let mut pos = 0;
        let mut got = None;
        while got.is_none() {
            let in_blob = matches!(r.state, State::Blob(..));
            let buf = r.buf();
            let n = buf.len().min(bytes.len() - pos);
            buf[..n].copy_from_slice(&bytes[pos..pos + n]);
            pos += n;
            if in_blob {
                blob_bytes += n;
            } else {
                head_bytes += n;
            }
            if r.filled(n, &mut pool).unwrap() {
                got = Some(r.decode::<NodeFrame>(&mut pool).unwrap());
            }
        }
        assert_eq!(got.as_ref(), Some(&frame));
        // observation (80,000 B), action (40,000 B) and next.reward (20,000 B) are
        // read aside, each but for at most one header window; the 5,000-byte bool
        // tensor and the headers are not.
        assert!(
            blob_bytes >= 140_000 - 3 * HEAD_WINDOW,
            "{blob_bytes} bytes straight into tensors"
        );
        assert!(
            head_bytes <= 5_000 + 3 * HEAD_WINDOW + 1_000,
            "{head_bytes} bytes through the header buffer"
        );
        let Some(NodeFrame::Message(FromNode::Batch(b))) = got else {
            unreachable!()
        };
        assert_eq!(
            b.data.get("observation").unwrap().as_f32().unwrap().as_ptr(),
            obs_ptr,
            "the observations landed in the recycled storage"
        );
    }

    #[test]
    fn weight_updates_are_read_aside_and_other_frames_are_not() {
        let mut tensors = BTreeMap::new();
        tensors.insert("w".to_string(), Tensor::F32(ArrayD::from_elem(IxDyn(&[64, 64]), 0.25)));
        tensors.insert("b".to_string(), Tensor::F32(ArrayD::from_elem(IxDyn(&[64]), 0.5)));
        let update = TrainerFrame::Message(ToNode::UpdateWeights(UpdateWeights {
            weights: Arc::new(Weights::new(tensors)),
        }));
        let bytes = encode(&update, usize::MAX).unwrap();
        let mut r = FrameReader::new(usize::MAX).with_min_blob(1);
        let mut pool = TensorPool::new(usize::MAX);
        let aside = feed_frame(&mut r, &bytes, &mut pool);
        assert!(aside > 0, "the 16 KiB weight was read into its own storage");
        assert_eq!(r.decode::<TrainerFrame>(&mut pool).unwrap(), update);
        // The same tensors under another frame type are not read aside.
        let hello = crate::wire::encode(
            &NodeFrame::Message(FromNode::Failed {
                node: 0,
                reason: "x".repeat(100_000),
            }),
            usize::MAX,
        )
        .unwrap();
        let got: Vec<NodeFrame> = read_all(&mut r, &hello, usize::MAX, &mut pool);
        assert!(r.filled.is_empty());
        assert_eq!(got.len(), 1);
    }

    /// A tensor as encoded, with a blob of any length.
    #[derive(serde::Serialize)]
    struct RawTensor {
        dtype: &'static str,
        shape: Vec<usize>,
        #[serde(with = "serde_bytes")]
        data: Vec<u8>,
    }

    fn raw(blob: usize) -> RawTensor {
        RawTensor {
            dtype: "f32",
            shape: vec![1, 8],
            data: vec![7; blob],
        }
    }

    /// A batch frame with a full tensor at `extra` (a key the decoder ignores, at
    /// the root or in `data`) before a tensor whose blob is empty.
    fn smuggling(extra_at_root: bool) -> Vec<u8> {
        #[derive(serde::Serialize)]
        struct Data {
            batch_size: Vec<usize>,
            #[serde(skip_serializing_if = "Option::is_none")]
            extra: Option<BTreeMap<String, RawTensor>>,
            tensors: BTreeMap<String, RawTensor>,
        }
        #[derive(serde::Serialize)]
        struct Frame {
            r#type: &'static str,
            #[serde(skip_serializing_if = "Option::is_none")]
            weights: Option<BTreeMap<String, BTreeMap<String, RawTensor>>>,
            node: usize,
            seq: u64,
            weights_version: u64,
            data: Data,
        }
        let full = || BTreeMap::from([("x".to_string(), raw(32))]);
        let frame = Frame {
            r#type: "batch",
            weights: extra_at_root.then(|| BTreeMap::from([("tensors".to_string(), full())])),
            node: 0,
            seq: 1,
            weights_version: 0,
            data: Data {
                batch_size: vec![1, 8],
                extra: (!extra_at_root).then(full),
                tensors: BTreeMap::from([("obs".to_string(), raw(0))]),
            },
        };
        let body = rmp_serde::to_vec_named(&frame).unwrap();
        let mut out = (body.len() as u32).to_be_bytes().to_vec();
        out.extend_from_slice(&body);
        out
    }

    #[test]
    fn a_tensor_the_decoder_ignores_cannot_fill_one_whose_blob_came_empty() {
        for extra_at_root in [false, true] {
            let frame = smuggling(extra_at_root);
            assert!(crate::wire::decode::<NodeFrame>(&frame[PREFIX_LEN..]).is_err());
            let mut r = FrameReader::new(usize::MAX).with_min_blob(1);
            let mut pool = TensorPool::new(usize::MAX);
            feed_frame(&mut r, &frame, &mut pool);
            assert!(r.filled.is_empty(), "nothing outside `data.tensors` was read aside");
            let got = r.decode::<NodeFrame>(&mut pool);
            assert!(got.is_err(), "decoded {got:?}");
        }
    }

    #[test]
    fn a_large_announced_frame_takes_memory_only_as_its_bytes_arrive() {
        let mut r = FrameReader::new(usize::MAX);
        let mut pool = TensorPool::new(0);
        r.buf().copy_from_slice(&200_000_000u32.to_be_bytes());
        assert!(!r.filled(4, &mut pool).unwrap());
        // Not MessagePack (0xc1): the scan stops and buffers the rest of the frame,
        // a window at a time.
        let b = r.buf();
        b[0] = 0xc1;
        assert!(!r.filled(1, &mut pool).unwrap());
        assert!(r.buf().len() <= HEAD_WINDOW, "{} bytes offered", r.buf().len());
        assert!(r.head.len() <= 2 * HEAD_WINDOW);
        // A string header announcing 184 MB: the same.
        let mut r = FrameReader::new(usize::MAX);
        r.buf().copy_from_slice(&200_000_000u32.to_be_bytes());
        r.filled(4, &mut pool).unwrap();
        r.buf()[..6].copy_from_slice(&[0x81, 0xdb, 0x0b, 0, 0, 0]);
        r.filled(6, &mut pool).unwrap();
        assert!(r.buf().len() <= HEAD_WINDOW);
    }

    #[test]
    fn a_batch_is_known_as_one_from_its_first_bytes_and_other_frames_are_not() {
        let mut pool = TensorPool::new(usize::MAX);
        let weights = TrainerFrame::Message(ToNode::UpdateWeights(UpdateWeights {
            weights: Arc::new(Weights::new(BTreeMap::new())),
        }));
        let cases = [
            (encode(&batch(5000), usize::MAX).unwrap(), true),
            (encode(&NodeFrame::Heartbeat, usize::MAX).unwrap(), false),
            (encode(&weights, usize::MAX).unwrap(), false),
        ];
        let from_trainer = |frame: &[u8]| std::ptr::eq(frame, cases[2].0.as_slice());
        let mut r = FrameReader::new(usize::MAX);
        for (frame, is_batch) in &cases {
            assert!(!r.reading_batch(), "nothing read yet");
            // A byte at a time: `type` is the first key, so a batch is known as one
            // a dozen bytes in, long before it is whole.
            let early = frame.len().min(PREFIX_LEN + 16);
            for (pos, &byte) in frame.iter().enumerate() {
                r.buf()[0] = byte;
                let whole = r.filled(1, &mut pool).unwrap();
                assert_eq!(whole, pos + 1 == frame.len());
                if pos < PREFIX_LEN {
                    assert!(!r.reading_batch(), "not from the prefix alone");
                } else if pos + 1 >= early {
                    assert_eq!(
                        r.reading_batch(),
                        *is_batch,
                        "after {} of {} bytes",
                        pos + 1,
                        frame.len()
                    );
                }
            }
            assert_eq!(r.reading_batch(), *is_batch, "whole, not decoded");
            if from_trainer(frame) {
                r.decode::<TrainerFrame>(&mut pool).unwrap();
            } else {
                r.decode::<NodeFrame>(&mut pool).unwrap();
            }
            assert!(!r.reading_batch(), "decoded: the next frame is unknown");
        }
    }

    #[test]
    fn the_scan_stops_at_the_type_of_a_frame_that_can_hold_no_blob_read_aside() {
        let mut pool = TensorPool::new(usize::MAX);
        // A batch of 10 frames (well under `MIN_BLOB`), a batch with a 64 KB tensor,
        // and a heartbeat (neither type): fed a byte at a time.
        let small = encode(&batch(10), usize::MAX).unwrap();
        let large = encode(&batch(4000), usize::MAX).unwrap();
        let beat = encode(&NodeFrame::Heartbeat, usize::MAX).unwrap();
        for (frame, stops, is_batch) in [(&small, true, true), (&large, false, true), (&beat, true, false)] {
            let mut r = FrameReader::new(usize::MAX);
            // The first key `type` and its value: within 24 bytes of the body.
            for (pos, &byte) in frame.iter().enumerate().take(PREFIX_LEN + 24) {
                r.buf()[0] = byte;
                assert!(!r.filled(1, &mut pool).unwrap() || pos + 1 == frame.len());
            }
            assert_eq!(r.stopped, stops, "{} bytes", frame.len());
            assert_eq!(r.reading_batch(), is_batch, "still known as a batch");
            let rest = &frame[(PREFIX_LEN + 24).min(frame.len())..];
            if !rest.is_empty() {
                let aside = feed_frame(&mut r, rest, &mut pool);
                assert_eq!(aside > 0, !stops, "{} bytes", frame.len());
            }
            let plain = wire::decode::<NodeFrame>(&frame[PREFIX_LEN..]).unwrap();
            assert_eq!(r.decode::<NodeFrame>(&mut pool).unwrap(), plain);
        }
    }

    #[test]
    fn reporting_more_than_the_buffer_offered_is_an_error_not_a_panic() {
        let mut r = FrameReader::new(usize::MAX);
        let mut pool = TensorPool::new(0);
        assert_eq!(r.buf().len(), PREFIX_LEN);
        assert!(r.filled(5, &mut pool).is_err());
        let frame = encode(&batch(3), usize::MAX).unwrap();
        let mut r = FrameReader::new(usize::MAX);
        feed_frame(&mut r, &frame, &mut pool);
        assert!(r.buf().is_empty(), "nothing past a complete frame");
        assert!(r.filled(1, &mut pool).is_err());
        assert_eq!(r.decode::<NodeFrame>(&mut pool).unwrap(), batch(3));
    }

    #[test]
    fn an_oversized_or_empty_prefix_is_refused_before_the_body() {
        let mut r = FrameReader::new(100);
        let mut pool = TensorPool::new(0);
        r.buf().copy_from_slice(&101u32.to_be_bytes());
        assert!(matches!(
            r.filled(4, &mut pool),
            Err(WireError::TooLarge { len: 101, max: 100 })
        ));
        let mut r = FrameReader::new(100);
        r.buf()[..2].copy_from_slice(&[0, 0]);
        assert!(!r.filled(2, &mut pool).unwrap());
        assert_eq!(r.partial(), 2);
        r.buf().copy_from_slice(&[0, 0]);
        assert_eq!(r.filled(2, &mut pool), Err(WireError::Empty));
    }

    #[test]
    fn a_blob_longer_than_its_frame_is_not_allocated() {
        // A tensor map whose shape and blob header claim 400 MB inside a frame of a
        // few dozen bytes: nothing is read aside, the decoder refuses the frame.
        let mut body = vec![0x82, 0xa4];
        body.extend_from_slice(b"type");
        body.extend_from_slice(&[0xa5]);
        body.extend_from_slice(b"batch");
        body.extend_from_slice(&[0xa4]);
        body.extend_from_slice(b"data");
        body.extend_from_slice(&[0x81, 0xa7]);
        body.extend_from_slice(b"tensors");
        body.extend_from_slice(&[0x81, 0xa1, b'x', 0x83, 0xa5]);
        body.extend_from_slice(b"dtype");
        body.extend_from_slice(&[0xa3]);
        body.extend_from_slice(b"f32");
        body.extend_from_slice(&[0xa5]);
        body.extend_from_slice(b"shape");
        body.extend_from_slice(&[0x91, 0xce]);
        body.extend_from_slice(&100_000_000u32.to_be_bytes());
        body.extend_from_slice(&[0xa4]);
        body.extend_from_slice(b"data");
        body.push(0xc6);
        body.extend_from_slice(&400_000_000u32.to_be_bytes());
        body.extend_from_slice(&[1, 2, 3]);
        let mut frame = (body.len() as u32).to_be_bytes().to_vec();
        frame.extend_from_slice(&body);
        let mut r = FrameReader::new(1 << 20).with_min_blob(1);
        let mut pool = TensorPool::new(0);
        assert_eq!(feed_frame(&mut r, &frame, &mut pool), 0, "nothing read aside");
        assert!(r.decode::<NodeFrame>(&mut pool).is_err());
        assert!(r.is_idle());
    }

    #[test]
    fn a_tensor_whose_shape_wraps_to_its_blob_is_not_read_aside_and_is_refused() {
        // f32 of shape [2, 2^63 + 2048]: 2 × (2^63 + 2048) wraps to 4096 elements, the
        // 16 KiB blob that follows. Counted with checks, it matches no blob.
        #[derive(serde::Serialize)]
        struct Enc<'a> {
            dtype: &'a str,
            shape: Vec<usize>,
            #[serde(with = "serde_bytes")]
            data: Vec<u8>,
        }
        #[derive(serde::Serialize)]
        struct Dict<'a> {
            batch_size: Vec<usize>,
            tensors: BTreeMap<&'a str, Enc<'a>>,
        }
        #[derive(serde::Serialize)]
        struct Frame<'a> {
            #[serde(rename = "type")]
            tag: &'a str,
            node: usize,
            seq: u64,
            weights_version: u64,
            data: Dict<'a>,
        }
        let shape = vec![2, (1usize << 63) + 2048];
        let enc = Enc {
            dtype: "f32",
            shape: shape.clone(),
            data: vec![0; 4 * 4096],
        };
        let body = rmp_serde::to_vec_named(&Frame {
            tag: "batch",
            node: 0,
            seq: 0,
            weights_version: 0,
            data: Dict {
                batch_size: shape,
                tensors: [("observation", enc)].into_iter().collect(),
            },
        })
        .unwrap();
        let mut frame = (body.len() as u32).to_be_bytes().to_vec();
        frame.extend_from_slice(&body);
        let mut r = FrameReader::new(1 << 20).with_min_blob(1);
        let mut pool = TensorPool::new(1 << 20);
        assert_eq!(feed_frame(&mut r, &frame, &mut pool), 0, "nothing read aside");
        let err = r.decode::<NodeFrame>(&mut pool).unwrap_err();
        assert!(err.to_string().contains("overflows"), "{err}");
        let plain = crate::wire::decode::<NodeFrame>(&body).unwrap_err();
        assert_eq!(err.to_string(), plain.to_string(), "as the plain decoder refuses it");
    }
}
