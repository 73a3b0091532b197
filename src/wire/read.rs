//! The decoder of every frame after login, both directions, read by hand on the one
//! [`Cursor`]: no serde tagged enum, no buffer of the frame.
//!
//! A frame is a map: its `type` is found first (the encoder writes it as the first
//! key, and then it costs nothing; written elsewhere, the keys are gone through
//! once to find it), then the fields of the frame it names are read in any order,
//! an unknown key skipped, a field given twice or missing refused (PROTOCOL.md §1).
//! The values of a `batch`, an `update_weights` and a `welcome`'s weights are read
//! as their parts, borrowed from the body, then their tensors built into the
//! memory given to the decode ([`Storage`]): tensors a
//! [`FrameReader`](crate::frame_reader::FrameReader) read aside, a recycled batch
//! of the same layout, or a [`TensorPool`]'s storage. `ready`'s layout and specs are
//! read by `read_specs.rs`, every limit checked as they are read; other deep values of
//! settings (`welcome`'s spec, a checkpoint's state) by their derived `Deserialize`
//! from their own bytes.

use std::collections::{BTreeMap, VecDeque};
use std::sync::Arc;

use serde::de::DeserializeOwned;

use super::cursor::Cursor;
use super::ends::{write_next, Ends};
use super::read_specs;
use super::{Auth, Hello, NodeFrame, TrainerFrame, Welcome, WireError};
use crate::message::names;
use crate::message::{Batch, Continue, FromNode, Seed, ToNode, UpdateWeights};
use crate::peer_text::{Bounded, BoundedBytes, BoundedDisplay};
use crate::policy::Weights;
use crate::pool::TensorPool;
use crate::tensor::{DType, Elements, Tensor, TensorDict};

/// Where the tensors of one decode find their memory.
pub struct Storage<'a> {
    /// Tensors a `FrameReader` read into storage of their own, in the frame's order:
    /// each holds the data of the next tensor whose blob came empty.
    pub(crate) read: VecDeque<Elements>,
    /// Storage for the others.
    pub(crate) pool: &'a mut TensorPool,
}

/// A frame type this module decodes: the wire's two. Sealed.
pub trait Frame: Sized + sealed::Sealed {}

impl Frame for NodeFrame {}
impl Frame for TrainerFrame {}

mod sealed {
    use super::{Fields, Storage};

    /// The frames of one direction, by `type`.
    pub trait Sealed: Sized {
        /// The frame named `tag`, its fields read off `fields`.
        fn read(tag: &str, fields: Fields<'_>, storage: &mut Storage<'_>) -> Result<Self, String>;
    }
}

/// Decodes the frame body `body` (without its prefix), its tensors into `storage`.
pub(crate) fn decode_into<T: Frame>(body: &[u8], storage: &mut Storage<'_>) -> Result<T, WireError> {
    if body.is_empty() {
        return Err(WireError::Empty);
    }
    let (tag, fields) = open(body).map_err(WireError::Decode)?;
    T::read(tag, fields, storage).map_err(WireError::Decode)
}

/// The frame's `type` and its fields, ready to read.
fn open(body: &[u8]) -> Result<(&str, Fields<'_>), String> {
    let mut c = Cursor::new(body);
    let n = c.frame_len()?;
    let fields = Fields {
        c,
        left: n,
        tag_seen: false,
    };
    // The encoder's way: `type` first.
    let mut first = fields;
    if n > 0 && first.c.str_bytes(u64::MAX).map_err(key_error)? == names::TYPE.as_bytes() {
        return Ok((tag_value(&mut first.c)?, fields));
    }
    // Anywhere else: through the keys once.
    let mut scan = fields;
    let mut tag = None;
    for _ in 0..n {
        if scan.c.str_bytes(u64::MAX).map_err(key_error)? == names::TYPE.as_bytes() {
            if tag.replace(tag_value(&mut scan.c)?).is_some() {
                return Err(duplicate(names::TYPE));
            }
        } else {
            scan.c.skip_value()?;
        }
    }
    Ok((tag.ok_or_else(|| missing(names::TYPE))?, fields))
}

