//! Frames written in parts: their own bytes (prefix, MessagePack headers, small
//! values), then each large tensor straight from its memory, never copied into a frame.
//!
//! The memory stays valid and unchanged because every part holds an `Arc` of what
//! owns the tensors (nobody writes through a shared `Arc`).

use std::sync::Arc;

use bytes::Bytes;
use rollout::policy::Weights;
use rollout::wire::FramePart;
use rollout::Tensor;

/// What owns the tensors a frame's parts point into.
pub(crate) trait TensorHolder: Send + Sync + 'static {
    /// The tensor named `key`, if any.
    fn tensor(&self, key: &str) -> Option<&Tensor>;
}

impl TensorHolder for Weights {
    fn tensor(&self, key: &str) -> Option<&Tensor> {
        self.tensors.get(key)
    }
}

/// The tensors whose memory already is their encoding: their names, and those bytes
/// (the `blobs` of [`rollout::wire::encode_parts`], in the same order).
pub(crate) fn blobs<'a>(tensors: impl Iterator<Item = (&'a str, &'a Tensor)>) -> (Vec<String>, Vec<&'a [u8]>) {
    tensors
        .filter_map(|(k, t)| t.le_bytes_in_place().map(|b| (k.to_string(), b)))
        .unzip()
}

/// The parts of [`rollout::wire::encode_parts`] as bytes to write: its own bytes as
/// they are, blob `i` as the memory of tensor `keys[i]` of `holder`.
pub(crate) fn to_bytes<H: TensorHolder>(parts: Vec<FramePart>, keys: &[String], holder: &Arc<H>) -> Vec<Bytes> {
    parts
        .into_iter()
        .map(|p| match p {
            FramePart::Own(bytes) => Bytes::from(bytes),
            FramePart::Blob(i) => Bytes::from_owner(TensorBytes {
                holder: Arc::clone(holder),
                key: keys[i].clone(),
            }),
        })
        .collect()
}

/// One tensor's memory as bytes, kept alive by its holder.
struct TensorBytes<H> {
    holder: Arc<H>,
    key: String,
}

impl<H: TensorHolder> AsRef<[u8]> for TensorBytes<H> {
    fn as_ref(&self) -> &[u8] {
        self.holder
            .tensor(&self.key)
            .and_then(Tensor::le_bytes_in_place)
            .unwrap_or_default()
    }
}
