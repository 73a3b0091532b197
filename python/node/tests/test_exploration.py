"""Ornstein-Uhlenbeck exploration run by the node (PROTOCOL.md §8, Exploration modules; version
7): one step is torchrl's ``OrnsteinUhlenbeckProcessModule`` with the same normal draws; through
the node every frame obeys the recursion from its own generator's draws, the noise restarts at
each episode, ``sigma`` anneals with ``_ou_steps``, ``eps`` comes from the weights of each
version, deterministic exploration and ``init_random_frames`` hold the state, a checkpoint
resumes with the same bytes, and a config the node cannot serve fails it naming the field."""

import copy

import numpy as np
import pytest
import torch
from torch import nn

import onnx_models as om
from conftest import Trainer, node_spec, tensors
from rollout_node import exploration, wire
from rollout_node.collect import Workers
from rollout_node.policy import ActionSpace, PolicyError

EXPLORATION = "spec.policy.config.exploration"
LOW, HIGH = -2.0, 2.0  # Pendulum's action bounds


class Actor(nn.Module):
    """Pendulum's deterministic actor (3 -> 1): ``2 tanh(w x + b)``, or 0 everywhere."""

    def __init__(self, seed=0, zero=False, d=1):
        super().__init__()
        torch.manual_seed(seed)
        self.net = nn.Linear(3, d)
        if zero:
            nn.init.zeros_(self.net.weight)
            nn.init.zeros_(self.net.bias)

    def forward(self, observation):
        return 2.0 * torch.tanh(self.net(observation))

    def act(self, obs):
        with torch.no_grad():
            return self(torch.from_numpy(np.asarray(obs, np.float32))).numpy()


def model(actor, eps=1.0):
    return om.with_eps(om.export(actor, torch.zeros(1, 3), ["action"]), "eps", eps)


def spec(actor, envs=4, eps=1.0, exploration_type="random", max_episode_steps=15, config=None, state=None, **rollout):
    """A node of ``envs`` Pendulum envs (episodes of ``max_episode_steps``), ``actor`` with OU noise."""
    return node_spec(env="Pendulum-v1", envs=envs, config={"max_episode_steps": max_episode_steps}, policy={
        "config": {"kind": "onnx", "model": model(actor, eps), "head": "deterministic",
                   "state": om.ou_state() if state is None else state,
                   "exploration": om.ou_config(**(config or {}))},
        "exploration": exploration_type, "init_seed": 0,
    }, **rollout)


def weights(actor, version, eps):
    t = {k: v.detach().numpy().astype(np.float32).copy() for k, v in actor.state_dict().items()}
    t["eps"] = np.array(eps, np.float32)
    return wire.weights_to_wire(version, t)


# -- one step against torchrl ---------------------------------------------------------------------

def torchrl_step(prev, steps, is_init, action, eps, z, theta, mu, sigma, dt, x0=(), sigma_min=None, n_steps_annealing=1000):
    """torchrl's ``_OrnsteinUhlenbeckProcess.add_sample`` and the module's ``eps``, written out in
    float64 numpy: ``(next noise, action + eps * noise, next steps)``, the action not clipped."""
    if sigma_min is not None:
        m, c, floor = -(sigma - sigma_min) / n_steps_annealing, sigma, sigma_min
    else:
        m, c, floor = 0.0, sigma, sigma
    x0 = np.asarray(x0 if len(x0) else [0.0], np.float64)
    prev = np.where(is_init[:, None], 0.0, prev)
    steps = np.where(is_init[:, None], 0.0, steps)
    p = prev + x0
    noise = p + theta * (mu - p) * dt + np.maximum(m * steps + c, floor) * np.sqrt(dt) * z
    return noise - x0, action + eps * noise, steps + 1


