//! A batch's storage while Python holds it, and its way back to the run.
//!
//! The NumPy arrays of a batch *view* the tensors the run collected into (no copy):
//! each array's base is the batch's [`BatchStorage`], which keeps those tensors
//! unchanged and in place. Python frees the storage when the last array viewing it
//! is gone (and every torch tensor made from one with `torch.from_numpy`, which
//! holds its array), and its drop hands the tensors back to the run, as
//! [`rollout_actors::DistributedCollector::recycle`] does for a Rust learner: the
//! node (or the trainer, for a stacked sync round) collects a later batch into the
//! same memory instead of fresh pages.

use ndarray::ArrayD;
use numpy::{Element, PyArray};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList};
use rollout::machine::Collected;
use rollout::{Tensor, TensorDict};
use rollout_actors::CollectorHandle;

/// The tensors of one batch, owned here until Python lets go of every array
/// viewing them (see the module's doc).
#[pyclass(module = "rollout._native", frozen)]
pub(crate) struct BatchStorage {
    /// The batch; its tensors are neither changed nor moved while this lives
    /// (arrays view them), only taken in `drop`.
    batch: Collected,
    /// Where the storage goes back to (`None`: it is freed).
    handle: Option<CollectorHandle>,
}

impl Drop for BatchStorage {
    fn drop(&mut self) {
        if let Some(handle) = &self.handle {
            // Nothing views the tensors any more: Python frees this object only then.
            let data = std::mem::replace(&mut self.batch.data, TensorDict::new(&[]));
            handle.recycle(Collected {
                index: self.batch.index,
                node: self.batch.node,
                weights_version: self.batch.weights_version,
                weights_versions: std::mem::take(&mut self.batch.weights_versions),
                policy_lag: self.batch.policy_lag,
                lagging: self.batch.lagging,
                data,
            });
        }
    }
}

/// An array viewing `a`, kept alive (with `a`) by `storage`.
fn view<'py, T: Element>(a: &ArrayD<T>, storage: &Bound<'py, BatchStorage>) -> Bound<'py, PyAny> {
    // SAFETY: `a` is a tensor of the batch `storage` owns, which is never changed or
    // moved before `storage` is dropped; the array holds a reference to `storage`
    // (its base), so `storage` outlives it.
    unsafe { PyArray::borrow_from_array(a, storage.clone().into_any()) }.into_any()
}

/// The array for a tensor of `storage`'s batch, and the address of the buffer it views.
fn tensor_view<'py>(t: &Tensor, storage: &Bound<'py, BatchStorage>) -> (Bound<'py, PyAny>, usize) {
    match t {
        Tensor::F32(a) => (view(a, storage), a.as_ptr() as usize),
        Tensor::F64(a) => (view(a, storage), a.as_ptr() as usize),
        Tensor::I64(a) => (view(a, storage), a.as_ptr() as usize),
        Tensor::Bool(a) => (view(a, storage), a.as_ptr() as usize),
        Tensor::U8(a) => (view(a, storage), a.as_ptr() as usize),
    }
}

/// A batch as a dict: `index`, `node`, `weights_version`, `weights_versions`,
/// `policy_lag`, `lagging`, `batch_size`, `data` (dotted key to an array viewing the batch's storage) and
/// `addresses` (dotted key to the address of the buffer the run collected into,
/// which the tests compare with the arrays' data pointers and across batches). With
/// `handle`, the storage goes back to the run once Python frees it.
pub(crate) fn batch_to_py(py: Python<'_>, batch: Collected, handle: Option<CollectorHandle>) -> PyResult<PyObject> {
    let out = PyDict::new(py);
    out.set_item("index", batch.index)?;
    out.set_item("node", batch.node)?;
    out.set_item("weights_version", batch.weights_version)?;
    out.set_item("weights_versions", PyList::new(py, &batch.weights_versions)?)?;
    out.set_item("policy_lag", batch.policy_lag)?;
    out.set_item("lagging", batch.lagging)?;
    out.set_item("batch_size", PyList::new(py, batch.data.batch_size())?)?;
    let storage = Bound::new(py, BatchStorage { batch, handle })?;
    let data = PyDict::new(py);
    let addresses = PyDict::new(py);
    for (key, tensor) in storage.get().batch.data.iter() {
        let (array, address) = tensor_view(tensor, &storage);
        data.set_item(key, array)?;
        addresses.set_item(key, address)?;
    }
    out.set_item("data", data)?;
    out.set_item("addresses", addresses)?;
    Ok(out.into_any().unbind())
}
