"""Q-value actors run by the node (PROTOCOL.md §8, Q-value actors; version 8): the ``onnx``
``qvalue`` head acts greedily (the first argmax of the model's action values) and records the
values and the greedy one's, frame by frame what the torch module computes; the
``epsilon_greedy`` module replaces a row's greedy action by a uniform one with probability
``eps``, read from the weights of each version, from the node's own generator (first draw
``u``, second the index); deterministic exploration stays greedy; ``init_random_frames``
record NaN; a recurrent Q model keeps its state; what the node cannot serve fails it naming
the field."""

import copy

import numpy as np
import pytest
import torch
from torch import nn

import onnx_models as om
from conftest import Trainer, node_spec, tensors
from rollout_node import exploration, wire
from rollout_node.collect import BuildError, Workers
from rollout_node.policy import PolicyError

ENV, OBS, N = "Acrobot-v1", 6, 3  # three actions: a uniform draw is not a coin
EXPLORATION = "spec.policy.config.exploration"
KEYS = {"action_value": ["f32", [N]], "chosen_action_value": ["f32", [1]]}


class QNet(nn.Module):
    """A Q network (Acrobot: 6 -> 3 action values), or one of constant values ``bias``."""

    def __init__(self, seed=0, obs=OBS, n=N, bias=None):
        super().__init__()
        torch.manual_seed(seed)
        self.net = nn.Sequential(nn.Linear(obs, 16), nn.Tanh(), nn.Linear(16, n))
        if bias is not None:
            for p in self.net.parameters():
                nn.init.zeros_(p)
            with torch.no_grad():
                self.net[2].bias.copy_(torch.tensor(bias))

    def forward(self, observation):
        return self.net(observation)

    def q(self, obs):
        """The module's action values of ``obs`` (``[k, obs]``), f32 numpy."""
        with torch.no_grad():
            return self(torch.from_numpy(np.asarray(obs, np.float32))).numpy()


def model(net, eps=0.0, name="eps", outputs=("action_value",), obs=OBS):
    """``net`` exported, with the initializer ``name`` holding ``eps`` read into the output
    ``egreedy_eps`` (what rollout's exporter adds for an ``EGreedyModule``); ``eps`` None: none."""
    m = om.export(net, torch.zeros(1, obs), list(outputs))
    return m if eps is None else om.with_eps(m, name, eps, "egreedy_eps")


def egreedy(eps="eps"):
    return {"kind": "epsilon_greedy", "eps": eps}


def spec(net, envs=4, eps=0.0, exploration_type="random", module=True, env=ENV, **rollout):
    """A node of ``envs`` Acrobot envs acting with ``net``'s Q values, epsilon-greedy (``eps`` in
    the model's weights) unless ``module`` is False."""
    config = {"kind": "onnx", "model": model(net, eps), "head": "qvalue"}
    if module:
        config["exploration"] = egreedy()
    return node_spec(env=env, envs=envs, policy={"config": config, "exploration": exploration_type, "init_seed": 0}, **rollout)


def weights(net, version, eps):
    """``net``'s state_dict and ``eps`` (shape ``[]``) as a weights update."""
    t = {k: v.detach().numpy().astype(np.float32).copy() for k, v in net.state_dict().items()}
    t["eps"] = np.array(eps, np.float32)
    return wire.weights_to_wire(version, t)


def collect(s, frames):
    w = Workers(s)
    try:
        return w.collect(frames)
    finally:
        w.close()


def check_values(b, net):
    """Every frame of batch ``b`` records the module's action values of its observation and
    the value of their first argmax, which torch's argmax picks wherever its two best values
    are apart (float kernels differ in the last bits). Returns the greedy actions ``[E, T]``."""
    av = b["action_value"].reshape(-1, N)
    q = net.q(b["observation"].reshape(-1, OBS))
    np.testing.assert_allclose(av, q, rtol=1e-5, atol=1e-5)
    greedy = np.argmax(av, axis=1)  # numpy's argmax: the first index of the max
    np.testing.assert_array_equal(b["chosen_action_value"].reshape(-1), av[np.arange(len(av)), greedy])
    top = np.sort(q, axis=1)
    clear = top[:, -1] - top[:, -2] > 1e-4
    assert clear.mean() > 0.9, "the test needs Q values whose best one stands out"
    np.testing.assert_array_equal(greedy[clear], q.argmax(axis=1)[clear])
    return greedy.reshape(b["action"].shape)


