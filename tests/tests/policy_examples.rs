//! docs/policies.md's worked examples are what the Rust policies do: every ```` ```json example````
//! block of the document is parsed (weights, observations, the mode) and the policy it names,
//! built from its `PolicySpec` and given those weights, is asked for the actions.
//!
//! - Deterministic examples list the actions; they must be exactly the Rust policy's, bit for
//!   bit (the document prints each f32 in its shortest form that reads back to the same f32).
//! - Random examples list the distribution instead (`probabilities` of each discrete action, or
//!   the `mean` and `std` of each continuous element): the Rust policy's samples must follow it
//!   (frequencies within 0.01, sample means within 4 standard errors, stds within 3 %), since
//!   another implementation's generator draws other samples from the same distribution.
//!
//! A document that lost its examples fails: at least one of every kind and mode is required.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use ndarray::{ArrayD, IxDyn};
use rollout::policy::{ActionsMut, Policy};
use rollout::{ExplorationType, PolicyConfig, PolicySpec, Spec, Tensor, Weights};
use serde_json::Value;

/// Samples per observation for the random examples.
const SAMPLES: usize = 40_000;

/// The JSON of every ```` ```json example```` block of docs/policies.md, with its title (the
/// last heading above it).
fn examples() -> Vec<(String, Value)> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/policies.md");
    let doc = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let mut out = Vec::new();
    let mut title = String::new();
    let mut block: Option<String> = None;
    for line in doc.lines() {
        match &mut block {
            None if line.starts_with('#') => title = line.trim_start_matches('#').trim().to_string(),
            None if line.trim() == "```json example" => block = Some(String::new()),
            None => {}
            Some(b) if line.trim() == "```" => {
                let v = serde_json::from_str(b).unwrap_or_else(|e| panic!("example {title:?}: {e}\n{b}"));
                out.push((title.clone(), v));
                block = None;
            }
            Some(b) => {
                b.push_str(line);
                b.push('\n');
            }
        }
    }
    assert!(block.is_none(), "an example block is not closed");
    out
}

/// A number, or `"inf"` / `"-inf"`.
fn num(v: &Value) -> f32 {
    match v {
        Value::Number(n) => n.as_f64().expect("a number") as f32,
        Value::String(s) if s == "inf" => f32::INFINITY,
        Value::String(s) if s == "-inf" => f32::NEG_INFINITY,
        other => panic!("not a number: {other}"),
    }
}

fn nums(v: &Value) -> Vec<f32> {
    v.as_array().expect("an array").iter().map(num).collect()
}

/// A nested array as an f32 tensor (its nesting is its shape).
fn tensor(v: &Value) -> Tensor {
    fn walk(v: &Value, depth: usize, shape: &mut Vec<usize>, data: &mut Vec<f32>) {
        match v {
            Value::Array(items) => {
                if shape.len() == depth {
                    shape.push(items.len());
                }
                assert_eq!(shape[depth], items.len(), "a ragged array");
                for i in items {
                    walk(i, depth + 1, shape, data);
                }
            }
            other => data.push(num(other)),
        }
    }
    let (mut shape, mut data) = (Vec::new(), Vec::new());
    walk(v, 0, &mut shape, &mut data);
    Tensor::F32(ArrayD::from_shape_vec(IxDyn(&shape), data).expect("shape"))
}

/// `{"n": N}` or `{"low": [..], "high": [..]}`.
fn action_spec(v: &Value) -> Spec {
    match v.get("n") {
        Some(n) => Spec::Discrete {
            n: n.as_u64().expect("n"),
        },
        None => Spec::Box {
            low: nums(&v["low"]),
            high: nums(&v["high"]),
        },
    }
}

/// The policy of example `e`, with its weights, in its mode.
fn build(title: &str, e: &Value) -> (Box<dyn Policy>, Spec, Vec<Vec<f32>>) {
    let config: PolicyConfig = serde_json::from_value(e["policy"].clone()).expect("policy");
    let exploration: ExplorationType = serde_json::from_value(e["exploration"].clone()).expect("exploration");
    let action = action_spec(&e["action_spec"]);
    let observations: Vec<Vec<f32>> = e["observations"]
        .as_array()
        .expect("observations")
        .iter()
        .map(nums)
        .collect();
    let obs_dim = observations[0].len();
    let obs = Spec::uniform_box(obs_dim, f32::NEG_INFINITY, f32::INFINITY);
    let spec = PolicySpec {
        config,
        exploration,
        init_seed: 0,
        record: true,
    };
    let mut p = spec.build(&obs, &action, 1).unwrap_or_else(|e| panic!("{title}: {e}"));
    let tensors: BTreeMap<String, Tensor> = e["weights"]
        .as_object()
        .expect("weights")
        .iter()
        .map(|(k, v)| (k.clone(), tensor(v)))
        .collect();
    p.set_weights(&Weights::new(tensors))
        .unwrap_or_else(|err| panic!("{title}: the example's weights: {err}"));
    (p, action, observations)
}

