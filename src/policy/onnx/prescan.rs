//! The model's protobuf walked before it is decoded: how many nodes it holds and what
//! decoding it would allocate, refused over [`MAX_MODEL_NODES`] nodes or over
//! [`max_decoded_bytes`] (twice the file plus [`DECODE_OVERHEAD_BYTES`]).
//!
//! prost decodes a message into structs far bigger than its bytes: an empty `NodeProto`
//! is 2 bytes in the file and over 200 in memory (a 16 MB file of empty nodes took
//! 1.3 GiB), a packed int64 of one byte is 8. This walk reads only tags and lengths,
//! follows the fields of the ONNX messages tract's `pb` decodes (unknown fields are
//! skipped by prost as here, at no cost), and sums a bound on what each would take
//! decoded: every message the size of its struct twice over (a `Vec`'s spare capacity),
//! every string or bytes its length plus two `Vec` headers, every packed varint the
//! size of its element twice over, every packed float its bytes.

use std::mem::size_of;

use tract_onnx::pb;

use super::{OnnxError, DECODE_OVERHEAD_BYTES, MAX_MODEL_NODES};

/// The deepest nesting of messages walked (prost's own limit is 100).
const MAX_DEPTH: usize = 100;

/// The most bytes decoding a file of `file_len` bytes may allocate.
pub(super) fn max_decoded_bytes(file_len: usize) -> usize {
    file_len.saturating_mul(2).saturating_add(DECODE_OVERHEAD_BYTES)
}

/// The messages of `onnx.proto` that tract's `pb` decodes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Msg {
    Model,
    Graph,
    Node,
    Attribute,
    Tensor,
    Segment,
    Sparse,
    ValueInfo,
    Type,
    TypeTensor,
    Shape,
    Dim,
    Entry,
    Annotation,
    Training,
    Function,
    Opset,
}

/// What a field holds, as decoding it allocates.
#[derive(Clone, Copy, Debug)]
enum Field {
    /// A nested message.
    Msg(Msg),
    /// A string or bytes.
    Bytes,
    /// A varint (packed when length-delimited), decoded to this many bytes each.
    Varint(usize),
    /// A fixed-size number (packed when length-delimited), decoded to its own size.
    Fixed,
}

impl Msg {
    /// The size of its decoded struct.
    fn size(self) -> usize {
        match self {
            Msg::Model => size_of::<pb::ModelProto>(),
            Msg::Graph => size_of::<pb::GraphProto>(),
            Msg::Node => size_of::<pb::NodeProto>(),
            Msg::Attribute => size_of::<pb::AttributeProto>(),
            Msg::Tensor => size_of::<pb::TensorProto>(),
            Msg::Segment => size_of::<pb::tensor_proto::Segment>(),
            Msg::Sparse => size_of::<pb::SparseTensorProto>(),
            Msg::ValueInfo => size_of::<pb::ValueInfoProto>(),
            Msg::Type => size_of::<pb::TypeProto>(),
            Msg::TypeTensor => size_of::<pb::type_proto::Tensor>(),
            Msg::Shape => size_of::<pb::TensorShapeProto>(),
            Msg::Dim => size_of::<pb::tensor_shape_proto::Dimension>(),
            Msg::Entry => size_of::<pb::StringStringEntryProto>(),
            Msg::Annotation => size_of::<pb::TensorAnnotation>(),
            Msg::Training => size_of::<pb::TrainingInfoProto>(),
            Msg::Function => size_of::<pb::FunctionProto>(),
            Msg::Opset => size_of::<pb::OperatorSetIdProto>(),
        }
    }

