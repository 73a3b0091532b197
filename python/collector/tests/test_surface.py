"""torchrl's collector surface on ``rollout.DistributedCollector``: ``len()``,
``frames_per_batch``, ``total_frames``, ``policy``, ``reset()``, ``state_dict`` /
``load_state_dict``, and what is readable after the run is shut down."""

import numpy as np
import pytest

import rollout


def counting(**kw):
    """The Counting env (the observation counts the steps of the episode) with episodes
    far longer than any batch here, stepped by a constant action of 1."""
    kw.setdefault("total_frames", -1)
    kw.setdefault("seed", 5)
    return rollout.DistributedCollector(
        "Counting", {"kind": "constant", "value": 1.0}, env_config={"max_steps": 100_000}, **kw
    )


def per_env(batch, key, envs):
    """``batch[key]`` as ``[envs, T]`` (the sync stack and a trailing 1 folded)."""
    a = np.asarray(batch[key])
    return a.reshape(envs, -1)


def test_len_is_torchrls_number_of_batches_and_iteration_yields_that_many():
    with rollout.DistributedCollector("CartPole-v1", "linear", frames_per_batch=300, total_frames=1000, seed=1) as c:
        assert len(c) == 4, "ceil(1000 / 300): the last batch is shorter"
        batches = list(c)
    assert len(batches) == 4
    assert [b.numel() for b in batches] == [300, 300, 300, 100]
    with rollout.DistributedCollector("CartPole-v1", frames_per_batch=250, total_frames=1000, seed=1) as c:
        assert len(c) == 4, "an exact multiple"


def test_an_endless_run_has_no_length_as_in_torchrl_and_is_still_true():
    with rollout.DistributedCollector("CartPole-v1", frames_per_batch=100, seed=1) as c:
        with pytest.raises(RuntimeError, match="Non-terminating collectors do not have a length"):
            len(c)
        assert c, "truth does not ask for a length"
        assert c.next() is not None


def test_frames_per_batch_and_total_frames_are_the_runs_and_outlive_it():
    with rollout.DistributedCollector("CartPole-v1", nodes=2, frames_per_batch=200, total_frames=1000, seed=1) as c:
        assert (c.frames_per_batch, c.total_frames) == (200, 1000)
    assert (c.frames_per_batch, c.total_frames, len(c)) == (200, 1000, 5)
    with rollout.DistributedCollector("CartPole-v1", frames_per_batch=64, seed=1) as c:
        assert (c.frames_per_batch, c.total_frames) == (64, -1), "endless: torchrl's -1"


@pytest.mark.parametrize("policy", [None, "linear", {"kind": "mlp", "hidden": [8]}])
def test_policy_is_what_was_passed(policy):
    with rollout.DistributedCollector("CartPole-v1", policy, frames_per_batch=100, total_frames=100, seed=1) as c:
        assert c.policy is policy


def test_policy_is_the_torch_module_passed():
    torch = pytest.importorskip("torch")
    pytest.importorskip("onnx")
    actor = torch.nn.Sequential(torch.nn.Linear(3, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
    with rollout.DistributedCollector("Pendulum-v1", actor, frames_per_batch=100, total_frames=200, seed=1) as c:
        assert c.policy is actor


def test_reset_starts_every_episode_anew_at_the_next_batch_of_a_sync_run():
    envs = 4  # 2 nodes x 2 envs, 10 steps each per batch
    with counting(nodes=2, envs_per_node=2, sync=True, frames_per_batch=40) as c:
        first, second = c.next(), c.next()
        steps1, steps2 = per_env(first, "step_count", envs), per_env(second, "step_count", envs)
        assert (steps2[:, 0] == steps1[:, -1] + 1).all(), "without a reset, episodes go on across batches"
        ids2 = per_env(second, ("collector", "traj_ids"), envs)
        c.reset()
        third = c.next()
        steps3 = per_env(third, "step_count", envs)
        ids3 = per_env(third, ("collector", "traj_ids"), envs)
        assert (steps3[:, 0] == 0).all(), f"every env starts a new episode: {steps3[:, 0]}"
        assert (per_env(third, "observation", envs)[:, 0] == 0).all(), "from the env's reset"
        assert not set(ids3[:, 0]) & set(ids2.ravel()), "new trajectory ids"
        done2 = per_env(second, ("next", "done"), envs)
        assert not done2[:, -1].any(), "the episodes in progress were cut without done"
        fourth = c.next()
        steps4 = per_env(fourth, "step_count", envs)
        assert (steps4[:, 0] == 10).all(), "and go on after the reset"


def test_reset_in_an_async_run_starts_anew_after_the_batch_each_node_is_collecting():
    with counting(nodes=1, frames_per_batch=10) as c:
        c.next()
        c.reset()
        # The node collects ahead of the loop: its batch under way goes on from before.
        ahead = np.asarray(c.next()["step_count"]).ravel()
        after = np.asarray(c.next()["step_count"]).ravel()
    assert ahead[0] == 10, ahead
    assert after[0] == 0, after


def test_reset_is_reproducible_from_the_seed():
    # CartPole's initial states come from the seeds: the episodes a reset starts are the
    # same in two runs of the same seed, and not those the run started with.
    def run(seed):
        with rollout.DistributedCollector("CartPole-v1", nodes=2, sync=True, frames_per_batch=20, seed=seed) as c:
            start = np.asarray(c.next()["observation"]).copy()
            c.reset()
            return start, np.asarray(c.next()["observation"]).copy()

    start, after = run(9)
    again = run(9)[1]
    assert (after == again).all(), "the same seed, the same episodes after the reset"
    assert not (after[..., 0, :] == start[..., 0, :]).all(), "seeds no env had before"


def test_reset_idx_selecting_some_nodes_only_is_refused_by_name():
    with counting(nodes=2, frames_per_batch=20) as c:
        c.reset([True, True])  # every node: the same as None
        with pytest.raises(rollout.ConfigError) as e:
            c.reset([True, False])
        assert e.value.field == "reset_idx" and "together" in str(e.value), e.value
        assert c.next() is not None, "the run goes on"


def test_state_dict_and_load_state_dict_keep_torchrls_names():
    for name in ("state_dict", "load_state_dict", "update_policy_weights_", "set_seed", "shutdown", "reset"):
        assert callable(getattr(rollout.DistributedCollector, name)), name


def test_stats_are_readable_after_the_with_block():
    with rollout.DistributedCollector("CartPole-v1", nodes=2, frames_per_batch=100, total_frames=1000, seed=1) as c:
        frames = sum(b.numel() for b in c)
        during = c.stats()
    after = c.stats()
    assert frames == 1000
    assert after.keys() == during.keys()
    assert after["restarts"] == [0, 0]
    assert after["frames_collected"] >= during["frames_collected"] >= 1000
    assert c.stats() == after, "the last stats, as often as asked"
