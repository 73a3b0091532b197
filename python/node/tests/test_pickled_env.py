"""A torchrl env the trainer ships as a cloudpickle (``torchrl_env``): loaded only with
``--allow-pickled-env``, stepped as torchrl steps it. Every batch is checked against torchrl
itself: the env made afresh, ``set_seed`` with the row's seed, ``reset()``, then ``step``
with the recorded actions and ``step_mdp``, as ``env.rollout`` does."""

import base64

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("torchrl")
cloudpickle = pytest.importorskip("cloudpickle")

from tensordict import TensorDict  # noqa: E402
from torchrl.data import Categorical, Composite, OneHot, Unbounded  # noqa: E402
from torchrl.envs import (  # noqa: E402
    CatFrames,
    Compose,
    DoubleToFloat,
    EnvBase,
    GymEnv,
    ObservationNorm,
    StepCounter,
    TransformedEnv,
)
from torchrl.envs.utils import step_mdp  # noqa: E402

from conftest import node_spec, tensors  # noqa: E402
from rollout_node import collect  # noqa: E402
from rollout_node.collect import BuildError, CheckpointError, Workers  # noqa: E402
from rollout_node.torchrl_env import PICKLED_ENV, python_version  # noqa: E402

SEED = 7


def pendulum():
    return TransformedEnv(
        GymEnv("Pendulum-v1"),
        Compose(
            DoubleToFloat(),
            ObservationNorm(loc=torch.tensor([0.0, 0.0, 1.0]), scale=0.5, in_keys=["observation"]),
            CatFrames(N=3, dim=-1, in_keys=["observation"]),
            StepCounter(max_steps=25),
        ),
    )


def cartpole():
    # GymEnv's discrete action is one-hot: the node's index is encoded for it.
    return TransformedEnv(GymEnv("CartPole-v1"), ObservationNorm(loc=0.0, scale=2.0, in_keys=["observation"]))


class TwoKeys(EnvBase):
    """A walk on a line of two observation keys (a dict observation for the node), a
    3-way categorical action, noise from a generator ``set_seed`` seeds, terminated past 2."""

    def __init__(self):
        super().__init__()
        self.observation_spec = Composite(
            position=Unbounded((1,), dtype=torch.float32), velocity=Unbounded((1,), dtype=torch.float64)
        )
        self.action_spec = Categorical(3)
        self.reward_spec = Unbounded((1,))
        self.full_done_spec = Composite(
            done=Categorical(2, (1,), dtype=torch.bool), terminated=Categorical(2, (1,), dtype=torch.bool)
        )
        self.rng = torch.Generator()

    def _set_seed(self, seed):
        self.rng.manual_seed(int(seed))

    def _reset(self, td):
        self.pos = torch.rand((1,), generator=self.rng) - 0.5
        self.vel = torch.zeros((1,), dtype=torch.float64)
        return self._obs(done=False)

    def _step(self, td):
        a = int(td["action"])
        self.vel = 0.9 * self.vel + 0.2 * (a - 1) + 0.05 * torch.randn((1,), generator=self.rng, dtype=torch.float64)
        self.pos = self.pos + self.vel.float()
        out = self._obs(done=bool(self.pos.abs() > 2))
        out["reward"] = -self.pos.abs()
        return out

    def _obs(self, done):
        d = torch.tensor([done])
        return TensorDict({"position": self.pos.clone(), "velocity": self.vel.clone(), "done": d, "terminated": d.clone()}, [])


def config(obj, exclude=(), python=None):
    return {
        "cloudpickle": base64.b64encode(cloudpickle.dumps(obj)).decode(),
        "python": python or python_version(),
        "exclude": list(exclude),
    }


def workers(obj, envs=2, exclude=("step_count",), allowed=True, **rollout):
    w = Workers(node_spec(PICKLED_ENV, envs, config(obj, exclude), policy={"config": {"kind": "random"}}, seed=SEED, **rollout),
                allow_pickled_env=allowed)
    return w


def torchrl_row(make, seed, actions):
    """torchrl's own frames of ``make()`` seeded ``seed`` stepped with ``actions``, as
    ``env.rollout`` steps it (resetting, unseeded, after an episode ends)."""
    env = make()
    env.set_seed(seed)
    td = env.reset()
    frames = []
    for a in actions:
        spec = env.action_spec
        if isinstance(spec, OneHot):
            td["action"] = torch.nn.functional.one_hot(torch.as_tensor(int(a)), spec.space.n).to(spec.dtype)
        else:
            td["action"] = torch.as_tensor(a).to(spec.dtype).reshape(spec.shape)
        out = env.step(td)
        frames.append(out.clone())
        td = step_mdp(out, keep_other=True)
        if bool(out["next", "done"].any()):
            td = env.reset()
    return frames


def check_rows(batch, make, keys):
    """Each row of ``batch`` is torchrl's frames for its seed and actions: ``keys`` maps each
    batch key to torchrl's."""
    E, T = batch["collector.traj_ids"].shape
    for k in range(E):
        frames = torchrl_row(make, SEED + k, batch["action"][k])
        for t, f in enumerate(frames):
            for ours, theirs in keys.items():
                want = f.get(theirs).detach().numpy()
                got = batch[ours][k, t]
                assert np.array_equal(got.reshape(want.shape).astype(want.dtype), want), f"row {k} frame {t} `{ours}`"
            te, tr = bool(f["next", "terminated"].any()), bool(f["next"].get("truncated", torch.zeros(1, dtype=torch.bool)).any())
            assert batch["next.terminated"][k, t, 0] == te and batch["next.truncated"][k, t, 0] == tr, (k, t)
            assert batch["next.done"][k, t, 0] == (te or tr)