fn tag_value<'a>(c: &mut Cursor<'a>) -> Result<&'a str, String> {
    c.text().map_err(|e| format!("`type` must be a string ({e})"))
}

fn key_error(e: String) -> String {
    format!("a key: {e}")
}

fn missing(name: &str) -> String {
    format!("missing field `{name}`")
}

fn duplicate(name: &str) -> String {
    format!("duplicate field `{name}`")
}

/// The entries of a frame's map after its `type`, key by key, each value to be read
/// by the caller (or skipped). A second `type` is refused.
#[derive(Clone, Copy)]
pub struct Fields<'a> {
    c: Cursor<'a>,
    left: u64,
    tag_seen: bool,
}

impl<'a> Fields<'a> {
    /// The next key other than `type`, the cursor at its value; `None` at the end.
    fn next(&mut self) -> Result<Option<&'a [u8]>, String> {
        while self.left > 0 {
            self.left -= 1;
            let key = self.c.str_bytes(u64::MAX).map_err(key_error)?;
            if key != names::TYPE.as_bytes() {
                return Ok(Some(key));
            }
            if std::mem::replace(&mut self.tag_seen, true) {
                return Err(duplicate(names::TYPE));
            }
            self.c.skip_value()?;
        }
        Ok(None)
    }

    /// Goes through every field, each read by `f` (which skips the ones it does not know).
    fn each(mut self, mut f: impl FnMut(&[u8], &mut Cursor<'a>) -> Result<(), String>) -> Result<(), String> {
        while let Some(key) = self.next()? {
            f(key, &mut self.c)?;
        }
        Ok(())
    }

    /// A frame of no fields (unknown ones skipped).
    fn none(self) -> Result<(), String> {
        self.each(|_, c| c.skip_value())
    }
}

/// One field's value, read once: what a frame's reader keeps per field.
struct Field<T> {
    name: &'static str,
    value: Option<T>,
}

impl<T> Field<T> {
    fn new(name: &'static str) -> Field<T> {
        Field { name, value: None }
    }

    /// Reads the value with `read`, refusing a second one.
    fn read<'a>(
        &mut self,
        c: &mut Cursor<'a>,
        read: impl FnOnce(&mut Cursor<'a>) -> Result<T, String>,
    ) -> Result<(), String> {
        if self.value.is_some() {
            return Err(duplicate(self.name));
        }
        self.value = Some(read(c).map_err(|e| format!("`{}`: {e}", self.name))?);
        Ok(())
    }

    fn get(self) -> Result<T, String> {
        self.value.ok_or_else(|| missing(self.name))
    }
}

impl<T> Field<Option<T>> {
    /// An optional field: absent is `None`.
    fn opt(self) -> Option<T> {
        self.value.flatten()
    }
}

fn uint(c: &mut Cursor<'_>) -> Result<u64, String> {
    c.uint()
}

fn size(c: &mut Cursor<'_>) -> Result<usize, String> {
    usize::try_from(c.uint()?).map_err(|_| "out of range".to_string())
}

fn string(c: &mut Cursor<'_>) -> Result<String, String> {
    c.text().map(str::to_owned)
}

fn bytes(c: &mut Cursor<'_>) -> Result<Vec<u8>, String> {
    c.bin().map(<[u8]>::to_vec)
}

/// A value read by its derived `Deserialize`, from its own bytes. Serde's errors echo
/// what they refuse (an unknown variant's name, say): shown bounded.
fn derived<T: DeserializeOwned>(c: &mut Cursor<'_>) -> Result<T, String> {
    rmp_serde::from_slice(c.value_bytes()?).map_err(|e| BoundedDisplay(&e).to_string())
}

/// Reads a frame's fields, `{name: read, ...}`: each once, in any order, unknown keys
/// skipped; the `Field`s, in the order named.
macro_rules! fields {
    ($fields:expr, { $($key:ident: $read:expr),* $(,)? }) => {{
        $(let mut $key = Field::new(stringify!($key));)*
        $fields.each(|k, c| match k {
            $(k if k == stringify!($key).as_bytes() => $key.read(c, $read),)*
            _ => c.skip_value(),
        })?;
        ($($key,)*)
    }};
}

