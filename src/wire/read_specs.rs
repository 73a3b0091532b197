//! The decoder of `ready`'s `specs` and `layout` (PROTOCOL.md §3, Spaces; §5, Ready),
//! by hand on the wire's one [`Cursor`]: every size a peer gives is checked against
//! its limit while it is read, before anything is allocated for it.
//!
//! What is checked here is what bounds memory: a box's rank ([`MAX_RANK`]) and element
//! count ([`MAX_ELEMENTS`]), per-element bounds exactly as many as the box's elements,
//! the per-element numbers of the whole specs ([`MAX_SPEC_VALUES`]: bounds and `nvec`
//! entries), dict entries ([`MAX_DICT_ENTRIES`]), depth ([`MAX_DICT_DEPTH`]) and name
//! lengths ([`MAX_NAME_LEN`]), a layout's entries and key lengths. Every array is
//! also checked against the bytes left before anything is reserved for it (each of
//! its values takes a byte at least). The rest of [`EnvSpecs::validate`]'s rules
//! (no NaN, bounds in order, counts of choices) are the caller's, after decoding.
//!
//! Memory: what is built is at most 8 bytes per byte read (a per-element bound of one
//! byte becomes an f64), plus a few hundred bytes per space, and never more than
//! [`MAX_SPEC_VALUES`] × 8 bytes of numbers in all. Work: each level of dicts skips
//! over the levels below it once before reading them, so every byte is visited at
//! most [`MAX_DICT_DEPTH`] + 2 times.
//!
//! Keys may come in any order; an unknown key is skipped, a key given twice refused,
//! and every error names the batch key of the space at fault (`observation.pixels`).

use std::collections::BTreeMap;

use super::cursor::Cursor;
use crate::schema::{BatchLayout, MAX_LAYOUT_ENTRIES, MAX_LAYOUT_KEY_LEN};
use crate::space::{
    Bounds, EnvSpecs, Space, MAX_AGENTS, MAX_DICT_DEPTH, MAX_DICT_ENTRIES, MAX_ELEMENTS, MAX_GROUPS, MAX_NAME_LEN,
    MAX_RANK, MAX_SPEC_VALUES,
};
use crate::tensor::DType;

/// The longest `kind` or `dtype` name read (the longest known is `multi_discrete`).
const MAX_TAG_LEN: u64 = 32;

/// Every dtype, for their names.
const DTYPES: [DType; 5] = [DType::F32, DType::F64, DType::I64, DType::Bool, DType::U8];

/// What the whole specs spent so far of their limits.
#[derive(Default)]
struct Budget {
    /// Per-element numbers (bounds, `nvec` entries).
    values: usize,
    /// Dict entries, over every level.
    entries: usize,
}

impl Budget {
    /// Takes `n` more per-element numbers, if the specs may have them.
    fn take_values(&mut self, n: usize) -> Result<(), String> {
        match self.values.checked_add(n) {
            Some(total) if total <= MAX_SPEC_VALUES => {
                self.values = total;
                Ok(())
            }
            _ => Err(format!(
                "{n} per-element values (bounds, nvec) with {} before them: more than {MAX_SPEC_VALUES} in all \
                 (a box that large sends one number as each bound)",
                self.values
            )),
        }
    }
}

/// `ready`'s `specs`: an [`EnvSpecs`] map, every limit checked as it is read.
pub(super) fn env_specs(c: &mut Cursor<'_>) -> Result<EnvSpecs, String> {
    let n = c.map_len()?;
    let mut budget = Budget::default();
    let (mut observation, mut action, mut agents) = (None, None, None);
    for _ in 0..n {
        let key = c.str_bytes(u64::MAX).map_err(|e| format!("a key: {e}"))?;
        if key == b"agents" {
            if agents.is_some() {
                return Err("`agents` given twice".into());
            }
            agents = Some(if c.nil()? { None } else { Some(agent_groups(c)?) });
            continue;
        }
        let (slot, name) = match key {
            b"observation" => (&mut observation, "observation"),
            b"action" => (&mut action, "action"),
            _ => {
                c.skip_value()?;
                continue;
            }
        };
        if slot.is_some() {
            return Err(format!("`{name}` given twice"));
        }
        *slot = Some(space(c, name, 0, &mut budget)?);
    }
    Ok(EnvSpecs {
        observation: observation.ok_or("missing `observation`")?,
        action: action.ok_or("missing `action`")?,
        agents: agents.flatten(),
    })
}

