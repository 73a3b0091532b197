//! A batch's observations on the wire once (protocol version 9): each `next.K` of an
//! observation key `K` is mostly `K` one step later, so a node sends `K` and, for
//! `next.K`, only the rows where it is not the next row's `K` (episode ends, and
//! each env's last frame); the trainer writes `next.K` back whole.
//!
//! Which rows those are is the node's to say (`rows`, flat frame indices): it finds
//! them by comparing bytes, not by trusting its `done` flags, so a frame rebuilt here
//! is the frame the node had, bit for bit. The trainer checks only what it can: rows
//! strictly increasing, inside the batch, every env's last frame among them, one
//! row of each tensor per listed row, dtypes and shapes those of `K`.

use std::collections::BTreeMap;

use serde::ser::SerializeStruct;
use serde::{Serialize, Serializer};

use crate::message::{names, Batch};
use crate::schema::keys;
use crate::tensor::{Tensor, TensorDict};

/// The fewest bytes sending each observation once must save for a batch to be sent so:
/// below it (CartPole's small batches) the trainer's rebuild costs more than the bytes
/// (the wire bench: 0.7 µs more per 10-frame batch, for 10 bytes).
pub const MIN_SAVED: usize = 16 << 10;

/// The prefix of the key a step's result is under.
const NEXT: &str = "next.";

/// What a batch sends of its `next.K` entries: the rows where each differs from `K`
/// one step later, and those rows of each.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct Ends {
    /// Flat frame indices (`env * steps + step`), strictly increasing.
    pub rows: Vec<u64>,
    /// `next.K` → its `rows`, shape `[rows.len(), ..K's feature shape]`.
    pub tensors: BTreeMap<String, Tensor>,
}

/// Whether `key` is an observation's (`observation`, or a leaf of an observation
/// dict, `observation.*`; a multi-agent group's `<group>.observation` and its leaves):
/// the entries a node sends once.
fn is_observation(key: &str) -> bool {
    let own = |k: &str| {
        k == keys::OBSERVATION
            || k.strip_prefix(keys::OBSERVATION)
                .is_some_and(|rest| rest.starts_with('.'))
    };
    own(key)
        || key
            .split_once('.')
            .is_some_and(|(group, rest)| group != "next" && own(rest))
}

/// An observation entry and its `next.` twin, as bytes.
struct Pair<'a> {
    key: String,
    obs: &'a [u8],
    next: &'a [u8],
    next_tensor: &'a Tensor,
    feature: Vec<usize>,
    /// Bytes of one frame's row.
    row: usize,
}

/// The lanes (envs) and steps of a batch of shape `[envs, steps]`.
fn lanes_steps(data: &TensorDict) -> Option<(usize, usize)> {
    match data.batch_size() {
        [lanes, steps] => Some((*lanes, *steps)),
        _ => None,
    }
}

impl Ends {
    /// The ends of `data`'s observation entries, or `None` when it has none to send
    /// once (no observation key with its `next.` twin of the same dtype and shape, a
    /// batch shape other than `[envs, steps]`, a tensor not in standard layout) or it
    /// would save fewer than [`MIN_SAVED`] bytes.
    pub fn of(data: &TensorDict) -> Option<Ends> {
        Ends::saving(data, MIN_SAVED)
    }