    /// Field `tag` of this message, as tract's `pb` declares it (`None`: not declared,
    /// skipped by prost without allocating).
    fn field(self, tag: u64) -> Option<Field> {
        use Field::{Bytes, Fixed, Msg as M, Varint};
        Some(match (self, tag) {
            (Msg::Model, 1 | 5) => Varint(8),
            (Msg::Model, 2 | 3 | 4 | 6) => Bytes,
            (Msg::Model, 7) => M(Msg::Graph),
            (Msg::Model, 8) => M(Msg::Opset),
            (Msg::Model, 14) => M(Msg::Entry),
            (Msg::Model, 20) => M(Msg::Training),
            (Msg::Model, 25) => M(Msg::Function),
            (Msg::Graph, 1) => M(Msg::Node),
            (Msg::Graph, 2 | 10) => Bytes,
            (Msg::Graph, 5) => M(Msg::Tensor),
            (Msg::Graph, 15) => M(Msg::Sparse),
            (Msg::Graph, 11..=13) => M(Msg::ValueInfo),
            (Msg::Graph, 14) => M(Msg::Annotation),
            (Msg::Node, 1..=4 | 6 | 7) => Bytes,
            (Msg::Node, 5) => M(Msg::Attribute),
            (Msg::Attribute, 1 | 4 | 9 | 13 | 21) => Bytes,
            (Msg::Attribute, 2 | 7) => Fixed,
            (Msg::Attribute, 3 | 8 | 20) => Varint(8),
            (Msg::Attribute, 5 | 10) => M(Msg::Tensor),
            (Msg::Attribute, 6 | 11) => M(Msg::Graph),
            (Msg::Attribute, 22 | 23) => M(Msg::Sparse),
            (Msg::Attribute, 15) => M(Msg::Type),
            (Msg::Tensor, 1 | 7 | 11 | 14) => Varint(8),
            (Msg::Tensor, 2 | 5) => Varint(4),
            (Msg::Tensor, 3) => M(Msg::Segment),
            (Msg::Tensor, 4 | 10) => Fixed,
            (Msg::Tensor, 6 | 8 | 9 | 12) => Bytes,
            (Msg::Tensor, 13) => M(Msg::Entry),
            (Msg::Segment, 1 | 2) => Varint(8),
            (Msg::Sparse, 1 | 2) => M(Msg::Tensor),
            (Msg::Sparse, 3) => Varint(8),
            (Msg::ValueInfo, 1 | 3) => Bytes,
            (Msg::ValueInfo, 2) => M(Msg::Type),
            (Msg::Type, 6) => Bytes,
            (Msg::Type, 1) => M(Msg::TypeTensor),
            (Msg::TypeTensor, 1) => Varint(4),
            (Msg::TypeTensor, 2) => M(Msg::Shape),
            (Msg::Shape, 1) => M(Msg::Dim),
            (Msg::Dim, 1) => Varint(8),
            (Msg::Dim, 2 | 3) => Bytes,
            (Msg::Entry, 1 | 2) => Bytes,
            (Msg::Annotation, 1) => Bytes,
            (Msg::Annotation, 2) => M(Msg::Entry),
            (Msg::Training, 1 | 2) => M(Msg::Graph),
            (Msg::Training, 3 | 4) => M(Msg::Entry),
            (Msg::Function, 1 | 4 | 5 | 6 | 8 | 10) => Bytes,
            (Msg::Function, 7) => M(Msg::Node),
            (Msg::Function, 9) => M(Msg::Opset),
            (Msg::Opset, 1) => Bytes,
            (Msg::Opset, 2) => Varint(8),
            _ => return None,
        })
    }
}

/// What the walk found.
#[derive(Debug, Default, PartialEq, Eq)]
pub(super) struct Scan {
    /// Nodes anywhere (the graph, subgraphs in attributes, functions).
    pub(super) nodes: usize,
    /// A bound on the bytes decoding allocates.
    pub(super) decoded_bytes: usize,
}

/// Walks `bytes` as a `ModelProto`; refuses a model over [`MAX_MODEL_NODES`] nodes or
/// whose decoding could allocate over [`max_decoded_bytes`]; a malformed protobuf is
/// [`OnnxError::NotOnnx`]. Reads each byte once, allocates nothing.
pub(super) fn prescan(bytes: &[u8]) -> Result<Scan, OnnxError> {
    let mut scan = Scan {
        nodes: 0,
        decoded_bytes: Msg::Model.size(),
    };
    let budget = max_decoded_bytes(bytes.len());
    walk(bytes, Msg::Model, 0, &mut scan, budget)?;
    Ok(scan)
}

/// Adds `n` to the decoded bound, refusing past the budget.
fn charge(scan: &mut Scan, n: usize, budget: usize) -> Result<(), OnnxError> {
    scan.decoded_bytes = scan.decoded_bytes.saturating_add(n);
    if scan.decoded_bytes > budget {
        return Err(OnnxError::Bound(format!(
            "decoding the model would take over {budget} bytes (twice its size plus {DECODE_OVERHEAD_BYTES}): \
             too many small messages or values for its size"
        )));
    }
    Ok(())
}

fn malformed(what: &str) -> OnnxError {
    OnnxError::NotOnnx(format!("malformed protobuf: {what}"))
}

/// Reads a varint at `*at`, moving past it.
fn varint(bytes: &[u8], at: &mut usize) -> Result<u64, OnnxError> {
    let mut value = 0u64;
    for shift in (0..64).step_by(7) {
        let b = *bytes.get(*at).ok_or_else(|| malformed("a varint runs past the end"))?;
        *at += 1;
        value |= u64::from(b & 0x7f) << shift;
        if b & 0x80 == 0 {
            return Ok(value);
        }
    }
    Err(malformed("a varint of more than 10 bytes"))
}

