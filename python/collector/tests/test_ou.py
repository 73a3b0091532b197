"""DDPG's exploration, torchrl's ``OrnsteinUhlenbeckProcessModule``, as the nodes run it
(PROTOCOL.md §8, Exploration modules): the exporter writes the actor without the module as
the ``deterministic`` head, the module as the config's ``exploration`` and its ``eps`` as a
weight; a Python node running that config draws what torchrl's own module draws from the same
normals, frame by frame, with the ``eps`` of each pushed version; TensorDict batches are laid
out as torchrl's collector lays them out; runs through ``rollout.DistributedCollector`` on
Python nodes keep the OU recursion and reach the annealed ``eps``; what cannot be served is
refused in one sentence."""

import copy
import json
import warnings

import numpy as np
import pytest
from conftest import PYTHON_NODE, require_python_node

torch = pytest.importorskip("torch")
pytest.importorskip("tensordict")
pytest.importorskip("torchrl")
onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")

from tensordict import TensorDict  # noqa: E402
from tensordict.nn import TensorDictModule, TensorDictSequential  # noqa: E402
from torch import nn  # noqa: E402
from torchrl.data import Bounded, OneHot, Unbounded  # noqa: E402
from torchrl.envs import GymEnv, InitTracker, TransformedEnv  # noqa: E402
from torchrl.envs.utils import ExplorationType, set_exploration_type  # noqa: E402
from torchrl.modules import MLP, OrnsteinUhlenbeckProcessModule, QValueActor, SafeModule, SafeSequential, TanhModule  # noqa: E402

import rollout  # noqa: E402
from rollout import _native  # noqa: E402
from rollout._batch import Batch  # noqa: E402
from rollout._tensordict import to_tensordict  # noqa: E402
from rollout._torch import export_policy  # noqa: E402

warnings.filterwarnings("ignore")

PENDULUM = json.loads(_native.builtin_env_specs("Pendulum-v1"))
SPEC = Bounded(-2.0, 2.0, (1,))
OU_KEYS = {"_ou_prev_noise", "_ou_steps"}


def ddpg_actor(seed=0, **ou):
    """torchrl's DDPG example's actor (``make_ddpg_agent``: an MLP to ``param``, a
    ``TanhModule`` to the action spec's bounds) and its exploration, the actor followed by an
    ``OrnsteinUhlenbeckProcessModule``. Returns ``(actor, module, policy)``."""
    torch.manual_seed(seed)
    actor = SafeSequential(
        SafeModule(MLP(in_features=3, out_features=1, num_cells=[16, 16]), in_keys=["observation"], out_keys=["param"]),
        TanhModule(in_keys=["param"], out_keys=["action"], spec=SPEC),
    )
    module = OrnsteinUhlenbeckProcessModule(spec=SPEC, **{"annealing_num_steps": 1000, **ou})
    return actor, module, TensorDictSequential(actor, module)


def deterministic(actor, obs):
    """The actor's own action (no exploration) for ``obs`` (any leading shape)."""
    with torch.no_grad():
        x = torch.as_tensor(np.asarray(obs), dtype=torch.float32)
        return actor(TensorDict({"observation": x.reshape(-1, 3)}, [x.reshape(-1, 3).shape[0]]))["action"].reshape(*x.shape[:-1], 1).numpy()


