//! The wire format is standard MessagePack: frames and `--output` files written by Rust are read
//! back by `scripts/msgpack_check.py` with Python's own `msgpack` package (no rmp-serde), and what
//! Python sees is compared field by field, and tensor values exactly, with the Rust side.
//!
//! Needs `python3` with `msgpack` (scripts/test.sh installs it); the tests fail, not skip, without.
//! The `rollout` binary is built the way tests/tests/cli.rs builds it. Every child process is waited
//! for with a deadline, then killed.

use std::io::Cursor;
use std::path::Path;
use std::process::{Command, ExitStatus};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use rollout::message::{Batch, Continue, FromNode, Seed, ToNode, UpdateWeights};
use rollout::node_spec::NodeSpec;
use rollout::wire::{
    auth_proof, encode_into, Auth, Hello, NodeFrame, TrainerFrame, Welcome, DEFAULT_MAX_FRAME, PROTOCOL_VERSION,
};
use rollout::{PolicyConfig, Registry, Tensor, TensorDict, Weights};
use rollout_tests::{rollout_bin, run_bounded, temp_file, OutputRecord};
use serde_json::{json, Value};

const RUN_TIMEOUT: Duration = Duration::from_secs(120);

struct Run {
    status: ExitStatus,
    stdout: Vec<u8>,
    stderr: String,
}

/// Runs a command with a deadline; panics if it does not end in time.
fn run(mut cmd: Command, what: &str) -> Run {
    let run = run_bounded(&mut cmd, RUN_TIMEOUT).unwrap_or_else(|e| panic!("cannot start {what}: {e}"));
    let stderr = run.stderr_text();
    let Some(status) = run.status else {
        panic!("{what} ran longer than {RUN_TIMEOUT:?}; stderr:\n{stderr}");
    };
    Run {
        status,
        stdout: run.stdout,
        stderr,
    }
}

/// Python 3 with `msgpack`, checked once; a clear failure otherwise.
fn python() -> &'static str {
    static OK: OnceLock<()> = OnceLock::new();
    OK.get_or_init(|| {
        let mut cmd = Command::new("python3");
        cmd.args(["-c", "import msgpack"]);
        let r = run(cmd, "python3 -c 'import msgpack'");
        assert!(
            r.status.success(),
            "python3 cannot import msgpack ({}): run scripts/test.sh, which installs it \
             (python3 -m pip install msgpack)\n{}",
            r.status,
            r.stderr
        );
    });
    "python3"
}

/// Runs `scripts/msgpack_check.py MODE FILE` and parses its JSON.
fn msgpack_check(mode: &str, file: &Path) -> Vec<Value> {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/msgpack_check.py");
    let mut cmd = Command::new(python());
    cmd.arg(&script).arg(mode).arg(file);
    let r = run(cmd, "msgpack_check.py");
    assert!(
        r.status.success(),
        "msgpack_check.py {mode} failed ({}):\n{}",
        r.status,
        r.stderr
    );
    let v: Value = serde_json::from_slice(&r.stdout).expect("msgpack_check.py prints JSON");
    v.as_array().expect("a JSON array").clone()
}

