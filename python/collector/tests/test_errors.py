"""Bad arguments name themselves; Rust errors keep their message; Ctrl-C is clean."""

import pickle
import signal

import numpy as np
import pytest

import rollout


def refused(**kw):
    kw.setdefault("env", "CartPole-v1")
    kw.setdefault("frames_per_batch", 10)
    with pytest.raises(rollout.ConfigError) as e:
        rollout.DistributedCollector(**kw)
    return e.value


@pytest.mark.parametrize(
    "kw, field",
    [
        (dict(frames_per_batch=0), "frames_per_batch"),
        (dict(frames_per_batch=None), "frames_per_batch"),
        (dict(frames_per_batch="ten"), "frames_per_batch"),
        (dict(total_frames=-5), "total_frames"),
        (dict(nodes=0), "nodes"),
        (dict(envs_per_node=0), "envs_per_node"),
        (dict(envs_per_node=4, envs_per_worker=3), "envs_per_worker"),
        (dict(envs_per_worker=0), "envs_per_worker"),
        (dict(env=None), "env"),
        (dict(env="NoSuchEnv-v0"), "env"),
        (dict(launcher="cloud"), "launcher"),
        (dict(exploration_type="greedy"), "exploration_type"),
        (dict(policy=3), "policy"),
        (dict(policy={"kind": "transformer"}), "policy"),
        (dict(batch_timeout=-1.0), "batch_timeout"),
        (dict(collector_kwargs=[{"colour": "red"}]), "collector_kwargs"),
        (dict(launcher="external"), "token"),
        (dict(launcher="local", slurm_kwargs={"partition": "x"}), "slurm_kwargs"),
    ],
)
def test_bad_arguments_are_named(kw, field):
    e = refused(**kw)
    assert isinstance(e, ValueError)
    assert e.field == field, str(e)
    assert field in str(e)


def test_config_errors_carry_the_rust_message():
    e = refused(frames_per_batch=0)
    assert "must be at least 1" in str(e)


def test_exceptions_live_at_rollout_and_pickle_with_their_field():
    for cls, base in [
        (rollout.ConfigError, ValueError),
        (rollout.CollectorError, RuntimeError),
        (rollout.CollectorTimeout, TimeoutError),
    ]:
        assert cls.__module__ == "rollout" and issubclass(cls, base)
        back = pickle.loads(pickle.dumps(cls("it broke")))
        assert type(back) is cls and str(back) == "it broke"
    # One raised by the extension: the same class, its field and message kept.
    e = refused(frames_per_batch=0)
    assert type(e) is rollout.ConfigError
    back = pickle.loads(pickle.dumps(e))
    assert type(back) is rollout.ConfigError
    assert back.field == "frames_per_batch" and str(back) == str(e)
    assert rollout.ConfigError("no field").field is None


def test_bad_weights_are_refused():
    with rollout.DistributedCollector("CartPole-v1", frames_per_batch=10, total_frames=-1, seed=1) as c:
        with pytest.raises(TypeError, match="float16"):
            c.update_policy_weights_({"weight": np.zeros((2, 4), dtype=np.float16)})
        with pytest.raises(TypeError, match="mapping"):
            c.update_policy_weights_([np.zeros(3, dtype=np.float32)])


def test_weights_that_do_not_fit_the_policy_are_a_config_error_and_the_run_goes_on():
    good = {"weight": np.zeros((2, 4), dtype=np.float32), "bias": np.zeros(2, dtype=np.float32)}
    with rollout.DistributedCollector("CartPole-v1", frames_per_batch=10, total_frames=-1, seed=1) as c:
        for weights, reason in [
            ({**good, "weight": np.zeros((2, 3), dtype=np.float32)}, "`weight` must be f32 [2, 4], got f32 [2, 3]"),
            ({"weight": good["weight"]}, "missing tensor `bias`"),
            ({**good, "scale": np.ones(1, dtype=np.float32)}, "unexpected tensor `scale`"),
        ]:
            with pytest.raises(rollout.ConfigError) as e:
                c.update_policy_weights_(weights)
            assert e.value.field == "weights" and reason in str(e.value)
        batch = c.next()
        assert batch.weights_version == 0, "nothing was stored"
        assert c.update_policy_weights_(good) == 1


def test_ctrl_c_interrupts_a_waiting_iteration_and_loses_no_batch():
    # A batch that takes seconds (an MLP policy, many frames), a SIGALRM raising
    # KeyboardInterrupt (what Ctrl-C does) a fraction of a second into the wait.
    def interrupt(signum, frame):
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGALRM, interrupt)
    try:
        with rollout.DistributedCollector("Pendulum-v1", {"kind": "mlp", "hidden": [256, 256]}, frames_per_batch=50_000, total_frames=-1, seed=1, batch_timeout=600.0, shutdown_timeout=300.0) as c:
            signal.setitimer(signal.ITIMER_REAL, 0.1)
            with pytest.raises(KeyboardInterrupt):
                c.next()
            batch = c.next()
            assert batch.index == 0, "the batch waited for when interrupted comes next"
            assert batch.numel() == 50_000
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def test_a_per_node_layout_sync_cannot_stack_names_collector_kwargs():
    e = refused(nodes=2, sync=True, collector_kwargs=[{}, {"env": "Pendulum-v1"}])
    assert e.field == "collector_kwargs" and "collector_kwargs" in str(e)
