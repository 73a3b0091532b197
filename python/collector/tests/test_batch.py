"""Batches: NumPy arrays viewing the Rust buffers, nested keys, lifetime, and their
storage going back to the run once Python frees them."""

import gc

import numpy as np
import pytest

import rollout


def one_batch(**kw):
    with rollout.DistributedCollector("CartPole-v1", frames_per_batch=40, total_frames=40, envs_per_node=2, seed=1, **kw) as c:
        return c.next()


def test_entries_view_the_rust_buffers_without_a_copy():
    b = one_batch()
    for key in b.keys(include_nested=True, leaves_only=True):
        a = b[key]
        assert isinstance(a, np.ndarray)
        assert not a.flags.owndata and a.base is not None, f"{key}: a view of a Rust-owned buffer"
        dotted = key if isinstance(key, str) else ".".join(key)
        assert a.__array_interface__["data"][0] == b._addresses[dotted], f"{key}: the very buffer Rust collected into"


def test_nested_keys_as_tensordict():
    b = one_batch()
    assert b["next", "reward"] is b["next"]["reward"] is b["next.reward"]
    assert b["next", "reward"].shape == (2, 20, 1)
    top = b.keys()
    assert "next" in top and "observation" in top and ("next", "reward") not in top
    nested = b.keys(include_nested=True)
    assert "next" in nested and ("next", "reward") in nested
    leaves = b.keys(include_nested=True, leaves_only=True)
    assert "next" not in leaves and ("next", "done") in leaves
    assert set(b["next"].keys()) == {"done", "observation", "reward", "terminated", "truncated"}
    assert ("next", "reward") in b and ("next", "nothing") not in b
    d = b.to_dict()
    assert d["next"]["reward"] is b["next", "reward"]
    assert d["collector"]["traj_ids"].dtype == np.int64


def test_batch_metadata():
    b = one_batch()
    assert b.index == 0 and b.node == 0 and b.weights_version == 0
    assert b.numel() == 40 and b.batch_size == (2, 20)


def test_an_array_outlives_the_collector():
    c = rollout.DistributedCollector("CartPole-v1", frames_per_batch=1000, total_frames=-1, seed=2)
    obs = c.next()["observation"]
    copy = obs.copy()
    c.shutdown()
    del c
    gc.collect()
    # Churn the allocator: a freed buffer would be overwritten.
    junk = [np.full(1000 * 4, 7.0, dtype=np.float32) for _ in range(50)]
    assert np.array_equal(obs, copy)
    assert obs.sum() == copy.sum() and len(junk) == 50


def recycled(c) -> int:
    return c.stats()["batches_recycled"]


@pytest.mark.parametrize("sync", [False, True])
def test_a_batch_python_frees_goes_back_to_the_run(sync):
    with rollout.DistributedCollector("CartPole-v1", nodes=2, frames_per_batch=200, total_frames=-1, sync=sync, seed=4) as c:
        b = c.next()
        obs = b["observation"]
        del b
        # An array still views the storage: nothing goes back.
        assert recycled(c) == 0
        del obs
        assert recycled(c) == 1
        for _ in range(5):
            c.next()  # each freed at once
        assert recycled(c) == 6


def test_held_batches_keep_their_values_while_the_run_reuses_freed_ones():
    with rollout.DistributedCollector("CartPole-v1", nodes=1, frames_per_batch=500, total_frames=-1, seed=5) as c:
        held = [c.next() for _ in range(3)]
        copies = [{k: b[k].copy() for k in b.keys(include_nested=True, leaves_only=True)} for b in held]
        assert recycled(c) == 0
        for _ in range(30):
            c.next()
        assert recycled(c) == 30
        for b, copy in zip(held, copies):
            for k, v in copy.items():
                assert np.array_equal(b[k], v), f"{k}: a held batch was written into"
