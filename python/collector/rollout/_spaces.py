"""A gymnasium env's spaces in PROTOCOL.md §3's form, for exporting a torch policy
before any node runs (an example observation, the action's bounds). Best effort:
``None`` when gymnasium is not installed or cannot make the env; the caller then
asks for ``env_spec``."""

from __future__ import annotations

from typing import Any, Dict, List, Mapping, Optional, Sequence

import numpy as np

_DTYPES = {np.dtype(np.float32): "f32", np.dtype(np.float64): "f64", np.dtype(np.uint8): "u8", np.dtype(np.int64): "i64"}


def _bounds(a: np.ndarray) -> list:
    return [None if not np.isfinite(v) else float(v) for v in np.asarray(a, dtype=np.float64).ravel()]


def _space(space: Any) -> Optional[Dict[str, Any]]:
    import gymnasium.spaces as S

    if isinstance(space, S.Box):
        return {
            "kind": "box",
            "dtype": _DTYPES.get(np.dtype(space.dtype), "f32"),
            "shape": list(space.shape),
            "low": _bounds(space.low),
            "high": _bounds(space.high),
        }
    if isinstance(space, S.Discrete):
        return {"kind": "discrete", "n": int(space.n), "start": int(space.start)}
    if isinstance(space, S.MultiDiscrete):
        return {"kind": "multi_discrete", "nvec": [int(n) for n in np.asarray(space.nvec).ravel()]}
    if isinstance(space, S.MultiBinary):
        return {"kind": "multi_binary", "n": int(np.prod(space.n))}
    if isinstance(space, S.Dict):
        spaces = {k: _space(v) for k, v in space.spaces.items()}
        return None if any(v is None for v in spaces.values()) else {"kind": "dict", "spaces": spaces}
    return None


def gymnasium_specs(
    env_id: str, env_config: Optional[Mapping[str, Any]], why: Optional[List[str]] = None
) -> Optional[Dict[str, Any]]:
    """``{"observation", "action"}`` of ``gymnasium.make(env_id, **env_config)``; None when
    it cannot be made here, the reason appended to ``why`` (for an error that needs the
    spaces: the nodes may still make the env)."""
    try:
        import gymnasium
    except ImportError:
        if why is not None:
            why.append("gymnasium is not installed in this process")
        return None
    try:
        env = gymnasium.make(env_id, **dict(env_config or {}))
    except Exception as e:
        if why is not None:
            first = (str(e).strip().splitlines() or [""])[0][:300]
            why.append(f"gymnasium.make({env_id!r}) failed here: {type(e).__name__}: {first}")
        return None
    try:
        obs, act = _space(env.observation_space), _space(env.action_space)
    finally:
        env.close()
    if obs is None or act is None:
        if why is not None:
            space = env.observation_space if obs is None else env.action_space
            why.append(f"{env_id!r}'s {'observation' if obs is None else 'action'} space ({type(space).__name__}) has no PROTOCOL.md §3 form")
        return None
    return {"observation": obs, "action": act}


#: The env ids of PettingZoo envs (PROTOCOL.md §3, Multi-agent envs): ``pettingzoo:<module>``
#: or ``pettingzoo:<module>:<factory>``, served by Python nodes.
PETTINGZOO = "pettingzoo:"


def torchrl_groups(agents: Sequence[str]) -> Dict[str, List[str]]:
    """torchrl's default ``group_map`` of ``PettingZooEnv``: an agent named
    ``<prefix>_<int>`` goes to group ``<prefix>``, any other to a group of its own."""
    groups: Dict[str, List[str]] = {}
    for agent in agents:
        prefix, _, index = agent.rpartition("_")
        group = prefix if prefix and index.isdigit() else agent
        groups.setdefault(group, []).append(agent)
    return groups


def make_pettingzoo(env_id: str, env_config: Optional[Mapping[str, Any]]) -> Any:
    """The PettingZoo parallel env of a ``pettingzoo:`` id, as the Python node makes it:
    the module's ``parallel_env(**config)``, or its AEC ``env`` converted with PettingZoo's
    ``aec_to_parallel``, or ``<module>:<factory>``'s result."""
    import importlib

    from pettingzoo.utils.conversions import aec_to_parallel
    from pettingzoo.utils.env import AECEnv

    module, _, factory = env_id[len(PETTINGZOO):].partition(":")
    m = importlib.import_module(module)
    kwargs = dict(env_config or {})
    if factory:
        env = getattr(m, factory)(**kwargs)
    elif hasattr(m, "parallel_env"):
        env = m.parallel_env(**kwargs)
    else:
        env = m.env(**kwargs)
    return aec_to_parallel(env) if isinstance(env, AECEnv) else env


def pettingzoo_specs(env_id: str, env_config: Optional[Mapping[str, Any]]) -> Optional[Dict[str, Any]]:
    """``{"observation", "action", "agents"}`` of a PettingZoo env (``None`` when it
    cannot be made here, or its groups' agents differ in their spaces)."""
    try:
        env = make_pettingzoo(env_id, env_config)
    except Exception:
        return None
    try:
        groups = torchrl_groups(list(env.possible_agents))
        obs, act = {}, {}
        for g, agents in groups.items():
            obs[g] = _space(env.observation_space(agents[0]))
            act[g] = _space(env.action_space(agents[0]))
            if obs[g] is None or act[g] is None:
                return None
    finally:
        env.close()
    return {
        "observation": {"kind": "dict", "spaces": obs},
        "action": {"kind": "dict", "spaces": act},
        "agents": groups,
    }