/// Checks Python's view of a tensor against the Rust one: dtype, shape and every value exactly.
fn assert_tensor(py: &Value, t: &Tensor, what: &str) {
    assert_eq!(py["dtype"], t.dtype().name(), "{what}");
    let shape: Vec<usize> = serde_json::from_value(py["shape"].clone()).expect("shape");
    assert_eq!(shape, t.shape(), "{what}");
    let values = py["values"]
        .as_array()
        .unwrap_or_else(|| panic!("{what}: no values in {py}"));
    assert_eq!(values.len(), t.len(), "{what}");
    // A finite float arrives as the exact double of the element (an f32 widened exactly); JSON
    // parsing may be 1 ulp off in f64, which rounding back to f32 removes.
    let float = |v: &Value| match v {
        Value::String(s) if s == "nan" => f64::NAN,
        Value::String(s) if s == "inf" => f64::INFINITY,
        Value::String(s) if s == "-inf" => f64::NEG_INFINITY,
        v => v.as_f64().unwrap_or_else(|| panic!("{what}: {v} is not a float")),
    };
    let same_f32 = |a: f32, b: f32| a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan());
    match t {
        Tensor::F32(a) => {
            for (i, (v, x)) in values.iter().zip(a.iter()).enumerate() {
                assert!(same_f32(float(v) as f32, *x), "{what}[{i}]: python {v}, rust {x}");
            }
        }
        Tensor::F64(a) => {
            for (i, (v, x)) in values.iter().zip(a.iter()).enumerate() {
                let p = float(v);
                assert!(
                    p == *x || (p.is_nan() && x.is_nan()),
                    "{what}[{i}]: python {v}, rust {x}"
                );
            }
        }
        Tensor::I64(a) => {
            let p: Vec<i64> = values.iter().map(|v| v.as_i64().expect("i64")).collect();
            assert_eq!(p, a.iter().copied().collect::<Vec<_>>(), "{what}");
        }
        Tensor::Bool(a) => {
            let p: Vec<bool> = values.iter().map(|v| v.as_bool().expect("bool")).collect();
            assert_eq!(p, a.iter().copied().collect::<Vec<_>>(), "{what}");
        }
        Tensor::U8(a) => {
            let p: Vec<u8> = values.iter().map(|v| v.as_u64().expect("u8") as u8).collect();
            assert_eq!(p, a.iter().copied().collect::<Vec<_>>(), "{what}");
        }
    }
}

fn assert_tensordict(py: &Value, td: &TensorDict, what: &str) {
    let batch: Vec<usize> = serde_json::from_value(py["batch_size"].clone()).expect("batch_size");
    assert_eq!(batch, td.batch_size(), "{what}");
    let tensors = py["tensors"].as_object().expect("tensors map");
    assert_eq!(
        tensors.keys().map(String::as_str).collect::<Vec<_>>(),
        td.keys().collect::<Vec<_>>(),
        "{what}"
    );
    for (k, t) in td.iter() {
        assert_tensor(&tensors[k], t, &format!("{what}.{k}"));
    }
}

fn assert_weights(py: &Value, w: &Weights, what: &str) {
    assert_eq!(keys(py), ["tensors", "version"], "{what}");
    assert_eq!(py["version"], w.version, "{what}");
    let tensors = py["tensors"].as_object().expect("tensors map");
    assert_eq!(tensors.len(), w.tensors.len(), "{what}");
    for (k, t) in &w.tensors {
        assert_tensor(&tensors[k], t, &format!("{what}.{k}"));
    }
}

fn keys(v: &Value) -> Vec<&str> {
    let mut k: Vec<&str> = v.as_object().expect("a map").keys().map(String::as_str).collect();
    k.sort_unstable();
    k
}

/// A node's share, collected the way a node does it: one `Rollout` per env worker, concatenated.
fn cartpole_batch() -> (NodeSpec, Batch, Weights) {
    let spec = NodeSpec::new("CartPole-v1", PolicyConfig::Linear, 2)
        .with_index(1)
        .with_lanes(2, 4)
        .with_env_share(8)
        .with_max_frames_per_traj(5)
        .with_seed(11);
    let mut workers = spec
        .build_workers(&Registry::with_builtins())
        .expect("CartPole workers");
    let weights = workers[0].weights().clone();
    let parts: Vec<TensorDict> = workers
        .iter_mut()
        .map(|w| w.collect_frames(12).expect("collect"))
        .collect();
    let data = TensorDict::cat(&parts).expect("cat");
    assert_eq!(data.batch_size(), &[2, 12]);
    let batch = Batch {
        node: 1,
        seq: 3,
        weights_version: 0,
        data,
    };
    (spec, batch, weights)
}