# -- the head -------------------------------------------------------------------------------------

@pytest.mark.parametrize("exploration_type", ["deterministic", "random"])
def test_without_a_module_the_action_is_the_first_argmax_and_the_records_are_the_models(exploration_type):
    net = QNet(seed=1)
    w = Workers(spec(net, module=False, exploration_type=exploration_type))
    try:
        layout = w.layout()
        b = w.collect(4 * 50)
    finally:
        w.close()
    assert {k: layout[k] for k in KEYS} == KEYS
    assert not set(layout) & {"action_log_prob", "logits", "loc", "scale", "is_init"}
    assert set(b) == set(layout)
    for k, (_, shape) in KEYS.items():
        assert b[k].dtype == np.float32 and b[k].shape == (4, 50, *shape), k
    np.testing.assert_array_equal(b["action"], check_values(b, net))


@pytest.mark.parametrize("bias, want", [([0.5, 0.5, 0.2], 0), ([0.2, 0.7, 0.7], 1), ([0.0, 0.0, 0.0], 0)])
def test_ties_go_to_the_first_index(bias, want):
    net = QNet(bias=bias)
    b = collect(spec(net, envs=2), 2 * 10)  # eps 0: greedy
    assert (b["action"] == want).all()
    np.testing.assert_array_equal(b["chosen_action_value"], np.float32(bias[want]))
    np.testing.assert_array_equal(b["action_value"], np.broadcast_to(np.float32(bias), (2, 10, N)))


# -- epsilon-greedy -------------------------------------------------------------------------------

def test_with_eps_0_every_action_is_greedy():
    net = QNet(seed=2)
    b = collect(spec(net, eps=0.0), 4 * 100)
    np.testing.assert_array_equal(b["action"], check_values(b, net))


def test_with_eps_1_actions_are_uniform_and_the_chosen_value_stays_the_greedy_ones():
    # 8 envs x 500 steps = 4,000 uniform draws over 3 actions: chi-square of 2 degrees of
    # freedom below 13.8 (p = 0.001; the seed is fixed, so the test does not flake); whether
    # the action is the greedy one is independent of it: 1/3 of the frames, within 0.04
    # (its sd is 0.0075).
    net = QNet(seed=3)
    b = collect(spec(net, envs=8, eps=1.0), 8 * 500)
    greedy = check_values(b, net)
    counts = np.bincount(b["action"].reshape(-1), minlength=N)
    expected = b["action"].size / N
    chi2 = ((counts - expected) ** 2 / expected).sum()
    assert chi2 < 13.8, (counts, chi2)
    same = b["action"] == greedy
    assert abs(same.mean() - 1 / 3) < 0.04, same.mean()
    # Where exploration took another action, the chosen value is still the greedy action's.
    av = b["action_value"]
    taken = np.take_along_axis(av, b["action"][..., None], axis=2)
    off = ~same
    assert (taken[off] != b["chosen_action_value"][off]).mean() > 0.99
    np.testing.assert_array_equal(b["chosen_action_value"], np.take_along_axis(av, greedy[..., None], axis=2))


def replay(rng, greedy, eps):
    """The actions the epsilon-greedy module takes from generator ``rng`` for the greedy
    actions ``greedy`` (``[E, T]``, every env stepping together): per step, ``u`` for each
    env, then an index for each env where ``u < eps``, in env order."""
    out = greedy.copy()
    for t in range(greedy.shape[1]):
        u = rng.random(greedy.shape[0])
        explore = u < np.float32(eps)
        out[explore, t] = rng.integers(0, N, size=int(explore.sum()), dtype=np.int64)
    return out


