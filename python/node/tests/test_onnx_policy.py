"""The ``onnx`` policy (rollout_node.onnx_policy) on models PyTorch exported: every action
and recorded log-probability is what the torch module and torch.distributions say of the
same observation, in the policy itself and in batches of a node serving a scripted trainer;
weight updates by state_dict name; bad models and bad updates named."""

import gymnasium as gym
import numpy as np
import pytest
import torch

import image_env  # noqa: F401  (registers TinyImage-v0)
import onnx_models as om
from conftest import Trainer, node_spec, tensors
from rollout_node import wire
from rollout_node.onnx_policy import OnnxPolicy
from rollout_node.policy import ActionSpace, PolicyError
from rollout_node import spaces

TOL = 1e-5


def build(model, head, env, exploration="deterministic", seed=0):
    e = gym.make(env)
    specs = spaces.specs(e.observation_space, e.action_space)
    leaves = spaces.leaves(specs["observation"])
    spec = {"config": {"kind": "onnx", "model": model, "head": head}, "exploration": exploration}
    return OnnxPolicy(spec, leaves, ActionSpace.of(e.action_space), seed), e


def observations(env, n, seed=0):
    """``n`` observations of ``env`` visited by random actions."""
    e = gym.make(env)
    o, _ = e.reset(seed=seed)
    e.action_space.seed(seed)
    out = []
    for _ in range(n):
        out.append(o)
        o, _, te, tr, _ = e.step(e.action_space.sample())
        if te or tr:
            o, _ = e.reset()
    return np.stack(out)


CASES = {
    # name: (module factory, head, env, outputs)
    "categorical": (lambda: om.CategoricalMlp(), "categorical", "CartPole-v1", ["logits"]),
    "normal": (lambda: om.GaussianActor(), "normal", "Pendulum-v1", ["loc", "log_std"]),
    "tanh_normal": (lambda: om.TanhNormalActor(), "tanh_normal", "Pendulum-v1", ["loc", "scale"]),
    "image": (lambda: om.ImageCnn(), "categorical", "TinyImage-v0", ["logits"]),
}


def case(name, seed=0):
    make, head, env, outs = CASES[name]
    torch.manual_seed(seed)
    m = make()
    obs = observations(env, 1)
    example = torch.from_numpy(obs) if obs.dtype == np.uint8 else torch.from_numpy(obs).float()
    return m, om.export(m, example, outs), head, env


def check_against_torch(m, head, pol, obs, act, rec):
    """Every action is the module's (mode: exact for discrete, 1e-5 for continuous) and every
    recorded log-probability and parameter is torch's for that action (1e-5)."""
    a = pol.action
    low = None if a.discrete else a.low.astype(np.float64)
    high = None if a.discrete else a.high.astype(np.float64)
    mode, lp, params = om.reference(m, head, obs, act, low, high, at_mode=pol.exploration == "deterministic")
    if pol.exploration == "deterministic":
        if a.discrete:
            assert (act == mode).all()
        else:
            np.testing.assert_allclose(act.reshape(mode.shape), mode, atol=TOL, rtol=0)
    np.testing.assert_allclose(rec["action_log_prob"], lp, atol=TOL, rtol=TOL)
    for key, v in params.items():
        np.testing.assert_allclose(rec[key], v, atol=TOL, rtol=TOL)


@pytest.mark.parametrize("name", sorted(CASES))
@pytest.mark.parametrize("exploration", ["deterministic", "random"])
def test_actions_and_log_probs_are_the_torch_modules(name, exploration):
    m, model, head, env = case(name)
    pol, _ = build(model, head, env, exploration, seed=5)
    obs = observations(env, 64, seed=2)
    act, rec = pol.act_recording(obs)
    check_against_torch(m, head, pol, obs, act, rec)
    if exploration == "random":  # sampled: not always the mode
        mode = om.reference(m, head, obs, act, *(None, None) if pol.action.discrete else (pol.action.low.astype(np.float64), pol.action.high.astype(np.float64)))[0]
        assert not np.allclose(act.reshape(mode.shape), mode)


