import os
import pathlib
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
