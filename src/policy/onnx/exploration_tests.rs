//! An `onnx` policy with an exploration module (PROTOCOL.md §8, Exploration modules):
//! torch's deterministic Pendulum actor (tests/fixtures/onnx/pendulum_deterministic)
//! with an `eps` initializer and its `ou_eps` output added as the exporter adds them.

use prost::Message;
use tract_onnx::pb::{self, tensor_proto::DataType};

use super::tests::{fixture, json};
use crate::machine::trainer::initial_weights_for;
use crate::policy::sampler::Sampler;
use crate::policy::{
    ActionsMut, ExplorationModule, ExplorationType, OnnxHead, OnnxModel, OrnsteinUhlenbeck, PolicyConfig, PolicySpec,
    RecordMut, StateIo, Weights,
};
use crate::space::EnvSpecs;
use crate::spec::Spec;
use crate::tensor::Tensor;

const EPS: &str = "explore.eps";

/// The fixture's bytes with a scalar f32 initializer `name` = `eps` and an output
/// `ou_eps` reading it.
fn with_eps(name: &str, eps: f32) -> OnnxModel {
    let bytes = std::fs::read(fixture("pendulum_deterministic.onnx")).unwrap();
    let mut m = pb::ModelProto::decode(&bytes[..]).unwrap();
    let g = m.graph.as_mut().unwrap();
    g.initializer.push(pb::TensorProto {
        name: name.into(),
        data_type: DataType::Float as i32,
        raw_data: eps.to_le_bytes().to_vec(),
        ..Default::default()
    });
    g.node.push(pb::NodeProto {
        name: "ou_eps".into(),
        op_type: "Identity".into(),
        input: vec![name.into()],
        output: vec!["ou_eps".into()],
        ..Default::default()
    });
    g.output.push(pb::ValueInfoProto {
        name: "ou_eps".into(),
        r#type: Some(pb::TypeProto {
            denotation: String::new(),
            value: Some(pb::type_proto::Value::TensorType(pb::type_proto::Tensor {
                elem_type: DataType::Float as i32,
                shape: Some(pb::TensorShapeProto { dim: vec![] }),
            })),
        }),
        doc_string: String::new(),
    });
    OnnxModel::parse(m.encode_to_vec()).unwrap()
}

/// A random walk (theta 0, dt 1, no annealing): each step's noise is the last plus
/// `sigma * z`.
fn walk(sigma: f32) -> OrnsteinUhlenbeck {
    OrnsteinUhlenbeck {
        eps: EPS.into(),
        theta: 0.0,
        mu: 0.0,
        sigma,
        sigma_min: None,
        n_steps_annealing: 1000,
        dt: 1.0,
        x0: vec![],
    }
}

fn config(model: OnnxModel, module: OrnsteinUhlenbeck) -> PolicyConfig {
    let module = ExplorationModule::OrnsteinUhlenbeck(module);
    PolicyConfig::Onnx {
        model,
        head: OnnxHead::Deterministic,
        state: module.state(1).to_vec(),
        exploration: Some(module),
    }
}

fn pendulum() -> (Spec, Spec) {
    (Spec::uniform_box(3, -8.0, 8.0), Spec::uniform_box(1, -2.0, 2.0))
}

