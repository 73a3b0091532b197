//! Dtype-tagged tensors over ndarray and the `TensorDict` that carries a batch.
//!
//! A [`Tensor`] is one of a few concrete element types so that batches can be
//! typed, checked and encoded without generics leaking into messages. A
//! [`TensorDict`] maps dotted paths (`next.observation`) to tensors that all
//! share a leading batch shape.
//!
//! On the wire (and in `--output` files) a tensor is a map
//! `{dtype, shape, data}` where `data` is one little-endian, C-order byte blob.
//!
//! One file per concept: [`DType`] (dtype.rs), [`TensorError`] (error.rs), the
//! tensor and its shape operations (ops.rs), the storage a pool recycles
//! (storage.rs), the byte codec (codec.rs) and [`TensorDict`] (dict.rs).

mod codec;
mod dict;
mod dtype;
mod error;
mod ops;
mod storage;

pub use dict::TensorDict;
pub use dtype::DType;
pub use error::TensorError;
pub(crate) use ops::max_i64;
pub use ops::Tensor;
pub(crate) use storage::Elements;
