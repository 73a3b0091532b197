"""rollout: distributed RL data collection in Rust, driven from Python.

``rollout.DistributedCollector`` takes torchrl's argument names and yields
batches whose entries are NumPy arrays viewing the buffers the Rust nodes
collected into (no copy). The Rust side's log events are ``logging`` records
under the ``rollout`` logger. See docs/python.md.
"""

from ._native import CollectorError, CollectorTimeout, ConfigError, __version__, refresh_log_levels
from ._batch import Batch
from ._collector import DistributedCollector
from ._ray import RayNodes

__all__ = [
    "Batch",
    "CollectorError",
    "CollectorTimeout",
    "ConfigError",
    "DistributedCollector",
    "RayNodes",
    "__version__",
    "refresh_log_levels",
]
