"""torchrl's test_distributed.py scenarios, from Python through `rollout`."""

import numpy as np
import pytest

import rollout

CONSTANT = {"kind": "constant", "value": 1.0}


def collect(**kw):
    with rollout.DistributedCollector(**kw) as c:
        return list(c)


@pytest.mark.parametrize("sync", [False, True])
@pytest.mark.parametrize("frames_per_batch", [50, 100])
def test_frames_per_batch(sync, frames_per_batch):
    batches = collect(env="CartPole-v1", nodes=2, frames_per_batch=frames_per_batch, total_frames=4 * frames_per_batch, sync=sync, seed=3)
    assert batches and all(b.numel() == frames_per_batch for b in batches)
    assert all(b["observation"].shape == b.batch_size + (4,) for b in batches)


@pytest.mark.parametrize("sync", [False, True])
def test_total_frames_exact(sync):
    batches = collect(env="CartPole-v1", nodes=2, frames_per_batch=60, total_frames=600, sync=sync, seed=4)
    assert sum(b.numel() for b in batches) == 600
    assert [b.index for b in batches] == list(range(10))


def test_sync_stacks_every_node():
    batches = collect(env="CartPole-v1", nodes=3, envs_per_node=2, frames_per_batch=120, total_frames=240, sync=True, seed=5)
    for b in batches:
        assert b.batch_size == (3, 2, 20)
        assert b.node is None
        assert len(b.weights_versions) == 3
        assert b["next", "reward"].shape == (3, 2, 20, 1)


def test_async_batches_name_their_node():
    batches = collect(env="CartPole-v1", nodes=2, frames_per_batch=40, total_frames=400, seed=6)
    assert {b.node for b in batches} <= {0, 1}
    assert all(b.batch_size == (1, 40) for b in batches)


@pytest.mark.parametrize("envs", [1, 3])
def test_envs_per_node(envs):
    batches = collect(env="CartPole-v1", nodes=2, envs_per_node=envs, frames_per_batch=30 * envs, total_frames=120 * envs, seed=7)
    assert all(b.batch_size == (envs, 30) for b in batches)


def test_envs_per_worker_changes_no_frame_of_a_deterministic_policy():
    def run(per):
        return collect(env="Pendulum-v1", policy={"kind": "mlp", "hidden": [16, 16]},
                       exploration_type="deterministic", nodes=2, envs_per_node=4,
                       envs_per_worker=per, frames_per_batch=80, total_frames=160, sync=True, seed=7)
    alone, grouped = run(1), run(4)
    assert len(alone) == len(grouped) == 2
    for a, g in zip(alone, grouped):
        for key in ("observation", "action", ("next", "reward")):
            assert np.array_equal(a[key], g[key]), key


def test_num_workers_per_collector_is_envs_per_node():
    batches = collect(env="CartPole-v1", num_workers_per_collector=2, frames_per_batch=20, total_frames=20, seed=7)
    assert batches[0].batch_size == (2, 10)


def test_per_node_configs():
    # Async: batches come in the order they are done, so read until both nodes have
    # delivered (a loaded machine may well hand several of one node's first).
    shapes = {}
    with rollout.DistributedCollector(
        env="CartPole-v1",
        nodes=2,
        frames_per_batch=20,
        total_frames=20 * 10_000,
        collector_kwargs=[{}, {"env": "Pendulum-v1", "envs_per_node": 2}],
        seed=8,
    ) as c:
        for b in c:
            shapes[b.node] = b["observation"].shape
            if len(shapes) == 2:
                break
    assert shapes[0] == (1, 20, 4)
    assert shapes[1] == (2, 10, 3)


@pytest.mark.parametrize("sync", [False, True])
def test_weight_updates_reach_the_batches(sync):
    with rollout.DistributedCollector("Counting", CONSTANT, nodes=2, frames_per_batch=20, total_frames=-1, sync=sync, update_after_each_batch=True, seed=9) as c:
        first = c.next()
        assert np.all(first["action"] == 1.0)
        version = c.update_policy_weights_({"value": np.array([2.0], dtype=np.float32)})
        assert version > first.weights_version
        for batch in c:
            if batch.weights_version >= version:
                assert np.all(batch["action"] == 2.0), "a batch of the new version acts with its weights"
                break
            assert batch.index < 50, "the new weights never reached a batch"


def test_update_to_some_workers_only():
    with rollout.DistributedCollector("Counting", CONSTANT, nodes=2, frames_per_batch=10, total_frames=-1, seed=10) as c:
        version = c.update_policy_weights_({"value": np.array([3.0], dtype=np.float32)}, worker_ids=[1])
        seen = set()
        for batch in c:
            if batch.weights_version >= version:
                assert batch.node == 1, "only node 1 got the update"
                assert np.all(batch["action"] == 3.0)
                break
            assert batch.index < 100, "node 1 never delivered a batch of the new version"


