"""``launcher="ray"`` (issue 41): the run's nodes as Ray actors on a real local Ray
cluster — a head and two worker raylets (``ray.cluster_utils.Cluster``), started by the
test and torn down — inside a network namespace the test creates and removes, since Ray
listens on every address of its host (there: only the namespace's loopback). One node
actor is killed with ``ray.kill`` mid-run, later the raylet of the other is stopped: each
time the node process dies with its actor, a new actor takes the slot, and the run's
frames stay exact (every (trajectory, step) once,
``total_frames`` in all); at the end no actor or node process is left
(``ray_cluster_run.py`` runs the cluster and reports)."""

import json
import os
import pathlib
import shutil
import subprocess
import sys

import pytest

import rollout

HERE = pathlib.Path(__file__).parent


def test_killed_node_actors_and_a_stopped_raylet_are_replaced_and_the_run_stays_exact_with_nothing_left_behind():
    pytest.importorskip("ray", reason="scripts/test.sh installs Ray")
    assert os.geteuid() == 0 and shutil.which("ip"), "needs root and iproute2 for its network namespace"
    ns = f"rollout-ray-{os.getpid()}"
    subprocess.run(["ip", "netns", "add", ns], check=True)
    try:
        subprocess.run(["ip", "netns", "exec", ns, "ip", "link", "set", "lo", "up"], check=True)
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
        r = subprocess.run(
            ["ip", "netns", "exec", ns, sys.executable, str(HERE / "ray_cluster_run.py")],
            env=env, capture_output=True, text=True, timeout=300,
        )
        assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-4000:]
        out = json.loads(r.stdout.strip().splitlines()[-1])
    finally:
        pids = subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True).stdout.split()
        for pid in pids:
            try:
                os.kill(int(pid), 9)
            except OSError:
                pass
        subprocess.run(["ip", "netns", "del", ns], check=False)
    assert out["raylets"] == 3, out
    assert out["actor_hosts"] == 2, f"the two node actors on two raylets: {out}"
    assert out["killed_gone"], f"the killed actor's node process died with it: {out}"
    assert out["raylet_gone"], f"the stopped raylet's actor and node process died with it: {out}"
    assert out["replaced"] == [1, 1] and out["stats"]["restarts"] == [1, 1], out
    assert out["frames"] == out["total"] == 12_000, out
    assert out["left_behind"] == [] and out["pids_watched"] >= 8, out


@pytest.mark.parametrize(
    "kw, field",
    [
        (dict(ray_address="127.0.0.1:6379"), "ray_address"),
        (dict(ray_actor_options={"num_cpus": 1}), "ray_actor_options"),
        (dict(launcher="ray", min_nodes=1, max_nodes=2), "launcher"),
        (dict(launcher="ray", ray_actor_options=[1]), "ray_actor_options"),
        (dict(launcher="ray", ray_actor_options={"no_such_option": 1}), "ray_actor_options"),
    ],
)
def test_ray_settings_that_cannot_work_are_refused_by_name(kw, field):
    with pytest.raises(rollout.ConfigError) as e:
        rollout.DistributedCollector("CartPole-v1", frames_per_batch=10, total_frames=100, **kw)
    assert field in str(e.value)