    /// [`Ends::of`], sending each observation once when that saves at least
    /// `min_saved` bytes.
    pub fn saving(data: &TensorDict, min_saved: usize) -> Option<Ends> {
        let (lanes, steps) = lanes_steps(data)?;
        let frames = lanes.checked_mul(steps)?;
        let pairs: Vec<Pair<'_>> = data
            .iter()
            .filter(|(k, _)| is_observation(k))
            .filter_map(|(k, obs)| {
                let key = format!("{NEXT}{k}");
                let next = data.get(&key).ok()?;
                if next.dtype() != obs.dtype() || next.shape() != obs.shape() {
                    return None;
                }
                let feature = obs.shape().get(2..)?.to_vec();
                let row = feature.iter().product::<usize>().checked_mul(obs.dtype().size())?;
                Some(Pair {
                    key,
                    obs: obs.le_bytes_in_place()?,
                    next: next.le_bytes_in_place()?,
                    next_tensor: next,
                    feature,
                    row,
                })
            })
            .collect();
        if pairs.is_empty() || frames == 0 {
            return None;
        }
        let differs = |flat: usize| {
            pairs
                .iter()
                .any(|p| p.next[flat * p.row..][..p.row] != p.obs[(flat + 1) * p.row..][..p.row])
        };
        let rows: Vec<u64> = (0..frames)
            .filter(|&flat| (flat + 1) % steps == 0 || differs(flat))
            .map(|flat| flat as u64)
            .collect();
        let saved: usize = pairs.iter().map(|p| p.row.saturating_mul(frames - rows.len())).sum();
        if saved < min_saved {
            return None;
        }
        let mut tensors = BTreeMap::new();
        for p in &pairs {
            let mut bytes = Vec::with_capacity(rows.len() * p.row);
            for &r in &rows {
                bytes.extend_from_slice(&p.next[r as usize * p.row..][..p.row]);
            }
            let shape: Vec<usize> = std::iter::once(rows.len()).chain(p.feature.iter().copied()).collect();
            let t = Tensor::from_le_bytes(p.next_tensor.dtype(), &shape, &bytes).ok()?;
            tensors.insert(p.key.clone(), t);
        }
        Some(Ends { rows, tensors })
    }

    /// Checks `rows` against a batch of `lanes` envs of `steps` frames each: strictly
    /// increasing, inside the batch, each env's last frame among them.
    pub(crate) fn check_rows(rows: &[u64], lanes: usize, steps: usize) -> Result<(), String> {
        let frames = lanes
            .checked_mul(steps)
            .ok_or_else(|| "the batch's frame count overflows".to_string())?;
        if let Some(w) = rows.windows(2).find(|w| w[0] >= w[1]) {
            return Err(format!("`ends.rows` not strictly increasing ({} then {})", w[0], w[1]));
        }
        if let Some(&last) = rows.last() {
            if last >= frames as u64 {
                return Err(format!("`ends.rows` holds {last}, past the batch's {frames} frames"));
            }
        }
        // Rows strictly increasing and inside the batch: each env's last frame is among
        // them when as many of them are last frames as there are envs (counted over
        // the rows, not the envs: the peer gave both numbers).
        if frames == 0 {
            return Ok(());
        }
        let last_frames = rows.iter().filter(|&&r| (r + 1) % steps as u64 == 0).count();
        if last_frames != lanes {
            let missing = (0..lanes)
                .map(|lane| ((lane + 1) * steps - 1) as u64)
                .find(|end| rows.binary_search(end).is_err())
                .unwrap_or_default();
            return Err(format!(
                "`ends.rows` lacks {missing}, an env's last frame (each env's last frame is sent)"
            ));
        }
        Ok(())
    }
}