CONFIGS = {
    "defaults": {},
    "annealed": {"sigma": 0.3, "sigma_min": 0.05, "n_steps_annealing": 10, "theta": 0.5, "mu": 0.2, "dt": 0.1},
    "x0 scalar": {"x0": [0.3]},
    "x0 per dim": {"x0": [0.3, -0.1], "sigma_min": 0.5, "n_steps_annealing": 3},
}


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_a_step_is_torchrls_with_the_same_draws(name, monkeypatch):
    config = om.ou_config(**CONFIGS[name])
    d, k = 2, 6
    ou = exploration.OrnsteinUhlenbeck(config, d)
    rng = np.random.default_rng(3)
    prev = rng.normal(size=(k, d)).astype(np.float32)
    steps = np.array([[0], [1], [5], [9], [10], [40]], np.float32)
    is_init = np.array([True, False, False, False, False, True])
    prev[is_init], steps[is_init] = 0, 0  # the node zeroes them before the step
    action = rng.uniform(-1, 1, (k, d)).astype(np.float32)
    z = rng.normal(size=(k, d)).astype(np.float32)
    eps = np.float32(0.7)
    act, nxt, n = ou.step(action, prev, steps, eps, z)
    assert act.dtype == nxt.dtype == n.dtype == np.float32
    want = torchrl_step(prev, steps, is_init, action, eps, z, **{k_: v for k_, v in config.items() if k_ not in ("kind", "eps")})
    for got, w, what in zip((nxt, act, n), want, ("next noise", "action", "steps")):
        np.testing.assert_allclose(got, w, rtol=1e-6, atol=1e-6, err_msg=what)

    # torchrl's own module, its normal draws replaced by the same z: the same f32 numbers.
    tr = pytest.importorskip("torchrl.modules")
    from tensordict import TensorDict
    from torchrl.data import Bounded
    from torchrl.envs.utils import ExplorationType, set_exploration_type

    c = dict(config)
    module = tr.OrnsteinUhlenbeckProcessModule(
        spec=Bounded(-10.0, 10.0, (d,)), eps_init=float(eps), eps_end=float(eps), theta=c["theta"], mu=c["mu"],
        sigma=c["sigma"], dt=c["dt"], x0=torch.tensor(c["x0"]) if c["x0"] else None, sigma_min=c["sigma_min"],
        n_steps_annealing=c["n_steps_annealing"],
    )
    monkeypatch.setattr(torch, "randn_like", lambda t: torch.from_numpy(z).to(t.dtype))
    td = TensorDict({"action": torch.from_numpy(action), "is_init": torch.from_numpy(is_init)[:, None],
                     "_ou_prev_noise": torch.from_numpy(prev), "_ou_steps": torch.from_numpy(steps[:, 0]).long()}, [k])
    with set_exploration_type(ExplorationType.RANDOM):
        out = module(td)
    np.testing.assert_allclose(nxt, out["_ou_prev_noise"].numpy(), rtol=0, atol=1e-6)
    np.testing.assert_allclose(act, out["action"].numpy(), rtol=0, atol=1e-6)
    np.testing.assert_array_equal(n[:, 0], out["_ou_steps"].numpy())


# -- through the node -----------------------------------------------------------------------------

def draws(w, columns):
    """The normal draws the node's next ``columns`` steps take, from a copy of its generator
    (one ``[E, d]`` draw per step when every row steps together)."""
    rng = copy.deepcopy(w.policy.rng)
    return [rng.standard_normal((w.E, 1)) for _ in range(columns)]


def check_frames(b, actor, z, eps, config):
    """Every frame of batch ``b``: the state as read is zero at ``is_init``, the next state
    and the action are the recursion's with the draws ``z`` and the actor's own action."""
    c = {k: v for k, v in om.ou_config(**config).items() if k not in ("kind", "eps")}
    E, T = b["action"].shape[:2]
    init = b["is_init"][..., 0]
    np.testing.assert_array_equal(init, b["step_count"][..., 0] == 0)
    assert (b["_ou_prev_noise"][init] == 0).all() and (b["_ou_steps"][init] == 0).all()
    for t in range(T):
        a = actor.act(b["observation"][:, t])
        nxt, act, n = torchrl_step(b["_ou_prev_noise"][:, t], b["_ou_steps"][:, t], init[:, t], a, eps, z[t], **c)
        np.testing.assert_allclose(b["next._ou_prev_noise"][:, t], nxt, rtol=1e-5, atol=1e-6, err_msg=f"frame {t}")
        np.testing.assert_allclose(b["action"][:, t], np.clip(act, LOW, HIGH), rtol=1e-5, atol=1e-5, err_msg=f"frame {t}")
        np.testing.assert_array_equal(b["next._ou_steps"][:, t], n)
        if t + 1 < T:  # the state a frame reads is the one its env's last frame left
            going_on = ~init[:, t + 1]
            np.testing.assert_array_equal(b["_ou_prev_noise"][going_on, t + 1], b["next._ou_prev_noise"][going_on, t])
            np.testing.assert_array_equal(b["_ou_steps"][going_on, t + 1], b["next._ou_steps"][going_on, t])


