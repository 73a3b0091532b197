"""torchrl envs rollout's nodes cannot build from an id (transforms of torchrl's own, a
custom ``EnvBase``) go to Python nodes as a cloudpickle: the collector starts them with
``--allow-pickled-env``, they step the env as torchrl does, and the frames are torchrl's own
``env.rollout`` frames for the same seed and a deterministic actor. What cannot be served
is refused before anything starts, in one sentence saying what to pass."""

import os
import subprocess
import sys
import threading
import warnings

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("torchrl")
cloudpickle = pytest.importorskip("cloudpickle")

from tensordict import TensorDict  # noqa: E402
from tensordict.nn import TensorDictModule  # noqa: E402
from torchrl.data import Categorical, Composite, NonTensor, Unbounded  # noqa: E402
from torchrl.envs import (  # noqa: E402
    CatFrames,
    Compose,
    DoubleToFloat,
    EnvBase,
    ExplorationType,
    GymEnv,
    ObservationNorm,
    RewardSum,
    SerialEnv,
    StepCounter,
    TransformedEnv,
    set_exploration_type,
)
from torchrl.modules import ProbabilisticActor  # noqa: E402

import rollout  # noqa: E402
from conftest import PYTHON_NODE, require_python_node  # noqa: E402

warnings.filterwarnings("ignore")

# The nodes do not import this module (it is not on their path): its functions and classes
# go to them by value, as a training script's (``__main__``) do.
cloudpickle.register_pickle_by_value(sys.modules[__name__])

SEED = 5
T = 120


def pendulum(max_steps=50):
    return TransformedEnv(
        GymEnv("Pendulum-v1"),
        Compose(
            DoubleToFloat(),
            ObservationNorm(loc=torch.tensor([0.0, 0.0, 1.0]), scale=0.5, in_keys=["observation"]),
            CatFrames(N=2, dim=-1, in_keys=["observation"]),
            StepCounter(max_steps=max_steps),
            RewardSum(),
        ),
    )


class Walk(EnvBase):
    """A walk on a line: observation [position, velocity], 3 actions (push left, none,
    right), noise from a generator ``set_seed`` seeds, terminated past 2."""

    def __init__(self):
        super().__init__()
        self.observation_spec = Composite(observation=Unbounded((2,), dtype=torch.float32))
        self.action_spec = Categorical(3)
        self.reward_spec = Unbounded((1,))
        self.full_done_spec = Composite(
            done=Categorical(2, (1,), dtype=torch.bool), terminated=Categorical(2, (1,), dtype=torch.bool)
        )
        self.rng = torch.Generator()

    def _set_seed(self, seed):
        self.rng.manual_seed(int(seed))

    def _reset(self, td):
        self.state = torch.cat([torch.rand((1,), generator=self.rng) - 0.5, torch.zeros(1)])
        return self._out(False)

    def _step(self, td):
        pos, vel = self.state
        vel = 0.9 * vel + 0.2 * (int(td["action"]) - 1) + 0.05 * torch.randn((), generator=self.rng)
        self.state = torch.stack([pos + vel, vel])
        out = self._out(bool(self.state[0].abs() > 2))
        out["reward"] = -self.state[:1].abs()
        return out

    def _out(self, done):
        d = torch.tensor([done])
        return TensorDict({"observation": self.state.clone(), "done": d, "terminated": d.clone()}, [])


def linear(n_in, n_out, weight, bias):
    lin = torch.nn.Linear(n_in, n_out)
    with torch.no_grad():
        lin.weight.copy_(torch.tensor(weight))
        lin.bias.copy_(torch.tensor(bias))
    return lin


def collected(make, actor, envs=2):
    """``envs`` rows of ``T`` frames through rollout, as ``[envs, T]``."""
    with rollout.DistributedCollector(
        create_env_fn=make, policy=actor, frames_per_batch=envs * T, total_frames=envs * T, envs_per_node=envs,
        seed=SEED, exploration_type="deterministic",
    ) as c:
        td = c.next()
        assert c.next() is None
    return td


def torchrl_rows(make, actor, envs=2):
    """torchrl's own: row ``k`` is ``env.rollout`` of an env seeded ``SEED + k`` (the seed
    rollout gives the node's env ``k``), resetting after each episode."""
    rows = []
    for k in range(envs):
        env = make()
        env.set_seed(SEED + k)
        with torch.no_grad(), set_exploration_type(ExplorationType.DETERMINISTIC):
            rows.append(env.rollout(T, actor, break_when_any_done=False))
    return rows


def same_frames(got, rows, keys, atol):
    for k, ref in enumerate(rows):
        for key in keys:
            want, have = ref[key].float(), got[k][key].float()
            assert have.shape == want.shape, (key, have.shape, want.shape)
            diff = (have - want).abs().max().item()
            assert diff <= atol, f"row {k} `{key}` differs by {diff}"


@pytest.fixture(autouse=True)
def python_node():
    require_python_node()


def test_a_transformed_env_of_torchrls_transforms_collects_torchrls_frames():
    actor = TensorDictModule(
        linear(6, 1, [[0.1, -0.2, 0.05, 0.1, 0.02, -0.05]], [0.1]), in_keys=["observation"], out_keys=["action"]
    )
    got = collected(pendulum, actor)
    rows = torchrl_rows(pendulum, actor)
    # The actor runs in onnxruntime on the nodes, in torch here: floats within 1e-4.
    same_frames(got, rows, ["observation", "action", ("next", "observation"), ("next", "reward"), ("next", "episode_reward")], 1e-4)
    same_frames(got, rows, ["step_count", ("next", "truncated"), ("next", "terminated"), ("next", "done")], 0)
    assert got["next", "truncated"].sum() >= 4, "StepCounter(max_steps=50) truncated episodes on the nodes"


