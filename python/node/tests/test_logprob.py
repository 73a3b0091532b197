"""What the node's built-in policies record beside their actions (docs/policies.md,
PROTOCOL.md §3): ``action_log_prob`` against a softmax by hand, the normal's closed form and
the uniform density; the batch's layout with the recorded keys; the fill values of frames
acted by ``init_random_frames``' random policy; a row whose env raised keeps its records."""

import math

import numpy as np
import pytest

import flaky_env
from conftest import node_spec
from rollout_node.collect import Workers
from rollout_node.policy import ActionSpace, Policy

SEED = 5


def spec(env, envs, kind="linear", exploration="random", config=None, **rollout):
    """A node acting with a built-in policy of ``kind`` (an MLP of one hidden layer of 5),
    seeded with ``SEED``."""
    policy = {"config": {"kind": kind, **({"hidden": [5]} if kind == "mlp" else {})},
              "exploration": exploration, "init_seed": 0}
    return node_spec(env, envs, config, policy, **{"seed": SEED, **rollout})


def set_weights(policy, scale=0.5):
    rng = np.random.default_rng(3)
    policy.set_weights(0, {k: rng.uniform(-scale, scale, s).astype(np.float32) for k, s in policy.layout.items()})


def softmax_log_prob(z, a):
    z = np.asarray(z, np.float64)
    return math.log(math.exp(z[a]) / sum(math.exp(v) for v in z))


def normal_log_prob(x, loc, s):
    x, loc, s = (np.asarray(v, np.float64) for v in (x, loc, s))
    return float((-((x - loc) / s) ** 2 / 2 - np.log(s) - math.log(math.sqrt(2 * math.pi))).sum())


@pytest.mark.parametrize("kind", ["linear", "mlp"])
@pytest.mark.parametrize("exploration", ["random", "deterministic"])
def test_categorical_records_logits_and_their_log_softmax(kind, exploration):
    p = Policy({"config": {"kind": kind, "hidden": [5]}, "exploration": exploration}, 4, ActionSpace(n=3), 1)
    set_weights(p, 2.0)
    obs = np.random.default_rng(0).uniform(-2, 2, (200, 4)).astype(np.float32)
    acts, rec = p.act_recording(obs)
    assert set(rec) == set(p.recorded_layout()) == {"action_log_prob", "logits"}
    assert rec["logits"].shape == (200, 3) and rec["action_log_prob"].shape == (200,)
    for i in range(200):
        assert rec["action_log_prob"][i] == pytest.approx(softmax_log_prob(rec["logits"][i], acts[i]), abs=1e-5)
        if exploration == "deterministic":
            assert rec["logits"][i][acts[i]] == rec["logits"][i].max()


@pytest.mark.parametrize("exploration", ["random", "deterministic"])
def test_normal_records_the_tanh_mean_the_noise_std_and_the_clipped_density(exploration):
    a = ActionSpace(low=[-2.0, -math.inf], high=[2.0, math.inf])
    p = Policy({"config": {"kind": "linear"}, "exploration": exploration}, 3, a, 1)
    set_weights(p, 3.0)
    obs = np.random.default_rng(0).uniform(-2, 2, (300, 3)).astype(np.float32)
    acts, rec = p.act_recording(obs)
    assert set(rec) == {"action_log_prob", "loc", "scale"}
    assert np.array_equal(rec["scale"], np.tile(np.float32([0.2, 0.1]), (300, 1)))
    if exploration == "random":
        assert (np.abs(acts[:, 0]) == 2.0).any(), "some actions were clipped"
    else:
        assert np.array_equal(acts[:, 0], np.clip(rec["loc"][:, 0], -2, 2))
    for i in range(300):
        want = normal_log_prob(acts[i], rec["loc"][i], rec["scale"][i])
        assert rec["action_log_prob"][i] == pytest.approx(want, rel=1e-5, abs=1e-5)