# ---- the export
def test_torchrls_ddpg_actor_exports_the_actor_as_the_deterministic_head_and_the_module_as_exploration():
    actor, module, policy = ddpg_actor()
    exported = export_policy(policy, PENDULUM)
    config = exported.config()
    model = config.pop("model")
    assert config == {
        "kind": "onnx",
        "head": "deterministic",
        "state": [{"name": "_ou_prev_noise", "shape": [1]}, {"name": "_ou_steps", "shape": [1]}],
        "exploration": {"kind": "ornstein_uhlenbeck", "eps": "module.1.eps", "theta": 0.15, "mu": 0.0, "sigma": 0.2,
                        "sigma_min": None, "n_steps_annealing": 1000, "dt": 0.01, "x0": []},
    }
    proto = onnx.load_from_string(model)
    onnx.checker.check_model(proto, full_check=True)
    assert [o.name for o in proto.graph.output] == ["action", "ou_eps"]
    assert [i.name for i in proto.graph.input] == ["observation"]
    obs = np.random.default_rng(0).normal(size=(5, 3)).astype(np.float32)
    action, eps = ort.InferenceSession(model, providers=["CPUExecutionProvider"]).run(None, {"observation": obs})
    np.testing.assert_allclose(action, deterministic(actor, obs), atol=1e-6)
    assert eps.shape == () and eps == 1.0
    # eps is a weight, by the buffer's state_dict name: the module's annealing is pushed.
    assert exported.weights()["module.1.eps"].shape == () and exported.weights()["module.1.eps"] == 1.0
    module.step(500)
    assert exported.weights()["module.1.eps"] == pytest.approx(0.55, abs=1e-4)  # 500 f32 steps
    assert exported.drop_keys == ("_ou_prev_noise", "_ou_steps", ("next", "_ou_prev_noise"), ("next", "_ou_steps"))


@pytest.mark.parametrize("kwargs, want", [
    ({"sigma_min": 0.05, "n_steps_annealing": 500}, {"sigma_min": 0.05, "n_steps_annealing": 500}),
    ({"sigma_min": 0.2}, {"sigma_min": None}),  # torchrl's m = 0: the same sigma throughout
    ({"sigma": 0.3, "sigma_min": 0.1, "n_steps_annealing": 7, "theta": 0.3, "mu": 0.1, "dt": 0.05},
     {"sigma": 0.3, "sigma_min": 0.1, "n_steps_annealing": 7, "theta": 0.3, "mu": 0.1, "dt": 0.05}),
    ({"x0": 0.25}, {"x0": [0.25]}),
    ({"x0": torch.tensor([0.5])}, {"x0": [0.5]}),
])
def test_the_modules_numbers_are_the_configs(kwargs, want):
    _, module, policy = ddpg_actor(**kwargs)
    got = export_policy(policy, PENDULUM).exploration
    assert {k: got[k] for k in want} == want


def two_dim_policy(**ou):
    spec = Bounded(-1.0, 1.0, (2,))
    actor = TensorDictSequential(
        TensorDictModule(nn.Linear(3, 2), in_keys=["observation"], out_keys=["param"]),
        TanhModule(in_keys=["param"], out_keys=["action"], spec=spec),
    )
    return TensorDictSequential(actor, OrnsteinUhlenbeckProcessModule(spec=spec, **ou))


def test_an_x0_per_action_dimension_is_written_as_it_is_and_one_of_another_shape_refused():
    specs = {"observation": PENDULUM["observation"], "action": {"kind": "box", "shape": [2], "low": [-1.0, -1.0], "high": [1.0, 1.0], "dtype": "f32"}}
    exported = export_policy(two_dim_policy(x0=torch.tensor([0.1, -0.2])), specs)
    assert exported.exploration["x0"] == pytest.approx([0.1, -0.2])
    assert exported.state[-2:] == [("_ou_prev_noise", (2,)), ("_ou_steps", (1,))]
    with pytest.raises(rollout.ConfigError, match=r"x0 is of shape \[3\]: give a number or one value per action dimension \(\[2\]\)"):
        export_policy(two_dim_policy(x0=torch.tensor([0.1, 0.2, 0.3])), specs)


