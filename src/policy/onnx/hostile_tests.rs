//! Hostile models, written here in code (tract's `pb` types, encoded with prost): each
//! is refused with an error naming the tensor or node, before tract evaluates anything,
//! and nothing panics.

use std::time::{Duration, Instant};

use prost::Message;
use tract_onnx::pb::{self, tensor_proto::DataType};
use tract_onnx::prelude::Framework;

use super::error::MAX_NAME_BYTES;
use super::guard::{guarded, MAX_PANIC_MESSAGE};
use super::*;
use crate::spec::Spec;

/// A value declared f32 `[batch, width]`.
fn value(name: &str, width: i64) -> pb::ValueInfoProto {
    use pb::tensor_shape_proto::{dimension::Value, Dimension};
    let dim = |v: Value| Dimension {
        denotation: String::new(),
        value: Some(v),
    };
    pb::ValueInfoProto {
        name: name.into(),
        r#type: Some(pb::TypeProto {
            denotation: String::new(),
            value: Some(pb::type_proto::Value::TensorType(pb::type_proto::Tensor {
                elem_type: DataType::Float as i32,
                shape: Some(pb::TensorShapeProto {
                    dim: vec![dim(Value::DimParam("batch".into())), dim(Value::DimValue(width))],
                }),
            })),
        }),
        doc_string: String::new(),
    }
}

fn tensor(name: &str, dt: DataType, dims: &[i64], raw: Vec<u8>) -> pb::TensorProto {
    pb::TensorProto {
        name: name.into(),
        data_type: dt as i32,
        dims: dims.to_vec(),
        raw_data: raw,
        ..Default::default()
    }
}

fn node(name: &str, op: &str, inputs: &[&str], outputs: &[&str]) -> pb::NodeProto {
    pb::NodeProto {
        name: name.into(),
        op_type: op.into(),
        input: inputs.iter().map(|s| s.to_string()).collect(),
        output: outputs.iter().map(|s| s.to_string()).collect(),
        ..Default::default()
    }
}

/// A `Constant` node holding `t`.
fn constant(out: &str, t: pb::TensorProto) -> pb::NodeProto {
    let mut n = node(out, "Constant", &[], &[out]);
    n.attribute.push(pb::AttributeProto {
        name: "value".into(),
        r#type: pb::attribute_proto::AttributeType::Tensor as i32,
        t: Some(t),
        ..Default::default()
    });
    n
}

fn i64s(values: &[i64]) -> Vec<u8> {
    values.iter().flat_map(|v| v.to_le_bytes()).collect()
}

/// CartPole's categorical policy, `logits = observation · W`, plus `nodes` and
/// `initializers` (which the output does not use).
fn model_with(nodes: Vec<pb::NodeProto>, initializers: Vec<pb::TensorProto>) -> pb::ModelProto {
    let w: Vec<u8> = [0.5f32, -0.5, 0.25, -0.25, 1.0, -1.0, 0.0, 0.0]
        .iter()
        .flat_map(|v| v.to_le_bytes())
        .collect();
    let mut graph = pb::GraphProto {
        name: "hostile".into(),
        node: vec![node("policy", "MatMul", &["observation", "W"], &["logits"])],
        initializer: vec![tensor("W", DataType::Float, &[4, 2], w)],
        input: vec![value("observation", 4)],
        output: vec![value("logits", 2)],
        ..Default::default()
    };
    graph.node.extend(nodes);
    graph.initializer.extend(initializers);
    pb::ModelProto {
        ir_version: 8,
        opset_import: vec![pb::OperatorSetIdProto {
            domain: String::new(),
            version: 13,
        }],
        graph: Some(graph),
        ..Default::default()
    }
}

fn cartpole() -> (Spec, Spec) {
    (
        Spec::uniform_box(4, f32::NEG_INFINITY, f32::INFINITY),
        Spec::Discrete { n: 2 },
    )
}

