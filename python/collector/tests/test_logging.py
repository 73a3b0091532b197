"""The Rust side's log events reach Python's `logging` under the `rollout` logger."""

import logging

import pytest

import rollout


def _failing_run():
    # Counting panics on one step in 3..6 after each seeded reset, a restart's too: its
    # worker fails, is restarted (warnings) until the intensity is spent, and the node
    # fails the run (errors).
    with rollout.DistributedCollector(
        "Counting", {"kind": "constant", "value": 1.0}, frames_per_batch=20, total_frames=40, seed=1,
        env_config={"max_steps": 100, "panic_between": [3, 6]},
    ) as c:
        with pytest.raises(rollout.CollectorError, match="injected panic"):
            list(c)


def test_a_failing_node_logs_warnings_and_errors_on_the_rollout_logger(caplog):
    caplog.set_level(logging.WARNING, logger="rollout")
    _failing_run()
    ours = [r for r in caplog.records if r.name.startswith("rollout.")]
    worker = [r for r in ours if r.getMessage().startswith("env worker failed worker=0")]
    assert worker, [(r.name, r.getMessage()[:80]) for r in caplog.records]
    assert worker[0].levelno == logging.WARNING and worker[0].name == "rollout.actors.env_worker"
    assert "injected panic" in worker[0].getMessage()
    failed = [r for r in ours if r.levelno == logging.ERROR and r.getMessage().startswith("collection failed")]
    # The logger is the Rust module path: the trainer's, or one of its files' below it, so a
    # level or handler set on `rollout.actors.trainer` governs it.
    assert failed and (failed[0].name + ".").startswith("rollout.actors.trainer."), [
        (r.name, r.levelname) for r in ours
    ]


def test_events_below_the_rollout_loggers_level_are_not_forwarded(caplog):
    caplog.set_level(logging.ERROR, logger="rollout")
    _failing_run()
    ours = [r for r in caplog.records if r.name.startswith("rollout.")]
    assert ours and all(r.levelno >= logging.ERROR for r in ours), [(r.name, r.levelname) for r in ours]