@pytest.mark.parametrize("make, env, says", [
    (lambda: TensorDictSequential(
        QValueActor(MLP(in_features=4, out_features=2, num_cells=[8]), in_keys=["observation"], spec=OneHot(2)),
        OrnsteinUhlenbeckProcessModule(spec=Bounded(-1.0, 1.0, (2,)))), "CartPole-v1", "not to a Q-value actor: use EGreedyModule"),
    (lambda: TensorDictSequential(ddpg_actor()[2], TensorDictModule(nn.Identity(), in_keys=["action"], out_keys=["action"])),
     "Pendulum-v1", "OrnsteinUhlenbeckProcessModule must be the actor's last module"),
    (lambda: TensorDictSequential(ddpg_actor()[0], OrnsteinUhlenbeckProcessModule(spec=SPEC, safe=False)),
     "Pendulum-v1", "with safe=False it does not clip"),
    (lambda: TensorDictSequential(ddpg_actor()[0], OrnsteinUhlenbeckProcessModule(spec=Bounded(-1.0, 1.0, (1,)))),
     "Pendulum-v1", "it clips to its spec's [[-1.0], [1.0]]"),
    (lambda: TensorDictSequential(ddpg_actor()[0], OrnsteinUhlenbeckProcessModule(spec=Unbounded((1,)))),
     "Pendulum-v1", "give the module the env's action spec"),
    (lambda: TensorDictSequential(ddpg_actor()[0], OrnsteinUhlenbeckProcessModule(spec=SPEC, is_init_key="start")),
     "Pendulum-v1", "resets its noise at 'start'"),
    (lambda: TensorDictSequential(ddpg_actor()[0], OrnsteinUhlenbeckProcessModule(spec=SPEC, dt=0.0)),
     "Pendulum-v1", "dt is 0.0: rollout's nodes take dt > 0"),
], ids=["q-values", "not-last", "unsafe", "other-bounds", "unbounded", "is-init-key", "dt-0"])
def test_what_the_nodes_cannot_serve_is_refused_in_one_sentence_when_built(make, env, says):
    with pytest.raises(rollout.ConfigError) as e:
        rollout.DistributedCollector(env, make(), frames_per_batch=10, total_frames=10)
    msg = str(e.value)
    assert e.value.field == "policy" and says in msg and "\n" not in msg, msg


# ---- a Python node running the exported config (in this process, no trainer)
def node(exported, envs=4, exploration="random", max_episode_steps=30):
    """rollout_node's envs and policy for ``exported``'s config, as a trainer's ``welcome`` gives
    them (Pendulum-v1, episodes of ``max_episode_steps``)."""
    collect = pytest.importorskip("rollout_node.collect")
    spec = {
        "index": 0, "env": {"name": "Pendulum-v1", "config": {"max_episode_steps": max_episode_steps}},
        "policy": {"config": exported.config(), "exploration": exploration, "init_seed": 0},
        "envs_per_node": envs, "first_lane": 0, "lanes": envs,
        "rollout": {"frames_per_batch": envs * 10, "max_frames_per_traj": None, "reset_at_each_iter": False,
                    "init_random_frames": 0, "seed": 3, "nan_is_failure": False},
    }
    return collect.Workers(spec)


def test_a_python_node_draws_what_torchrls_module_draws_from_the_same_normals_with_each_pushed_eps(monkeypatch):
    # 4 envs, episodes of 30 steps, 3 batches of 20 steps; eps annealed (module.step) and
    # pushed after the first. torchrl's own policy replays every frame with the node's draws
    # (a copy of its generator), its state carried from its own outputs, zeroed at is_init.
    actor, module, policy = ddpg_actor(seed=1, sigma=0.6, dt=0.05, eps_end=0.2)
    exported = export_policy(policy, PENDULUM)
    w = node(exported)
    E = w.E
    state = {"_ou_prev_noise": torch.zeros(E, 1), "_ou_steps": torch.zeros(E, dtype=torch.int64)}
    starts = 0
    try:
        for batch in range(3):
            if batch == 1:
                module.step(600)  # eps 1 -> 0.52
                w.policy.set_weights(1, exported.weights())
            rng = copy.deepcopy(w.policy.rng)
            b = w.collect(E * 20)
            for t in range(20):
                z = torch.from_numpy(rng.standard_normal((E, 1)).astype(np.float32))
                monkeypatch.setattr(torch, "randn_like", lambda x, z=z: z.to(x.dtype))
                is_init = torch.from_numpy(b["is_init"][:, t])
                for k in state:
                    state[k] = torch.where(is_init.reshape(-1, *[1] * (state[k].dim() - 1)), torch.zeros((), dtype=state[k].dtype), state[k])
                np.testing.assert_array_equal(b["_ou_prev_noise"][:, t], state["_ou_prev_noise"].numpy(), err_msg=f"{batch}, {t}")
                np.testing.assert_array_equal(b["_ou_steps"][:, t, 0], state["_ou_steps"].numpy())
                td = TensorDict({"observation": torch.from_numpy(b["observation"][:, t]), "is_init": is_init, **state}, [E])
                with torch.no_grad(), set_exploration_type(ExplorationType.RANDOM):
                    out = policy(td)
                np.testing.assert_allclose(b["action"][:, t], out["action"].numpy(), atol=1e-5, rtol=0, err_msg=f"{batch}, {t}")
                np.testing.assert_allclose(b["next._ou_prev_noise"][:, t], out["_ou_prev_noise"].numpy(), atol=1e-6, rtol=0)
                np.testing.assert_array_equal(b["next._ou_steps"][:, t, 0], out["_ou_steps"].numpy())
                state = {k: out[k] for k in state}
            starts += int(b["is_init"][:, 1:].sum())
    finally:
        w.close()
    monkeypatch.undo()
    assert module.eps.item() == pytest.approx(0.52, abs=1e-4)
    assert starts > 0, "no episode started inside a batch"


