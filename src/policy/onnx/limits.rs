//! The decoded model checked before tract evaluates anything: every constant tensor
//! holds the data its dims declare, and no op is asked to make a constant bigger than
//! the budget.
//!
//! tract folds constants while it analyses a model: a 367-byte `ConstantOfShape` of
//! 2^28 elements made the check allocate 1 GiB, one of 2^40 panicked in tract, an int64
//! initializer declaring 2^40 elements with 8 bytes of data failed naming nothing, a
//! string initializer with raw data panicked. Here, in every graph (subgraphs too):
//!
//! - each initializer and each tensor in an attribute (a `Constant`'s value): dims not
//!   negative nor over [`MAX_MODEL_BYTES`], their product in checked arithmetic, a type
//!   tract can load (no string with raw data), external data refused, and exactly the
//!   data the dims declare (raw bytes = elements × element size, or that many typed
//!   values); all of them together at most [`MAX_MODEL_BYTES`] elements;
//! - each op that makes a tensor whose size comes from its inputs or attributes
//!   (`ConstantOfShape`, `Expand`, `Tile`, `Range`, `Resize`, `Upsample`, `Pad`,
//!   `OneHot`, `RandomNormal`, `RandomUniform`), when that size is given by a constant
//!   (an initializer or a `Constant` node): the elements it would make, summed over the
//!   model, at most [`MAX_MODEL_CONSTANT_ELEMENTS`]. A size computed by other ops from
//!   constants is not evaluated here (tract's analysis may fold it).

use std::collections::HashMap;

use tract_onnx::pb::{self, tensor_proto::DataType};

use super::{OnnxError, MAX_MODEL_BYTES, MAX_MODEL_CONSTANT_ELEMENTS};

/// What the checks count across the model.
#[derive(Default)]
struct Totals {
    /// Elements of all constant tensors.
    constant_elements: usize,
    /// Elements the size-making ops would make.
    made_elements: usize,
}

/// Checks every graph of `model` (see the module docs).
pub(super) fn check_model(model: &pb::ModelProto) -> Result<(), OnnxError> {
    let mut totals = Totals::default();
    if let Some(graph) = &model.graph {
        check_graph(graph, &HashMap::new(), &mut totals)?;
    }
    Ok(())
}

/// A node's name for errors: its own, else its first output's.
pub(super) fn node_name(node: &pb::NodeProto) -> &str {
    if node.name.is_empty() {
        node.output.first().map(String::as_str).unwrap_or("")
    } else {
        &node.name
    }
}

/// A constant known before the analysis.
#[derive(Clone, Copy)]
enum Const<'a> {
    /// A tensor (an initializer, or a `Constant`'s `value`).
    Tensor(&'a pb::TensorProto),
    /// A `Constant`'s `value_int` or `value_ints` (`value_float(s)` as floats).
    Ints(&'a [i64]),
    /// A `Constant`'s `value_float` or `value_floats`.
    Floats(&'a [f32]),
}

fn check_graph<'a>(
    graph: &'a pb::GraphProto,
    outer: &HashMap<&'a str, Const<'a>>,
    totals: &mut Totals,
) -> Result<(), OnnxError> {
    let mut consts = outer.clone();
    for init in &graph.initializer {
        check_tensor(init, &init.name, totals)?;
        consts.insert(&init.name, Const::Tensor(init));
    }
    if let Some(s) = graph.sparse_initializer.first() {
        let name = s.values.as_ref().map(|v| v.name.as_str()).unwrap_or("");
        return Err(OnnxError::initializer(name, "a sparse initializer (not supported)"));
    }
    for node in &graph.node {
        for attr in &node.attribute {
            let at = |what: &str| format!("{}, attribute `{}`{what}", node_name(node), attr.name);
            if let Some(t) = &attr.t {
                check_tensor(t, &at(""), totals)?;
            }
            for (i, t) in attr.tensors.iter().enumerate() {
                check_tensor(t, &at(&format!("[{i}]")), totals)?;
            }
            if attr.sparse_tensor.is_some() || !attr.sparse_tensors.is_empty() {
                return Err(OnnxError::node(
                    node_name(node),
                    &node.op_type,
                    "a sparse tensor attribute (not supported)",
                ));
            }
        }
        if node.op_type == "Constant" && node.domain.is_empty() {
            if let (Some(out), Some(c)) = (node.output.first(), constant_value(node)) {
                consts.insert(out, c);
            }
        }
        check_made_elements(node, &consts, totals)?;
        for attr in &node.attribute {
            for g in attr.g.iter().chain(&attr.graphs) {
                check_graph(g, &consts, totals)?;
            }
        }
    }
    Ok(())
}

/// The value of a `Constant` node, by whichever attribute holds it.
fn constant_value(node: &pb::NodeProto) -> Option<Const<'_>> {
    node.attribute.iter().find_map(|a| match a.name.as_str() {
        "value" => a.t.as_ref().map(Const::Tensor),
        "value_int" => Some(Const::Ints(std::slice::from_ref(&a.i))),
        "value_ints" => Some(Const::Ints(&a.ints)),
        "value_float" => Some(Const::Floats(std::slice::from_ref(&a.f))),
        "value_floats" => Some(Const::Floats(&a.floats)),
        _ => None,
    })
}

