"""Types of ``rollout._native``, the extension module behind :mod:`rollout`.

Users call :class:`rollout.DistributedCollector`; these are the native pieces it
wraps, typed for checkers and editors.
"""

from typing import Any, Dict, List, Mapping, Optional, Tuple

import numpy as np

__version__: str

class ConfigError(ValueError):
    """A setting the collector cannot run with; ``field`` names the argument."""

    field: Optional[str]

class CollectorError(RuntimeError):
    """The collector failed (a node, the launcher, a checkpoint, ...)."""

class CollectorTimeout(TimeoutError):
    """A bounded wait of the collector ran out."""

class NativeCollector:
    """The Rust collector behind a thread of its own; every method may be called
    from any thread."""

    def __init__(self, settings: Dict[str, Any]) -> None: ...
    def next_batch(self) -> Optional[Dict[str, Any]]: ...
    def update_policy_weights(
        self, weights: Mapping[str, np.ndarray], worker_ids: Optional[List[int]] = None
    ) -> int: ...
    def push_policy_weights(self, worker_ids: Optional[List[int]] = None) -> None: ...
    def set_seed(self, seed: int) -> int: ...
    def reset_envs(self) -> int: ...
    def checkpoint(self) -> bytes: ...
    def stats(self) -> Dict[str, Any]: ...
    @property
    def nodes(self) -> int: ...
    @property
    def frames_per_batch(self) -> int: ...
    @property
    def total_frames(self) -> int: ...
    def listen_addr(self) -> Optional[str]: ...
    def metrics_addr(self) -> Optional[str]: ...
    def node_pids(self) -> List[int]: ...
    def slurm_job_ids(self) -> List[str]: ...
    def shutdown(self) -> None: ...

def refresh_log_levels() -> None:
    """Reads the ``rollout`` logger's level again (levels set after the import take
    effect at the next collector)."""

def check_checkpoint(checkpoint: bytes) -> None:
    """Decodes checkpoint bytes as ``resume`` would: ``ConfigError`` (``field``
    ``"resume"``) when they are not a checkpoint."""

def builtin_env_specs(name: str, config: Optional[str] = None) -> Optional[str]:
    """The JSON specs (``{"observation", "action"}``) of the built-in env ``name`` made
    with the JSON ``config``, or ``None`` when no built-in env has that name."""

def bench_rust_loop(settings: Dict[str, Any], batches: int, recycle: bool) -> Tuple[float, int]: ...
def bench_rust_weights(settings: Dict[str, Any], weights: Mapping[str, np.ndarray], rounds: int) -> float: ...

def run_node(
    join: str,
    token_file: Optional[str] = None,
    allow_insecure_token_file: bool = False,
    name: Optional[str] = None,
    index: Optional[int] = None,
    connect_timeout: float = 30.0,
) -> None:
    """A Rust node (``rollout node``'s code): joins the trainer at ``join`` and serves it
    until it shuts the node down, or leaves on SIGTERM/SIGINT; blocking."""