/// Writes `next` (shape `[lanes, steps, ..]`, every element overwritten) from `obs`
/// (the same shape) one step later, and `at_ends` (`[rows.len(), ..]`) at `rows`.
/// `rows` must have passed [`Ends::check_rows`]; dtypes and shapes are checked here.
pub(crate) fn write_next(
    next: &mut Tensor,
    obs: &Tensor,
    at_ends: &Tensor,
    rows: &[u64],
    lanes: usize,
    steps: usize,
) -> Result<(), String> {
    let frames = lanes * steps;
    let feature = obs.shape().get(2..).unwrap_or_default();
    if obs.shape().get(..2) != Some(&[lanes, steps][..]) || next.shape() != obs.shape() {
        return Err(format!(
            "shape {:?} is not the batch's [{lanes}, {steps}, ..]",
            obs.shape()
        ));
    }
    if at_ends.shape().first() != Some(&rows.len()) || at_ends.shape().get(1..) != Some(feature) {
        let want: Vec<usize> = std::iter::once(rows.len()).chain(feature.iter().copied()).collect();
        return Err(format!(
            "shape {:?}, not {want:?} (a row per `ends.rows`, the observation's feature shape)",
            at_ends.shape()
        ));
    }
    macro_rules! write {
        ($($v:ident),*) => {
            match (next, obs, at_ends) {
                $((Tensor::$v(n), Tensor::$v(o), Tensor::$v(e)) => {
                    match (n.as_slice_mut(), o.as_slice(), e.as_slice()) {
                        (Some(n), Some(o), Some(e)) => {
                            fill(n, o, e, rows, frames);
                            Ok(())
                        }
                        _ => Err("a tensor not in standard layout".to_string()),
                    }
                })*
                (_, o, e) => Err(format!("dtype {}, not the observation's {}", e.dtype(), o.dtype())),
            }
        };
    }
    write!(F32, F64, I64, Bool, U8)
}

/// [`write_next`] on the elements: each env's frames up to its next listed row are
/// the observation one step later (one copy per run), a listed row its `at_ends` row.
fn fill<T: Copy>(next: &mut [T], obs: &[T], at_ends: &[T], rows: &[u64], frames: usize) {
    if frames == 0 {
        return;
    }
    let row = obs.len() / frames;
    let mut from = 0;
    for (j, &r) in rows.iter().enumerate() {
        let r = r as usize;
        // Frames `from..r` follow on within their env (no listed row between, and an
        // env's last frame is listed): `next` there is `obs` one frame on.
        if from < r {
            next[from * row..r * row].copy_from_slice(&obs[(from + 1) * row..(r + 1) * row]);
        }
        next[r * row..(r + 1) * row].copy_from_slice(&at_ends[j * row..(j + 1) * row]);
        from = r + 1;
    }
    debug_assert_eq!(from, frames, "checked: the last frame is listed");
}

/// A batch as a node of version 9 sends it: `data` without the `next.K` entries
/// `ends` holds, then `ends`. Serializes as the `batch` frame (PROTOCOL.md §3).
pub struct BatchFrame<'a> {
    /// The batch, whole.
    pub batch: &'a Batch,
    /// Its ends, if it has observations to send once.
    pub ends: Option<Ends>,
}

impl<'a> BatchFrame<'a> {
    /// `batch` with its observations sent once, where it has any.
    pub fn new(batch: &'a Batch) -> BatchFrame<'a> {
        BatchFrame {
            batch,
            ends: Ends::of(&batch.data),
        }
    }
}

/// `data` less the entries `ends` holds, in TensorDict's form.
struct DataWithout<'a> {
    data: &'a TensorDict,
    ends: Option<&'a Ends>,
}

impl Serialize for DataWithout<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let kept = |k: &str| !self.ends.is_some_and(|e| e.tensors.contains_key(k));
        let tensors: BTreeMap<&str, &Tensor> = self.data.iter().filter(|(k, _)| kept(k)).collect();
        let mut st = s.serialize_struct("TensorDict", 2)?;
        st.serialize_field("batch_size", self.data.batch_size())?;
        st.serialize_field("tensors", &tensors)?;
        st.end()
    }
}

impl Serialize for BatchFrame<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let b = self.batch;
        let mut st = s.serialize_struct("Batch", if self.ends.is_some() { 6 } else { 5 })?;
        st.serialize_field(names::TYPE, names::BATCH)?;
        st.serialize_field("node", &b.node)?;
        st.serialize_field("seq", &b.seq)?;
        st.serialize_field("weights_version", &b.weights_version)?;
        st.serialize_field(
            "data",
            &DataWithout {
                data: &b.data,
                ends: self.ends.as_ref(),
            },
        )?;
        if let Some(ends) = &self.ends {
            st.serialize_field("ends", ends)?;
        }
        st.end()
    }
}

#[cfg(test)]
#[path = "ends_tests.rs"]
pub(crate) mod tests;