@pytest.mark.parametrize("space, want", [
    (ActionSpace(n=6), -math.log(6)),
    (ActionSpace(low=[-2.0, 0.0], high=[2.0, 0.5]), -math.log(4) - math.log(0.5)),
    (ActionSpace(low=[-math.inf, 0.0], high=[math.inf, math.inf]), -2 * math.log(2)),
    (ActionSpace(kind="multi_discrete", nvec=[3, 2]), -math.log(6)),
    (ActionSpace(kind="multi_binary", n=4), -4 * math.log(2)),
])
def test_random_records_the_uniform_density(space, want):
    p = Policy({"config": {"kind": "random"}}, None, space, 1)
    _, rec = p.act_recording(np.zeros((7, 1), np.float32))
    assert p.recorded_layout() == {"action_log_prob": ["f32", []]}
    assert np.array_equal(rec["action_log_prob"], np.full(7, np.float32(want)))


def test_constant_records_nothing():
    p = Policy({"config": {"kind": "constant"}}, 2, ActionSpace(n=3), 1)
    p.set_weights(0, {"value": np.float32([1.0])})
    acts, rec = p.act_recording(np.zeros((4, 2), np.float32))
    assert rec == {} and p.recorded_layout() == {} and list(acts) == [1] * 4


@pytest.mark.parametrize("env, kind, keys", [
    ("CartPole-v1", "linear", {"action_log_prob": [], "logits": [2]}),
    ("CartPole-v1", "mlp", {"action_log_prob": [], "logits": [2]}),
    ("Pendulum-v1", "linear", {"action_log_prob": [], "loc": [1], "scale": [1]}),
    ("Pendulum-v1", "random", {"action_log_prob": []}),
])
def test_batches_carry_the_recorded_keys_with_the_random_frames_fill_values(env, kind, keys):
    w = Workers(spec(env, 2, kind, init_random_frames=10))
    if kind != "random":
        set_weights(w.policy)
    layout = w.layout()
    assert {k: layout[k][1] for k in ("action_log_prob", "logits", "loc", "scale") if k in layout} == keys
    b = w.collect(2 * 30)
    assert set(b) == set(layout)
    for key, shape in keys.items():
        assert b[key].dtype == np.float32 and b[key].shape == (2, 30, *shape)
    lp = b["action_log_prob"]
    uniform = np.float32(-math.log(2) if env == "CartPole-v1" else -math.log(4))
    assert np.array_equal(lp[:, :10], np.full((2, 10), uniform)), "the random policy's density"
    for k in range(2):
        for t in range(30):
            if "logits" in keys:
                z = b["logits"][k, t]
                if t < 10:
                    assert np.array_equal(z, [0, 0]), "the uniform categorical"
                assert lp[k, t] == pytest.approx(softmax_log_prob(z, b["action"][k, t]), abs=1e-5)
            elif "loc" in keys:
                loc, s = b["loc"][k, t], b["scale"][k, t]
                if t < 10:
                    assert np.isnan(loc).all() and np.isnan(s).all()
                else:
                    assert lp[k, t] == pytest.approx(normal_log_prob(b["action"][k, t], loc, s), abs=1e-5)
            else:
                assert lp[k, t] == uniform
    w.close()


def test_a_row_whose_env_raises_keeps_its_records_consistent():
    flaky_env.COUNT[0] = -1
    w = Workers(spec("FlakyCartPole-v0", 3, config={"fail_at": 17}))
    set_weights(w.policy)
    b = w.collect(3 * 30)
    assert w.restart_count == [0, 1, 0]
    for k in range(3):
        for t in range(30):
            want = softmax_log_prob(b["logits"][k, t], b["action"][k, t])
            assert b["action_log_prob"][k, t] == pytest.approx(want, abs=1e-5), (k, t)
    # The logits are the policy's for the recorded observation.
    _, rec = w.policy.act_recording(b["observation"].reshape(-1, 4))
    assert np.array_equal(rec["logits"], b["logits"].reshape(-1, 2))
    w.close()