def test_every_frame_follows_the_recursion_from_the_nodes_draws_and_restarts_with_each_episode():
    config = CONFIGS["annealed"] | {"x0": [0.05]}
    actor = Actor(seed=1)
    w = Workers(spec(actor, config=config))
    try:
        for _ in range(3):  # 3 batches of 10 steps: episodes of 15 end inside and across them
            z = draws(w, 10)
            check_frames(w.collect(40), actor, z, 1.0, config)
    finally:
        w.close()


def test_with_theta_0_and_dt_1_the_noise_is_a_random_walk_of_step_sd_sigma_times_eps():
    # 16 envs, episodes of 50 steps, 200 steps each: 3,200 increments of sd sigma = 0.05 (the
    # sample sd within 0.003 of it: its own sd is about 0.0006); the actor's action is 0, so
    # each action is eps times the noise wherever it is not clipped.
    actor = Actor(zero=True)
    w = Workers(spec(actor, envs=16, eps=0.5, max_episode_steps=50, config={"theta": 0.0, "dt": 1.0, "sigma": 0.05}))
    try:
        b = w.collect(16 * 200)
    finally:
        w.close()
    steps = b["next._ou_prev_noise"] - b["_ou_prev_noise"]
    assert abs(steps.std() - 0.05) < 0.003, steps.std()
    assert abs(steps.mean()) < 0.003, steps.mean()
    free = np.abs(b["action"]) < HIGH
    np.testing.assert_allclose(b["action"][free], 0.5 * b["next._ou_prev_noise"][free], rtol=1e-6)
    # The walk grows within an episode (sd 0.05 sqrt(n)) and restarts at each one's first frame.
    late = b["step_count"][..., 0] >= 40
    assert abs(b["_ou_prev_noise"][late].std() - 0.05 * np.sqrt(44.5)) < 0.1  # 64 episodes: sd ~0.03
    assert b["is_init"][:, 1:].sum() == 16 * 3 and (b["_ou_prev_noise"][b["is_init"][..., 0]] == 0).all()


def test_sigma_anneals_with_the_episodes_steps():
    # sigma 0.4 -> 0.04 over 9 steps, theta 0, dt 1: the increment of step n has sd
    # max(0.04, 0.4 - 0.04 n); 32 envs x 10 episodes of 20 steps.
    actor = Actor(zero=True)
    config = {"theta": 0.0, "dt": 1.0, "sigma": 0.4, "sigma_min": 0.04, "n_steps_annealing": 9}
    w = Workers(spec(actor, envs=32, max_episode_steps=20, config=config))
    try:
        b = w.collect(32 * 200)
    finally:
        w.close()
    inc = (b["next._ou_prev_noise"] - b["_ou_prev_noise"])[..., 0]
    n = b["_ou_steps"][..., 0]
    np.testing.assert_array_equal(n, b["step_count"][..., 0])  # one noisy step per frame
    for steps, sd in ((0, 0.4), (3, 0.28), (6, 0.16), (12, 0.04), (19, 0.04)):
        got = inc[n == steps].std()
        assert abs(got / sd - 1) < 0.15, (steps, got, sd)  # 320 draws: the ratio's sd is 0.04


def test_eps_is_read_from_the_weights_of_each_version():
    actor = Actor(seed=2)
    config = {"sigma": 0.3}
    w = Workers(spec(actor, eps=1.0, config=config))
    try:
        z = draws(w, 5)
        check_frames(w.collect(20), actor, z, 1.0, config)
        w.policy.set_weights(1, wire.weights_from_wire(weights(actor, 1, 0.25))[1])
        assert w.policy.eps == np.float32(0.25)
        z = draws(w, 5)
        check_frames(w.collect(20), actor, z, 0.25, config)  # the state goes on, the scale is new
    finally:
        w.close()


class Beyond(nn.Module):
    """An actor whose action leaves Pendulum's box: 3 everywhere."""

    def __init__(self):
        super().__init__()
        self.net = nn.Linear(3, 1)
        nn.init.zeros_(self.net.weight)
        nn.init.constant_(self.net.bias, 3.0)

    def forward(self, observation):
        return self.net(observation)


