"""The remote launchers from Python: process nodes, SLURM on the local cluster (scripts/slurm-local.sh),
an elastic run of external nodes (``min_nodes``, ``max_nodes``)."""

import os
import pathlib
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

import numpy as np
import pytest
from conftest import PYTHON_NODE, alive, require_python_node, rollout_bin

import rollout


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


def _frames(**kw):
    """Every batch of a sync CartPole run as ``{key: array}``, in order."""
    with rollout.DistributedCollector("CartPole-v1", nodes=2, frames_per_batch=60, total_frames=360, seed=18, sync=True, **kw) as c:
        pids = c.node_pids() if kw.get("launcher") == "process" else []
        cmdlines = [pathlib.Path(f"/proc/{p}/cmdline").read_bytes().split(b"\0") for p in pids]
        out = [{k: np.array(b[k]) for k in ("observation", "action", ("next", "reward"))} for b in c]
    return out, cmdlines


def test_without_the_binary_the_process_launcher_runs_the_packages_rust_node(monkeypatch):
    local, _ = _frames()
    monkeypatch.delenv("ROLLOUT_BIN", raising=False)
    monkeypatch.setenv("PATH", "/nonexistent")
    remote, cmdlines = _frames(launcher="process")
    # The nodes are this interpreter running the package's node: no `rollout` binary.
    assert len(cmdlines) == 2
    for words in cmdlines:
        assert words[:4] == [sys.executable.encode(), b"-m", b"rollout", b"node"], words
    # The same Rust node's frames: every batch as the in-process nodes make it.
    assert len(remote) == len(local) == 6
    for a, b in zip(local, remote):
        for key in a:
            np.testing.assert_array_equal(a[key], b[key], err_msg=str(key))


def test_the_packages_node_says_what_is_wrong_in_one_line_and_exits_2(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "ROLLOUT_TOKEN"}
    for argv, field in (
        ([], "--join"),
        (["--join", "127.0.0.1:1", "--index", "-1"], "index"),
        (["--join", "127.0.0.1:1"], "token"),
        (["--join", "127.0.0.1:1", "--connect-timeout", "nan"], "connect_timeout"),
    ):
        env_run = env if field == "token" else dict(env, ROLLOUT_TOKEN="a-token-of-twenty-bytes")
        out = subprocess.run(
            [sys.executable, "-m", "rollout", "node", *argv], env=env_run, capture_output=True, text=True, timeout=60
        )
        lines = out.stderr.strip().splitlines()
        assert out.returncode == 2 and len(lines) == 1 and lines[0].startswith("error: ") and field in lines[0], (argv, out.stderr)


def test_process_launcher_nodes():
    with rollout.DistributedCollector("CartPole-v1", nodes=2, launcher="process", node_program=rollout_bin(), frames_per_batch=50, total_frames=300, seed=18) as c:
        assert len(c.node_pids()) == 2
        assert c.listen_addr() is not None
        batches = list(c)
    assert sum(b.numel() for b in batches) == 300
    assert {b.node for b in batches} <= {0, 1}


TOKEN = "python-elastic-membership-token"


def free_addr():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{s.getsockname()[1]}"


def node_process(addr, index):
    """``rollout node --join ADDR --index I``, as anyone holding the token would start it
    (it retries until the trainer listens)."""
    return subprocess.Popen(
        [rollout_bin(), "node", "--join", addr, "--index", str(index)],
        env=dict(os.environ, ROLLOUT_TOKEN=TOKEN),
        stdin=subprocess.DEVNULL,
    )


def pull_until(batches, it, node):
    """Pulls batches into ``batches`` until one of ``node`` comes, within a deadline."""
    end = time.monotonic() + 60
    while time.monotonic() < end:
        b = next(it, None)
        assert b is not None, f"the run ended before a batch of node {node}"
        batches.append(b)
        if b.node == node:
            return
    pytest.fail(f"no batch of node {node} within 60 s")