def test_weights_from_anything_with_array():
    class Tensorish:
        def __init__(self, a):
            self.a = a

        def __array__(self, dtype=None, copy=None):
            return self.a

    with rollout.DistributedCollector("Counting", CONSTANT, frames_per_batch=10, total_frames=-1, sync=True, update_after_each_batch=True, seed=11) as c:
        v = c.update_policy_weights_({"value": Tensorish(np.array([4.0], dtype=np.float32))})
        for batch in c:
            if batch.weights_version >= v:
                assert np.all(batch["action"] == 4.0)
                break
            assert batch.index < 50


def test_seeding_repeats_a_run():
    def run(seed):
        return [b["observation"].copy() for b in collect(env="CartPole-v1", nodes=2, frames_per_batch=100, total_frames=400, sync=True, seed=seed)]

    a, b, other = run(12), run(12), run(13)
    assert all(np.array_equal(x, y) for x, y in zip(a, b))
    assert not all(np.array_equal(x, y) for x, y in zip(a, other))


def test_set_seed_returns_the_next_seed_and_repeats():
    def after_reseed():
        with rollout.DistributedCollector("CartPole-v1", nodes=2, frames_per_batch=50, total_frames=-1, sync=True, seed=1) as c:
            nxt = c.set_seed(42)
            return nxt, [c.next()["observation"].copy() for _ in range(2)]

    (n1, a), (n2, b) = after_reseed(), after_reseed()
    assert isinstance(n1, int) and n1 == n2 and n1 != 42
    assert all(np.array_equal(x, y) for x, y in zip(a, b))


def test_endless_mode_and_shutdown():
    c = rollout.DistributedCollector("CartPole-v1", nodes=2, frames_per_batch=50, total_frames=-1, seed=14)
    got = 0
    for batch in c:
        got += 1
        if got == 25:
            break
    assert got == 25, "an endless run keeps yielding"
    c.shutdown()
    c.shutdown()  # idempotent
    with pytest.raises(rollout.CollectorError, match="shut down"):
        c.next()  # the run is over, not empty


def test_stats_count_frames():
    with rollout.DistributedCollector("CartPole-v1", nodes=2, frames_per_batch=50, total_frames=200, seed=15) as c:
        frames = sum(b.numel() for b in c)
        s = c.stats()
    assert frames == 200
    assert s["restarts"] == [0, 0] and s["dropped_late"] == 0
    assert s["frames_collected"] >= 200


def test_state_dict_resumes_the_same_batches():
    kw = dict(env="CartPole-v1", nodes=2, frames_per_batch=100, total_frames=600, sync=True, seed=16)
    with rollout.DistributedCollector(**kw) as c:
        c.next()
        state = c.state_dict()
        assert isinstance(state["checkpoint"], bytes)
        rest = [b["observation"].copy() for b in c]
        c.load_state_dict(state)
        again = [b["observation"].copy() for b in c]
    with rollout.DistributedCollector(resume=state, **kw) as c:
        resumed = [b["observation"].copy() for b in c]
    assert len(rest) == 5
    for x, y, z in zip(rest, again, resumed):
        assert np.array_equal(x, y) and np.array_equal(x, z)


def test_split_trajs_and_max_frames_per_traj():
    batches = collect(env="CartPole-v1", frames_per_batch=100, total_frames=100, split_trajs=True, max_frames_per_traj=10, seed=17)
    b = batches[0]
    assert b.batch_size[1] <= 10
    assert ("collector", "mask") in b.keys(include_nested=True)



def test_metrics_served_for_prometheus():
    import urllib.request

    with rollout.DistributedCollector(env="CartPole-v1", nodes=2, frames_per_batch=50, total_frames=200, seed=6, metrics="127.0.0.1:0") as c:
        addr = c.metrics_addr()
        assert addr is not None and addr.startswith("127.0.0.1:")
        batches = list(c)
        with urllib.request.urlopen(f"http://{addr}/metrics", timeout=10) as r:
            text = r.read().decode()
    frames = sum(float(l.split()[-1]) for l in text.splitlines() if l.startswith("rollout_frames_total{"))
    assert frames == sum(b.numel() for b in batches) == 200
    assert "rollout_build_info" in text


def test_metrics_off_by_default():
    with rollout.DistributedCollector(env="CartPole-v1", frames_per_batch=50, total_frames=50, seed=6) as c:
        assert c.metrics_addr() is None


@pytest.mark.parametrize("exploration, record, records", [
    ("random", None, True),
    ("deterministic", None, False),
    ("deterministic", True, True),
    ("random", False, False),
])
def test_batches_carry_the_records_when_the_nodes_sample_unless_told(exploration, record, records):
    kw = {} if record is None else {"record": record}
    batches = collect(env="CartPole-v1", policy="linear", frames_per_batch=20, total_frames=40,
                      exploration_type=exploration, seed=1, **kw)
    for b in batches:
        assert ("action_log_prob" in b) == records and ("logits" in b) == records, b.keys()
        assert "observation" in b and ("next", "observation") in b


def test_record_must_be_a_bool():
    with pytest.raises(rollout.ConfigError, match="record"):
        collect(env="CartPole-v1", frames_per_batch=20, total_frames=20, record="yes")