#[test]
fn the_noise_is_added_to_torchs_action_and_walks_from_the_state_the_rollout_holds() {
    let j = json("pendulum_deterministic");
    let obs: Vec<f32> = j["observation"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|r| r.as_array().unwrap().iter().map(|x| x.as_f64().unwrap() as f32))
        .collect();
    let torch: Vec<f32> = j["action"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r[0].as_f64().unwrap() as f32)
        .collect();
    let k = torch.len();
    let (o, a) = pendulum();
    let spec = PolicySpec {
        config: config(with_eps(EPS, 0.5), walk(0.3)),
        exploration: ExplorationType::Random,
        init_seed: 0,
        record: true,
    };
    let mut p = spec.build(&o, &a, 9).unwrap();
    assert_eq!(p.state().len(), 2);
    let mut z = Sampler::new(9);
    let mut before = vec![vec![0.0; k], vec![0.0; k]];
    for step in 0..3 {
        let mut after = vec![vec![f32::NAN; k], vec![f32::NAN; k]];
        let mut actions = vec![f32::NAN; k];
        let io = StateIo {
            is_init: &vec![step == 0; k],
            before: &before,
            after: &mut after,
        };
        p.act_recurrent(&obs, k, io, ActionsMut::Continuous(&mut actions), RecordMut::nothing())
            .unwrap();
        for i in 0..k {
            let noise = before[0][i] + 0.3 * z.normal();
            assert_eq!(after[0][i], noise, "step {step} row {i}");
            assert_eq!(after[1][i], before[1][i] + 1.0);
            // torch's action (to its 1e-5), plus eps times the noise, in the box.
            let want = (torch[i] + 0.5 * noise).clamp(-2.0, 2.0);
            assert!(
                (actions[i] - want).abs() <= 1e-5,
                "step {step} row {i}: {} vs {want}",
                actions[i]
            );
        }
        before = after;
    }
    // The update's eps reaches the noise: 0 gives torch's action.
    let mut update: Weights = p.weights().clone().with_version(1);
    if let Some(Tensor::F32(e)) = update.tensors.get_mut(EPS) {
        e.fill(0.0);
    }
    p.set_weights(&update).unwrap();
    let mut after = vec![vec![0.0; k], vec![0.0; k]];
    let mut actions = vec![f32::NAN; k];
    let io = StateIo {
        is_init: &vec![false; k],
        before: &before,
        after: &mut after,
    };
    p.act_recurrent(&obs, k, io, ActionsMut::Continuous(&mut actions), RecordMut::nothing())
        .unwrap();
    for i in 0..k {
        assert!((actions[i] - torch[i].clamp(-2.0, 2.0)).abs() <= 1e-5);
    }
}

#[test]
fn the_trainer_refuses_a_model_without_the_eps_it_names_before_any_node_acts() {
    let (o, a) = pendulum();
    let specs = EnvSpecs::from_specs(&o, &a);
    let ok = PolicySpec::from(config(with_eps(EPS, 0.5), walk(0.3)));
    let w = initial_weights_for(&ok, &specs).unwrap().unwrap();
    assert!(w.tensors.contains_key(EPS));
    let missing = PolicySpec::from(config(with_eps("other.eps", 0.5), walk(0.3)));
    let err = initial_weights_for(&missing, &specs).unwrap_err();
    assert!(err.contains("exploration.eps") && err.contains(EPS), "{err}");
    // A discrete action, or a head that samples, cannot take the module.
    let err = initial_weights_for(&ok, &EnvSpecs::from_specs(&o, &Spec::Discrete { n: 2 })).unwrap_err();
    assert!(err.contains("box action"), "{err}");
    let mut normal = ok.clone();
    if let PolicyConfig::Onnx { head, .. } = &mut normal.config {
        *head = OnnxHead::Normal;
    }
    let err = initial_weights_for(&normal, &specs).unwrap_err();
    assert!(err.contains("deterministic"), "{err}");
}

#[test]
fn the_trainer_holds_a_hand_made_state_to_the_naming_rules() {
    let (o, a) = pendulum();
    let specs = EnvSpecs::from_specs(&o, &a);
    let mut spec = PolicySpec::from(config(with_eps(EPS, 0.5), walk(0.3)));
    if let PolicyConfig::Onnx { state, .. } = &mut spec.config {
        state.insert(0, crate::policy::StateTensor::new("next.h", [4]));
    }
    // The rule's own words (state[0]: ...), not the model's missing input.
    let err = initial_weights_for(&spec, &specs).unwrap_err();
    assert!(err.contains("state[0]") && err.contains("next.h"), "{err}");
}