def test_an_elastic_run_takes_a_node_that_joins_while_it_runs_and_lets_one_leave():
    addr = free_addr()
    total, fpb = 200_000, 20
    nodes = [node_process(addr, 0)]
    try:
        # The run starts once min_nodes (node 0) joined: the constructor returns then.
        with rollout.DistributedCollector(
            "Counting", {"kind": "constant", "value": 1.0},
            min_nodes=1, max_nodes=2, frames_per_batch=fpb, total_frames=total, seed=3,
            launcher="external", listen=addr, token=TOKEN,
            heartbeat=0.1, heartbeat_timeout=2.0, join_timeout=60.0, batch_timeout=60.0,
        ) as c:
            assert c.nodes == 2, "an elastic run has max_nodes slots"
            it = iter(c)
            batches = [next(it)]
            assert batches[0].node == 0
            nodes.append(node_process(addr, 1))
            pull_until(batches, it, 1)
            # Node 0 leaves on SIGTERM (`leave`, exit 0); the run goes on without it.
            nodes[0].send_signal(signal.SIGTERM)
            assert nodes[0].wait(timeout=60) == 0
            left_at = len(batches)
            batches.extend(it)
            stats = c.stats()
        assert sum(b.numel() for b in batches) == total, "total_frames exact"
        assert [b.index for b in batches] == list(range(len(batches))), "every batch once, in order"
        assert all(b.numel() == fpb for b in batches)
        after = {b.node for b in batches[left_at + 2:]}
        assert after == {1}, f"after node 0 left, only node 1 delivers: {after}"
        assert (stats["joined"], stats["left"], stats["restarts"]) == (2, 1, [0, 0]), stats
        assert nodes[1].wait(timeout=60) == 0, "node 1 exits 0 after the shutdown"
    finally:
        for n in nodes:
            if n.poll() is None:
                n.kill()
                n.wait()


@pytest.mark.parametrize(
    "kwargs, field",
    [
        (dict(min_nodes=2), "max_nodes"),
        (dict(max_nodes=2, nodes=2), "nodes"),
        (dict(max_nodes=2), "launcher"),
        (dict(max_nodes=2, launcher="external", sync=True), "sync"),
        (dict(max_nodes=0, launcher="external"), "max_nodes"),
    ],
)
def test_elastic_settings_that_cannot_work_are_refused_by_name(kwargs, field):
    with pytest.raises(rollout.ConfigError) as e:
        rollout.DistributedCollector("Counting", frames_per_batch=10, token=TOKEN, **kwargs)
    assert e.value.field == field, str(e.value)


# ---- node_command: Python nodes (python/node) started by the launchers

def cmdline(pid):
    with open(f"/proc/{pid}/cmdline", "rb") as f:
        return f.read().split(b"\0")


def test_process_launcher_runs_a_python_node_command_and_replaces_a_killed_node():
    require_python_node()
    with rollout.DistributedCollector(
        "CartPole-v1",
        nodes=2,
        sync=True,
        launcher="process",
        node_command=PYTHON_NODE,
        frames_per_batch=100,
        total_frames=2000,
        seed=4,
        node_max_restarts=3,
        heartbeat=0.2,
        heartbeat_timeout=2.0,
    ) as c:
        pids = c.node_pids()
        for i, pid in enumerate(pids):
            words = cmdline(pid)
            assert words[1:3] == [b"-m", b"rollout_node"], words
            assert words[words.index(b"--index") + 1] == str(i).encode(), words
        frames = 0
        for n, b in enumerate(c):
            frames += b.numel()
            if n == 1:
                os.kill(pids[1], signal.SIGKILL)
        assert frames == 2000
        assert c.stats()["restarts"] == [0, 1]
        now = c.node_pids()
        assert now[0] == pids[0] and now[1] != pids[1]
        assert cmdline(now[1])[1:3] == [b"-m", b"rollout_node"]
    for pid in set(pids + now):
        assert not alive(pid), f"node process {pid} outlived the run"