def test_a_transformed_gym_env_collects_what_torchrl_steps():
    w = workers(pendulum)
    assert w.specs["observation"]["shape"] == [9] and w.specs["observation"]["dtype"] == "f32"
    b = w.collect(2 * 60)
    check_rows(b, pendulum, {
        "observation": "observation", "next.observation": ("next", "observation"),
        "next.reward": ("next", "reward"), "step_count": "step_count",
    })
    assert b["next.truncated"].sum() >= 4, "StepCounter(max_steps=25) truncates in the env"
    # The episode after a truncation starts a new trajectory at step_count 0.
    assert (b["step_count"][:, 25, 0] == 0).all() and (b["collector.traj_ids"][:, 25] != b["collector.traj_ids"][:, 24]).all()
    w.close()


def test_a_one_hot_action_is_encoded_for_the_env():
    w = workers(cartpole, exclude=())
    assert w.specs["action"] == {"kind": "discrete", "n": 2}
    b = w.collect(2 * 40)
    check_rows(b, cartpole, {"observation": "observation", "next.observation": ("next", "observation"),
                             "next.reward": ("next", "reward")})
    w.close()


def test_an_env_of_several_observation_keys_is_a_dict_observation():
    w = workers(TwoKeys, exclude=())
    assert set(w.specs["observation"]["spaces"]) == {"position", "velocity"}
    b = w.collect(2 * 50)
    assert b["observation.velocity"].dtype == np.float64 and b["observation.position"].dtype == np.float32
    check_rows(b, TwoKeys, {
        "observation.position": "position", "observation.velocity": "velocity",
        "next.observation.position": ("next", "position"), "next.reward": ("next", "reward"),
    })
    assert b["next.terminated"].any(), "some walk ends within 50 steps"
    w.close()


def test_an_env_instance_is_pickled_as_it_is():
    w = workers(pendulum())
    b = w.collect(2 * 30)
    check_rows(b, pendulum, {"observation": "observation", "next.reward": ("next", "reward")})
    w.close()


def test_without_the_flag_the_node_refuses_naming_it():
    with pytest.raises(BuildError) as e:
        workers(pendulum, allowed=False)
    assert "--allow-pickled-env" in str(e.value) and "trainer's code" in str(e.value)


def test_without_the_flag_the_node_process_fails_and_says_so(trainer):
    trainer.start_node()
    trainer.join(node_spec(PICKLED_ENV, 1, config(pendulum), policy={"config": {"kind": "random"}}))
    code, err = trainer.finish()
    assert code == 1 and "--allow-pickled-env" in err, err


def test_with_the_flag_the_node_process_serves_batches(trainer):
    trainer.start_node("--allow-pickled-env")
    ready = trainer.join(node_spec(PICKLED_ENV, 1, config(pendulum, ["step_count"]), policy={"config": {"kind": "random"}}))
    assert ready["type"] == "ready" and ready["specs"]["observation"]["shape"] == [9], ready
    trainer.send({"type": "continue", "seq": 0, "frames": 20})
    batch = trainer.recv()
    assert batch["type"] == "batch", batch
    b = tensors(batch)
    check_rows(b, pendulum, {"observation": "observation", "next.reward": ("next", "reward")})
    trainer.send({"type": "shutdown"})
    assert trainer.recv()["type"] == "down"
    assert trainer.finish()[0] == 0


@pytest.mark.parametrize(
    "cfg, says",
    [
        (dict(python="2.7"), "Python 2.7"),
        (dict(cloudpickle="not base64!"), "base64"),
        (dict(cloudpickle=base64.b64encode(cloudpickle.dumps(42)).decode()), "int"),
        (dict(exclude="step_count"), "exclude"),
    ],
    ids=["python-version", "base64", "not-an-env", "exclude"],
)
def test_a_config_that_is_no_pickled_env_is_refused_in_one_sentence(cfg, says):
    c = {**config(pendulum), **cfg}
    with pytest.raises(BuildError) as e:
        Workers(node_spec(PICKLED_ENV, 1, c, policy={"config": {"kind": "random"}}), allow_pickled_env=True)
    assert says in str(e.value) and "\n" not in str(e.value) and c["cloudpickle"][:40] not in str(e.value), e.value


def test_checkpoints_are_refused_saying_why():
    w = workers(pendulum)
    with pytest.raises(CheckpointError) as e:
        collect.snapshot(w)
    assert "pickled torchrl env" in str(e.value)
    with pytest.raises(CheckpointError):
        collect.restore(w, {"workers": []})
    w.close()


def test_a_run_of_a_pickled_env_replays_by_seed(tmp_path, capsys):
    from rollout_node.replay import main
    from test_replay_by_seed import write

    w = workers(pendulum)
    batches = [w.collect(2 * 30) for _ in range(2)]
    w.close()
    write(tmp_path / "out", batches)
    (tmp_path / "env.pkl").write_bytes(cloudpickle.dumps(pendulum))
    args = [str(tmp_path / "out"), "--pickled-env", str(tmp_path / "env.pkl"), "--seed", str(SEED)]
    assert main(args) == 0
    assert "120 frames replay through the pickled torchrl env by seed" in capsys.readouterr().out
    batches[1]["next.observation"][1, 3, 0] += 0.01
    write(tmp_path / "out", batches)
    assert main(args) == 1
    assert "row 1 frame 33: `next.observation`" in capsys.readouterr().err
