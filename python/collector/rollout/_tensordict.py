"""Batches as ``tensordict.TensorDict`` s, laid out as torchrl's collectors lay them out.

Every entry of the :class:`~rollout.Batch` becomes a torch tensor made with
``torch.from_numpy``: it shares the NumPy array's memory, which is the buffer the
Rust side collected into (no copy). What torchrl's layout adds is made here:

- the env axis of a node with one env is dropped (a view), as a torchrl collector
  over one env yields ``[T]`` and over ``N`` envs ``[N, T]``; a sync batch is
  stacked per node (``[nodes, T]`` or ``[nodes, N, T]``), as torchrl stacks its
  collectors' batches;
- the root ``done``, ``terminated`` and ``truncated`` (``[..., 1]`` bool): torchrl
  records the done state of each step's first observation, always ``False`` here
  since a finished episode is reset before its next step (new, zeroed tensors);
- a one-hot action (``int64 [..., n]``, a new tensor) when the actor's action is
  one-hot (torchrl's ``OneHotCategorical``); rollout records the index.
"""

from __future__ import annotations

from typing import Any, Optional

from ._batch import Batch

try:
    import torch
    from tensordict import TensorDict
except ImportError as _e:  # pragma: no cover - the message is the point
    raise ImportError(
        "rollout: TensorDict batches need torch and tensordict: pip install 'rollout[torch]'"
    ) from _e

_ROOT_DONE = ("done", "terminated", "truncated")


def to_tensordict(batch: Batch, one_hot: Optional[int] = None, squeeze_env: bool = True) -> "TensorDict":
    """``batch`` as a TensorDict (see the module's doc); ``one_hot``: the number of
    actions, to write the discrete action as torchrl's one-hot (``None``: as it is);
    ``squeeze_env``: drop a node's env axis when it has one env."""
    size = list(batch.batch_size)
    env_axis = len(size) - 2  # [envs, T] or [nodes, envs, T]
    drop = squeeze_env and env_axis >= 0 and size[env_axis] == 1
    if drop:
        del size[env_axis]

    def tensor(a: Any) -> "torch.Tensor":
        t = torch.from_numpy(a)
        return t.squeeze(env_axis) if drop else t

    fields: dict = {}
    for key, value in batch.items(include_nested=True, leaves_only=True):
        parts = key if isinstance(key, tuple) else (key,)
        d = fields
        for p in parts[:-1]:
            d = d.setdefault(p, {})
        d[parts[-1]] = tensor(value)

    if one_hot is not None and "action" in fields:
        a = fields["action"]
        if a.dtype == torch.int64 and a.dim() == len(size):
            fields["action"] = torch.nn.functional.one_hot(a, one_hot)

    next_done = fields.get("next", {}).get("done")
    if next_done is not None:
        for k in _ROOT_DONE:
            if k not in fields:
                fields[k] = torch.zeros(next_done.shape, dtype=torch.bool)
    return TensorDict(fields, batch_size=size)