def test_a_node_command_that_cannot_start_is_a_config_error():
    with pytest.raises(rollout.ConfigError) as e:
        rollout.DistributedCollector("CartPole-v1", frames_per_batch=10, launcher="process", node_command=["/nonexistent/python", "-m", "rollout_node"])
    assert e.value.field == "node_command" and "/nonexistent/python" in str(e.value)
    with pytest.raises(rollout.ConfigError) as e:
        rollout.DistributedCollector("CartPole-v1", frames_per_batch=10, launcher="process", node_command="python -m rollout_node")
    assert e.value.field == "node_command" and "list of words" in str(e.value)
    with pytest.raises(rollout.ConfigError) as e:
        rollout.DistributedCollector("CartPole-v1", frames_per_batch=10, launcher="process", node_command=[], node_program="/bin/true")
    assert e.value.field == "node_command"
    with pytest.raises(rollout.ConfigError) as e:
        rollout.DistributedCollector("CartPole-v1", frames_per_batch=10, launcher="process", node_command=[])
    assert e.value.field == "node_command" and "empty" in str(e.value)


def test_slurm_launcher_runs_a_python_node_command():
    require_slurm()
    require_python_node()
    out_dir = tempfile.mkdtemp(prefix="rollout-py-slurm-cmd-")
    try:
        with rollout.DistributedCollector(
            "CartPole-v1",
            nodes=2,
            frames_per_batch=100,
            total_frames=1000,
            seed=0,
            launcher="slurm",
            slurm_kwargs={"job_name": "rollout-py-test-cmd", "output_dir": out_dir},
            listen="127.0.0.1:0",
            advertise="127.0.0.1",
            node_command=PYTHON_NODE,
            heartbeat=0.1,
            heartbeat_timeout=1.5,
            join_timeout=120.0,
            batch_timeout=120.0,
        ) as c:
            jobs = c.slurm_job_ids()
            frames = sum(b.numel() for b in c)
        assert frames == 1000
        scripts = list(pathlib.Path(out_dir).glob("*/nodes.sbatch"))
        assert len(scripts) == 1 and "-m rollout_node --join" in scripts[0].read_text()
        queue = subprocess.run(["squeue", "-h", "-j", jobs[0]], capture_output=True, text=True, timeout=60)
        assert queue.stdout.strip() == "", f"tasks left after shutdown: {queue.stdout}"
    finally:
        shutil.rmtree(out_dir, ignore_errors=True)


# ---- any env: the trainer learns an env it cannot build from the Python nodes it started


def test_an_env_only_the_python_nodes_know_is_collected_in_its_own_dtypes():
    require_python_node()
    with rollout.DistributedCollector(
        "Acrobot-v1",
        nodes=2,
        envs_per_node=2,
        sync=True,
        launcher="process",
        node_command=PYTHON_NODE,
        policy={"kind": "mlp", "hidden": [8]},
        exploration_type="deterministic",
        frames_per_batch=200,
        total_frames=1000,
        seed=3,
    ) as c:
        batches = list(c)
    assert sum(b.numel() for b in batches) == 1000
    for b in batches:
        assert b["observation"].dtype == np.float32 and b["observation"].shape == (2, 2, 50, 6)
        assert b["action"].dtype == np.int64 and b["action"].shape == (2, 2, 50)
        assert b.weights_version == 0
    with rollout.DistributedCollector(
        "HalfCheetah-v5",
        nodes=1,
        launcher="process",
        node_command=PYTHON_NODE,
        policy="random",
        frames_per_batch=100,
        total_frames=300,
        seed=3,
    ) as c:
        batches = list(c)
    assert sum(b.numel() for b in batches) == 300
    for b in batches:
        assert b["observation"].dtype == np.float64 and b["observation"].shape == (1, 100, 17)
        assert b["next", "observation"].dtype == np.float64
        assert b["action"].dtype == np.float32 and b["action"].shape == (1, 100, 6)