/// Parses and checks `bytes` against CartPole; the error, and how long it took.
fn refused(bytes: Vec<u8>) -> (OnnxError, Duration) {
    let start = Instant::now();
    let (obs, action) = cartpole();
    let result = OnnxModel::parse(bytes).and_then(|m| m.check(&obs, &action, OnnxHead::Categorical, &[]));
    (result.expect_err("a hostile model was accepted"), start.elapsed())
}

/// The ConstantOfShape model with a shape of `n` elements from an int64 initializer.
fn constant_of_shape(n: i64) -> Vec<u8> {
    model_with(
        vec![node("big", "ConstantOfShape", &["shape"], &["zeros"])],
        vec![tensor("shape", DataType::Int64, &[1], i64s(&[n]))],
    )
    .encode_to_vec()
}

#[test]
fn the_honest_base_model_and_small_constants_pass() {
    let (obs, action) = cartpole();
    let small = model_with(
        vec![
            node("zeros", "ConstantOfShape", &["shape"], &["z"]),
            constant("c", tensor("c", DataType::Int64, &[2], i64s(&[3, 4]))),
        ],
        vec![tensor("shape", DataType::Int64, &[2], i64s(&[16, 16]))],
    );
    let m = OnnxModel::parse(small.encode_to_vec()).unwrap();
    m.check(&obs, &action, OnnxHead::Categorical, &[]).unwrap();
}

#[test]
fn a_string_initializer_with_raw_data_is_refused_naming_it() {
    let bytes = model_with(vec![], vec![tensor("names", DataType::String, &[2], b"ab".to_vec())]).encode_to_vec();
    let (e, _) = refused(bytes);
    assert!(
        matches!(&e, OnnxError::Initializer { name, reason } if name == "names" && reason.contains("raw data")),
        "{e}"
    );
}

#[test]
fn tract_s_panic_on_a_string_initializer_with_raw_data_is_caught_by_the_guard() {
    // The same model handed to tract directly (past the checks): tract 0.23.9 panics
    // (`unimplemented!` in its raw tensor loading); the guard makes that an error.
    let proto = model_with(vec![], vec![tensor("names", DataType::String, &[2], b"ab".to_vec())]);
    let e = guarded("typing the model", || {
        tract_onnx::onnx()
            .model_for_proto_model(&proto)
            .map(|_| ())
            .map_err(OnnxError::tract)
    })
    .expect_err("tract accepted a string initializer with raw data");
    assert!(
        matches!(&e, OnnxError::Panicked { doing, message, .. } if doing == "typing the model" && message.len() <= MAX_PANIC_MESSAGE + 32),
        "{e}"
    );
}

#[test]
fn a_constant_of_shape_of_2_to_the_40_is_refused_naming_the_node_quickly() {
    let (e, took) = refused(constant_of_shape(1 << 40));
    assert!(
        matches!(&e, OnnxError::Node { node, op, reason } if node == "big" && op == "ConstantOfShape" && reason.contains("1099511627776")),
        "{e}"
    );
    assert!(took < Duration::from_secs(2), "{took:?}");
}

#[test]
fn a_constant_of_shape_of_2_to_the_28_is_refused_before_tract_folds_it() {
    let bytes = constant_of_shape(1 << 28);
    assert!(bytes.len() < 400, "{} bytes", bytes.len());
    // Refused by the parse itself, before any call into tract's analysis (which folded
    // it into a 1 GiB constant).
    let e = OnnxModel::parse(bytes).expect_err("parsed");
    assert!(
        matches!(&e, OnnxError::Node { node, op, .. } if node == "big" && op == "ConstantOfShape"),
        "{e}"
    );
    assert!(e.to_string().contains(&MAX_MODEL_CONSTANT_ELEMENTS.to_string()), "{e}");
}