impl sealed::Sealed for NodeFrame {
    fn read(tag: &str, f: Fields<'_>, storage: &mut Storage<'_>) -> Result<NodeFrame, String> {
        let m = match tag {
            names::BATCH => FromNode::Batch(batch(f, storage)?),
            names::HELLO => {
                let (protocol_version, node_name, node_index) = fields!(f, {
                    protocol_version: |c| u32::try_from(c.uint()?).map_err(|_| "out of range".to_string()),
                    node_name: string,
                    node_index: |c| if c.nil()? { Ok(None) } else { size(c).map(Some) },
                });
                return Ok(NodeFrame::Hello(Hello {
                    protocol_version: protocol_version.get()?,
                    node_name: node_name.get()?,
                    node_index: node_index.opt(),
                }));
            }
            names::AUTH => {
                let (proof,) = fields!(f, { proof: bytes });
                return Ok(NodeFrame::Auth(Auth { proof: proof.get()? }));
            }
            names::HEARTBEAT => {
                f.none()?;
                return Ok(NodeFrame::Heartbeat);
            }
            names::WEIGHTS_UPDATED => {
                let (node, version) = fields!(f, { node: size, version: uint });
                FromNode::WeightsUpdated {
                    node: node.get()?,
                    version: version.get()?,
                }
            }
            names::SEEDED => {
                let (node, next_seed) = fields!(f, { node: size, next_seed: uint });
                FromNode::Seeded {
                    node: node.get()?,
                    next_seed: next_seed.get()?,
                }
            }
            names::DOWN => FromNode::Down { node: node_only(f)? },
            names::LEAVE => FromNode::Leave { node: node_only(f)? },
            names::RESTORED => FromNode::Restored { node: node_only(f)? },
            names::FAILED => {
                let (node, reason) = fields!(f, { node: size, reason: string });
                FromNode::Failed {
                    node: node.get()?,
                    reason: reason.get()?,
                }
            }
            names::READY => {
                let (node, layout, specs) = fields!(f, {
                    node: size,
                    layout: read_specs::layout,
                    specs: |c| if c.nil()? { Ok(None) } else { read_specs::env_specs(c).map(Some) },
                });
                FromNode::Ready {
                    node: node.get()?,
                    layout: layout.get()?,
                    specs: specs.opt().map(Box::new),
                }
            }
            names::SNAPSHOT => {
                let (node, id, state) = fields!(f, { node: size, id: uint, state: derived });
                FromNode::Snapshot {
                    node: node.get()?,
                    id: id.get()?,
                    state: state.get()?,
                }
            }
            names::CHECKPOINT_FAILED => {
                let (node, id, reason) = fields!(f, { node: size, id: uint, reason: string });
                FromNode::CheckpointFailed {
                    node: node.get()?,
                    id: id.get()?,
                    reason: reason.get()?,
                }
            }
            other => return Err(unknown(other)),
        };
        Ok(NodeFrame::Message(m))
    }
}