/// `k` actions of `p` for the same observation `o`, one row of `dim` values each.
fn act(p: &mut dyn Policy, action: &Spec, o: &[f32], k: usize) -> Vec<Vec<f64>> {
    let obs: Vec<f32> = o.iter().copied().cycle().take(o.len() * k).collect();
    match action {
        Spec::Discrete { .. } => {
            let mut a = vec![0i64; k];
            p.act(&obs, k, ActionsMut::Discrete(&mut a)).expect("act");
            a.into_iter().map(|x| vec![x as f64]).collect()
        }
        Spec::Box { low, .. } => {
            let d = low.len();
            let mut a = vec![0f32; k * d];
            p.act(&obs, k, ActionsMut::Continuous(&mut a)).expect("act");
            a.chunks(d).map(|r| r.iter().map(|&x| x as f64).collect()).collect()
        }
    }
}

fn deterministic(title: &str, e: &Value) {
    let (mut p, action, observations) = build(title, e);
    let expected = e["actions"].as_array().expect("actions");
    assert_eq!(
        expected.len(),
        observations.len(),
        "{title}: one action per observation"
    );
    for (o, want) in observations.iter().zip(expected) {
        let got = act(p.as_mut(), &action, o, 1).remove(0);
        match &action {
            Spec::Discrete { .. } => {
                assert_eq!(got[0] as i64, want.as_i64().expect("an integer"), "{title}: {o:?}");
            }
            Spec::Box { .. } => {
                let want = nums(want);
                let got: Vec<f32> = got.iter().map(|&x| x as f32).collect();
                let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                assert_eq!(
                    bits(&got),
                    bits(&want),
                    "{title}: {o:?} gives {got:?}, the doc says {want:?}"
                );
            }
        }
    }
}

fn random(title: &str, e: &Value) {
    let (mut p, action, observations) = build(title, e);
    for (i, o) in observations.iter().enumerate() {
        let samples = act(p.as_mut(), &action, o, SAMPLES);
        if let Some(probs) = e.get("probabilities") {
            let probs = nums(&probs[i]);
            for (a, &want) in probs.iter().enumerate() {
                let freq = samples.iter().filter(|s| s[0] as usize == a).count() as f64 / SAMPLES as f64;
                assert!(
                    (freq - want as f64).abs() < 0.01,
                    "{title}: {o:?}: action {a} drawn {freq:.4} of the time, the doc says {want}"
                );
            }
        } else {
            let (mean, std) = (nums(&e["mean"][i]), nums(&e["std"][i]));
            for j in 0..mean.len() {
                let col: Vec<f64> = samples.iter().map(|s| s[j]).collect();
                let m = col.iter().sum::<f64>() / SAMPLES as f64;
                let s = (col.iter().map(|x| (x - m).powi(2)).sum::<f64>() / (SAMPLES - 1) as f64).sqrt();
                let se = std[j] as f64 / (SAMPLES as f64).sqrt();
                assert!(
                    (m - mean[j] as f64).abs() < 4.0 * se + 1e-6,
                    "{title}: {o:?}: element {j}'s mean {m}, the doc says {}",
                    mean[j]
                );
                assert!(
                    (s - std[j] as f64).abs() < 0.03 * std[j] as f64 + 1e-6,
                    "{title}: {o:?}: element {j}'s std {s}, the doc says {}",
                    std[j]
                );
            }
        }
    }
}

#[test]
fn docs_policies_md_worked_examples_are_what_the_rust_policies_do() {
    let all = examples();
    let mut seen = BTreeSet::new();
    for (title, e) in &all {
        let kind = e["policy"]["kind"].as_str().expect("policy.kind").to_string();
        let mode = e["exploration"].as_str().expect("exploration").to_string();
        match mode.as_str() {
            "deterministic" => deterministic(title, e),
            "random" => random(title, e),
            other => panic!("{title}: exploration {other:?}"),
        }
        seen.insert((kind, mode));
    }
    for kind in ["linear", "mlp", "constant"] {
        for mode in ["deterministic", "random"] {
            assert!(
                seen.contains(&(kind.to_string(), mode.to_string())),
                "docs/policies.md has no {mode} example of `{kind}`: {seen:?}"
            );
        }
    }
    assert!(seen.contains(&("random".to_string(), "random".to_string())), "{seen:?}");
}
