"""``Batch``: one yielded batch, read as a TensorDict user expects.

Rust keys are dotted paths (``next.reward``); here they are also nested keys:
``batch["next", "reward"]``, ``batch["next"]["reward"]`` and
``batch["next.reward"]`` are the same array. Entries are NumPy arrays that own
the Rust buffer they view (its base object), so they outlive the batch and the
collector.
"""

from __future__ import annotations

from typing import Any, Dict, Iterator, List, Optional, Tuple, Union

import numpy as np

Key = Union[str, Tuple[str, ...]]


def _dotted(key: Key) -> str:
    if isinstance(key, tuple):
        if not key or not all(isinstance(k, str) for k in key):
            raise KeyError(key)
        return ".".join(key)
    if isinstance(key, str):
        return key
    raise KeyError(key)


class Batch:
    """A batch of frames: ``[envs, T]`` (async) or ``[nodes, envs, T]`` (sync).

    ``node`` is the node that collected it (``None`` for a sync batch stacked
    from all nodes), ``weights_version`` the oldest weights version its frames
    used, ``weights_versions`` each share's (one per node in a sync batch),
    :attr:`policy_version` each frame's, ``policy_lag`` how many versions the
    oldest were behind the stored weights when the batch was yielded, ``lagging``
    whether that is past ``max_policy_lag`` (delivered with ``deliver_lagging``),
    ``index`` its position in the run.
    """

    __slots__ = (
        "_data",
        "_prefix",
        "batch_size",
        "index",
        "node",
        "weights_version",
        "weights_versions",
        "policy_lag",
        "lagging",
        "_addresses",
    )

    def __init__(self, raw: Dict[str, Any], prefix: str = "") -> None:
        self._data: Dict[str, np.ndarray] = raw["data"]
        self._addresses: Dict[str, int] = raw.get("addresses", {})
        self._prefix = prefix
        self.batch_size: Tuple[int, ...] = tuple(raw["batch_size"])
        self.index: int = raw["index"]
        self.node: Optional[int] = raw["node"]
        self.weights_version: int = raw["weights_version"]
        self.weights_versions: List[int] = list(raw["weights_versions"])
        self.policy_lag: int = raw.get("policy_lag", 0)
        self.lagging: bool = raw.get("lagging", False)

    @property
    def policy_version(self) -> np.ndarray:
        """The weights version each frame's action came from, ``int64`` shaped as the
        batch (torchrl's ``policy_version``): a sync batch's first axis is its nodes,
        each with its share's version; a sync batch split into trajectories carries
        them per frame (``("collector", "weights_version")``)."""
        size = self.batch_size
        per_frame = self._data.get("collector.weights_version")
        if per_frame is not None and tuple(per_frame.shape) == size:
            return per_frame.astype(np.int64, copy=True)
        versions = self.weights_versions
        if len(versions) == 1:
            return np.full(size, versions[0], dtype=np.int64)
        if self.node is None and size and size[0] == len(versions):
            lead = (len(versions),) + (1,) * (len(size) - 1)
            return np.broadcast_to(np.asarray(versions, dtype=np.int64).reshape(lead), size).copy()
        return np.full(size, self.weights_version, dtype=np.int64)

    def _sub(self, prefix: str) -> "Batch":
        sub = object.__new__(Batch)
        for name in Batch.__slots__:
            setattr(sub, name, getattr(self, name))
        sub._prefix = prefix
        return sub

    def _full(self, key: Key) -> str:
        return self._prefix + _dotted(key)

    def __getitem__(self, key: Key) -> Union[np.ndarray, "Batch"]:
        full = self._full(key)
        if full in self._data:
            return self._data[full]
        nested = full + "."
        if any(k.startswith(nested) for k in self._data):
            return self._sub(nested)
        raise KeyError(key)

    def get(self, key: Key, default: Any = None) -> Any:
        """The entry (or sub-batch) at ``key``, or ``default``."""
        try:
            return self[key]
        except KeyError:
            return default

    def __contains__(self, key: Key) -> bool:
        return self.get(key) is not None

    def _own_keys(self) -> List[str]:
        n = len(self._prefix)
        return [k[n:] for k in self._data if k.startswith(self._prefix)]

    def keys(self, include_nested: bool = False, leaves_only: bool = False) -> List[Key]:
        """Keys as TensorDict gives them: top-level names; with ``include_nested``
        nested keys as tuples (``("next", "reward")``); with ``leaves_only`` no
        sub-batch keys."""
        out: List[Key] = []
        seen = set()
        for k in self._own_keys():
            parts = tuple(k.split("."))
            if not include_nested:
                key: Key = parts[0]
                if len(parts) > 1 and leaves_only:
                    continue
                if key not in seen:
                    seen.add(key)
                    out.append(key)
                continue
            for depth in range(1, len(parts) + 1):
                if depth < len(parts) and leaves_only:
                    continue
                sub = parts[:depth]
                key = sub[0] if depth == 1 else sub
                if key not in seen:
                    seen.add(key)
                    out.append(key)
        return out

    def items(self, include_nested: bool = False, leaves_only: bool = False) -> Iterator[Tuple[Key, Any]]:
        """``(key, value)`` pairs for :meth:`keys`."""
        for k in self.keys(include_nested, leaves_only):
            yield k, self[k]

    def __iter__(self) -> Iterator[Key]:
        return iter(self.keys())

    def __len__(self) -> int:
        return len(self.keys())

    def to_dict(self) -> Dict[str, Any]:
        """Nested plain dicts of the arrays (no copy)."""
        out: Dict[str, Any] = {}
        for k in self._own_keys():
            parts = k.split(".")
            d = out
            for p in parts[:-1]:
                d = d.setdefault(p, {})
            d[parts[-1]] = self._data[self._prefix + k]
        return out

    def numel(self) -> int:
        """Frames in the batch (the product of the batch shape)."""
        return int(np.prod(self.batch_size, dtype=np.int64))

    @property
    def shape(self) -> Tuple[int, ...]:
        """The batch shape (TensorDict's ``batch_size``)."""
        return self.batch_size

    def __repr__(self) -> str:
        return (
            f"Batch(batch_size={list(self.batch_size)}, index={self.index}, node={self.node}, "
            f"weights_version={self.weights_version}, keys={self.keys(include_nested=True, leaves_only=True)})"
        )