/// A multi-agent env's `agents` (PROTOCOL.md §3, Multi-agent envs): group → agent
/// names, at most [`MAX_GROUPS`] groups and [`MAX_AGENTS`] agents in all, every name
/// at most [`MAX_NAME_LEN`] bytes, checked as they are read (a group twice refused;
/// the other rules are [`EnvSpecs::validate`]'s).
fn agent_groups(c: &mut Cursor<'_>) -> Result<BTreeMap<String, Vec<String>>, String> {
    let at = |e: String| format!("agents: {e}");
    let groups = c.map_len().map_err(at)?;
    if groups > MAX_GROUPS as u64 {
        return Err(at(format!("{groups} groups (at most {MAX_GROUPS})")));
    }
    let mut out = BTreeMap::new();
    let mut total = 0usize;
    for _ in 0..groups {
        let name = utf8(
            c.str_bytes(MAX_NAME_LEN as u64)
                .map_err(|e| at(format!("a group name: {e}")))?,
        )
        .map_err(|e| at(format!("a group name: {e}")))?;
        // A peer's name, escaped before it reaches an error or a log line.
        let shown = crate::peer_text::Bounded(&name).to_string();
        let n = c.array_len().map_err(|e| at(format!("{shown}: {e}")))?;
        let left = (MAX_AGENTS - total) as u64;
        if n > left {
            return Err(at(format!(
                "{shown}: {n} agents with {total} before them (at most {MAX_AGENTS} in all)"
            )));
        }
        let mut agents = Vec::with_capacity(n as usize);
        for _ in 0..n {
            let agent = c
                .str_bytes(MAX_NAME_LEN as u64)
                .map_err(|e| at(format!("{shown}: an agent name: {e}")))?;
            agents.push(utf8(agent).map_err(|e| at(format!("{shown}: an agent name: {e}")))?);
        }
        total += agents.len();
        if out.insert(name.clone(), agents).is_some() {
            return Err(at(format!("{shown}: given twice")));
        }
    }
    Ok(out)
}

/// A name read from the wire, which must be UTF-8.
fn utf8(bytes: &[u8]) -> Result<String, String> {
    std::str::from_utf8(bytes)
        .map(str::to_string)
        .map_err(|_| "not UTF-8".to_string())
}

/// `ready`'s `layout`: a map of batch key → `[dtype, feature shape]`.
pub(super) fn layout(c: &mut Cursor<'_>) -> Result<BatchLayout, String> {
    let n = c.map_len()?;
    if n > MAX_LAYOUT_ENTRIES as u64 {
        return Err(format!("{n} entries (at most {MAX_LAYOUT_ENTRIES})"));
    }
    let mut out = BatchLayout::new();
    for _ in 0..n {
        let key = std::str::from_utf8(
            c.str_bytes(MAX_LAYOUT_KEY_LEN as u64)
                .map_err(|e| format!("a key: {e}"))?,
        )
        .map_err(|_| "a key that is not UTF-8".to_string())?;
        let entry = (|| {
            if c.array_len()? != 2 {
                return Err("expected [dtype, shape]".to_string());
            }
            let dtype = dtype(c)?;
            let shape = shape(c)?;
            Ok((dtype, shape))
        })()
        .map_err(|e| format!("{key}: {e}"))?;
        if out.insert(key.to_string(), entry).is_some() {
            return Err(format!("{key}: given twice"));
        }
    }
    Ok(out)
}

/// The value of each key of a space's map, found once, read once the `kind` is known.
#[derive(Default)]
struct Fields<'a> {
    kind: Option<&'a [u8]>,
    dtype: Option<Cursor<'a>>,
    shape: Option<Cursor<'a>>,
    low: Option<Cursor<'a>>,
    high: Option<Cursor<'a>>,
    n: Option<Cursor<'a>>,
    start: Option<Cursor<'a>>,
    nvec: Option<Cursor<'a>>,
    spaces: Option<Cursor<'a>>,
}

