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
  one-hot (torchrl's ``OneHotCategorical``); rollout records the index;
- the log-probability under the actor's ``log_prob_key`` (rollout records it as
  ``action_log_prob``), or none when the actor does not return one;
- with a recurrent policy (or an env with torchrl's ``InitTracker``), ``("next",
  "is_init")`` (``[..., 1]`` bool, new zeroed tensors), as ``InitTracker`` writes it:
  a step's result never starts an episode; ``is_init``, the state entries and their
  ``("next", name)`` come from the nodes as they are (``is_init`` is written from
  ``step_count == 0`` for an ``InitTracker`` when the policy records none);
- an exploration module's state (``_ou_prev_noise``, ``_ou_steps`` and their ``next``
  keys, PROTOCOL.md §8) is left out (``leave_out``), as torchrl's collectors leave out
  private keys; the :class:`~rollout.Batch` keeps it;
- ``("collector", "weights_version")`` and ``("collector", "node")`` (``int64``, the
  batch's shape, new tensors): which weights and which node made each frame, so
  batches still in flight when weights change can be told apart;
- of a multi-agent env (PROTOCOL.md §3, Multi-agent envs), each group's ``(g, "done")``,
  ``(g, "terminated")`` and ``(g, "truncated")`` (``[..., n, 1]`` bool, new tensors) at
  the step's start, as torchrl's ``PettingZooEnv`` writes them: an agent present is not
  done, an agent not present (gone) is all three; and the masks left out unless asked
  (``agent_masks``: torchrl's ``use_mask``).
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
_IS_INIT = "is_init"


_LOG_PROB = "action_log_prob"
_KEEP = object()


def to_tensordict(
    batch: Batch,
    one_hot: Optional[int] = None,
    squeeze_env: bool = True,
    log_prob_key: Any = _KEEP,
    leave_out: Any = (),
    is_init: bool = False,
    agent_masks: bool = True,
) -> "TensorDict":
    """``batch`` as a TensorDict (see the module's doc); ``one_hot``: the number of
    actions, to write the discrete action as torchrl's one-hot (``None``: as it is);
    ``squeeze_env``: drop a node's env axis when it has one env; ``log_prob_key``:
    where the log-probability goes (``None``: dropped; by default kept as it is; a list of
    ``(group, key or None)``: each group's, for an actor per group);
    ``leave_out``: entries to leave out (a key, or a tuple for a nested one);
    ``is_init``: write ``is_init`` (the env has torchrl's ``InitTracker``) from
    ``step_count`` when the nodes did not record it; ``agent_masks``: keep a multi-agent
    env's ``(g, "mask")`` and ``("next", g, "mask")``."""
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

    for key in leave_out:
        parts = key if isinstance(key, tuple) else (key,)
        d = fields
        for p in parts[:-1]:
            d = d.get(p, {})
        d.pop(parts[-1], None)

    if one_hot is not None and "action" in fields:
        a = fields["action"]
        if a.dtype == torch.int64 and a.dim() == len(size):
            fields["action"] = torch.nn.functional.one_hot(a, one_hot)

    groups = _groups(fields)
    if isinstance(log_prob_key, list):
        # An actor per group: [(group, its log_prob_key or None)].
        for g, key in log_prob_key:
            log_prob = fields.get(g, {}).pop(_LOG_PROB, None)
            if log_prob is not None and key is not None:
                parts = key if isinstance(key, tuple) else (key,)
                d = fields
                for p in parts[:-1]:
                    d = d.setdefault(p, {})
                d[parts[-1]] = log_prob
    elif log_prob_key is not _KEEP and isinstance(log_prob_key, tuple) and len(log_prob_key) == 2 and log_prob_key[0] in groups:
        # A multi-agent actor's log-probability, under its group.
        group = fields[log_prob_key[0]]
        log_prob = group.pop(_LOG_PROB, None)
        if log_prob is not None:
            group[log_prob_key[1]] = log_prob
    elif log_prob_key is not _KEEP and _LOG_PROB in fields:
        log_prob = fields.pop(_LOG_PROB)
        if log_prob_key is not None:
            parts = log_prob_key if isinstance(log_prob_key, tuple) else (log_prob_key,)
            d = fields
            for p in parts[:-1]:
                d = d.setdefault(p, {})
            d[parts[-1]] = log_prob

    _write_origin(fields.setdefault("collector", {}), batch, size)
    for g in groups:
        _write_agent_flags(fields, g, agent_masks)

    next_done = fields.get("next", {}).get("done")
    if next_done is not None:
        for k in _ROOT_DONE:
            if k not in fields:
                fields[k] = torch.zeros(next_done.shape, dtype=torch.bool)
    if is_init and _IS_INIT not in fields and "step_count" in fields:
        fields[_IS_INIT] = fields["step_count"] == 0
    init = fields.get(_IS_INIT)
    if init is not None and _IS_INIT not in fields.setdefault("next", {}):
        fields["next"][_IS_INIT] = torch.zeros(init.shape, dtype=torch.bool)
    return TensorDict(fields, batch_size=size)


def _groups(fields: dict) -> list:
    """The groups of a multi-agent env's batch: the keys ``g`` with a ``("next", g, "done")``."""
    nxt = fields.get("next", {})
    return [g for g, v in nxt.items() if isinstance(v, dict) and "done" in v and "reward" in v]


def _write_agent_flags(fields: dict, g: str, keep_mask: bool) -> None:
    """Group ``g``'s flags at the step's start, from its mask (an agent not present has
    left: done, terminated and truncated, torchrl's rule), and its masks kept or not."""
    mask = fields[g].get("mask")
    if mask is None:
        return
    gone = (~mask).unsqueeze(-1)
    for k in _ROOT_DONE:
        fields[g].setdefault(k, gone.clone())
    if not keep_mask:
        fields[g].pop("mask", None)
        fields.get("next", {}).get(g, {}).pop("mask", None)


def _write_origin(collector: dict, batch: Batch, size: list) -> None:
    """``weights_version`` and ``node`` of every frame: the version of the weights its
    action came from (:attr:`Batch.policy_version`), and its node, one per share, a
    sync batch's first axis being its nodes. A sync batch split into trajectories has
    trajectories on that axis: its versions come per frame, its node not at all."""
    collector["weights_version"] = torch.from_numpy(batch.policy_version).reshape(size)
    split = "mask" in collector
    if batch.node is not None:
        collector["node"] = torch.full(size, batch.node, dtype=torch.int64)
    elif not split and size and size[0] == len(batch.weights_versions):
        lead = [len(batch.weights_versions)] + [1] * (len(size) - 1)
        # Contiguous (not expanded views), so `view` works on them as on every other entry.
        collector["node"] = torch.arange(len(batch.weights_versions), dtype=torch.int64).reshape(lead).expand(size).contiguous()


class EpisodeReward:
    """torchrl's ``RewardSum``, written into each TensorDict: ``episode_reward`` (the
    reward summed over the episode before the step) and ``("next", "episode_reward")``
    (including it), ``float32 [..., 1]``. An episode that goes on past the end of a
    batch carries its sum to the next batch of its trajectory id (async batches of
    different nodes may come in any order); only episodes in progress are held."""

    def __init__(self) -> None:
        self._open: dict = {}

    def write(self, td: "TensorDict") -> None:
        reward = td.get(("next", "reward"))
        traj = td.get(("collector", "traj_ids"))
        done = td.get(("next", "done"))
        mask = td.get(("collector", "mask"), None)
        steps = traj.shape[-1]
        r = reward.reshape(-1, steps).double()
        t = traj.reshape(-1, steps)
        d = done.reshape(-1, steps)
        m = mask.reshape(-1, steps) if mask is not None else torch.ones_like(d)
        nxt = torch.empty_like(r)
        for row in range(r.shape[0]):
            valid = int(m[row].sum())
            if valid == 0:
                nxt[row] = 0.0
                continue
            rr = r[row] * m[row]
            c = torch.cumsum(rr, 0)
            start = torch.ones(steps, dtype=torch.bool)
            start[1:] = t[row, 1:] != t[row, :-1]
            first = torch.nonzero(start).squeeze(1)
            offset = torch.where(first > 0, -c[(first - 1).clamp_min(0)], torch.zeros((), dtype=c.dtype))
            offset[0] += self._open.pop(int(t[row, 0]), 0.0)
            nxt[row] = c + offset[torch.cumsum(start.long(), 0) - 1]
            last = valid - 1
            if not bool(d[row, last]):
                self._open[int(t[row, last])] = float(nxt[row, last])
        shape = reward.shape
        td.set(("next", "episode_reward"), nxt.reshape(shape).to(torch.float32))
        td.set("episode_reward", (nxt - r).reshape(shape).to(torch.float32))
