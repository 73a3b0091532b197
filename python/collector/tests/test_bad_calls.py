"""Bad calls on a run: wrong worker ids, garbage checkpoints, a deadline passed, calls
after shutdown, a batch larger than ``max_frame``. Each is a clear error and the run (when
there is one) goes on untouched."""

import os

import numpy as np
import pytest

import rollout

ROLLOUT_BIN = os.environ.get("ROLLOUT_BIN")


def linear(value):
    return {"weight": np.full((2, 4), value, dtype=np.float32), "bias": np.zeros(2, dtype=np.float32)}


def run(**kw):
    kw.setdefault("frames_per_batch", 20)
    kw.setdefault("total_frames", -1)
    kw.setdefault("seed", 3)
    return rollout.DistributedCollector("CartPole-v1", "linear", nodes=2, **kw)


@pytest.mark.parametrize("ids", [[2], [-1], [0, 7], "0", [0.5]])
def test_worker_ids_that_name_no_node_are_refused_and_nothing_is_stored(ids):
    with run() as c:
        with pytest.raises(rollout.ConfigError) as e:
            c.update_policy_weights_(linear(0.5), worker_ids=ids)
        assert e.value.field == "worker_ids", e.value
        # Nothing stored: the next update is version 1, and batches still use version 0.
        assert c.next().weights_version == 0
        assert c.update_policy_weights_(linear(0.5)) == 1


@pytest.mark.parametrize(
    "resume",
    [b"garbage", b"", {"checkpoint": b"\x92\x01"}, {"checkpoint": "text"}, {"weights": b""}, 7],
)
def test_a_garbage_checkpoint_is_a_config_error_naming_resume(resume):
    with pytest.raises(rollout.ConfigError) as e:
        run(resume=resume)
    assert e.value.field == "resume", e.value


def test_load_state_dict_with_garbage_leaves_the_run_going():
    with run() as c:
        c.next()
        for bad in ({"checkpoint": b"garbage"}, {"nothing": 1}):
            with pytest.raises(rollout.ConfigError) as e:
                c.load_state_dict(bad)
            assert e.value.field == "resume", e.value
        assert c.next() is not None  # the same run, still collecting


def test_a_batch_that_does_not_come_in_time_is_a_collector_timeout():
    # 20,000 steps of a 256-256 MLP on one node: about a second, over a 0.2 s deadline.
    c = rollout.DistributedCollector(
        "CartPole-v1", {"kind": "mlp", "hidden": [256, 256]}, frames_per_batch=20_000, total_frames=-1, seed=1,
        batch_timeout=0.2,
    )
    try:
        with pytest.raises(rollout.CollectorTimeout) as e:
            c.next()
        assert isinstance(e.value, TimeoutError) and "0.2" in str(e.value), e.value
    finally:
        c.shutdown()


def test_calls_after_shutdown_say_the_run_is_over():
    c = run()
    c.next()
    c.shutdown()
    c.shutdown()  # idempotent
    # Iterating raises (an empty iteration would hide that the run is over).
    with pytest.raises(rollout.CollectorError) as e:
        c.next()
    assert "shut down" in str(e.value), e.value
    with pytest.raises(rollout.CollectorError) as e:
        for _ in c:
            pytest.fail("a batch after shutdown")
    assert "shut down" in str(e.value), e.value
    for call in (lambda: c.update_policy_weights_(linear(0.1)), lambda: c.set_seed(1), c.state_dict, c.reset):
        with pytest.raises(rollout.CollectorError) as e:
            call()
        assert "shut down" in str(e.value) or "gone" in str(e.value), e.value


@pytest.mark.skipif(not ROLLOUT_BIN, reason="needs the release `rollout` binary (ROLLOUT_BIN)")
def test_a_batch_over_max_frame_is_refused_before_any_node_starts():
    # 2,000 CartPole frames of one node are about 126 KB on the wire: over a 64 KiB max_frame.
    with pytest.raises(rollout.ConfigError) as e:
        rollout.DistributedCollector(
            "CartPole-v1", frames_per_batch=4000, total_frames=-1, nodes=2, launcher="process",
            node_program=ROLLOUT_BIN, max_frame=64 * 1024,
        )
    assert e.value.field in ("max_frame", "frames_per_batch"), e.value
