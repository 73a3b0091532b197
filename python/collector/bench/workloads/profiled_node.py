"""``python profiled_node.py PREFIX ARGS...``: ``python -m rollout_node ARGS...`` under
cProfile (its main thread: the env stepping, the policy, the batch), the profile written to
``PREFIX.<pid>.prof`` when the node exits. For bench_workloads.py's ``--profile-nodes``."""

import cProfile
import os
import sys

from rollout_node.__main__ import main

if __name__ == "__main__":
    prefix, argv = sys.argv[1], sys.argv[2:]
    prof = cProfile.Profile()
    try:
        status = prof.runcall(main, argv)
    finally:
        prof.dump_stats(f"{prefix}.{os.getpid()}.prof")
    sys.exit(status)