def layout(td):
    """Leaf key -> (dtype, feature shape): the batch dims left out."""
    n = len(td.batch_size)
    return {k: (v.dtype, tuple(v.shape[n:])) for k, v in td.items(include_nested=True, leaves_only=True)}


def torchrl_batch(policy, frames=16):
    """One batch of torchrl's own collector: Pendulum-v1 with InitTracker, the OU actor."""
    from torchrl.collectors import Collector

    c = Collector(TransformedEnv(GymEnv("Pendulum-v1"), InitTracker()), policy, frames_per_batch=frames, total_frames=frames)
    try:
        return next(iter(c))
    finally:
        c.shutdown()


#: What rollout's batches hold beside torchrl's (the step count and the frame's origin), and
#: what torchrl's hold beside rollout's (the actor's intermediate `param`, which the exported
#: model does not give).
OURS_ONLY = {"step_count", ("collector", "weights_version"), ("collector", "node")}
TORCHRL_ONLY = {"param"}


def assert_torchrl_layout(ours, theirs):
    ours, theirs = layout(ours), layout(theirs)
    assert not {k for k in theirs if (k if isinstance(k, str) else k[-1]).startswith("_")}, "torchrl leaves private keys out"
    assert set(ours) - set(theirs) == OURS_ONLY, set(ours) ^ set(theirs)
    assert set(theirs) - set(ours) == TORCHRL_ONLY, set(ours) ^ set(theirs)
    for k in set(theirs) & set(ours):
        assert ours[k] == theirs[k], (k, ours[k], theirs[k])
    assert ours["is_init"] == (torch.bool, (1,)) and ours[("next", "is_init")] == (torch.bool, (1,))


def test_tensordict_batches_of_a_python_node_are_laid_out_as_torchrls_collector_with_init_tracker():
    _, _, policy = ddpg_actor()
    exported = export_policy(policy, PENDULUM)
    w = node(exported, envs=1)
    try:
        raw = {"data": w.collect(16), "batch_size": [1, 16], "index": 0, "node": 0, "weights_version": 0, "weights_versions": [0]}
    finally:
        w.close()
    ours = to_tensordict(Batch(raw), leave_out=exported.drop_keys, is_init=True)
    assert ours.batch_size == (16,)
    assert_torchrl_layout(ours, torchrl_batch(policy))


# ---- runs through rollout.DistributedCollector on Python nodes
def python_nodes(**kw):
    require_python_node()
    return {"launcher": "process", "node_command": PYTHON_NODE, "seed": 5, **kw}


def test_a_run_of_python_nodes_is_laid_out_as_torchrls_collector_with_init_tracker():
    actor, _, policy = ddpg_actor()
    env = lambda: TransformedEnv(GymEnv("Pendulum-v1"), InitTracker())  # noqa: E731
    with rollout.DistributedCollector(create_env_fn=env, policy=policy, frames_per_batch=16, total_frames=16, **python_nodes()) as c:
        td = c.next()
    assert td.batch_size == (16,)
    assert_torchrl_layout(td, torchrl_batch(policy))
    noise = td["action"].numpy() - deterministic(actor, td["observation"].numpy())
    assert (np.abs(noise) > 1e-4).mean() > 0.9, "the nodes add the module's noise"


