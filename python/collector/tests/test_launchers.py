"""The remote launchers from Python: process nodes, SLURM on the local cluster (scripts/slurm-local.sh)."""

import os
import pathlib
import shutil
import subprocess
import tempfile

import pytest

import rollout


def rollout_bin():
    path = os.environ.get("ROLLOUT_BIN") or str(pathlib.Path(__file__).resolve().parents[3] / "target" / "release" / "rollout")
    if not os.path.exists(path):
        pytest.skip(f"no rollout binary at {path} (scripts/test.sh builds it)")
    return path


def require_slurm():
    # As tests/tests/slurm.rs: scripts/test.sh brings the local cluster up, so a
    # missing one is a failure, not a skip.
    assert shutil.which("sbatch"), "no sbatch: run scripts/slurm-local.sh"
    out = subprocess.run(["sinfo", "-h", "-o", "%T"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout.strip(), f"no SLURM node up: {out.stderr}"


def test_slurm_launcher_collects_exact_frames_and_ends_its_job():
    require_slurm()
    out_dir = tempfile.mkdtemp(prefix="rollout-py-slurm-")
    try:
        with rollout.DistributedCollector(
            "Counting",
            {"kind": "constant", "value": 1.0},
            nodes=2,
            frames_per_batch=100,
            total_frames=1000,
            seed=0,
            launcher="slurm",
            slurm_kwargs={"job_name": "rollout-py-test", "output_dir": out_dir},
            listen="127.0.0.1:0",
            advertise="127.0.0.1",
            node_program=rollout_bin(),
            heartbeat=0.1,
            heartbeat_timeout=1.5,
            join_timeout=120.0,
            batch_timeout=120.0,
        ) as c:
            jobs = c.slurm_job_ids()
            assert len(jobs) == 1
            frames = sum(b.numel() for b in c)
        assert frames == 1000
        queue = subprocess.run(["squeue", "-h", "-j", jobs[0]], capture_output=True, text=True, timeout=60)
        assert queue.stdout.strip() == "", f"tasks left after shutdown: {queue.stdout}"
    finally:
        shutil.rmtree(out_dir, ignore_errors=True)


def test_slurm_needs_advertise():
    with pytest.raises(rollout.ConfigError) as e:
        rollout.DistributedCollector("Counting", frames_per_batch=10, launcher="slurm", node_program=rollout_bin())
    assert e.value.field == "advertise"


def test_unknown_slurm_option_is_named():
    with pytest.raises(rollout.ConfigError) as e:
        rollout.DistributedCollector(
            "Counting", frames_per_batch=10, launcher="slurm", node_program=rollout_bin(), advertise="127.0.0.1", slurm_kwargs={"queue": "x"}
        )
    assert e.value.field == "slurm_kwargs" and "queue" in str(e.value)


def test_process_launcher_needs_the_binary(monkeypatch):
    monkeypatch.delenv("ROLLOUT_BIN", raising=False)
    monkeypatch.setenv("PATH", "/nonexistent")
    with pytest.raises(rollout.ConfigError) as e:
        rollout.DistributedCollector("Counting", frames_per_batch=10, launcher="process")
    assert e.value.field == "node_program"


def test_process_launcher_nodes():
    with rollout.DistributedCollector("CartPole-v1", nodes=2, launcher="process", node_program=rollout_bin(), frames_per_batch=50, total_frames=300, seed=18) as c:
        assert len(c.node_pids()) == 2
        assert c.listen_addr() is not None
        batches = list(c)
    assert sum(b.numel() for b in batches) == 300
    assert {b.node for b in batches} <= {0, 1}