impl sealed::Sealed for TrainerFrame {
    fn read(tag: &str, f: Fields<'_>, storage: &mut Storage<'_>) -> Result<TrainerFrame, String> {
        let m = match tag {
            names::UPDATE_WEIGHTS => {
                let (weights,) = fields!(f, { weights: weights_parts });
                let weights = storage.weights(weights.get()?)?;
                ToNode::UpdateWeights(UpdateWeights {
                    weights: Arc::new(weights),
                })
            }
            names::CONTINUE => {
                let (seq, frames) = fields!(f, { seq: uint, frames: size });
                ToNode::Continue(Continue {
                    seq: seq.get()?,
                    frames: frames.get()?,
                })
            }
            names::SEED => {
                let (seed,) = fields!(f, { seed: uint });
                ToNode::Seed(Seed { seed: seed.get()? })
            }
            names::SHUTDOWN => {
                f.none()?;
                ToNode::Shutdown
            }
            names::SNAPSHOT => {
                let (id,) = fields!(f, { id: uint });
                ToNode::Snapshot { id: id.get()? }
            }
            names::RESTORE => {
                // The state's fields are the frame's: its map read as the state (its
                // `type` an unknown key to it), once the fields were checked for a
                // second `type`.
                let whole = f.c.whole();
                f.none()?;
                let state = rmp_serde::from_slice(whole).map_err(|e| e.to_string())?;
                ToNode::Restore(Box::new(state))
            }
            names::HEARTBEAT => {
                f.none()?;
                return Ok(TrainerFrame::Heartbeat);
            }
            names::CHALLENGE => {
                let (nonce,) = fields!(f, { nonce: bytes });
                return Ok(TrainerFrame::Challenge { nonce: nonce.get()? });
            }
            names::REJECT => {
                let (reason,) = fields!(f, { reason: string });
                return Ok(TrainerFrame::Reject { reason: reason.get()? });
            }
            names::WELCOME => {
                let (node_index, spec, weights, heartbeat_ms, heartbeat_timeout_ms, max_frame) = fields!(f, {
                    node_index: size,
                    spec: derived,
                    weights: |c| if c.nil()? { Ok(None) } else { weights_parts(c).map(Some) },
                    heartbeat_ms: uint,
                    heartbeat_timeout_ms: uint,
                    max_frame: uint,
                });
                let weights = match weights.opt() {
                    Some(w) => Some(storage.weights(w)?),
                    None => None,
                };
                return Ok(TrainerFrame::Welcome(Box::new(Welcome {
                    node_index: node_index.get()?,
                    spec: spec.get()?,
                    weights,
                    heartbeat_ms: heartbeat_ms.get()?,
                    heartbeat_timeout_ms: heartbeat_timeout_ms.get()?,
                    max_frame: max_frame.get()?,
                })));
            }
            other => return Err(unknown(other)),
        };
        Ok(TrainerFrame::Message(m))
    }
}

fn unknown(tag: &str) -> String {
    format!("unknown frame type `{}`", Bounded(tag))
}

fn node_only(f: Fields<'_>) -> Result<usize, String> {
    let (node,) = fields!(f, { node: size });
    node.get()
}

/// Most dimensions kept without an allocation.
const INLINE_DIMS: usize = 8;

/// A shape, without an allocation up to [`INLINE_DIMS`] dimensions.
#[derive(Clone, Debug, Default)]
struct Dims {
    len: usize,
    inline: [usize; INLINE_DIMS],
    more: Vec<usize>,
}

impl Dims {
    fn as_slice(&self) -> &[usize] {
        if self.len > INLINE_DIMS {
            &self.more
        } else {
            &self.inline[..self.len]
        }
    }
}

/// An array of unsigned integers, each a `usize`.
fn dims(c: &mut Cursor<'_>) -> Result<Dims, String> {
    let mut d = Dims::default();
    dims_into(c, &mut d)?;
    Ok(d)
}

/// [`dims`], into `d` (a tensor's shape is read in place: the hot path of a batch).
fn dims_into(c: &mut Cursor<'_>, d: &mut Dims) -> Result<(), String> {
    let len = usize::try_from(c.array_len()?).map_err(|_| "too many dimensions".to_string())?;
    d.len = len;
    if len > INLINE_DIMS {
        // Each dimension takes a byte at least: no more is reserved than there are bytes.
        d.more.reserve(len.min(c.left()));
        for _ in 0..len {
            d.more.push(size(c)?);
        }
    } else {
        for slot in &mut d.inline[..len] {
            *slot = size(c)?;
        }
    }
    Ok(())
}

/// One tensor's parts, not yet checked against each other.
struct Parts<'a> {
    dtype: DType,
    shape: Dims,
    data: &'a [u8],
}

/// Every dtype, for their names.
const DTYPES: [DType; 5] = [DType::F32, DType::F64, DType::I64, DType::Bool, DType::U8];