#[test]
fn frames_decode_with_python_msgpack() {
    let (spec, batch, weights) = cartpole_batch();
    let weights = weights.with_version(4);
    let nonce: Vec<u8> = (0..32).collect();
    let proof = auth_proof(b"token", &nonce, "node-1");
    let mut bytes = Vec::new();
    let mut put_t = |f: &TrainerFrame| encode_into(f, DEFAULT_MAX_FRAME, &mut bytes).expect("encode");
    put_t(&TrainerFrame::Message(ToNode::Continue(Continue {
        seq: 3,
        frames: 24,
    })));
    put_t(&TrainerFrame::Welcome(Box::new(Welcome {
        node_index: 1,
        spec: spec.clone(),
        weights: Some(weights.clone()),
        heartbeat_ms: 1000,
        heartbeat_timeout_ms: 5000,
        max_frame: DEFAULT_MAX_FRAME as u64,
    })));
    put_t(&TrainerFrame::Message(ToNode::UpdateWeights(UpdateWeights {
        weights: Arc::new(weights.clone()),
    })));
    put_t(&TrainerFrame::Challenge { nonce: nonce.clone() });
    put_t(&TrainerFrame::Message(ToNode::Seed(Seed { seed: 99 })));
    put_t(&TrainerFrame::Reject {
        reason: "no ✗".into()
    });
    put_t(&TrainerFrame::Heartbeat);
    put_t(&TrainerFrame::Message(ToNode::Shutdown));
    let mut put_n = |f: &NodeFrame| encode_into(f, DEFAULT_MAX_FRAME, &mut bytes).expect("encode");
    put_n(&NodeFrame::Message(FromNode::Batch(batch.clone())));
    put_n(&NodeFrame::Hello(Hello {
        protocol_version: PROTOCOL_VERSION,
        node_name: "node-1".into(),
        node_index: None,
    }));
    put_n(&NodeFrame::Auth(Auth { proof: proof.clone() }));
    put_n(&NodeFrame::Message(FromNode::WeightsUpdated { node: 1, version: 4 }));
    put_n(&NodeFrame::Message(FromNode::Seeded {
        node: 1,
        next_seed: u64::MAX,
    }));
    put_n(&NodeFrame::Message(FromNode::Down { node: 1 }));
    put_n(&NodeFrame::Message(FromNode::Failed {
        node: 1,
        reason: "env 0 failed".into(),
    }));

    let file = temp_file("frames.bin");
    std::fs::write(file.path(), &bytes).expect("write frames");
    let frames = msgpack_check("frames", file.path());
    let types: Vec<&str> = frames.iter().map(|f| f["type"].as_str().expect("type")).collect();
    assert_eq!(
        types,
        [
            "continue",
            "welcome",
            "update_weights",
            "challenge",
            "seed",
            "reject",
            "heartbeat",
            "shutdown",
            "batch",
            "hello",
            "auth",
            "weights_updated",
            "seeded",
            "down",
            "failed"
        ]
    );
    let [cont, welcome, update, challenge, seed, reject, hb, shutdown, b, hello, auth, wu, seeded, down, failed] =
        &frames[..]
    else {
        unreachable!()
    };

    assert_eq!(cont, &json!({"type": "continue", "seq": 3, "frames": 24}));

    assert_eq!(
        keys(welcome),
        [
            "heartbeat_ms",
            "heartbeat_timeout_ms",
            "max_frame",
            "node_index",
            "spec",
            "type",
            "weights"
        ]
    );
    assert_eq!(welcome["node_index"], 1);
    assert_eq!(welcome["heartbeat_ms"], 1000);
    assert_eq!(welcome["heartbeat_timeout_ms"], 5000);
    assert_eq!(welcome["max_frame"], DEFAULT_MAX_FRAME as u64);
    // The spec has no float and no bytes: serde_json's view of it is exactly Python's.
    assert_eq!(welcome["spec"], serde_json::to_value(&spec).expect("spec to JSON"));
    assert_eq!(
        welcome["spec"]["policy"]["config"],
        json!({"kind": "linear"}),
        "policy config is internally tagged by `kind`"
    );
    assert_eq!(welcome["spec"]["env"], json!({"name": "CartPole-v1", "config": null}));
    assert_weights(&welcome["weights"], &weights, "welcome.weights");

    assert_eq!(keys(update), ["type", "weights"]);
    assert_weights(&update["weights"], &weights, "update_weights.weights");

    assert_eq!(challenge, &json!({"type": "challenge", "nonce": {"hex": hex(&nonce)}}));
    assert_eq!(seed, &json!({"type": "seed", "seed": 99}));
    assert_eq!(reject, &json!({"type": "reject", "reason": "no ✗"}));
    assert_eq!(hb, &json!({"type": "heartbeat"}));
    assert_eq!(shutdown, &json!({"type": "shutdown"}));

    assert_eq!(keys(b), ["data", "node", "seq", "type", "weights_version"]);
    assert_eq!(b["node"], 1);
    assert_eq!(b["seq"], 3);
    assert_eq!(b["weights_version"], 0);
    assert_eq!(keys(&b["data"]), ["batch_size", "tensors"]);
    assert_tensordict(&b["data"], &batch.data, "batch.data");
    // The CartPole keys a trainer relies on, with torchrl's names and dtypes.
    for (k, dtype, shape) in [
        ("observation", "f32", json!([2, 12, 4])),
        ("action", "i64", json!([2, 12])),
        ("next.observation", "f32", json!([2, 12, 4])),
        ("next.reward", "f32", json!([2, 12, 1])),
        ("next.done", "bool", json!([2, 12, 1])),
        ("next.terminated", "bool", json!([2, 12, 1])),
        ("next.truncated", "bool", json!([2, 12, 1])),
        ("collector.traj_ids", "i64", json!([2, 12])),
        ("step_count", "i64", json!([2, 12, 1])),
    ] {
        let t = &b["data"]["tensors"][k];
        assert_eq!((&t["dtype"], &t["shape"]), (&json!(dtype), &shape), "{k}");
    }
    // max_frames_per_traj = 5 over 12 steps: some truncations happened, so bools are not all false.
    let trunc = b["data"]["tensors"]["next.truncated"]["values"]
        .as_array()
        .expect("values");
    assert!(trunc.iter().any(|v| v == true), "{trunc:?}");

    assert_eq!(
        hello,
        &json!({"type": "hello", "protocol_version": PROTOCOL_VERSION, "node_name": "node-1", "node_index": null})
    );
    assert_eq!(auth, &json!({"type": "auth", "proof": {"hex": hex(&proof)}}));
    assert_eq!(wu, &json!({"type": "weights_updated", "node": 1, "version": 4}));
    assert_eq!(seeded, &json!({"type": "seeded", "node": 1, "next_seed": u64::MAX}));
    assert_eq!(down, &json!({"type": "down", "node": 1}));
    assert_eq!(failed, &json!({"type": "failed", "node": 1, "reason": "env 0 failed"}));
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// PROTOCOL.md's §7 "Worked example", as the document shows it.
fn protocol_md_section_7() -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../PROTOCOL.md");
    let doc = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let start = doc.find("## 7. Worked example").expect("PROTOCOL.md has a §7");
    doc[start..].to_string()
}