#[test]
fn ops_making_tensors_of_constant_sizes_share_one_budget() {
    let half = (MAX_MODEL_CONSTANT_ELEMENTS / 2 + 1) as i64;
    let cases: Vec<(pb::ModelProto, &str)> = vec![
        // Two under the budget each, over it together: the second is named.
        (
            model_with(
                vec![
                    node("first", "ConstantOfShape", &["shape"], &["a"]),
                    node("second", "ConstantOfShape", &["shape"], &["b"]),
                ],
                vec![tensor("shape", DataType::Int64, &[1], i64s(&[half]))],
            ),
            "second",
        ),
        (
            model_with(
                vec![
                    constant(
                        "shape",
                        tensor("shape", DataType::Int64, &[3], i64s(&[1 << 13, 1 << 13, 1 << 13])),
                    ),
                    node("wide", "Expand", &["W", "shape"], &["e"]),
                ],
                vec![],
            ),
            "wide",
        ),
        (
            model_with(
                vec![node("tiled", "Tile", &["W", "reps"], &["t"])],
                vec![tensor("reps", DataType::Int64, &[2], i64s(&[1 << 20, 1 << 10]))],
            ),
            "tiled",
        ),
        (
            model_with(
                vec![node("count", "Range", &["start", "limit", "delta"], &["r"])],
                vec![
                    tensor("start", DataType::Int64, &[], i64s(&[0])),
                    tensor("limit", DataType::Int64, &[], i64s(&[1 << 40])),
                    tensor("delta", DataType::Int64, &[], i64s(&[1])),
                ],
            ),
            "count",
        ),
        (
            model_with(
                vec![node("still", "Range", &["start", "limit", "delta"], &["r"])],
                vec![
                    tensor("start", DataType::Int64, &[], i64s(&[0])),
                    tensor("limit", DataType::Int64, &[], i64s(&[4])),
                    tensor("delta", DataType::Int64, &[], i64s(&[0])),
                ],
            ),
            "still",
        ),
        (
            model_with(
                vec![node("padded", "Pad", &["W", "pads"], &["p"])],
                vec![tensor("pads", DataType::Int64, &[4], i64s(&[0, 0, 1 << 30, 0]))],
            ),
            "padded",
        ),
    ];
    for (model, name) in cases {
        let (e, took) = refused(model.encode_to_vec());
        assert!(
            matches!(&e, OnnxError::Node { node, .. } if node == name),
            "{name}: {e}"
        );
        assert!(took < Duration::from_secs(2), "{name}: {took:?}");
    }
}

#[test]
fn an_int64_initializer_declaring_2_to_the_40_elements_with_8_bytes_is_refused_naming_it() {
    let bytes = model_with(vec![], vec![tensor("huge", DataType::Int64, &[1 << 40], i64s(&[7]))]).encode_to_vec();
    let (e, _) = refused(bytes);
    assert!(
        matches!(&e, OnnxError::Initializer { name, reason } if name == "huge" && reason.contains("1099511627776") && reason.contains("8 bytes")),
        "{e}"
    );
    // Typed data the same: the count of values must be the count declared.
    let mut t = tensor("typed", DataType::Int64, &[3], Vec::new());
    t.int64_data = vec![1, 2];
    let (e, _) = refused(model_with(vec![], vec![t]).encode_to_vec());
    assert!(
        matches!(&e, OnnxError::Initializer { name, .. } if name == "typed"),
        "{e}"
    );
    // Negative and overflowing dims.
    for dims in [vec![-1i64], vec![1 << 26, 1 << 26, 1 << 26]] {
        let (e, _) =
            refused(model_with(vec![], vec![tensor("odd", DataType::Float, &dims, Vec::new())]).encode_to_vec());
        assert!(
            matches!(&e, OnnxError::Initializer { name, .. } if name == "odd"),
            "{dims:?}: {e}"
        );
    }
}