fn dtype(c: &mut Cursor<'_>) -> Result<DType, String> {
    let name = c.str_bytes(u64::MAX)?;
    DTYPES.into_iter().find(|d| d.name().as_bytes() == name).ok_or_else(|| {
        let known: Vec<String> = DTYPES.iter().map(|d| format!("`{d}`")).collect();
        format!(
            "unknown dtype `{}`, expected one of {}",
            BoundedBytes(name),
            known.join(", ")
        )
    })
}

/// A tensor: `{dtype, shape, data}` in any order.
fn tensor_parts<'a>(c: &mut Cursor<'a>) -> Result<Parts<'a>, String> {
    let n = c.map_len()?;
    // Read in place, without `Field`: a batch holds many small tensors.
    let (mut dt, mut shape, mut data, mut have_shape) = (None, Dims::default(), None, false);
    let field = |name: &'static str| move |e: String| format!("`{name}`: {e}");
    for _ in 0..n {
        match c.str_bytes(u64::MAX).map_err(key_error)? {
            b"dtype" if dt.is_none() => dt = Some(dtype(c).map_err(field("dtype"))?),
            b"shape" if !have_shape => {
                dims_into(c, &mut shape).map_err(field("shape"))?;
                have_shape = true;
            }
            b"data" if data.is_none() => data = Some(c.bin().map_err(field("data"))?),
            k @ (b"dtype" | b"shape" | b"data") => return Err(duplicate(&String::from_utf8_lossy(k))),
            _ => c.skip_value()?,
        }
    }
    if !have_shape {
        return Err(missing("shape"));
    }
    Ok(Parts {
        dtype: dt.ok_or_else(|| missing("dtype"))?,
        shape,
        data: data.ok_or_else(|| missing("data"))?,
    })
}

/// Most tensor entries reserved for at once, whatever count the frame gives.
const MAX_RESERVE: usize = 64;

/// A map of key → tensor, its entries in the frame's order.
fn tensor_entries<'a>(c: &mut Cursor<'a>) -> Result<Vec<(&'a str, Parts<'a>)>, String> {
    let n = c.map_len()?;
    let mut out = Vec::with_capacity((n as usize).min(MAX_RESERVE));
    for _ in 0..n {
        let key = c.text().map_err(key_error)?;
        let t = tensor_parts(c).map_err(|e| format!("`{}`: {e}", Bounded(key)))?;
        out.push((key, t));
    }
    Ok(out)
}

/// A batch's `data`: its batch shape and its tensors' parts.
struct DictParts<'a> {
    batch_size: Dims,
    tensors: Vec<(&'a str, Parts<'a>)>,
}

fn dict_parts<'a>(c: &mut Cursor<'a>) -> Result<DictParts<'a>, String> {
    let n = c.map_len()?;
    let (mut batch_size, mut tensors) = (Field::new("batch_size"), Field::new("tensors"));
    for _ in 0..n {
        match c.str_bytes(u64::MAX).map_err(key_error)? {
            b"batch_size" => batch_size.read(c, dims)?,
            b"tensors" => tensors.read(c, tensor_entries)?,
            _ => c.skip_value()?,
        }
    }
    Ok(DictParts {
        batch_size: batch_size.get()?,
        tensors: tensors.get()?,
    })
}

/// Weights: their version and their tensors' parts.
struct WeightsParts<'a> {
    version: u64,
    tensors: Vec<(&'a str, Parts<'a>)>,
}

fn weights_parts<'a>(c: &mut Cursor<'a>) -> Result<WeightsParts<'a>, String> {
    let n = c.map_len()?;
    let (mut version, mut tensors) = (Field::new("version"), Field::new("tensors"));
    for _ in 0..n {
        match c.str_bytes(u64::MAX).map_err(key_error)? {
            b"version" => version.read(c, uint)?,
            b"tensors" => tensors.read(c, tensor_entries)?,
            _ => c.skip_value()?,
        }
    }
    Ok(WeightsParts {
        version: version.get()?,
        tensors: tensors.get()?,
    })
}

/// A batch's `ends` (protocol version 9): the rows where each `next.K` it holds is not
/// `K` one step later, and those rows of each.
struct EndsParts<'a> {
    rows: Vec<u64>,
    tensors: Vec<(&'a str, Parts<'a>)>,
}

