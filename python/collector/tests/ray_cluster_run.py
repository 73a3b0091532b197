"""A run of ``launcher="ray"`` on a real local Ray cluster (a head and two worker
raylets), with one node actor killed mid-run and later the raylet of the other stopped; prints what ``test_ray.py`` checks, as
JSON. Run by that test inside a network namespace of its own (Ray listens on every
address of its host: there, only the namespace's loopback)."""

import json
import os
import sys
import time

import numpy as np
import ray
from ray.cluster_utils import Cluster

import rollout


def alive(pid):
    """Whether process ``pid`` runs (a zombie does not)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


def gone_within(pids, seconds=30):
    """Whether every process of ``pids`` ended within ``seconds``."""
    end = time.monotonic() + seconds
    while any(alive(p) for p in pids) and time.monotonic() < end:
        time.sleep(0.05)
    return not any(alive(p) for p in pids)


def main():
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 0, "include_dashboard": False})
    for _ in range(2):
        cluster.add_node(num_cpus=1)
    ray.init(address=cluster.address, log_to_driver=False)
    cluster.wait_for_nodes()
    out = {"raylets": len([n for n in ray.nodes() if n["Alive"]])}
    total, fpb = 12_000, 200
    seen = set()
    frames, batches, pids = 0, 0, set()
    with rollout.DistributedCollector(
        "CartPole-v1", nodes=2, envs_per_node=2, frames_per_batch=fpb, total_frames=total, sync=True, seed=3,
        launcher="ray", ray_address=cluster.address, heartbeat=0.2, heartbeat_timeout=3.0, join_timeout=60.0,
        batch_timeout=120.0,
    ) as c:
        nodes = c._ray_nodes
        placed = ray.get([nodes.actor(i).pids.remote() for i in range(2)], timeout=60)
        out["actor_hosts"] = len(set(ray.get([nodes.actor(i).host.remote() for i in range(2)], timeout=60)))
        for b in c:
            ids = b["collector", "traj_ids"].reshape(-1)
            steps = b["step_count"].reshape(-1)
            for pair in zip(ids.tolist(), steps.tolist()):
                assert pair not in seen, f"frame {pair} delivered twice"
                seen.add(pair)
            frames += b.numel()
            batches += 1
            pids.update(nodes.pids())
            if batches == 5:
                killed = nodes.actor(0)
                killed_pids = ray.get(killed.pids.remote(), timeout=60)
                ray.kill(killed)
                out["killed_gone"] = gone_within(killed_pids)
                pids.update(killed_pids)
            if batches == 25:
                # A raylet stopped: node 1's, a fresh one taking its place in the cluster.
                cluster.add_node(num_cpus=1)
                cluster.wait_for_nodes()
                host = ray.get(nodes.actor(1).host.remote(), timeout=60)
                lost_pids = ray.get(nodes.actor(1).pids.remote(), timeout=60)
                raylet = next(n for n in cluster.worker_nodes if n.node_id == host)
                cluster.remove_node(raylet)
                out["raylet_gone"] = gone_within(lost_pids)
                pids.update(lost_pids)
        out["stats"] = c.stats()
        out["replaced"] = list(nodes.replaced)
    out.update(frames=frames, batches=batches, total=total, placed=len(placed))
    gone_within(pids)
    out["left_behind"] = sorted(p for p in pids if alive(p))
    out["pids_watched"] = len(pids)
    ray.shutdown()
    cluster.shutdown()
    print(json.dumps(out))


if __name__ == "__main__":
    sys.exit(main())