#[test]
fn a_file_of_many_empty_nodes_is_refused_before_it_is_decoded() {
    // 16 MB of empty nodes appended to an honest model: protobuf merges the second
    // `graph` field into the first. Written as bytes, so the test allocates no node.
    let mut bytes = model_with(vec![], vec![]).encode_to_vec();
    let empty_nodes = 8 << 20;
    let len = 2 * empty_nodes as u64;
    bytes.push(0x3a); // field 7 (graph), length-delimited
    let mut v = len;
    while v >= 0x80 {
        bytes.push((v as u8) | 0x80);
        v >>= 7;
    }
    bytes.push(v as u8);
    bytes.extend(std::iter::repeat_n([0x0au8, 0x00], empty_nodes).flatten());
    let (e, took) = refused(bytes);
    assert!(
        matches!(&e, OnnxError::Bound(m) if m.contains(&MAX_MODEL_NODES.to_string())),
        "{e}"
    );
    assert!(took < Duration::from_secs(2), "{took:?}");
}

#[test]
fn names_from_the_model_are_bounded_and_escaped_in_errors() {
    let name = format!("\u{1b}[31m{}", "n".repeat(100_000));
    let bytes = model_with(vec![], vec![tensor(&name, DataType::String, &[1], b"a".to_vec())]).encode_to_vec();
    let (e, _) = refused(bytes);
    let text = e.to_string();
    assert!(!text.contains('\u{1b}'), "{text:.80}");
    assert!(text.len() < 2 * MAX_NAME_BYTES + 200, "{} bytes", text.len());
    assert!(text.contains("(100005 bytes)"), "{text}");
}

#[test]
fn a_panic_in_tract_while_running_is_an_error_of_the_step_and_the_next_step_runs_again() {
    use crate::policy::{ActionsMut, Policy, PolicyError};
    // A second output of K x 2^24 x 2^24 f32 (2^50 bytes per row, past any address
    // space), its shape made from the observation's at run time: the checks cannot size
    // it (no constant says it), tract types it symbolically, and at run time asserts its
    // allocation succeeded: a panic inside the step.
    let mut axis = pb::AttributeProto {
        name: "axis".into(),
        r#type: pb::attribute_proto::AttributeType::Int as i32,
        ..Default::default()
    };
    axis.i = 0;
    let mut concat = node("dims", "Concat", &["k", "rest"], &["dims"]);
    concat.attribute.push(axis.clone());
    let mut gather = node("k", "Gather", &["obs_shape", "first"], &["k"]);
    gather.attribute.push(axis);
    let mut proto = model_with(
        vec![
            node("obs_shape", "Shape", &["observation"], &["obs_shape"]),
            gather,
            concat,
            node("huge", "ConstantOfShape", &["dims"], &["huge"]),
        ],
        vec![
            tensor("first", DataType::Int64, &[1], i64s(&[0])),
            tensor("rest", DataType::Int64, &[2], i64s(&[1 << 24, 1 << 24])),
        ],
    );
    if let Some(g) = proto.graph.as_mut() {
        g.output.push(pb::ValueInfoProto {
            name: "huge".into(),
            ..Default::default()
        });
    }
    let (obs, action) = cartpole();
    let model = OnnxModel::parse(proto.encode_to_vec()).unwrap();
    // Built the usual way, the trial pass meets the panic: refused where it is built.
    match OnnxPolicy::new(&model, OnnxHead::Categorical, &obs, &action, 1) {
        Err(PolicyError::Onnx(OnnxError::Panicked { .. })) => {}
        other => panic!(
            "expected the trial pass's panic as an error, got {:?}",
            other.map(|p| p.engine())
        ),
    }
    // Built without the trial pass, as a model that fails only later would be.
    let mut policy =
        OnnxPolicy::with_mode(&model, OnnxHead::Categorical, &obs, &action, 1, WeightMode::Rebuild).unwrap();
    assert_eq!(policy.engine(), OnnxEngine::Tract(WeightMode::Rebuild));
    for step in 0..2 {
        let mut actions = vec![-1i64; 2];
        let e = policy
            .act(&[0.0; 8], 2, ActionsMut::Discrete(&mut actions))
            .expect_err("a step of 2^51 bytes ran");
        assert!(
            matches!(&e, PolicyError::Onnx(OnnxError::Panicked { doing, message, .. })
                if doing == "running the model" && message.contains("failed to allocate")),
            "step {step}: {e}"
        );
    }
}