def frames(batch, key):
    """``key`` of a Batch as ``[rows, T, ...]`` (its nodes and envs as rows)."""
    a = np.asarray(batch[key])
    T = batch.batch_size[-1]
    return a.reshape(-1, T, *a.shape[len(batch.batch_size):])


def nodes_of(kind):
    """The collector's arguments for nodes of ``kind``: the Rust nodes of the default
    launcher (Pendulum-v1 is a built-in env; tract runs the actor) or Python nodes."""
    return {"seed": 5} if kind == "rust" else python_nodes()


@pytest.mark.parametrize("kind", ["python", "rust"])
def test_a_run_keeps_the_ou_recursion_and_reaches_the_annealed_eps(kind):
    # 2 envs, batches of 400 frames, episodes cut at 50: the recorded noise goes on from frame
    # to frame and restarts at each episode, each action is the actor's plus eps times the
    # noise where it is not clipped, and the recursion's residuals are sigma sqrt(dt) times
    # standard normals. module.step(1000) anneals eps 1 -> 0.1; update_policy_weights_()
    # pushes it, and the frames of that version have a tenth of the noise.
    theta, mu, sigma, dt = 0.15, 0.0, 0.5, 0.05
    actor, module, policy = ddpg_actor(seed=2, sigma=sigma, dt=dt, eps_end=0.1)
    with rollout.DistributedCollector(
        "Pendulum-v1", policy, frames_per_batch=400, total_frames=-1, envs_per_node=2, max_frames_per_traj=50,
        tensordict=False, **nodes_of(kind),
    ) as c:
        first = c.next()
        module.step(1000)
        version = c.update_policy_weights_()
        later = next(b for b in iter(c.next, None) if b.weights_version == version)
    scales = []
    for b, eps in ((first, 1.0), (later, 0.1)):
        init = frames(b, "is_init")[..., 0]
        prev, nxt = frames(b, "_ou_prev_noise")[..., 0], frames(b, "next._ou_prev_noise")[..., 0]
        steps, next_steps = frames(b, "_ou_steps")[..., 0], frames(b, "next._ou_steps")[..., 0]
        np.testing.assert_array_equal(init, frames(b, "step_count")[..., 0] == 0)
        assert init[:, 1:].sum() == 2 * 3 and (prev[init] == 0).all() and (steps[init] == 0).all()
        np.testing.assert_array_equal(prev[:, 1:][~init[:, 1:]], nxt[:, :-1][~init[:, 1:]])
        np.testing.assert_array_equal(next_steps, steps + 1)
        action = frames(b, "action")[..., 0]
        a = deterministic(actor, frames(b, "observation"))[..., 0]
        free = np.abs(action) < 2.0
        assert free.mean() > 0.8
        np.testing.assert_allclose(action[free] - a[free], eps * nxt[free], atol=2e-5, rtol=0)
        r = (nxt - prev - theta * (mu - prev) * dt) / (sigma * np.sqrt(dt))
        assert abs(r.mean()) < 0.15 and abs(r.std() - 1) < 0.08, (r.mean(), r.std())  # 800 normals
        scales.append(np.abs(action[free] - a[free]).mean())
    assert scales[1] < 0.2 * scales[0], scales


@pytest.mark.parametrize("kind", ["python", "rust"])
def test_deterministic_exploration_takes_the_actors_own_action_and_holds_the_noise(kind):
    actor, _, policy = ddpg_actor(seed=3)
    with rollout.DistributedCollector(
        "Pendulum-v1", policy, frames_per_batch=100, total_frames=100, tensordict=False, exploration_type="deterministic", **nodes_of(kind),
    ) as c:
        b = c.next()
    np.testing.assert_allclose(frames(b, "action"), deterministic(actor, frames(b, "observation")), atol=1e-6, rtol=0)
    for k in ("_ou_prev_noise", "next._ou_prev_noise", "_ou_steps", "next._ou_steps"):
        assert (frames(b, k) == 0).all(), k