def test_the_recorded_keys_are_the_heads():
    _, model, _, _ = case("categorical")
    pol, _ = build(model, "categorical", "CartPole-v1")
    assert pol.recorded_layout() == {"action_log_prob": ["f32", []], "logits": ["f32", [2]]}
    _, model, _, _ = case("normal")
    pol, _ = build(model, "normal", "Pendulum-v1")
    assert pol.recorded_layout() == {"action_log_prob": ["f32", []], "loc": ["f32", [1]], "scale": ["f32", [1]]}
    _, rec = pol.act_recording(observations("Pendulum-v1", 3))
    assert {k: (v.dtype, v.shape) for k, v in rec.items()} == {
        "action_log_prob": (np.float32, (3,)), "loc": (np.float32, (3, 1)), "scale": (np.float32, (3, 1))}


def test_a_normal_action_is_clipped_before_its_log_prob_is_taken():
    torch.manual_seed(0)
    m = om.GaussianActor()
    with torch.no_grad():
        m.net[2].bias.fill_(5.0)  # loc far above Pendulum's high of 2
    model = om.export(m, torch.zeros(1, 3), ["loc", "log_std"])
    pol, _ = build(model, "normal", "Pendulum-v1")
    obs = observations("Pendulum-v1", 8)
    act, rec = pol.act_recording(obs)
    assert (act == 2.0).all()
    check_against_torch(m, "normal", pol, obs, act, rec)


def test_a_deterministic_head_gives_the_modules_output():
    torch.manual_seed(0)
    m = om.DeterministicActor()
    model = om.export(m, torch.zeros(1, 3), ["action"])
    pol, _ = build(model, "deterministic", "Pendulum-v1")
    obs = observations("Pendulum-v1", 16)
    act, rec = pol.act_recording(obs)
    with torch.no_grad():
        want = m(torch.from_numpy(obs).float()).numpy()
    np.testing.assert_allclose(act, want, atol=TOL, rtol=0)
    assert pol.recorded_layout() == {} and rec == {}


def test_weights_are_the_state_dict_and_an_update_changes_the_actions():
    m, model, head, env = case("categorical")
    pol, _ = build(model, head, env)
    assert pol.version == 0
    assert pol.layout == {k: tuple(v.shape) for k, v in m.state_dict().items()}
    obs = observations(env, 200, seed=3)
    before = pol.act(obs)
    om.perturb(m, 1)
    version, tensors_ = wire.weights_from_wire(om.state_weights(m, 4))
    pol.set_weights(version, tensors_)
    after, rec = pol.act_recording(obs)
    assert pol.version == 4 and (before != after).any()
    check_against_torch(m, head, pol, obs, after, rec)


def test_an_update_naming_an_unknown_tensor_or_of_a_wrong_shape_is_refused_naming_it():
    m, model, head, env = case("categorical")
    pol, _ = build(model, head, env)
    good = {k: v.detach().numpy().copy() for k, v in m.state_dict().items()}
    obs = observations(env, 10)
    before = pol.act(obs)
    bad = dict(good, **{"net.9.weight": np.zeros((2, 2), np.float32)})
    with pytest.raises(PolicyError, match=r"unexpected tensor `net\.9\.weight`"):
        pol.set_weights(1, bad)
    bad = dict(good, **{"net.2.weight": np.zeros((3, 32), np.float32)})
    with pytest.raises(PolicyError, match=r"`net\.2\.weight` must be f32 \[32, 32\]"):
        pol.set_weights(1, bad)
    bad = dict(good)
    del bad["net.0.bias"]
    with pytest.raises(PolicyError, match=r"missing tensor `net\.0\.bias`"):
        pol.set_weights(1, bad)
    assert pol.version == 0 and (pol.act(obs) == before).all()  # nothing changed


def test_bad_models_are_refused_naming_what_is_wrong():
    with pytest.raises(PolicyError, match="not an ONNX model"):
        build(b"certainly not onnx", "categorical", "CartPole-v1")
    _, model, _, _ = case("categorical")
    with pytest.raises(PolicyError, match="head must be one of"):
        build(model, "beta", "CartPole-v1")
    with pytest.raises(PolicyError, match="needs a box action"):
        build(model, "normal", "CartPole-v1")
    # A discrete env of another observation size (the head fits: its refusal comes first).
    with pytest.raises(PolicyError, match=r"input `observation` is \[batch, 4\], the observation `observation` is \[K, 6\]"):
        build(model, "categorical", "Acrobot-v1")
    _, gauss, _, _ = case("normal")
    with pytest.raises(PolicyError, match="needs a discrete action"):
        build(gauss, "categorical", "Pendulum-v1")
    m = om.GaussianActor()
    only_loc = om.export(torch.nn.Sequential(m.net), torch.zeros(1, 3), ["loc"])
    with pytest.raises(PolicyError, match="one output `scale` or `log_std`"):
        build(only_loc, "normal", "Pendulum-v1")
    # A model whose logits are not the action space's size: named at its first step.
    pol, _ = build(model, "categorical", "CartPole-v1")
    pol.action = ActionSpace(n=3)
    with pytest.raises(PolicyError, match=r"output `logits` is \[2, 2\], the categorical head needs \[2, 3\]"):
        pol.act(observations("CartPole-v1", 2))


