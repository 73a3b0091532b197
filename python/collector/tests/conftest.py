import os
import pathlib
import subprocess
import sys

import pytest

# The examples are imported by the tests as modules.
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "examples"))


def rollout_bin():
    """The `rollout` binary the process launcher starts: $ROLLOUT_BIN, or the release
    build of this checkout (the test is skipped without one)."""
    path = os.environ.get("ROLLOUT_BIN") or str(pathlib.Path(__file__).resolve().parents[3] / "target" / "release" / "rollout")
    if not os.path.exists(path):
        pytest.skip(f"no rollout binary at {path} (scripts/test.sh builds it)")
    return path


# A Python node (python/node) run by this interpreter.
PYTHON_NODE = [sys.executable, "-m", "rollout_node"]


def require_python_node():
    """Skips the test when this interpreter has no rollout_node."""
    probe = subprocess.run(PYTHON_NODE + ["--help"], capture_output=True, timeout=60)
    if probe.returncode != 0:
        pytest.skip(f"no rollout_node in {sys.executable} (pip install ./python/node)")


def alive(pid):
    """Process `pid` exists and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return ") Z " not in f.read()
    except FileNotFoundError:
        return False