def test_the_draws_are_u_then_the_index_from_the_nodes_generator():
    net = QNet(seed=4)
    w = Workers(spec(net, eps=0.4))
    try:
        rng = copy.deepcopy(w.policy.rng)
        b = w.collect(4 * 60)
    finally:
        w.close()
    greedy = check_values(b, net)
    want = replay(rng, greedy, 0.4)
    np.testing.assert_array_equal(b["action"], want)
    assert (b["action"] != greedy).any()


def test_a_step_takes_the_second_draw_only_where_u_is_below_eps():
    class Scripted:
        """A generator whose draws are given: ``u`` then the indices."""

        def __init__(self, u, idx):
            self.u, self.idx, self.asked = np.array(u), np.array(idx, np.int64), []

        def random(self, k):
            assert k == len(self.u)
            return self.u

        def integers(self, low, high, size, dtype):
            self.asked.append((low, high, size))
            return self.idx[:size]

    module = exploration.EpsilonGreedy(egreedy(), 5)
    rng = Scripted([0.1, 0.5, 0.25, 0.9], [4, 0])
    got = module.step(np.array([1, 1, 1, 1], np.int64), np.float32(0.3), rng)
    np.testing.assert_array_equal(got, [4, 1, 0, 1])  # rows 0 and 2 explore, in row order
    assert rng.asked == [(0, 5, 2)]
    rng = Scripted([0.9, 0.5], [])
    np.testing.assert_array_equal(module.step(np.array([2, 3], np.int64), np.float32(0.0), rng), [2, 3])
    assert rng.asked == []


def test_deterministic_exploration_is_greedy_whatever_eps():
    net = QNet(seed=5)
    b = collect(spec(net, eps=1.0, exploration_type="deterministic"), 4 * 100)
    np.testing.assert_array_equal(b["action"], check_values(b, net))


def test_init_random_frames_record_nan():
    # Each of the 2 workers acts randomly for its first 10 frames: columns 0..9.
    net = QNet(seed=6)
    b = collect(spec(net, envs=2, eps=0.0, init_random_frames=10), 2 * 30)
    for k in KEYS:
        assert np.isnan(b[k][:, :10]).all() and np.isfinite(b[k][:, 10:]).all(), k
    acted = {k: v[:, 10:] for k, v in b.items()}
    np.testing.assert_array_equal(acted["action"], check_values(acted, net))


