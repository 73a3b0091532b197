//! Weights from NumPy: one copy, into buffers the trainer owns and shares with every
//! node. (Batches go the other way without a copy: `storage`.)

use std::collections::BTreeMap;

use ndarray::ArrayD;
use numpy::{Element, PyReadonlyArrayDyn, PyUntypedArrayMethods};
use pyo3::exceptions::PyTypeError;
use pyo3::prelude::*;
use pyo3::types::PyDict;
use rollout::{Tensor, Weights};

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