impl<'a> Fields<'a> {
    /// The keys of the space map at `c`, each value skipped and remembered.
    fn read(c: &mut Cursor<'a>) -> Result<Fields<'a>, String> {
        let n = c.map_len()?;
        let mut f = Fields::default();
        for _ in 0..n {
            let key = c.str_bytes(u64::MAX).map_err(|e| format!("a key: {e}"))?;
            if key == b"kind" {
                if f.kind.is_some() {
                    return Err("`kind` given twice".into());
                }
                f.kind = Some(c.str_bytes(MAX_TAG_LEN).map_err(|e| format!("`kind`: {e}"))?);
                continue;
            }
            let (slot, name) = match key {
                b"dtype" => (&mut f.dtype, "dtype"),
                b"shape" => (&mut f.shape, "shape"),
                b"low" => (&mut f.low, "low"),
                b"high" => (&mut f.high, "high"),
                b"n" => (&mut f.n, "n"),
                b"start" => (&mut f.start, "start"),
                b"nvec" => (&mut f.nvec, "nvec"),
                b"spaces" => (&mut f.spaces, "spaces"),
                _ => {
                    c.skip_value()?;
                    continue;
                }
            };
            if slot.is_some() {
                return Err(format!("`{name}` given twice"));
            }
            *slot = Some(*c);
            c.skip_value()?;
        }
        Ok(f)
    }
}

/// The value of field `name`, read by `read`; missing is an error.
fn required<'a, T>(
    at: Option<Cursor<'a>>,
    name: &str,
    read: impl FnOnce(&mut Cursor<'a>) -> Result<T, String>,
) -> Result<T, String> {
    let mut c = at.ok_or_else(|| format!("missing `{name}`"))?;
    read(&mut c).map_err(|e| format!("`{name}`: {e}"))
}

/// The value of optional field `name` (absent or nil: `None`), read by `read`.
fn optional<'a, T>(
    at: Option<Cursor<'a>>,
    name: &str,
    read: impl FnOnce(&mut Cursor<'a>) -> Result<T, String>,
) -> Result<Option<T>, String> {
    let Some(mut c) = at else {
        return Ok(None);
    };
    if c.nil()? {
        return Ok(None);
    }
    read(&mut c).map(Some).map_err(|e| format!("`{name}`: {e}"))
}

/// The space under batch key `key`, `depth` dicts deep.
fn space(c: &mut Cursor<'_>, key: &str, depth: usize, budget: &mut Budget) -> Result<Space, String> {
    let at = |e: String| format!("{key}: {e}");
    let f = Fields::read(c).map_err(at)?;
    let kind = f.kind.ok_or_else(|| at("missing `kind`".into()))?;
    match kind {
        b"box" => {
            let dtype = required(f.dtype, "dtype", dtype).map_err(at)?;
            let shape = required(f.shape, "shape", shape).map_err(at)?;
            let elements = elements(&shape).map_err(at)?;
            let mut read_bounds = |value: Option<Cursor<'_>>, name: &str| {
                optional(value, name, |c| bounds(c, elements, budget)).map_err(at)
            };
            let low = read_bounds(f.low, "low")?;
            let high = read_bounds(f.high, "high")?;
            Ok(Space::Box {
                dtype,
                shape,
                low,
                high,
            })
        }
        b"discrete" => Ok(Space::Discrete {
            n: required(f.n, "n", |c| c.uint()).map_err(at)?,
            start: optional(f.start, "start", int).map_err(at)?.unwrap_or(0),
        }),
        b"multi_discrete" => Ok(Space::MultiDiscrete {
            nvec: required(f.nvec, "nvec", |c| nvec(c, budget)).map_err(at)?,
        }),
        b"multi_binary" => Ok(Space::MultiBinary {
            n: required(f.n, "n", size).map_err(at)?,
        }),
        b"dict" => {
            if depth >= MAX_DICT_DEPTH {
                return Err(at(format!("dicts nested deeper than {MAX_DICT_DEPTH}")));
            }
            let mut c = f.spaces.ok_or_else(|| at("missing `spaces`".into()))?;
            dict(&mut c, key, depth, budget)
        }
        other => Err(at(format!(
            "unknown kind `{}` (kinds: box, discrete, multi_discrete, multi_binary, dict)",
            String::from_utf8_lossy(other)
        ))),
    }
}

/// A dict's `spaces` under batch key `key`: each entry's space under `key.name`.
fn dict(c: &mut Cursor<'_>, key: &str, depth: usize, budget: &mut Budget) -> Result<Space, String> {
    let n = c.map_len().map_err(|e| format!("{key}: `spaces`: {e}"))?;
    let total = usize::try_from(n)
        .ok()
        .and_then(|n| budget.entries.checked_add(n))
        .filter(|&t| t <= MAX_DICT_ENTRIES)
        .ok_or_else(|| format!("{key}: more than {MAX_DICT_ENTRIES} dict entries"))?;
    budget.entries = total;
    let mut spaces = BTreeMap::new();
    for _ in 0..n {
        let name = c
            .str_bytes(MAX_NAME_LEN as u64)
            .map_err(|e| format!("{key}: an entry name: {e} (names are 1 to {MAX_NAME_LEN} bytes)"))?;
        let name = std::str::from_utf8(name).map_err(|_| format!("{key}: an entry name that is not UTF-8"))?;
        let inner = format!("{key}.{name}");
        let s = space(c, &inner, depth + 1, budget)?;
        if spaces.insert(name.to_string(), s).is_some() {
            return Err(format!("{inner}: given twice"));
        }
    }
    Ok(Space::Dict { spaces })
}

