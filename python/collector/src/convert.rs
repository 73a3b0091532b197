//! Tensors to NumPy and back. A batch's tensors are *moved* into NumPy arrays:
//! `PyArray::from_owned_array` makes the array's base an object holding the Rust
//! buffer, so the array views the memory the nodes collected into (no copy) and
//! keeps it alive however long Python holds it. Weights go the other way with one
//! copy, into buffers the trainer owns and shares with every node.

use std::collections::BTreeMap;

use ndarray::ArrayD;
use numpy::{Element, PyArray, PyReadonlyArrayDyn, PyUntypedArrayMethods};
use pyo3::exceptions::PyTypeError;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList};
use rollout::{Tensor, Weights};
use rollout_actors::Collected;

/// The NumPy array owning `a`'s buffer, and the buffer's address.
fn owned<T: Element>(py: Python<'_>, a: ArrayD<T>) -> (PyObject, usize) {
    let address = a.as_ptr() as usize;
    (PyArray::from_owned_array(py, a).into_any().unbind(), address)
}

/// The array for a tensor, and the address of the Rust buffer it views.
pub(crate) fn tensor_to_py(py: Python<'_>, t: Tensor) -> (PyObject, usize) {
    match t {
        Tensor::F32(a) => owned(py, a),
        Tensor::F64(a) => owned(py, a),
        Tensor::I64(a) => owned(py, a),
        Tensor::Bool(a) => owned(py, a),
        Tensor::U8(a) => owned(py, a),
    }
}

/// A batch as a dict: `index`, `node`, `weights_version`, `weights_versions`,
/// `batch_size`, `data` (dotted key to array) and `addresses` (dotted key to the
/// Rust buffer's address, which the tests compare with the arrays' data pointers).
pub(crate) fn batch_to_py(py: Python<'_>, c: Collected) -> PyResult<PyObject> {
    let out = PyDict::new(py);
    out.set_item("index", c.index)?;
    out.set_item("node", c.node)?;
    out.set_item("weights_version", c.weights_version)?;
    out.set_item("weights_versions", PyList::new(py, &c.weights_versions)?)?;
    out.set_item("batch_size", PyList::new(py, c.data.batch_size())?)?;
    let data = PyDict::new(py);
    let addresses = PyDict::new(py);
    for (key, tensor) in c.data.into_entries() {
        let (array, address) = tensor_to_py(py, tensor);
        data.set_item(&key, array)?;
        addresses.set_item(&key, address)?;
    }
    out.set_item("data", data)?;
    out.set_item("addresses", addresses)?;
    Ok(out.into_any().unbind())
}

/// Reads one array of a supported dtype into a tensor (one copy).
fn array_to_tensor(name: &str, value: &Bound<'_, PyAny>) -> PyResult<Tensor> {
    fn take<T: Element + Clone>(a: PyReadonlyArrayDyn<'_, T>) -> ArrayD<T> {
        a.as_array().to_owned()
    }
    if let Ok(a) = value.extract::<PyReadonlyArrayDyn<'_, f32>>() {
        return Ok(Tensor::F32(take(a)));
    }
    if let Ok(a) = value.extract::<PyReadonlyArrayDyn<'_, f64>>() {
        return Ok(Tensor::F64(take(a)));
    }
    if let Ok(a) = value.extract::<PyReadonlyArrayDyn<'_, i64>>() {
        return Ok(Tensor::I64(take(a)));
    }
    if let Ok(a) = value.extract::<PyReadonlyArrayDyn<'_, bool>>() {
        return Ok(Tensor::Bool(take(a)));
    }
    if let Ok(a) = value.extract::<PyReadonlyArrayDyn<'_, u8>>() {
        return Ok(Tensor::U8(take(a)));
    }
    let dtype = match value.downcast::<numpy::PyUntypedArray>() {
        Ok(a) => a.dtype().to_string(),
        Err(_) => value.get_type().name()?.to_string(),
    };
    Err(PyTypeError::new_err(format!(
        "weight {name:?}: expected a NumPy array of float32, float64, int64, bool or uint8, got {dtype}"
    )))
}

/// Weights from a dict of names to NumPy arrays (version 0: the trainer numbers them).
pub(crate) fn weights_from_py(weights: &Bound<'_, PyDict>) -> PyResult<Weights> {
    let mut tensors = BTreeMap::new();
    for (name, value) in weights.iter() {
        let name: String = name
            .extract()
            .map_err(|_| PyTypeError::new_err("weight names must be strings"))?;
        let tensor = array_to_tensor(&name, &value)?;
        tensors.insert(name, tensor);
    }
    Ok(Weights::new(tensors))
}
