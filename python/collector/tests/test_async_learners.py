"""What an async learner (IMPALA, APPO) needs from a batch (issue 39): the version of
the weights behind every frame, the lag against the stored weights, a cap on it, and
prefetch, from Python."""

import numpy as np
import pytest

import rollout


# The linear policy's weights for CartPole (2 actions x 4 observations): a learner's update.
WEIGHTS = {"weight": np.full((2, 4), 0.1, dtype=np.float32), "bias": np.zeros(2, dtype=np.float32)}


def run(**kw):
    """An async run of 2 CartPole nodes x 2 envs (linear policy), 100-frame batches, a new
    version stored after every batch (and pushed to the node that delivered it); returns the batches' (policy_version, lag,
    lagging, weights_version, frames) and the run's stats."""
    out = []
    with rollout.DistributedCollector(
        env="CartPole-v1",
        policy="linear",
        nodes=2,
        envs_per_node=2,
        frames_per_batch=100,
        seed=5,
        update_after_each_batch=True,
        **kw,
    ) as c:
        for b in c:
            out.append((b.policy_version, b.policy_lag, b.lagging, b.weights_version, b.numel()))
            c.update_policy_weights_(WEIGHTS)
        stats = c.stats()
    return out, stats


def test_every_frame_names_its_version_and_versions_advance_with_prefetch():
    batches, _ = run(total_frames=2_000, prefetch=1)
    assert sum(n for *_, n in batches) == 2_000, "total_frames exact with a node collecting ahead"
    for per_frame, lag, lagging, version, _ in batches:
        assert per_frame.dtype == np.int64 and per_frame.shape == (2, 50)
        assert (per_frame == version).all()
        assert lag >= 0 and not lagging, "no cap, nothing flagged"
    assert max(v for *_, v, _ in batches) > 0, "the pushed versions reach the frames"


def test_past_max_policy_lag_batches_are_dropped_counted_and_asked_again():
    batches, stats = run(total_frames=3_000, max_policy_lag=0)
    assert sum(n for *_, n in batches) == 3_000, "total_frames counts delivered frames only"
    assert all(lag == 0 for _, lag, *_ in batches)
    assert stats["dropped_lagging"] > 0 and stats["frames_dropped_lagging"] == 100 * stats["dropped_lagging"]


def test_lagging_batches_can_be_delivered_flagged():
    batches, stats = run(total_frames=2_000, max_policy_lag=0, deliver_lagging=True)
    assert any(lagging for _, _, lagging, *_ in batches)
    assert all(lagging == (lag > 0) for _, lag, lagging, *_ in batches)
    assert stats["dropped_lagging"] == 0


@pytest.mark.parametrize("split_trajs", [False, True])
def test_sync_tensordicts_give_each_nodes_frames_its_version_in_torchrls_key(split_trajs):
    pytest.importorskip("tensordict")
    with rollout.DistributedCollector(
        env="CartPole-v1",
        policy="linear",
        nodes=2,
        frames_per_batch=40,
        sync=True,
        seed=1,
        split_trajs=split_trajs,
        tensordict=True,
        track_policy_version=True,
    ) as c:
        it = iter(c)
        first = next(it)
        assert (first["policy_version"] == 0).all()
        # New weights for node 0 only: the next round's shares differ.
        v = c.update_policy_weights_(WEIGHTS, worker_ids=[0])
        td = next(it)
        versions = td["collector", "weights_version"]
        assert versions.shape == td.batch_size and (td["policy_version"] == versions).all()
        if split_trajs:
            mask = td["collector", "mask"]
            assert (int((versions[mask] == v).sum()), int((versions[mask] == 0).sum())) == (20, 20)
        else:
            assert (versions[0] == v).all() and (versions[1] == 0).all()


@pytest.mark.parametrize(
    "kw, field",
    [
        (dict(sync=True, max_policy_lag=1), "max_policy_lag"),
        (dict(sync=True, prefetch=1), "prefetch"),
        (dict(prefetch=17), "prefetch"),
        (dict(deliver_lagging=True), "deliver_lagging"),
    ],
)
def test_misused_lag_settings_are_a_config_error_naming_the_field(kw, field):
    with pytest.raises(rollout.ConfigError) as e:
        rollout.DistributedCollector(env="CartPole-v1", frames_per_batch=10, total_frames=100, **kw)
    assert field in str(e.value)