class RecurrentQ(nn.Module):
    """A GRU step on Acrobot's observation (hidden 4, zeroed at ``is_init``) under a linear
    head giving 3 action values: a recurrent Q model, its state ``h`` ``[1, 4]``."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(7)
        self.gru = nn.GRUCell(OBS, 4)
        self.head = nn.Linear(4, N)

    def forward(self, observation, is_init, h):
        nh = self.gru(observation, (h * (~is_init).float().unsqueeze(-1))[:, 0])
        return self.head(nh) * 10.0, nh.unsqueeze(1)  # spread apart: argmaxes stand out

    def export(self, eps):
        ins = {"observation": torch.zeros(2, OBS), "is_init": torch.zeros(2, 1, dtype=torch.bool), "h": torch.zeros(2, 1, 4)}
        return om.with_eps(om.export_step(self, ins, ["action_value", "next.h"]), "eps", eps, "egreedy_eps")


def test_a_recurrent_q_model_keeps_its_state_and_explores():
    # Episodes of 25 steps (max_frames_per_traj) in batches of 40: the state restarts inside.
    net = RecurrentQ()
    s = spec(QNet(), eps=0.3, max_frames_per_traj=25)
    s["policy"]["config"].update(model=net.export(0.3), state=[{"name": "h", "shape": [1, 4]}])
    w = Workers(s)
    try:
        assert w.policy.model_state == [("h", (1, 4))]
        rng = copy.deepcopy(w.policy.rng)
        b = w.collect(4 * 40)
    finally:
        w.close()
    init = b["is_init"][..., 0]
    assert init[:, 1:].any() and (b["h"][init] == 0).all()
    greedy = np.zeros(b["action"].shape, np.int64)
    for t in range(40):
        with torch.no_grad():
            q, nh = net(torch.from_numpy(b["observation"][:, t]), torch.from_numpy(b["is_init"][:, t]), torch.from_numpy(b["h"][:, t]))
        np.testing.assert_allclose(b["next.h"][:, t], nh.numpy(), atol=1e-5, rtol=0)
        np.testing.assert_allclose(b["action_value"][:, t], q.numpy(), atol=1e-4, rtol=1e-5)
        greedy[:, t] = np.argmax(b["action_value"][:, t], axis=1)
        np.testing.assert_array_equal(greedy[:, t], q.numpy().argmax(axis=1))
        np.testing.assert_array_equal(b["chosen_action_value"][:, t, 0], b["action_value"][np.arange(4), t, greedy[:, t]])
    np.testing.assert_array_equal(b["action"], replay(rng, greedy, 0.3))


# -- the spec -------------------------------------------------------------------------------------

def bad_spec(what):
    """A spec the node cannot serve, and the start of the reason it gives."""
    net = QNet()
    s = spec(net)
    config = s["policy"]["config"]
    if what == "qvalue on a box action":
        s["env"] = {"name": "Pendulum-v1", "config": None}
        config["model"] = model(QNet(obs=3, n=1), obs=3)
        return s, "onnx: the qvalue head needs a discrete action space, the env's is box"
    if what == "after another head":
        config.update(head="categorical", model=model(net, outputs=("logits",)))
        return s, f"{EXPLORATION}: epsilon-greedy exploration follows the `qvalue` head, not 'categorical'"
    if what == "eps missing":
        config["exploration"] = egreedy("nope")
        return s, f"{EXPLORATION}.eps names `nope`, which is not an f32 initializer of the model"
    if what == "eps of 2 elements":
        config["model"] = model(net, eps=[0.1, 0.2])
        return s, f"{EXPLORATION}.eps names `eps`, an initializer of 2 elements, not one"
    if what == "eps not named":
        config["exploration"] = {"kind": "epsilon_greedy"}
        return s, f"{EXPLORATION}.eps must name the model's f32 initializer holding eps, got None"
    if what == "Ornstein-Uhlenbeck after qvalue":
        config["exploration"] = om.ou_config()
        config["state"] = om.ou_state()
        return s, f"{EXPLORATION}: Ornstein-Uhlenbeck noise acts on a box action, the env's is discrete"
    if what == "unknown kind":
        config["exploration"] = {"kind": "boltzmann", "eps": "eps"}
        return s, f"{EXPLORATION}.kind must be one of 'ornstein_uhlenbeck', 'epsilon_greedy', got 'boltzmann'"
    if what == "no output action_value":
        config["model"] = model(net, outputs=("q",))
        return s, "onnx: the qvalue head needs an output `action_value`; the model's are ['q', 'egreedy_eps']"
    if what == "integer action values":
        class Argmax(nn.Module):
            def forward(self, observation):
                return (observation[:, :N] * 100).long()

        config["model"] = om.with_eps(om.export(Argmax(), torch.zeros(1, OBS), ["action_value"]), "eps", 0.0, "egreedy_eps")
        return s, "onnx: model output `action_value` is int64, the qvalue head needs float [K, 3]"
    if what in KEYS:
        config["state"] = [{"name": what, "shape": [1]}]
        return s, f"spec.policy.config.state[0].name `{what}` is a key the batch has already"
    raise AssertionError(what)


@pytest.mark.parametrize("what", [
    "qvalue on a box action", "after another head", "eps missing", "eps of 2 elements", "eps not named",
    "Ornstein-Uhlenbeck after qvalue", "unknown kind", "no output action_value", "integer action values", *KEYS,
])
def test_what_the_node_cannot_serve_is_refused_naming_the_field(what):
    s, reason = bad_spec(what)
    with pytest.raises((PolicyError, BuildError)) as e:  # BuildError: the spec's own check
        Workers(s)
    assert str(e.value).startswith(reason), str(e.value)


def test_eps_may_be_of_shape_1():
    net = QNet(seed=8)
    s = spec(net)
    s["policy"]["config"]["model"] = model(net, eps=[1.0])
    w = Workers(s)
    try:
        assert w.policy.eps == np.float32(1.0)
        b = w.collect(4 * 100)
    finally:
        w.close()
    assert (b["action"] != check_values(b, net)).mean() > 0.5  # eps 1: 2/3 of them


@pytest.mark.parametrize("what", ["qvalue on a box action", "after another head", "eps missing", "eps of 2 elements"])
def test_a_refusal_fails_the_node_in_one_line_naming_the_field(trainer, what):
    s, reason = bad_spec(what)
    trainer.start_node()
    f = trainer.join(s)
    assert f["type"] == "failed", f
    assert f["reason"].startswith(f"cannot build the node: {reason}"), f["reason"]
    assert "\n" not in f["reason"]
    code, err = trainer.finish()
    assert code == 1 and "Traceback" not in err, err


# -- the wire -------------------------------------------------------------------------------------

def batch(trainer, seq, frames):
    trainer.send({"type": "continue", "seq": seq, "frames": frames})
    b = trainer.recv()
    assert (b["type"], b.get("seq")) == ("batch", seq), b.get("reason", b)
    return b


def stop(trainer):
    trainer.send({"type": "shutdown"})
    assert trainer.recv()["type"] == "down"
    assert trainer.finish()[0] == 0


def test_an_update_that_changes_eps_changes_the_exploring_fraction(trainer):
    # Version 8 at hello (conftest checks it). eps 0 (version 0): no frame explores; eps 0.5
    # (version 1, the same network): a frame takes another action than the greedy one with
    # probability 0.5 * 2/3, measured over 1,200 frames within 0.06 (4 sd); eps 0 again
    # (version 2): none.
    net = QNet(seed=9)
    s = spec(net, eps=0.0)
    trainer.start_node()
    ready = trainer.join(s, weights=weights(net, 0, 0.0))
    assert ready["type"] == "ready", ready
    assert {k: ready["layout"][k] for k in KEYS} == KEYS
    assert not set(ready["layout"]) & {"action_log_prob", "logits", "is_init"}

    def fraction(seq, version, batches):
        off = []
        for i in range(batches):
            b = batch(trainer, seq + i, 400)
            assert b["weights_version"] == version
            assert {k: [t["dtype"], t["shape"][2:]] for k, t in b["data"]["tensors"].items()} == ready["layout"]
            t = tensors(b)
            off.append((t["action"] != check_values(t, net)).reshape(-1))
        return np.concatenate(off).mean()

    assert fraction(1, 0, 2) == 0
    trainer.send({"type": "update_weights", "weights": weights(net, 1, 0.5)})
    assert trainer.recv() == {"type": "weights_updated", "node": 0, "version": 1}
    got = fraction(3, 1, 3)
    assert abs(got - 1 / 3) < 0.06, got
    trainer.send({"type": "update_weights", "weights": weights(net, 2, 0.0)})
    assert trainer.recv() == {"type": "weights_updated", "node": 0, "version": 2}
    assert fraction(6, 2, 1) == 0
    stop(trainer)


def test_a_restored_snapshot_explores_with_the_same_draws(trainer, tmp_path):
    # eps 0.5: the batch after a snapshot, collected again by a new node restored from it, has
    # the same bytes (the generator's state is in the snapshot).
    net = QNet(seed=10)
    s = spec(net, eps=0.5)
    trainer.start_node()
    assert trainer.join(s, weights=weights(net, 0, 0.5))["type"] == "ready"
    batch(trainer, 1, 80)
    trainer.send({"type": "snapshot", "id": 1})
    snap = trainer.recv()
    assert (snap["type"], snap["id"]) == ("snapshot", 1), snap
    after = tensors(batch(trainer, 2, 80))
    stop(trainer)
    assert (after["action"] != check_values(after, net)).any()

    other_dir = tmp_path / "other"
    other_dir.mkdir()
    other = Trainer(other_dir)
    try:
        other.start_node()
        assert other.join(s, weights=weights(net, 0, 0.5))["type"] == "ready"
        other.send({"type": "restore", **snap["state"]})
        assert other.recv() == {"type": "restored", "node": 0}
        got = tensors(batch(other, 2, 80))
        assert set(got) == set(after)
        for k, v in after.items():
            assert got[k].tobytes() == v.tobytes(), k
        stop(other)
    finally:
        other.close()