def test_the_noise_is_added_to_the_heads_action_clipped_to_the_box():
    # PROTOCOL.md §8: `a` is the deterministic head's action, 3 clipped to 2; the noisy
    # action is clipped again. (torchrl would add the noise to 3: only for an actor whose
    # action leaves the box, which a TanhModule's does not.)
    s = spec(Actor(), config={"sigma": 2.0, "theta": 0.0})
    s["policy"]["config"]["model"] = model(Beyond())
    w = Workers(s)
    try:
        b = w.collect(80)
    finally:
        w.close()
    noise = b["next._ou_prev_noise"]
    np.testing.assert_allclose(b["action"], np.clip(2.0 + noise, LOW, HIGH), atol=1e-6, rtol=0)
    assert (b["action"] < HIGH).mean() > 0.3, "the noise takes the action back into the box"


def test_deterministic_exploration_adds_no_noise_and_holds_the_state():
    actor = Actor(seed=3)
    w = Workers(spec(actor, exploration_type="deterministic"))
    try:
        b = w.collect(80)
    finally:
        w.close()
    a = actor.act(b["observation"].reshape(-1, 3)).reshape(b["action"].shape)
    np.testing.assert_allclose(b["action"], np.clip(a, LOW, HIGH), rtol=1e-6, atol=1e-6)
    for name in (exploration.NOISE, exploration.STEPS):
        assert (b[name] == 0).all() and (b["next." + name] == 0).all(), name


def test_init_random_frames_hold_the_state():
    actor = Actor(seed=4)
    w = Workers(spec(actor, envs=2, init_random_frames=12))
    try:
        b = w.collect(2 * 20)
    finally:
        w.close()
    for name in (exploration.NOISE, exploration.STEPS):
        assert (b[name][:, :12] == 0).all() and (b["next." + name][:, :12] == 0).all(), name
    # The first frame the model acts reads the zero state and moves it.
    assert (b["_ou_steps"][:, 12] == 0).all() and (b["next._ou_steps"][:, 12] == 1).all()
    assert (b["next._ou_prev_noise"][:, 12] != 0).all()