def test_a_uint8_image_stays_uint8_for_a_uint8_input():
    m, model, head, env = case("image")
    pol, _ = build(model, head, env)
    assert pol._feeds == [("observation", 0, None)]


class DictActor(torch.nn.Module):
    """Logits of 3 actions from two leaves of a dict observation: an f64 vector (a float
    input: cast by the node) and a u8 image (a u8 input: kept)."""

    def __init__(self):
        super().__init__()
        self.pos = torch.nn.Linear(2, 3)
        self.img = torch.nn.Linear(16, 3)

    def forward(self, pos, img):
        return self.pos(pos) + self.img(img.flatten(1).float())


def test_a_dict_observation_feeds_one_input_per_leaf_by_its_key():
    import io

    import spaces_env  # noqa: F401  (registers DictSpaces-v0)

    torch.manual_seed(0)
    m = DictActor()
    f = io.BytesIO()
    torch.onnx.export(m, (torch.zeros(1, 2), torch.zeros(1, 4, 4, dtype=torch.uint8)), f,
                      input_names=["observation.pos", "observation.inner.img"], output_names=["logits"],
                      dynamic_axes={"observation.pos": {0: "b"}, "observation.inner.img": {0: "b"}, "logits": {0: "b"}},
                      dynamo=False, do_constant_folding=False)
    e = gym.make("DictSpaces-v0", action="discrete")
    specs = spaces.specs(e.observation_space, e.action_space)
    leaves = spaces.leaves(specs["observation"])
    spec = {"config": {"kind": "onnx", "model": f.getvalue(), "head": "categorical"}, "exploration": "deterministic"}
    pol = OnnxPolicy(spec, leaves, ActionSpace.of(e.action_space), 0)
    obs = []
    o, _ = e.reset(seed=1)
    for _ in range(30):
        obs.append(o)
        o, _, te, tr, _ = e.step(e.action_space.sample())
        if te or tr:
            o, _ = e.reset()
    cur = [np.stack([leaf.get(x) for x in obs]).astype(leaf.np) for leaf in leaves]
    act, rec = pol.act_recording(cur)
    pos = torch.from_numpy(np.stack([x["pos"] for x in obs])).float()
    img = torch.from_numpy(np.stack([x["inner"]["img"] for x in obs]))
    with torch.no_grad():
        z = m(pos, img).double()
    assert (act == z.argmax(-1).numpy() - 1).all()  # Discrete(3, start=-1)
    lp = torch.distributions.Categorical(logits=z).log_prob(torch.from_numpy(act + 1)).numpy()
    np.testing.assert_allclose(rec["action_log_prob"], lp, atol=TOL, rtol=TOL)


def onnx_spec(model, head, exploration="deterministic", env="CartPole-v1", **rollout):
    return node_spec(policy={"config": {"kind": "onnx", "model": model, "head": head},
                                 "exploration": exploration, "init_seed": 0}, env=env, **rollout)


