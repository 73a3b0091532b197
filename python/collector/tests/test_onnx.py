"""policy="onnx": a model PyTorch exported, collected with in-process nodes; the actions
are the model's own (onnxruntime on the recorded observations, when installed)."""

import json
from pathlib import Path

import numpy as np
import pytest

import rollout

FIXTURES = Path(__file__).resolve().parents[3] / "tests" / "fixtures" / "onnx"


def test_an_onnx_policy_acts_as_its_model():
    model = FIXTURES / "cartpole_categorical.onnx"
    c = rollout.DistributedCollector(
        "CartPole-v1",
        policy="onnx",
        policy_file=str(model),
        onnx_head="categorical",
        exploration_type="deterministic",
        frames_per_batch=100,
        total_frames=200,
        nodes=2,
        seed=0,
    )
    obs, actions = [], []
    for batch in c:
        obs.append(np.asarray(batch["observation"]).reshape(-1, 4))
        actions.append(np.asarray(batch["action"]).reshape(-1))
    c.shutdown()
    obs, actions = np.concatenate(obs), np.concatenate(actions)
    assert len(actions) == 200
    ort = pytest.importorskip("onnxruntime")
    s = ort.InferenceSession(str(model))
    (logits,) = s.run(None, {"observation": obs.astype(np.float32)})
    assert (actions == logits.argmax(-1)).all()


def test_the_weights_are_the_models_initializers():
    c = rollout.DistributedCollector(
        "CartPole-v1",
        policy="onnx",
        policy_file=str(FIXTURES / "cartpole_categorical.onnx"),
        onnx_head="categorical",
        frames_per_batch=10,
        total_frames=10,
    )
    update = json.loads((FIXTURES / "cartpole_categorical_update.json").read_text())["state_dict"]
    weights = {k: np.asarray(v["data"], dtype=np.float32).reshape(v["shape"]) for k, v in update.items()}
    c.update_policy_weights_(weights)
    with pytest.raises(Exception, match="net.9.weight"):
        c.update_policy_weights_({**weights, "net.9.weight": np.zeros(2, dtype=np.float32)})
    c.shutdown()


@pytest.mark.parametrize(
    "kw, field",
    [
        (dict(policy="onnx", onnx_head="categorical"), "policy_file"),
        (dict(policy="onnx", policy_file=str(FIXTURES / "cartpole_categorical.onnx")), "onnx_head"),
        (dict(policy="onnx", policy_file=str(FIXTURES / "cartpole_categorical.onnx"), onnx_head="beta"), "onnx_head"),
        (dict(policy="onnx", policy_file=str(FIXTURES / "bad_unknown_op.onnx"), onnx_head="categorical"), "policy_file"),
        (dict(policy="linear", policy_file=str(FIXTURES / "cartpole_categorical.onnx")), "policy_file"),
    ],
)
def test_bad_onnx_arguments_are_named(kw, field):
    with pytest.raises(rollout.ConfigError) as e:
        rollout.DistributedCollector("CartPole-v1", frames_per_batch=10, **kw)
    assert e.value.field == field, str(e.value)