def test_declared_env_specs_hold_the_nodes_to_them():
    require_python_node()
    # Acrobot-v1's bounds as a person writes them (f32 boxes compare at f32 precision).
    high = [1, 1, 1, 1, 12.566371, 28.274334]
    acrobot = {
        "observation": {"kind": "box", "dtype": "f32", "shape": [6], "low": [-h for h in high], "high": high},
        "action": {"kind": "discrete", "n": 3},
    }
    with rollout.DistributedCollector(
        "Acrobot-v1",
        nodes=1,
        launcher="process",
        node_command=PYTHON_NODE,
        env_spec=acrobot,
        policy="random",
        frames_per_batch=100,
        total_frames=200,
        seed=3,
    ) as c:
        assert sum(b.numel() for b in c) == 200
    other = dict(acrobot, action={"kind": "discrete", "n": 4})
    with pytest.raises(rollout.CollectorError) as e:
        with rollout.DistributedCollector(
            "Acrobot-v1",
            nodes=1,
            launcher="process",
            node_command=PYTHON_NODE,
            env_spec=other,
            policy="random",
            frames_per_batch=100,
            total_frames=200,
            batch_timeout=60.0,
        ) as c:
            list(c)
    assert "discrete 3" in str(e.value) and "discrete 4" in str(e.value), str(e.value)
    with pytest.raises(rollout.ConfigError) as e:
        rollout.DistributedCollector("Acrobot-v1", frames_per_batch=10, launcher="process", node_command=PYTHON_NODE,
                                     env_spec={"observation": {"kind": "box", "dtype": "f32", "shape": [0]}, "action": acrobot["action"]})
    assert e.value.field == "env_spec", e.value.field


def test_slurm_launcher_collects_an_env_only_the_python_nodes_know():
    require_slurm()
    require_python_node()
    out_dir = tempfile.mkdtemp(prefix="rollout-py-slurm-any-")
    try:
        with rollout.DistributedCollector(
            "Acrobot-v1",
            nodes=2,
            frames_per_batch=100,
            total_frames=600,
            seed=0,
            policy="linear",
            launcher="slurm",
            slurm_kwargs={"job_name": "rollout-py-test-any", "output_dir": out_dir},
            listen="127.0.0.1:0",
            advertise="127.0.0.1",
            node_command=PYTHON_NODE,
            heartbeat=0.1,
            heartbeat_timeout=1.5,
            join_timeout=120.0,
            batch_timeout=120.0,
        ) as c:
            batches = list(c)
        assert sum(b.numel() for b in batches) == 600
        assert all(b["observation"].shape[-1] == 6 for b in batches)
    finally:
        shutil.rmtree(out_dir, ignore_errors=True)


def test_an_env_id_no_builtin_env_has_starts_python_nodes_by_itself():
    # Acrobot-v1 is gymnasium's, not one of the built-in envs: with no launcher said,
    # the collector starts Python nodes with this interpreter and learns the spaces from them.
    require_python_node()
    with rollout.DistributedCollector("Acrobot-v1", nodes=2, frames_per_batch=40, total_frames=80, seed=3) as c:
        pids = c.node_pids()
        assert len(pids) == 2
        for pid in pids:
            assert cmdline(pid)[:3] == [sys.executable.encode(), b"-m", b"rollout_node"], cmdline(pid)
        batches = list(c)
    assert sum(b.numel() for b in batches) == 80
    assert batches[0]["observation"].shape[-1] == 6  # Acrobot's observation
    for pid in pids:
        assert not alive(pid), f"node process {pid} outlived the run"


def test_an_env_id_without_the_python_node_installed_says_what_to_install(monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "rollout_node" else real(name, *a))
    with pytest.raises(rollout.ConfigError) as e:
        rollout.DistributedCollector("Acrobot-v1", frames_per_batch=40, total_frames=80)
    assert e.value.field == "env" and "pip install" in str(e.value) and "\n" not in str(e.value), e.value
