"""While one thread waits in `next()`, other threads read the stats, push weights and
shut the run down: none of them waits for that batch."""

import threading
import time

import numpy as np
import pytest

import rollout

DEADLINE = 120.0


def mlp_weights(value):
    shapes = {"layers.0.weight": (256, 4), "layers.0.bias": (256,), "layers.1.weight": (256, 256),
              "layers.1.bias": (256,), "layers.2.weight": (2, 256), "layers.2.bias": (2,)}
    return {k: np.full(s, value, dtype=np.float32) for k, s in shapes.items()}


def test_stats_weights_and_shutdown_from_another_thread_while_one_waits_in_next():
    # A batch of seconds (50,000 steps of a 256-256 MLP), waited for on another thread.
    c = rollout.DistributedCollector(
        "CartPole-v1", {"kind": "mlp", "hidden": [256, 256]}, frames_per_batch=50_000, total_frames=-1, seed=1,
        batch_timeout=600.0, shutdown_timeout=300.0,
    )
    waiting, got = threading.Event(), {}

    def wait_for_a_batch():
        waiting.set()
        try:
            got["batch"] = c.next()
        except BaseException as e:  # reported below, on the test's thread
            got["error"] = e

    t = threading.Thread(target=wait_for_a_batch)
    t.start()
    try:
        assert waiting.wait(DEADLINE)
        # The waiting thread holds the GIL until its wait releases it: it is in `next()` now.
        stats = c.stats()
        assert stats["frames_collected"] >= 0
        assert c.update_policy_weights_(mlp_weights(0.01)) == 1
        c.update_policy_weights_()  # the stored weights pushed again
        assert t.is_alive() and not got, f"the batch came before the calls returned: {got}"
    finally:
        c.shutdown()
    t.join(DEADLINE)
    assert not t.is_alive(), "next() did not return after shutdown()"
    assert got == {"batch": None}, got
    with pytest.raises(rollout.CollectorError, match="shut down"):
        c.next()  # asked after the shutdown: the run is over


def test_shutdown_from_another_thread_is_prompt_with_a_huge_batch_in_flight():
    # Pendulum stepped by a 256-256 MLP on 2 nodes, 400,000 frames per node's batch: tens
    # of seconds of stepping, which shutdown() waited for before the nodes stopped between steps.
    c = rollout.DistributedCollector(
        "Pendulum-v1", {"kind": "mlp", "hidden": [256, 256]}, nodes=2, frames_per_batch=400_000,
        total_frames=-1, seed=1, batch_timeout=600.0,
    )
    got = {}

    def wait_for_a_batch():
        try:
            got["batch"] = c.next()
        except BaseException as e:  # reported below, on the test's thread
            got["error"] = e

    start = time.process_time()  # every thread of the process: the env workers' included
    t = threading.Thread(target=wait_for_a_batch)
    t.start()
    try:
        # The nodes are collecting once the process burns CPU: waiting uses next to none.
        deadline = time.monotonic() + DEADLINE
        while time.process_time() - start < 1.0:
            assert time.monotonic() < deadline, "the nodes never started collecting"
            assert t.is_alive(), got
            time.sleep(0.05)
    finally:
        stop = time.monotonic()
        c.shutdown()
        took = time.monotonic() - stop
    t.join(DEADLINE)
    assert not t.is_alive(), "next() did not return after shutdown()"
    assert got == {"batch": None}, got
    assert took < 3.0, f"shutdown() took {took:.1f} s with a batch in flight"