fn ends_parts<'a>(c: &mut Cursor<'a>) -> Result<EndsParts<'a>, String> {
    let n = c.map_len()?;
    let (mut rows, mut tensors) = (Field::new("rows"), Field::new("tensors"));
    for _ in 0..n {
        match c.str_bytes(u64::MAX).map_err(key_error)? {
            b"rows" => rows.read(c, |c| {
                // Every element takes at least a byte: `array_len` checked the count
                // against the bytes left, which bounds what this holds.
                let n = c.array_len()?;
                let mut out = Vec::with_capacity((n as usize).min(MAX_RESERVE));
                for _ in 0..n {
                    out.push(c.uint()?);
                }
                Ok(out)
            })?,
            b"tensors" => tensors.read(c, tensor_entries)?,
            _ => c.skip_value()?,
        }
    }
    Ok(EndsParts {
        rows: rows.get()?,
        tensors: tensors.get()?,
    })
}

fn batch(f: Fields<'_>, storage: &mut Storage<'_>) -> Result<Batch, String> {
    let (node, seq, weights_version, data, ends) = fields!(f, {
        node: size,
        seq: uint,
        weights_version: uint,
        data: dict_parts,
        ends: |c| if c.nil()? { Ok(None) } else { ends_parts(c).map(Some) },
    });
    let data = data.get()?;
    let data = match ends.opt() {
        None => storage.dict(data)?,
        Some(ends) => storage
            .dict_with_ends(data, &ends)
            .map_err(|e| format!("`ends`: {e}"))?,
    };
    Ok(Batch {
        node: node.get()?,
        seq: seq.get()?,
        weights_version: weights_version.get()?,
        data,
    })
}