/// Where tract reads a tensor's typed values from, for each type it loads, and the size
/// of one element in raw data.
enum Typed {
    Int32,
    Int64,
    Float,
    Double,
    Strings,
}

fn layout(dt: DataType) -> Option<(Typed, usize)> {
    Some(match dt {
        DataType::Bool | DataType::Uint8 | DataType::Int8 => (Typed::Int32, 1),
        DataType::Uint16 | DataType::Int16 | DataType::Float16 => (Typed::Int32, 2),
        DataType::Uint32 | DataType::Int32 => (Typed::Int32, 4),
        DataType::Uint64 | DataType::Int64 => (Typed::Int64, 8),
        DataType::Float => (Typed::Float, 4),
        DataType::Double => (Typed::Double, 8),
        DataType::String => (Typed::Strings, 0),
        _ => return None,
    })
}

/// The elements `dims` declare, each dim checked not negative, their product in checked
/// arithmetic.
fn elements(dims: &[i64], bad: impl Fn(String) -> OnnxError) -> Result<usize, OnnxError> {
    let mut n = 1usize;
    for &d in dims {
        let d = usize::try_from(d).map_err(|_| bad(format!("negative dimension {d} in {dims:?}")))?;
        n = n
            .checked_mul(d)
            .ok_or_else(|| bad(format!("dims {dims:?} overflow the element count")))?;
    }
    Ok(n)
}

/// No dim over [`MAX_MODEL_BYTES`] (checked once the data matched, for tensors of no
/// element with an absurd dim).
fn no_absurd_dim(dims: &[i64], bad: impl Fn(String) -> OnnxError) -> Result<(), OnnxError> {
    match dims.iter().find(|&&d| d > MAX_MODEL_BYTES as i64) {
        Some(d) => Err(bad(format!("dimension {d} in {dims:?} is over {MAX_MODEL_BYTES}"))),
        None => Ok(()),
    }
}

/// A constant tensor holds exactly the data its dims declare, of a type tract loads.
fn check_tensor(t: &pb::TensorProto, name: &str, totals: &mut Totals) -> Result<(), OnnxError> {
    let bad = |reason: String| OnnxError::initializer(name, reason);
    if t.data_location == Some(pb::tensor_proto::DataLocation::External as i32) || !t.external_data.is_empty() {
        return Err(bad("stored in an external file; export it inside the model".into()));
    }
    let dt = DataType::try_from(t.data_type).map_err(|_| bad(format!("unknown data type {}", t.data_type)))?;
    let (typed, size) = layout(dt).ok_or_else(|| bad(format!("data type {} is not supported", dt.as_str_name())))?;
    let n = elements(&t.dims, bad)?;
    check_data(t, dt, typed, size, n, bad)?;
    no_absurd_dim(&t.dims, bad)?;
    totals.constant_elements = totals.constant_elements.saturating_add(n);
    if totals.constant_elements > MAX_MODEL_BYTES {
        return Err(bad(format!(
            "{n} elements take the model's constants over {MAX_MODEL_BYTES} elements in all"
        )));
    }
    Ok(())
}

/// The tensor holds exactly the `n` elements its dims declare.
fn check_data(
    t: &pb::TensorProto,
    dt: DataType,
    typed: Typed,
    size: usize,
    n: usize,
    bad: impl Fn(String) -> OnnxError,
) -> Result<(), OnnxError> {
    if !t.raw_data.is_empty() {
        if matches!(typed, Typed::Strings) {
            return Err(bad("a STRING tensor with raw data (strings are not raw bytes)".into()));
        }
        let want = n
            .checked_mul(size)
            .ok_or_else(|| bad(format!("dims {:?} overflow the byte count", t.dims)))?;
        if t.raw_data.len() != want {
            return Err(bad(format!(
                "dims {:?} declare {n} {} elements ({want} bytes), the raw data holds {} bytes",
                t.dims,
                dt.as_str_name(),
                t.raw_data.len()
            )));
        }
        return Ok(());
    }
    let (field, held) = match typed {
        Typed::Int32 => ("int32_data", t.int32_data.len()),
        Typed::Int64 => ("int64_data", t.int64_data.len()),
        Typed::Float => ("float_data", t.float_data.len()),
        Typed::Double => ("double_data", t.double_data.len()),
        Typed::Strings => ("string_data", t.string_data.len()),
    };
    if held != n {
        return Err(bad(format!(
            "dims {:?} declare {n} {} elements, {field} holds {held}",
            t.dims,
            dt.as_str_name()
        )));
    }
    Ok(())
}

