"""``python profiled_node.py PREFIX ARGS...``: ``python -m rollout_node ARGS...`` under
cProfile (its main thread: the env stepping, the policy, the batch), the profile written to
``PREFIX.<pid>.prof`` when the node exits, and ``PREFIX.<pid>.json``: the node's wall
time, the process's CPU time (every thread: the session's reader, writer and heartbeat
threads too) and the main thread's. For bench_workloads.py's ``--profile-nodes``."""

import cProfile
import json
import os
import sys
import time

from rollout_node.__main__ import main

if __name__ == "__main__":
    prefix, argv = sys.argv[1], sys.argv[2:]
    prof = cProfile.Profile()
    wall, cpu, main_cpu = time.perf_counter(), time.process_time(), time.thread_time()
    try:
        status = prof.runcall(main, argv)
    finally:
        times = {
            "wall_s": time.perf_counter() - wall,
            "process_cpu_s": time.process_time() - cpu,
            "main_thread_cpu_s": time.thread_time() - main_cpu,
        }
        prof.dump_stats(f"{prefix}.{os.getpid()}.prof")
        with open(f"{prefix}.{os.getpid()}.json", "w") as f:
            json.dump(times, f)
    sys.exit(status)
