"""torchrl's forms of ``create_env_fn``: an id, a callable, an ``EnvCreator``, a
``GymEnv``, a ``TransformedEnv``, a list of them. Each form that names an env the
nodes build collects exactly what the id collects; any other torchrl env goes to
Python nodes pickled (tests/test_pickled_env.py); what is no env is refused before
anything starts, in one sentence saying what to pass."""

import warnings

import numpy as np
import pytest

pytest.importorskip("torch")
pytest.importorskip("torchrl")

from torchrl.envs import Compose, EnvCreator, GymEnv, RewardSum, StepCounter, TransformedEnv  # noqa: E402

import rollout  # noqa: E402

warnings.filterwarnings("ignore")


def first_batch(create_env_fn, **kw):
    kw = {"frames_per_batch": 64, "total_frames": 64, "seed": 11, "tensordict": False, **kw}
    with rollout.DistributedCollector(create_env_fn=create_env_fn, **kw) as c:
        b = c.next()
        return {k: np.array(v) for k, v in b.items(include_nested=True, leaves_only=True)}


def same(a, b):
    assert a.keys() == b.keys()
    for k in a:
        np.testing.assert_array_equal(a[k], b[k], err_msg=str(k))


def make_cartpole():
    return GymEnv("CartPole-v1")


@pytest.mark.parametrize(
    "form",
    [
        GymEnv("CartPole-v1"),
        make_cartpole,
        lambda: GymEnv("CartPole-v1"),
        EnvCreator(make_cartpole),
        TransformedEnv(GymEnv("CartPole-v1"), StepCounter()),
        TransformedEnv(GymEnv("CartPole-v1"), Compose(StepCounter())),
        [make_cartpole],
    ],
    ids=["GymEnv", "function", "lambda", "EnvCreator", "TransformedEnv-StepCounter", "Compose", "list"],
)
def test_a_form_naming_an_env_collects_what_its_id_collects(form):
    same(first_batch(form), first_batch("CartPole-v1"))


def test_gym_make_keyword_arguments_go_to_the_nodes():
    # CartPole's episodes end by max_episode_steps: 20 at most here, against longer ones
    # of the same run without it.
    kw = {"total_frames": 400, "frames_per_batch": 400}
    assert first_batch(GymEnv("CartPole-v1"), **kw)["step_count"].max() > 20
    assert first_batch(GymEnv("CartPole-v1", max_episode_steps=20), **kw)["step_count"].max() <= 20


def test_a_list_gives_one_env_per_node_and_must_match_nodes():
    b = first_batch([make_cartpole, make_cartpole], sync=True, frames_per_batch=64)
    assert b["observation"].shape[:2] == (2, 1)
    with pytest.raises(rollout.ConfigError) as e:
        first_batch([make_cartpole, make_cartpole], nodes=3)
    assert e.value.field == "create_env_fn" and "one per node" in str(e.value)


class NotAnEnv:
    pass


@pytest.mark.parametrize(
    "form, says",
    [
        (lambda: NotAnEnv(), "NotAnEnv"),
        (lambda: 1 / 0, "ZeroDivisionError"),
        (42, "int"),
        ([], "empty"),
    ],
    ids=["not-an-env", "raises", "int", "empty-list"],
)
def test_a_form_the_nodes_cannot_build_is_refused_in_one_sentence_before_anything_starts(form, says):
    with pytest.raises(rollout.ConfigError) as e:
        first_batch(form)
    msg = str(e.value)
    assert e.value.field == "create_env_fn" and says in msg and "\n" not in msg, msg


def test_a_form_not_named_by_an_id_goes_to_python_nodes_pickled():
    # torchrl's frame_skip, a StepCounter limit, a RewardSum of its own keys: done by the
    # env itself on Python nodes (tests/test_pickled_env.py checks the frames in full).
    from rollout._env_forms import resolve
    from rollout._pickled_env import PICKLED_ENV

    skip = GymEnv("CartPole-v1", frame_skip=2)
    assert resolve(skip)[0] == PICKLED_ENV
    b = first_batch(skip)
    assert (b["next", "reward"][~b["next", "done"]] == 2.0).all(), "two frames' reward per step"
    b = first_batch(TransformedEnv(GymEnv("CartPole-v1"), StepCounter(max_steps=10)))
    assert b["step_count"].max() == 9 and b["next", "truncated"][b["step_count"] == 9].all()
    b = first_batch(TransformedEnv(GymEnv("CartPole-v1"), RewardSum(in_keys=["reward"], out_keys=["ret"])), policy="random")
    assert ("observation", "ret") in b and ("observation", "observation") in b, "a dict observation"


@pytest.mark.parametrize("sync", [False, True])
def test_reward_sum_is_the_episodes_running_return_across_batches(sync):
    # Pendulum's episodes (200 steps) span several 64-frame batches: each frame's
    # ("next", "episode_reward") is the sum of its trajectory's rewards so far, wherever
    # the batches cut it, and the root entry the same before the step (0 at a start).
    import torch

    env = TransformedEnv(GymEnv("Pendulum-v1"), Compose(StepCounter(), RewardSum()))
    sums = {}
    with rollout.DistributedCollector(create_env_fn=env, frames_per_batch=128, total_frames=128 * 8, nodes=2, sync=sync, seed=3) as c:
        for td in c:
            flat = td.reshape(-1)
            for i in range(flat.numel()):
                traj = int(flat["collector", "traj_ids"][i])
                before = sums.get(traj, 0.0)
                reward = float(flat["next", "reward"][i])
                assert abs(float(flat["episode_reward"][i]) - before) < 1e-3, (traj, i)
                sums[traj] = before + reward
                assert abs(float(flat["next", "episode_reward"][i]) - sums[traj]) < 1e-3, (traj, i)
            starts = flat["step_count"].squeeze(-1) == 0
            assert (flat["episode_reward"][starts] == 0).all()
            assert flat["episode_reward"].dtype == torch.float32 and flat["episode_reward"].shape == flat["next", "reward"].shape
    assert len(sums) >= 4, "episodes across batches"


def test_reward_sum_needs_tensordict_batches():
    env = TransformedEnv(GymEnv("CartPole-v1"), RewardSum())
    with pytest.raises(rollout.ConfigError) as e:
        rollout.DistributedCollector(create_env_fn=env, frames_per_batch=8, total_frames=8, tensordict=False)
    assert e.value.field == "tensordict", e.value