/// A constant's values as integers (integer tensors and `value_int(s)`), if it has any.
fn ints(c: Const<'_>) -> Option<Vec<i64>> {
    match c {
        Const::Ints(v) => Some(v.to_vec()),
        Const::Floats(_) => None,
        Const::Tensor(t) => {
            let dt = DataType::try_from(t.data_type).ok()?;
            let raw = &t.raw_data;
            match dt {
                DataType::Int64 if raw.is_empty() => Some(t.int64_data.clone()),
                DataType::Int64 => Some(
                    raw.chunks_exact(8)
                        .map(|c| i64::from_le_bytes([c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]]))
                        .collect(),
                ),
                DataType::Int32 if raw.is_empty() => Some(t.int32_data.iter().map(|&v| i64::from(v)).collect()),
                DataType::Int32 => Some(
                    raw.chunks_exact(4)
                        .map(|c| i64::from(i32::from_le_bytes([c[0], c[1], c[2], c[3]])))
                        .collect(),
                ),
                _ => None,
            }
        }
    }
}

/// A constant's values as floats (any numeric tensor), if it has any.
fn floats(c: Const<'_>) -> Option<Vec<f64>> {
    match c {
        Const::Floats(v) => Some(v.iter().map(|&x| f64::from(x)).collect()),
        Const::Ints(v) => Some(v.iter().map(|&x| x as f64).collect()),
        Const::Tensor(t) => {
            let dt = DataType::try_from(t.data_type).ok()?;
            let raw = &t.raw_data;
            match dt {
                DataType::Float if raw.is_empty() => Some(t.float_data.iter().map(|&x| f64::from(x)).collect()),
                DataType::Float => Some(
                    raw.chunks_exact(4)
                        .map(|c| f64::from(f32::from_le_bytes([c[0], c[1], c[2], c[3]])))
                        .collect(),
                ),
                DataType::Double if raw.is_empty() => Some(t.double_data.clone()),
                DataType::Double => Some(
                    raw.chunks_exact(8)
                        .map(|c| f64::from_le_bytes([c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]]))
                        .collect(),
                ),
                _ => ints(c).map(|v| v.into_iter().map(|x| x as f64).collect()),
            }
        }
    }
}

/// A constant's declared dims (a `value_ints` is one-dimensional).
fn dims(c: Const<'_>) -> Vec<i64> {
    match c {
        Const::Tensor(t) => t.dims.clone(),
        Const::Ints(v) => vec![v.len() as i64],
        Const::Floats(v) => vec![v.len() as i64],
    }
}