/// The hex of the first backtick span on the line after the line starting with `lead`.
fn inline_hex_after(section: &str, lead: &str) -> String {
    let mut lines = section.lines().skip_while(|l| !l.starts_with(lead));
    let first = lines
        .next()
        .unwrap_or_else(|| panic!("§7 has no line starting with {lead:?}"));
    // The span is on the same line after the lead (`heartbeat`) or on the next one (`hello`).
    let rest = first.strip_prefix(lead).unwrap_or(first);
    let line = if rest.contains('`') {
        rest.to_string()
    } else {
        lines.next().unwrap_or("").to_string()
    };
    let span = line
        .split('`')
        .nth(1)
        .unwrap_or_else(|| panic!("no `…` span after {lead:?}"));
    span.split_whitespace().collect()
}

/// The doc's examples are the bytes the encoder writes: a reader writing a node from
/// PROTOCOL.md alone gets what the reference trainer expects (the version in `hello` too).
#[test]
fn protocol_md_worked_examples_are_the_encoders_bytes() {
    let section = protocol_md_section_7();
    // The annotated `continue` frame: hex bytes, then two or more spaces, then a comment.
    let block = section.split("```").nth(1).expect("§7 opens with a code block");
    let continue_hex: String = block
        .lines()
        .filter_map(|l| l.split("  ").next())
        .flat_map(str::split_whitespace)
        .collect();
    let mut bytes = Vec::new();
    encode_into(
        &ToNode::Continue(Continue { seq: 7, frames: 1000 }),
        DEFAULT_MAX_FRAME,
        &mut bytes,
    )
    .expect("encode continue");
    assert_eq!(continue_hex, hex(&bytes), "continue {{seq: 7, frames: 1000}}");

    let mut bytes = Vec::new();
    encode_into(&NodeFrame::Heartbeat, DEFAULT_MAX_FRAME, &mut bytes).expect("encode heartbeat");
    assert_eq!(
        inline_hex_after(&section, "`heartbeat` (either direction):"),
        hex(&bytes),
        "heartbeat"
    );

    let lead = format!("`hello {{protocol_version: {PROTOCOL_VERSION}, node_name: \"n\", node_index: nil}}` body:");
    let mut bytes = Vec::new();
    let hello = NodeFrame::Hello(Hello {
        protocol_version: PROTOCOL_VERSION,
        node_name: "n".into(),
        node_index: None,
    });
    encode_into(&hello, DEFAULT_MAX_FRAME, &mut bytes).expect("encode hello");
    assert_eq!(
        inline_hex_after(&section, &lead),
        hex(&bytes[4..]),
        "hello body (no length prefix)"
    );
}