/// Walks the fields of one message of kind `msg`.
fn walk(bytes: &[u8], msg: Msg, depth: usize, scan: &mut Scan, budget: usize) -> Result<(), OnnxError> {
    if depth > MAX_DEPTH {
        return Err(malformed(&format!("messages nested deeper than {MAX_DEPTH}")));
    }
    let mut at = 0;
    while at < bytes.len() {
        let key = varint(bytes, &mut at)?;
        let tag = key >> 3;
        let wire = key & 7;
        if tag == 0 {
            return Err(malformed("field number 0"));
        }
        let field = msg.field(tag);
        match wire {
            0 => {
                varint(bytes, &mut at)?;
                if let Some(Field::Varint(size)) = field {
                    charge(scan, 2 * size, budget)?;
                }
            }
            1 | 5 => {
                let n = if wire == 1 { 8 } else { 4 };
                at = at
                    .checked_add(n)
                    .filter(|&end| end <= bytes.len())
                    .ok_or_else(|| malformed("a fixed-size field runs past the end"))?;
                if let Some(Field::Fixed) = field {
                    charge(scan, 2 * n, budget)?;
                }
            }
            2 => {
                let len = usize::try_from(varint(bytes, &mut at)?)
                    .map_err(|_| malformed("a length over the address space"))?;
                let end = at
                    .checked_add(len)
                    .filter(|&end| end <= bytes.len())
                    .ok_or_else(|| malformed("a length-delimited field runs past the end"))?;
                let body = &bytes[at..end];
                at = end;
                match field {
                    Some(Field::Msg(inner)) => {
                        if inner == Msg::Node {
                            scan.nodes += 1;
                            if scan.nodes > MAX_MODEL_NODES {
                                return Err(OnnxError::Bound(format!("the model has over {MAX_MODEL_NODES} nodes")));
                            }
                        }
                        charge(scan, 2 * inner.size(), budget)?;
                        walk(body, inner, depth + 1, scan, budget)?;
                    }
                    Some(Field::Bytes) => charge(scan, len.saturating_add(2 * size_of::<Vec<u8>>()), budget)?,
                    Some(Field::Varint(size)) => {
                        let count = body.iter().filter(|&&b| b & 0x80 == 0).count();
                        charge(scan, count.saturating_mul(2 * size), budget)?;
                    }
                    Some(Field::Fixed) => charge(scan, len, budget)?,
                    None => {}
                }
            }
            _ => return Err(malformed(&format!("wire type {wire} (field {tag})"))),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A length-delimited field.
    fn ld(tag: u64, body: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        put_varint(&mut out, tag << 3 | 2);
        put_varint(&mut out, body.len() as u64);
        out.extend_from_slice(body);
        out
    }

    fn put_varint(out: &mut Vec<u8>, mut v: u64) {
        while v >= 0x80 {
            out.push((v as u8) | 0x80);
            v >>= 7;
        }
        out.push(v as u8);
    }

    #[test]
    fn counts_nodes_and_refuses_past_the_bound() {
        let node = ld(1, &ld(4, b"Relu"));
        let graph: Vec<u8> = node.repeat(3);
        let scan = prescan(&ld(7, &graph)).unwrap();
        assert_eq!(scan.nodes, 3);
        let empty_nodes = ld(1, b"").repeat(MAX_MODEL_NODES + 1);
        let e = prescan(&ld(7, &empty_nodes)).unwrap_err();
        assert!(e.to_string().contains("nodes"), "{e}");
    }

    #[test]
    fn refuses_packed_varints_that_would_decode_to_far_more_than_their_bytes() {
        // 40 MB of one-byte int64s: 640 MB decoded, over 2 x 40 MB + 64 MiB.
        let ints = vec![1u8; 40 << 20];
        let tensor = ld(7, &ints);
        let e = prescan(&ld(7, &ld(5, &tensor))).unwrap_err();
        assert!(matches!(e, OnnxError::Bound(_)), "{e}");
        // As raw bytes they cost what they weigh.
        let tensor = ld(9, &ints);
        assert!(prescan(&ld(7, &ld(5, &tensor))).is_ok());
    }

    #[test]
    fn malformed_protobufs_are_not_onnx() {
        for bad in [vec![0x3a, 0x05, 0x00], vec![0x08, 0xff], vec![0x0b], vec![0x3a; 300]] {
            assert!(matches!(prescan(&bad), Err(OnnxError::NotOnnx(_))), "{bad:?}");
        }
        // Nesting past the depth bound: attributes holding graphs holding nodes ...
        let mut deep = Vec::new();
        for _ in 0..40 {
            deep = ld(1, &ld(5, &ld(6, &deep)));
        }
        assert!(matches!(prescan(&ld(7, &deep)), Err(OnnxError::NotOnnx(_))));
    }
}