@pytest.mark.parametrize("name", sorted(CASES))
def test_a_node_records_the_modules_actions_and_log_probs_and_an_update_takes_effect_from_its_version(trainer, name):
    m, model, head, env = case(name)
    trainer.start_node("--import", "image_env")
    ready = trainer.join(onnx_spec(model, head, env=env, max_frames_per_traj=30), weights=om.state_weights(m, 0))
    assert ready["type"] == "ready", ready
    a = ActionSpace.of(gym.make(env).action_space)
    for key, (dtype, shape) in {"action_log_prob": ("f32", []), **({"logits": ("f32", [a.n])} if head == "categorical" else {"loc": ("f32", [1]), "scale": ("f32", [1])})}.items():
        assert ready["layout"][key] == [dtype, shape]
    probe = OnnxPolicy({"config": {"kind": "onnx", "model": model, "head": head}, "exploration": "deterministic"},
                       spaces.leaves(ready["specs"]["observation"]), a, 0)

    def batch(seq, version):
        trainer.send({"type": "continue", "seq": seq, "frames": 40})
        b = trainer.recv()
        assert (b["type"], b["seq"], b["weights_version"]) == ("batch", seq, version), b.get("reason", b["type"])
        t = tensors(b)
        obs = t["observation"].reshape((-1,) + t["observation"].shape[2:])
        act = t["action"].reshape((-1,) + t["action"].shape[2:])
        rec = {k: t[k].reshape((-1,) + t[k].shape[2:]) for k in probe.recorded_layout()}
        check_against_torch(m, head, probe, obs, act, rec)
        return obs, act

    batch(1, 0)
    obs, old = batch(2, 0)
    om.perturb(m, 7)
    trainer.send({"type": "update_weights", "weights": om.state_weights(m, 1)})
    assert trainer.recv() == {"type": "weights_updated", "node": 0, "version": 1}
    batch(3, 1)  # checked against the perturbed module
    # The old weights' actions on the same observations differ: the update took effect.
    probe_old = probe.act(obs)
    assert (probe_old == old).all()
    version, ts = wire.weights_from_wire(om.state_weights(m, 1))
    probe.set_weights(version, ts)
    assert (probe.act(obs) != old).any()
    trainer.send({"type": "shutdown"})
    assert trainer.recv()["type"] == "down"
    assert trainer.finish()[0] == 0


def test_init_random_frames_record_the_uniform_log_density_and_zero_logits(trainer):
    m, model, head, env = case("categorical")
    trainer.start_node()
    trainer.join(onnx_spec(model, head, init_random_frames=10), weights=om.state_weights(m, 0))
    trainer.send({"type": "continue", "seq": 1, "frames": 40})
    t = tensors(trainer.recv())
    # Each of the 2 workers acts randomly for its first 10 frames: columns 0..9.
    random = np.zeros((2, 20), bool)
    random[:, :10] = True
    np.testing.assert_array_equal(t["action_log_prob"][random], np.float32(-np.log(2)))
    assert (t["logits"][random] == 0).all()
    obs, act = t["observation"][~random], t["action"][~random]
    rec = {k: t[k][~random] for k in ("action_log_prob", "logits")}
    pol, _ = build(model, head, env)
    check_against_torch(m, head, pol, obs, act, rec)
    trainer.send({"type": "shutdown"})
    assert trainer.recv()["type"] == "down"


def test_a_model_that_is_not_onnx_fails_the_node_naming_the_policy(trainer):
    trainer.start_node()
    ready = trainer.join(onnx_spec(b"\x00 not a model", "categorical"))
    assert ready["type"] == "failed"
    assert "cannot build the node" in ready["reason"] and "not an ONNX model" in ready["reason"]
    assert trainer.finish()[0] == 1


@pytest.mark.parametrize("bad, named", [
    ({"net.7.weight": np.zeros((2, 2), np.float32)}, r"unexpected tensor `net.7.weight`"),
    ({"net.4.weight": np.zeros((2, 31), np.float32)}, r"`net.4.weight` must be f32 [2, 32]"),
])
def test_an_update_naming_an_unknown_tensor_or_a_wrong_shape_fails_the_node_naming_it(trainer, bad, named):
    m, model, head, _ = case("categorical")
    trainer.start_node()
    trainer.join(onnx_spec(model, head), weights=om.state_weights(m, 0))
    ts = {k: v.detach().numpy().copy() for k, v in m.state_dict().items()}
    ts.update(bad)
    trainer.send({"type": "update_weights", "weights": wire.weights_to_wire(1, ts)})
    f = trainer.recv()
    assert f["type"] == "failed" and named in f["reason"], f
    assert trainer.finish()[0] == 1


def test_without_onnxruntime_the_policy_says_which_extra_to_install(monkeypatch):
    _, model, head, env = case("categorical")
    monkeypatch.setitem(__import__("sys").modules, "onnxruntime", None)  # import fails
    with pytest.raises(PolicyError, match=r"needs onnx and onnxruntime: pip install 'rollout-node\[onnx\]'"):
        build(model, head, env)