impl Storage<'_> {
    /// The tensor of `e`: the next tensor read aside if its blob came empty and that
    /// one has its dtype and element count, else decoded into pooled (or fresh) storage.
    fn tensor(&mut self, e: &Parts<'_>) -> Result<Tensor, String> {
        let shape = e.shape.as_slice();
        let elems = shape.iter().try_fold(1usize, |acc, &d| acc.checked_mul(d));
        let read_aside = e.data.is_empty()
            && self
                .read
                .front()
                .is_some_and(|r| r.dtype() == e.dtype && Some(r.len()) == elems);
        if read_aside {
            if let Some(r) = self.read.pop_front() {
                return r.into_tensor(shape).map_err(|e| e.to_string());
            }
        }
        Tensor::from_le_bytes_into(e.dtype, shape, e.data, |dtype, n| self.pool.take(dtype, n))
            .map_err(|e| e.to_string())
    }

    /// The entries' tensors, in order, as a map (a later entry replaces an earlier
    /// one of the same key, as decoding a map does).
    fn tensors(&mut self, entries: &[(&str, Parts<'_>)]) -> Result<BTreeMap<String, Tensor>, String> {
        let mut out = BTreeMap::new();
        for (key, e) in entries {
            let t = self.tensor(e)?;
            out.insert((*key).to_string(), t);
        }
        Ok(out)
    }

    fn weights(&mut self, w: WeightsParts<'_>) -> Result<Weights, String> {
        Ok(Weights {
            version: w.version,
            tensors: self.tensors(&w.tensors)?,
        })
    }

    /// A batch's dict: the recycled batch of the pool holding it, if it has its
    /// layout and no tensor was read aside; else built tensor by tensor.
    fn dict(&mut self, d: DictParts<'_>) -> Result<TensorDict, String> {
        if self.read.is_empty() {
            if let Some(td) = self.pool.take_dict() {
                match refill(td, &d, &[]) {
                    Ok(td) => return Ok(td),
                    Err(td) => self.pool.put_tensors(td),
                }
            }
        }
        let tensors = self.tensors(&d.tensors)?;
        TensorDict::decoded(d.batch_size.as_slice().to_vec(), tensors).map_err(|e| e.to_string())
    }

    /// A batch's dict sent with `ends`: its `next.K` entries written from `K` one
    /// step later and the rows `ends` holds (`wire/ends.rs`), into the recycled batch
    /// when `d` and `ends` together have its layout, else into pooled storage.
    fn dict_with_ends(&mut self, d: DictParts<'_>, ends: &EndsParts<'_>) -> Result<TensorDict, String> {
        let &[lanes, steps] = d.batch_size.as_slice() else {
            return Err(format!(
                "a batch of shape {:?}, not [envs, steps]",
                d.batch_size.as_slice()
            ));
        };
        Ends::check_rows(&ends.rows, lanes, steps)?;
        let mut rebuilt = Vec::with_capacity(ends.tensors.len());
        for (key, _) in &ends.tensors {
            if key.strip_prefix("next.").is_none_or(str::is_empty) {
                return Err(format!("`{}` is not a `next.` key", Bounded(key)));
            }
            if rebuilt.contains(key) || d.tensors.iter().any(|(k, _)| k == key) {
                return Err(format!("`{}` given twice", Bounded(key)));
            }
            rebuilt.push(*key);
        }
        let recycled = if self.read.is_empty() {
            match self.pool.take_dict().map(|td| refill(td, &d, &rebuilt)) {
                Some(Ok(td)) => Some(td),
                Some(Err(td)) => {
                    self.pool.put_tensors(td);
                    None
                }
                None => None,
            }
        } else {
            None
        };
        let mut td = match recycled {
            Some(td) => td,
            None => {
                let tensors = self.tensors(&d.tensors)?;
                TensorDict::decoded(d.batch_size.as_slice().to_vec(), tensors).map_err(|e| e.to_string())?
            }
        };
        for (key, parts) in &ends.tensors {
            let at_ends = Tensor::from_le_bytes(parts.dtype, parts.shape.as_slice(), parts.data)
                .map_err(|e| format!("`{}`: {e}", Bounded(key)))?;
            let obs_key = &key["next.".len()..];
            let recycled = td.remove(key);
            let obs = td
                .get(obs_key)
                .map_err(|_| format!("`{}` without `{}` in `data`", Bounded(key), Bounded(obs_key)))?;
            let mut next = match recycled {
                Some(t) => t,
                None => self
                    .pool
                    .take(obs.dtype(), obs.len())
                    .map(|e| e.into_tensor(obs.shape()))
                    .transpose()
                    .map_err(|e| e.to_string())?
                    .unwrap_or_else(|| Tensor::zeros(obs.dtype(), obs.shape())),
            };
            write_next(&mut next, obs, &at_ends, &ends.rows, lanes, steps)
                .map_err(|e| format!("`{}`: {e}", Bounded(key)))?;
            td.set(key, next).map_err(|e| e.to_string())?;
        }
        Ok(td)
    }
}

/// `td`, a recycled batch, holding the batch `d` instead, if `d` has its layout:
/// its batch shape, and its keys in order (so none twice), dtypes and shapes, each
/// blob exactly the length its tensor needs (bool bytes 0 or 1), but for the keys
/// `rebuilt` (the `next.K` of `ends`, written afterwards), which `d` must not hold.
/// Then only elements are written, and the dict is the one a decode would build (it
/// was valid with these keys and shapes). Else `td` back, to be pooled; its
/// elements are scratch.
fn refill(mut td: TensorDict, d: &DictParts<'_>, rebuilt: &[&str]) -> Result<TensorDict, TensorDict> {
    let same = td.batch_size() == d.batch_size.as_slice()
        && td.len() == d.tensors.len() + rebuilt.len()
        && td.iter_mut().filter(|(key, _)| !rebuilt.contains(key)).count() == d.tensors.len()
        && td
            .iter_mut()
            .filter(|(key, _)| !rebuilt.contains(key))
            .zip(&d.tensors)
            .all(|((key, t), (k, e))| {
                key == *k && t.dtype() == e.dtype && t.shape() == e.shape.as_slice() && t.refill_from_le(e.data)
            })
        // A consumer's dict may have been reshaped in place (`get_mut`): then it is
        // not what a decode would build.
        && td.validate().is_ok();
    if same {
        Ok(td)
    } else {
        Err(td)
    }
}