/// Checks the elements an op whose output size comes from constants would make.
fn check_made_elements(
    node: &pb::NodeProto,
    consts: &HashMap<&str, Const<'_>>,
    totals: &mut Totals,
) -> Result<(), OnnxError> {
    if !node.domain.is_empty() && node.domain != "ai.onnx" {
        return Ok(());
    }
    let name = node_name(node);
    let op = node.op_type.as_str();
    let bad = |reason: String| OnnxError::node(name, op, reason);
    let input = |i: usize| {
        node.input
            .get(i)
            .filter(|n| !n.is_empty())
            .and_then(|n| consts.get(n.as_str()).copied())
    };
    let attr = |n: &str| node.attribute.iter().find(|a| a.name == n);
    // The dims of input `i` when it is a constant.
    let const_dims = |i: usize| input(i).map(dims);
    // The elements of a shape given as values.
    let product = |shape: &[i64], what: &str| -> Result<usize, OnnxError> {
        let mut n = 1usize;
        for &d in shape {
            let d = usize::try_from(d).map_err(|_| bad(format!("{what} {shape:?} holds {d}")))?;
            n = n
                .checked_mul(d)
                .ok_or_else(|| bad(format!("{what} {shape:?} overflows")))?;
        }
        Ok(n)
    };
    let numel = |i: usize| -> Result<usize, OnnxError> {
        match const_dims(i) {
            Some(d) => product(&d, "the input's dims"),
            None => Ok(1),
        }
    };
    let made: usize = match op {
        "ConstantOfShape" => match input(0).and_then(ints) {
            Some(shape) => product(&shape, "the shape")?,
            None => 0,
        },
        "Expand" => match input(1).and_then(ints) {
            Some(shape) => {
                let x = const_dims(0).unwrap_or_default();
                let rank = shape.len().max(x.len());
                let at = |v: &[i64], i: usize| -> i64 {
                    (i + v.len())
                        .checked_sub(rank)
                        .and_then(|j| v.get(j).copied())
                        .unwrap_or(1)
                };
                let out: Vec<i64> = (0..rank).map(|i| at(&shape, i).max(at(&x, i))).collect();
                if shape.iter().any(|&d| d < 0) {
                    return Err(bad(format!("the shape {shape:?} holds a negative dimension")));
                }
                product(&out, "the expanded shape")?
            }
            None => 0,
        },
        "Tile" => match input(1).and_then(ints) {
            Some(reps) => product(&reps, "the repeats")?
                .checked_mul(numel(0)?)
                .ok_or_else(|| bad("the tiled size overflows".into()))?,
            None => 0,
        },
        "Range" => match (
            input(0).and_then(floats),
            input(1).and_then(floats),
            input(2).and_then(floats),
        ) {
            (Some(start), Some(limit), Some(delta)) => {
                let (Some(&start), Some(&limit), Some(&delta)) = (start.first(), limit.first(), delta.first()) else {
                    return Err(bad("start, limit and delta must be scalars".into()));
                };
                if delta == 0.0 || !delta.is_finite() || !start.is_finite() || !limit.is_finite() {
                    return Err(bad(format!("start {start}, limit {limit}, delta {delta}")));
                }
                let n = ((limit - start) / delta).ceil().max(0.0);
                if n > MAX_MODEL_CONSTANT_ELEMENTS as f64 {
                    return Err(bad(format!(
                        "makes {n} elements, over the budget of {MAX_MODEL_CONSTANT_ELEMENTS}"
                    )));
                }
                n as usize
            }
            _ => 0,
        },
        "Resize" | "Upsample" => {
            let sizes = if op == "Resize" { input(3).and_then(ints) } else { None };
            let scales_at = if op == "Resize" && node.input.len() >= 3 { 2 } else { 1 };
            let scales = input(scales_at)
                .and_then(floats)
                .or_else(|| attr("scales").map(|a| a.floats.iter().map(|&x| f64::from(x)).collect()));
            match (sizes, scales) {
                (Some(sizes), _) if !sizes.is_empty() => product(&sizes, "the sizes")?,
                (_, Some(scales)) if !scales.is_empty() => {
                    let mut n = numel(0)? as f64;
                    for &s in &scales {
                        if !s.is_finite() || s < 0.0 {
                            return Err(bad(format!("the scales {scales:?} hold {s}")));
                        }
                        n *= s.max(1.0);
                    }
                    if n > MAX_MODEL_CONSTANT_ELEMENTS as f64 {
                        return Err(bad(format!(
                            "scales {scales:?} make over {MAX_MODEL_CONSTANT_ELEMENTS} elements"
                        )));
                    }
                    n as usize
                }
                _ => 0,
            }
        }
        "Pad" => {
            let pads = input(1).and_then(ints).or_else(|| attr("pads").map(|a| a.ints.clone()));
            match pads {
                Some(pads) => {
                    let limit = MAX_MODEL_CONSTANT_ELEMENTS as i64;
                    if let Some(p) = pads.iter().find(|p| !(-limit..=limit).contains(*p)) {
                        return Err(bad(format!("pads {pads:?} hold {p}")));
                    }
                    match const_dims(0) {
                        Some(x) if pads.len() == 2 * x.len() => {
                            let out: Vec<i64> = x
                                .iter()
                                .enumerate()
                                .map(|(i, &d)| d.saturating_add(pads[i]).saturating_add(pads[i + x.len()]).max(0))
                                .collect();
                            product(&out, "the padded shape")?
                        }
                        _ => 0,
                    }
                }
                None => 0,
            }
        }
        "OneHot" => match input(1).and_then(ints).and_then(|d| d.first().copied()) {
            Some(depth) => product(&[depth], "the depth")?
                .checked_mul(numel(0)?)
                .ok_or_else(|| bad("the one-hot size overflows".into()))?,
            None => 0,
        },
        "RandomNormal" | "RandomUniform" => match attr("shape") {
            Some(a) => product(&a.ints, "the shape")?,
            None => 0,
        },
        _ => 0,
    };
    totals.made_elements = totals.made_elements.saturating_add(made);
    if totals.made_elements > MAX_MODEL_CONSTANT_ELEMENTS {
        return Err(bad(format!(
            "makes {made} elements, over the budget of {MAX_MODEL_CONSTANT_ELEMENTS} for all such ops"
        )));
    }
    Ok(())
}