class RecurrentDeterministic(nn.Module):
    """A GRU step on Pendulum's observation (hidden 4, zeroed at ``is_init``) to ``2 tanh``
    of a linear head: a recurrent deterministic model, its state ``h`` ``[1, 4]``."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(6)
        self.gru = nn.GRUCell(3, 4)
        self.head = nn.Linear(4, 1)

    def forward(self, observation, is_init, h):
        nh = self.gru(observation, (h * (~is_init).float().unsqueeze(-1))[:, 0])
        return 2.0 * torch.tanh(self.head(nh)), nh.unsqueeze(1)

    def export(self):
        ins = {"observation": torch.zeros(2, 3), "is_init": torch.zeros(2, 1, dtype=torch.bool), "h": torch.zeros(2, 1, 4)}
        return om.with_eps(om.export_step(self, ins, ["action", "next.h"]))


def test_a_recurrent_models_state_and_the_modules_are_kept_side_by_side():
    # The model takes `h` alone (the module's tensors, the list's last two, are not its
    # inputs); every frame: the model's action and next `h` from the recorded `h`, the
    # noise's recursion from the node's draws.
    net = RecurrentDeterministic()
    s = spec(Actor(), state=[{"name": "h", "shape": [1, 4]}] + om.ou_state(), config={"sigma": 0.4})
    s["policy"]["config"]["model"] = net.export()
    w = Workers(s)
    try:
        assert [n for n, _ in w.policy.model_state] == ["h"]
        z = draws(w, 20)
        b = w.collect(80)
    finally:
        w.close()
    init = b["is_init"][..., 0]
    assert (b["h"][init] == 0).all() and init[:, 1:].any()
    c = {k: v for k, v in om.ou_config(sigma=0.4).items() if k not in ("kind", "eps")}
    for t in range(20):
        with torch.no_grad():
            a, nh = net(torch.from_numpy(b["observation"][:, t]), torch.from_numpy(b["is_init"][:, t]), torch.from_numpy(b["h"][:, t]))
        np.testing.assert_allclose(b["next.h"][:, t], nh.numpy(), atol=1e-5, rtol=0)
        nxt, act, _ = torchrl_step(b["_ou_prev_noise"][:, t], b["_ou_steps"][:, t], init[:, t], a.numpy(), 1.0, z[t], **c)
        np.testing.assert_allclose(b["next._ou_prev_noise"][:, t], nxt, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(b["action"][:, t], np.clip(act, LOW, HIGH), atol=1e-5, rtol=0)


# -- the spec -------------------------------------------------------------------------------------

@pytest.mark.parametrize("change, reason", [
    ({"kind": "gaussian"}, f"{EXPLORATION}.kind must be one of 'ornstein_uhlenbeck', 'epsilon_greedy', got 'gaussian'"),
    ({"eps": ""}, f"{EXPLORATION}.eps must name the model's f32 initializer holding eps"),
    ({"eps": "nope"}, f"{EXPLORATION}.eps names `nope`, which is not an f32 initializer of the model"),
    ({"eps": "net.bias"}, None),  # one element: a weight of the model may serve as eps
    ({"eps": "net.weight"}, f"{EXPLORATION}.eps names `net.weight`, an initializer of 3 elements, not one"),
    ({"theta": float("nan")}, f"{EXPLORATION}.theta must be a finite number, got nan"),
    ({"mu": "0"}, f"{EXPLORATION}.mu must be a finite number, got '0'"),
    ({"sigma": -0.1}, f"{EXPLORATION}.sigma must be >= 0, got -0.1"),
    ({"sigma": float("inf")}, f"{EXPLORATION}.sigma must be a finite number, got inf"),
    ({"dt": 0.0}, f"{EXPLORATION}.dt must be > 0, got 0.0"),
    ({"dt": True}, f"{EXPLORATION}.dt must be a finite number, got True"),
    ({"sigma_min": -1.0}, f"{EXPLORATION}.sigma_min must be nil or a finite number >= 0, got -1.0"),
    ({"n_steps_annealing": 0}, f"{EXPLORATION}.n_steps_annealing must be an integer >= 1, got 0"),
    ({"n_steps_annealing": 1.5}, f"{EXPLORATION}.n_steps_annealing must be an integer >= 1, got 1.5"),
    ({"x0": [0.1, 0.2]}, f"{EXPLORATION}.x0 has 2 values: give none, one, or one per action dimension (1)"),
    ({"x0": [float("inf")]}, f"{EXPLORATION}.x0 must be an array of finite numbers"),
    ({"x0": 0.1}, f"{EXPLORATION}.x0 must be an array of finite numbers, got 0.1"),
])
def test_a_bad_exploration_config_is_refused_naming_the_field(change, reason):
    s = spec(Actor())
    s["policy"]["config"]["exploration"].update(change)
    if reason is None:
        Workers(s).close()
        return
    with pytest.raises(PolicyError) as e:
        Workers(s)
    assert str(e.value).startswith(reason), str(e.value)


@pytest.mark.parametrize("edit, reason", [
    (lambda s: s["policy"]["config"].update(state=om.ou_state()[:1]),
     "spec.policy.config.state must end with the Ornstein-Uhlenbeck module's `_ou_prev_noise` [1], `_ou_steps` [1], "
     "it lists `_ou_prev_noise` [1]"),
    (lambda s: s["policy"]["config"].update(state=None),
     "spec.policy.config.state must end with the Ornstein-Uhlenbeck module's `_ou_prev_noise` [1], `_ou_steps` [1], "
     "it lists nothing"),
    (lambda s: s["policy"]["config"].update(state=om.ou_state()[::-1]),
     "spec.policy.config.state must end with the Ornstein-Uhlenbeck module's `_ou_prev_noise` [1], `_ou_steps` [1], "
     "it lists `_ou_steps` [1], `_ou_prev_noise` [1]"),
    (lambda s: s["policy"]["config"].update(state=om.ou_state() + [{"name": "h", "shape": [4]}]),
     "spec.policy.config.state must end with the Ornstein-Uhlenbeck module's"),
    (lambda s: s["policy"]["config"].update(state=[{"name": "_ou_prev_noise", "shape": [2]}, om.ou_state()[1]]),
     "spec.policy.config.state must end with the Ornstein-Uhlenbeck module's `_ou_prev_noise` [1], `_ou_steps` [1], "
     "it lists `_ou_prev_noise` [2], `_ou_steps` [1]"),
    (lambda s: s["policy"]["config"].update(head="normal"),
     f"{EXPLORATION}: Ornstein-Uhlenbeck noise follows the `deterministic` head, not 'normal'"),
    (lambda s: s["policy"]["config"].update(exploration=[1]), f"{EXPLORATION} must be a map, got list"),
])
def test_what_the_module_needs_of_the_policy_is_checked_naming_the_field(edit, reason):
    s = spec(Actor())
    edit(s)
    with pytest.raises(PolicyError) as e:
        Workers(s)
    assert str(e.value).startswith(reason), str(e.value)


def test_a_discrete_action_is_refused_naming_the_field():
    from rollout_node.onnx_policy import OnnxPolicy

    config = {"kind": "onnx", "model": model(Actor()), "head": "deterministic", "state": om.ou_state(),
              "exploration": om.ou_config()}
    with pytest.raises(PolicyError, match=f"^{EXPLORATION}: Ornstein-Uhlenbeck noise acts on a box action, the env's is discrete"):
        OnnxPolicy({"config": config}, [], ActionSpace(n=2), 0)


def test_a_bad_config_fails_the_node_in_one_line(trainer):
    s = spec(Actor())
    s["policy"]["config"]["exploration"]["dt"] = -1.0
    trainer.start_node()
    f = trainer.join(s, weights=weights(Actor(), 0, 1.0))
    assert f["type"] == "failed", f
    assert f["reason"] == f"cannot build the node: {EXPLORATION}.dt must be > 0, got -1.0", f["reason"]
    code, err = trainer.finish()
    assert code == 1 and "Traceback" not in err, err


# -- the wire and checkpoints ---------------------------------------------------------------------

def collect(trainer, seq, frames):
    trainer.send({"type": "continue", "seq": seq, "frames": frames})
    b = trainer.recv()
    assert (b["type"], b.get("seq")) == ("batch", seq), b.get("reason", b)
    return b


def stop(trainer):
    trainer.send({"type": "shutdown"})
    assert trainer.recv()["type"] == "down"
    assert trainer.finish()[0] == 0


def test_the_layout_holds_the_state_and_a_restored_snapshot_goes_on_with_the_same_bytes(trainer, tmp_path):
    # Version 8 at hello (conftest checks it); ready.layout and every batch hold is_init and
    # the module's state and next state. New weights (eps 0.5) after batch 2, a snapshot after
    # every batch from 3 on; the one after batch 4 is restored on a new node, which writes the
    # same bytes.
    actor = Actor(seed=5)
    s = spec(actor, config={"sigma": 0.5})
    trainer.start_node()
    ready = trainer.join(s, weights=weights(actor, 0, 1.0))
    assert ready["type"] == "ready", ready
    want = {"is_init": ["bool", [1]], "_ou_prev_noise": ["f32", [1]], "next._ou_prev_noise": ["f32", [1]],
            "_ou_steps": ["f32", [1]], "next._ou_steps": ["f32", [1]]}
    assert {k: ready["layout"][k] for k in want} == want
    assert not set(ready["layout"]) & {"action_log_prob", "loc", "scale"}
    batches, snaps = {}, {}
    for seq in range(1, 10):
        b = collect(trainer, seq, 40)
        assert {k: [t["dtype"], t["shape"][2:]] for k, t in b["data"]["tensors"].items()} == ready["layout"]
        batches[seq] = tensors(b)
        if seq == 2:
            trainer.send({"type": "update_weights", "weights": weights(actor, 1, 0.5)})
            assert trainer.recv()["type"] == "weights_updated"
        if seq >= 3:
            trainer.send({"type": "snapshot", "id": seq})
            snap = trainer.recv()
            assert (snap["type"], snap["id"]) == ("snapshot", seq), snap
            snaps[seq] = snap["state"]
    stop(trainer)

    # Episodes of 15 steps, batches of 10: batch 5 goes on with the episodes of batch 4 (a
    # nonzero noise read at its first frame) and the batches after it start new ones.
    at = 4
    nxt = batches[at + 1]
    assert not nxt["is_init"][:, 0, 0].any() and (nxt["_ou_prev_noise"][:, 0, 0] != 0).all()
    assert all(batches[s_]["is_init"].any() for s_ in (at + 1, at + 3))
    state = snaps[at]
    for worker in state["workers"]:
        assert worker["rollout"]["recurrent"]["names"] == ["_ou_prev_noise", "_ou_steps"]
    other_dir = tmp_path / "other"
    other_dir.mkdir()
    other = Trainer(other_dir)
    try:
        other.start_node()
        other.join(s, weights=weights(actor, 0, 1.0))
        other.send({"type": "restore", **state})
        assert other.recv() == {"type": "restored", "node": 0}
        for seq in range(at + 1, at + 4):
            b = collect(other, seq, 40)
            assert b["weights_version"] == 1
            got = tensors(b)
            assert set(got) == set(batches[seq])
            for k, v in batches[seq].items():
                assert got[k].tobytes() == v.tobytes(), f"batch {seq}, `{k}`"
        stop(other)
    finally:
        other.close()