def pendulum_short():
    # Another env than pendulum()'s with the same specs (a run's nodes report the same ones).
    return pendulum(max_steps=30)


def test_a_list_gives_each_node_its_own_pickled_env():
    actor = TensorDictModule(
        linear(6, 1, [[0.1, -0.2, 0.05, 0.1, 0.02, -0.05]], [0.1]), in_keys=["observation"], out_keys=["action"]
    )
    with rollout.DistributedCollector(
        create_env_fn=[pendulum, pendulum_short], policy=actor, frames_per_batch=2 * T, total_frames=2 * T,
        sync=True, seed=SEED, exploration_type="deterministic",
    ) as c:
        got = c.next()
    assert got.batch_size == (2, T)
    # Node k's one env is seeded SEED + k (node k starts where node k-1's seeds end).
    rows = []
    for k, make in enumerate([pendulum, pendulum_short]):
        env = make()
        env.set_seed(SEED + k)
        with torch.no_grad():
            rows.append(env.rollout(T, actor, break_when_any_done=False))
    same_frames(got, rows, ["observation", ("next", "reward"), ("next", "episode_reward")], 1e-4)
    same_frames(got, rows, ["step_count", ("next", "truncated")], 0)
    assert got[0]["step_count"].max() == 49 and got[1]["step_count"].max() == 29


def test_a_custom_env_base_collects_torchrls_frames():
    actor = ProbabilisticActor(
        TensorDictModule(linear(2, 3, [[-1.0, -0.5], [0.0, 0.0], [1.0, 0.5]], [0.0, 0.1, 0.0]), in_keys=["observation"], out_keys=["logits"]),
        in_keys=["logits"], distribution_class=torch.distributions.Categorical, spec=Walk().action_spec,
    )
    got = collected(Walk, actor)
    rows = torchrl_rows(Walk, actor)
    same_frames(got, rows, ["observation", ("next", "observation"), ("next", "reward")], 1e-5)
    same_frames(got, rows, ["action", ("next", "terminated"), ("next", "done")], 0)
    assert got["next", "terminated"].any(), "walks end within the batch"


def test_a_checkpoint_is_refused_naming_the_pickled_env_and_the_run_goes_on():
    with rollout.DistributedCollector(create_env_fn=pendulum, policy="random", frames_per_batch=16, total_frames=48, seed=1) as c:
        c.next()
        with pytest.raises(rollout.CollectorError) as e:
            c.state_dict()
        assert "pickled torchrl env cannot be checkpointed" in str(e.value), e.value
        assert c.next() is not None and c.next() is not None and c.next() is None


def test_the_names_and_bounds_are_the_nodes():
    from rollout import _pickled_env
    from rollout_node import torchrl_env

    assert _pickled_env.PICKLED_ENV == torchrl_env.PICKLED_ENV
    assert _pickled_env.MAX_PICKLE_BYTES == torchrl_env.MAX_PICKLE_BYTES
    assert _pickled_env.FLAG == torchrl_env.FLAG


class HoldsALock:
    lock = threading.Lock()

    def __call__(self):
        self.lock  # noqa: B018 - held, so that the callable cannot be pickled
        return pendulum()


class NonTensorObs(Walk):
    def __init__(self):
        super().__init__()
        self.observation_spec = Composite(observation=Unbounded((2,)), label=NonTensor(shape=()))


def refused(**kw):
    kw = {"frames_per_batch": 8, "total_frames": 8, **kw}
    with pytest.raises(rollout.ConfigError) as e:
        rollout.DistributedCollector(**kw)
    msg = str(e.value)
    assert "\n" not in msg, msg
    return e.value.field, msg


@pytest.mark.parametrize(
    "kw, field, says",
    [
        (dict(create_env_fn=HoldsALock()), "create_env_fn", "cannot be pickled"),
        (dict(create_env_fn=lambda: SerialEnv(2, pendulum)), "create_env_fn", "batch_size [2]"),
        (dict(create_env_fn=NonTensorObs), "create_env_fn", "label"),
        (dict(create_env_fn=pendulum, launcher="process"), "create_env_fn", "--allow-pickled-env"),
        (dict(create_env_fn=pendulum, launcher="process", node_command=PYTHON_NODE), "node_command", "--allow-pickled-env"),
        (dict(create_env_fn=pendulum, env_config={"g": 9.8}), "env_config", "leave env_config out"),
        (dict(create_env_fn=pendulum, max_frame=1 << 20), "max_frame", "max_frame"),
    ],
    ids=["unpicklable", "batched", "no-space", "rust-nodes", "flag-missing", "env_config", "max_frame"],
)
def test_what_cannot_be_served_is_refused_before_anything_starts(kw, field, says):
    got, msg = refused(**kw)
    assert got == field and says in msg, msg


def test_an_external_node_without_the_flag_fails_the_run_naming_it():
    token = "pickled-env-test-token-0123456789"
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        addr = f"127.0.0.1:{s.getsockname()[1]}"
    node = subprocess.Popen(
        PYTHON_NODE + ["--join", addr, "--connect-timeout", "60"],
        env=dict(os.environ, ROLLOUT_TOKEN=token), stdin=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )
    try:
        with pytest.raises(rollout.CollectorError) as e:
            with rollout.DistributedCollector(
                create_env_fn=pendulum, frames_per_batch=8, total_frames=8, launcher="external", listen=addr,
                token=token, join_timeout=60.0, batch_timeout=60.0,
            ) as c:
                c.next()
        assert "--allow-pickled-env" in str(e.value), e.value
        _, err = node.communicate(timeout=60)
        assert node.returncode == 1 and "--allow-pickled-env" in err.decode(), err
    finally:
        if node.poll() is None:
            node.kill()
            node.wait()