def test_the_only_input_may_have_any_name_and_an_extra_input_is_named():
    import io

    torch.manual_seed(0)
    m = om.CategoricalMlp()
    f = io.BytesIO()
    torch.onnx.export(m, (torch.zeros(1, 4),), f, input_names=["obs"], output_names=["out"],
                      dynamic_axes={"obs": {0: "b"}, "out": {0: "b"}}, dynamo=False, do_constant_folding=False)
    pol, _ = build(f.getvalue(), "categorical", "CartPole-v1")
    obs = observations("CartPole-v1", 20)
    check_against_torch(m, "categorical", pol, obs, *pol.act_recording(obs))

    class TwoInputs(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.m = m

        def forward(self, observation, mask):
            return self.m(observation) + mask

    f = io.BytesIO()
    torch.onnx.export(TwoInputs(), (torch.zeros(1, 4), torch.zeros(1, 2)), f, input_names=["observation", "mask"],
                      output_names=["logits"], dynamo=False, do_constant_folding=False)
    with pytest.raises(PolicyError, match=r"model input `mask` is not an observation key \(they are \['observation'\]\)"):
        build(f.getvalue(), "categorical", "CartPole-v1")


def test_a_row_collected_again_after_its_env_failed_keeps_its_recordings_frame_by_frame(trainer):
    # Env 0 raises at its 5th step: its row starts over, acting randomly again for its first
    # 3 frames while the other rows act with the model (random and model rows in one call).
    m, model, head, _ = case("categorical")
    trainer.start_node("--import", "flaky_env")
    spec = onnx_spec(model, head, env="FlakyCartPole-v0", init_random_frames=3)
    spec["env"]["config"] = {"fail_at": 5}
    spec["envs_per_node"] = spec["lanes"] = 3
    ready = trainer.join(spec, weights=om.state_weights(m, 0))
    assert ready["type"] == "ready", ready
    trainer.send({"type": "continue", "seq": 1, "frames": 60})
    b = trainer.recv()
    assert b["type"] == "batch", b
    t = tensors(b)
    # Row 0 started over from its restart seed, not from its first reset's (seed 7).
    assert (t["observation"][0, 0] != gym.make("CartPole-v1").reset(seed=7)[0]).any()
    assert (t["observation"][1, 0] == gym.make("CartPole-v1").reset(seed=8)[0]).all()
    random = np.zeros((3, 20), bool)
    random[:, :3] = True
    assert (t["logits"][random] == 0).all() and (t["action_log_prob"][random] == np.float32(-np.log(2))).all()
    pol, _ = build(model, head, "CartPole-v1")
    rec = {k: t[k][~random] for k in ("action_log_prob", "logits")}
    check_against_torch(m, head, pol, t["observation"][~random], t["action"][~random], rec)
    trainer.send({"type": "shutdown"})
    assert trainer.recv()["type"] == "down"


def test_a_snapshot_restored_on_a_new_node_samples_the_same_next_batch_with_the_states_weights(trainer, tmp_path):
    m, model, head, _ = case("categorical")
    spec = onnx_spec(model, head, exploration="random")
    trainer.start_node()
    trainer.join(spec, weights=om.state_weights(m, 0))
    learned = __import__("copy").deepcopy(m)
    om.perturb(learned, 3)
    trainer.send({"type": "update_weights", "weights": om.state_weights(learned, 2)})
    assert trainer.recv()["type"] == "weights_updated"
    trainer.send({"type": "continue", "seq": 1, "frames": 40})
    assert trainer.recv()["type"] == "batch"
    trainer.send({"type": "snapshot", "id": 3})
    snap = trainer.recv()
    assert (snap["type"], snap["id"]) == ("snapshot", 3), snap
    trainer.send({"type": "continue", "seq": 2, "frames": 40})
    expected = tensors(trainer.recv())
    trainer.send({"type": "shutdown"})
    assert trainer.recv()["type"] == "down"

    other_dir = tmp_path / "other"
    other_dir.mkdir()
    other = Trainer(other_dir)
    try:
        other.start_node()
        other.join(spec, weights=om.state_weights(m, 0))  # the state's weights win
        other.send({"type": "restore", **snap["state"]})
        assert other.recv() == {"type": "restored", "node": 0}
        other.send({"type": "continue", "seq": 1, "frames": 40})
        b = other.recv()
        assert b.get("weights_version") == 2, b
        got = tensors(b)
        assert set(got) >= {"action_log_prob", "logits"}
        for k in expected:
            assert np.array_equal(got[k], expected[k]), k
        other.send({"type": "shutdown"})
        assert other.recv()["type"] == "down"
    finally:
        other.close()
