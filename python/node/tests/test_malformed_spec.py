"""A `welcome` whose spec is malformed ends the node with the documented `failed` frame
naming the field, one line on stderr and exit 1: never a Python traceback."""

import pytest

from conftest import linear_weights, node_spec


def _without(key):
    spec = node_spec()
    del spec[key]
    return spec


def _with_rollout(**fields):
    spec = node_spec()
    spec["rollout"].update(fields)
    return spec


def _with(**fields):
    spec = node_spec()
    spec.update(fields)
    return spec


@pytest.mark.parametrize(
    "spec, reason",
    [
        (_with(rollout="x"), "spec.rollout must be a map, got str 'x'"),
        (_with_rollout(seed=None), "spec.rollout.seed must be a uint, got NoneType None"),
        (_with_rollout(seed=-1), "spec.rollout.seed must be a uint, got int -1"),
        (_with_rollout(reset_at_each_iter="no"), "spec.rollout.reset_at_each_iter must be a bool"),
        (_without("lanes"), "spec.lanes is missing"),
        (_without("env"), "spec.env is missing"),
        (_with(env={"config": None}), "spec.env.name is missing"),
        (_with(env={"name": "CartPole-v1", "done_on_any": 1}), "spec.env.done_on_any must be a bool, got int 1"),
        (_with(policy="linear"), "spec.policy must be a map, got str 'linear'"),
        (_with(policy={"config": {"kind": "linear"}, "init_seed": 1.5}), "spec.policy.init_seed must be a uint"),
        (_with(envs_per_node=True), "spec.envs_per_node must be a uint, got bool True"),
    ],
)
def test_a_malformed_spec_fails_the_node_with_a_one_line_reason(trainer, spec, reason):
    trainer.start_node()
    f = trainer.join(spec, weights=linear_weights(2, 4))
    assert f["type"] == "failed", f
    assert f["reason"] == f"cannot build the node: {reason}" or f["reason"].startswith(f"cannot build the node: {reason}"), f
    code, err = trainer.finish()
    assert code == 1, err
    assert "Traceback" not in err, err
    assert err.strip().splitlines() == [f"error: {f['reason']}"], err