#[test]
fn python_rejects_a_broken_frame_file() {
    // The checker is a real check: a truncated frame and a wrong blob length are errors.
    let mut bytes = Vec::new();
    encode_into(
        &TrainerFrame::Message(ToNode::Continue(Continue { seq: 1, frames: 2 })),
        DEFAULT_MAX_FRAME,
        &mut bytes,
    )
    .unwrap();
    let file = temp_file("broken.bin");
    std::fs::write(file.path(), &bytes[..bytes.len() - 1]).unwrap();
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/msgpack_check.py");
    let mut cmd = Command::new(python());
    cmd.arg(&script).arg("frames").arg(file.path());
    let r = run(cmd, "msgpack_check.py");
    assert_eq!(r.status.code(), Some(1), "{}", r.stderr);
    assert!(r.stderr.contains("announces"), "{}", r.stderr);
}

// --- `rollout collect --output FILE`, read by Python ---------------------------------------

#[test]
fn output_file_decodes_with_python_msgpack() {
    // Python is checked first: without msgpack this fails fast, before the build.
    python();
    let file = temp_file("output.msgpack");
    let path = file.path().to_str().expect("utf-8 temp path");
    let args = [
        "collect",
        "--env",
        "Counting",
        "--policy",
        "constant",
        "--total-frames",
        "100",
        "--frames-per-batch",
        "50",
        "--output",
        path,
        "--quiet",
    ];
    let mut cmd = Command::new(rollout_bin());
    cmd.args(args).env_remove("RUST_LOG");
    let r = run(cmd, "rollout collect");
    assert!(r.status.success(), "`rollout {}` failed:\n{}", args.join(" "), r.stderr);

    let bytes = std::fs::read(file.path()).expect("read the output file");
    let mut cur = Cursor::new(&bytes[..]);
    let mut records = Vec::new();
    while (cur.position() as usize) < bytes.len() {
        let rec: OutputRecord = rmp_serde::from_read(&mut cur).expect("a record");
        records.push(rec);
    }
    assert_eq!(records.len(), 2);

    let py = msgpack_check("output", file.path());
    assert_eq!(py.len(), records.len());
    let mut frames = 0;
    for (i, (p, rec)) in py.iter().zip(&records).enumerate() {
        assert_eq!(
            keys(p),
            [
                "batch",
                "data",
                "node",
                "policy_lag",
                "weights_version",
                "weights_versions"
            ]
        );
        assert_eq!(rec.batch, i as u64);
        assert_eq!(p["batch"], rec.batch);
        assert_eq!(p["node"], json!(rec.node));
        assert_eq!(p["weights_version"], rec.weights_version);
        assert_eq!(p["weights_versions"], json!(rec.weights_versions));
        assert_eq!(p["policy_lag"], rec.policy_lag);
        let data = p["data"].as_object().expect("data map");
        assert_eq!(
            data.keys().map(String::as_str).collect::<Vec<_>>(),
            rec.data.keys().map(String::as_str).collect::<Vec<_>>()
        );
        for (k, t) in &rec.data {
            assert_tensor(&data[k], t, &format!("record {i}.{k}"));
        }
        let obs = &data["observation"];
        assert_eq!(obs["dtype"], "f32");
        let shape: Vec<usize> = serde_json::from_value(obs["shape"].clone()).unwrap();
        frames += shape[..shape.len() - 1].iter().product::<usize>();
        // The constant policy's action is 1: the count goes up by one per step.
        let action = &data["action"]["values"];
        assert!(
            action.as_array().unwrap().iter().all(|v| v.as_f64() == Some(1.0)),
            "{action}"
        );
    }
    assert_eq!(frames, 100);
}