/// A dtype by its name.
fn dtype(c: &mut Cursor<'_>) -> Result<DType, String> {
    let name = c.str_bytes(MAX_TAG_LEN)?;
    DTYPES.into_iter().find(|d| d.name().as_bytes() == name).ok_or_else(|| {
        let known: Vec<&str> = DTYPES.iter().map(|d| d.name()).collect();
        format!(
            "unknown dtype `{}` (dtypes: {})",
            String::from_utf8_lossy(name),
            known.join(", ")
        )
    })
}

/// A shape: at most [`MAX_RANK`] dimensions, each a `usize`.
fn shape(c: &mut Cursor<'_>) -> Result<Vec<usize>, String> {
    let rank = c.array_len()?;
    if rank > MAX_RANK as u64 {
        return Err(format!("{rank} dimensions (at most {MAX_RANK})"));
    }
    (0..rank).map(|_| size(c)).collect()
}

/// The element count of a box of `shape`, at most [`MAX_ELEMENTS`].
fn elements(shape: &[usize]) -> Result<usize, String> {
    shape
        .iter()
        .try_fold(1usize, |acc, &d| acc.checked_mul(d))
        .filter(|&n| n <= MAX_ELEMENTS)
        .ok_or_else(|| format!("a box of shape {shape:?} has more than {MAX_ELEMENTS} elements"))
}

/// An array's length, checked against the bytes left (every value takes one at least).
fn array_len(c: &mut Cursor<'_>) -> Result<usize, String> {
    let n = c.array_len()?;
    usize::try_from(n)
        .ok()
        .filter(|&n| n <= c.left())
        .ok_or_else(|| format!("an array of {n} values in {} bytes", c.left()))
}

/// A box's bounds: one number, or exactly `elements` of them (taken from `budget`).
fn bounds(c: &mut Cursor<'_>, elements: usize, budget: &mut Budget) -> Result<Bounds, String> {
    if !matches!(c.peek()?, 0x90..=0x9f | 0xdc | 0xdd) {
        return number(c).map(Bounds::Uniform);
    }
    let n = array_len(c)?;
    if n != elements {
        return Err(format!("{n} bounds for a box of {elements} elements"));
    }
    budget.take_values(n)?;
    let mut v = Vec::with_capacity(n);
    for _ in 0..n {
        v.push(number(c)?);
    }
    Ok(Bounds::Each(v))
}

/// A multi-discrete space's `nvec` (taken from `budget`).
fn nvec(c: &mut Cursor<'_>, budget: &mut Budget) -> Result<Vec<u64>, String> {
    let n = array_len(c)?;
    budget.take_values(n)?;
    let mut v = Vec::with_capacity(n);
    for _ in 0..n {
        v.push(c.uint()?);
    }
    Ok(v)
}

/// A non-negative integer that fits a `usize`.
fn size(c: &mut Cursor<'_>) -> Result<usize, String> {
    let v = c.uint()?;
    usize::try_from(v).map_err(|_| format!("{v} is out of range"))
}

/// A signed integer in any MessagePack integer form that fits an `i64`.
fn int(c: &mut Cursor<'_>) -> Result<i64, String> {
    match c.peek()? {
        m @ 0xd0..=0xd3 => {
            c.byte()?;
            let bytes = 1u64 << (m - 0xd0);
            let raw = c.be(bytes)?;
            // Sign-extend the `bytes`-byte two's complement value.
            let shift = 64 - 8 * bytes as u32;
            Ok(((raw << shift) as i64) >> shift)
        }
        m @ 0xe0..=0xff => {
            c.byte()?;
            Ok(i64::from(m as i8))
        }
        _ => {
            let v = c.uint()?;
            i64::try_from(v).map_err(|_| format!("{v} is out of range"))
        }
    }
}

/// A number in any MessagePack number form (integers as the nearest f64).
fn number(c: &mut Cursor<'_>) -> Result<f64, String> {
    match c.peek()? {
        0xca => {
            c.byte()?;
            Ok(f64::from(f32::from_bits(c.be(4)? as u32)))
        }
        0xcb => {
            c.byte()?;
            Ok(f64::from_bits(c.be(8)?))
        }
        0xcc..=0xcf | 0x00..=0x7f => Ok(c.uint()? as f64),
        0xd0..=0xd3 | 0xe0..=0xff => Ok(int(c)? as f64),
        _ => Err("expected a number".into()),
    }
}

#[cfg(test)]
mod tests;
