"""A PettingZoo env's agents as groups, and its spaces as ``ready.specs`` and batch entries
(PROTOCOL.md §3, version 10, multi-agent envs).

Groups are torchrl's ``PettingZooEnv`` default ``group_map``, so that a torchrl user finds
the keys they know: over ``possible_agents`` in order, an agent ``<prefix>_<int>`` joins group
``<prefix>``, any other agent is a group of its own named as the agent. A group's agents share
one observation and one action space (the space of one agent is sent); its agent axis is the
order of its agents in ``possible_agents``. Every batch key of group ``g`` starts ``g.``
(``g.observation``, ``g.action``, ``g.mask``, ``next.g.reward``, ...), so a group's name may
hold no dot, nor be one of the batch's own root names.
"""

from . import spaces
from .spaces import SpaceError

#: The limits of ``ready.specs.agents`` (PROTOCOL.md §3): the trainer refuses more.
MAX_GROUPS, MAX_AGENTS, MAX_NAME_BYTES = 16, 1024, 64
#: Group names that would make a key the batch (or its TensorDict: the root ``done``,
#: ``terminated``, ``truncated``) has already.
_RESERVED = ("next", "collector", "step_count", "done", "terminated", "truncated")


def group_map(agents):
    """``{group: [agents]}`` of ``agents`` (``possible_agents``, in order), as torchrl's
    ``PettingZooEnv`` builds its default group map: ``name_<int>`` to ``name``."""
    out = {}
    for a in agents:
        parts = str(a).split("_")
        try:
            int(parts[-1])
            group = "_".join(parts[:-1]) if len(parts) > 1 else None
        except ValueError:
            group = None
        out.setdefault(a if group is None else group, []).append(a)
    return out


def check_agents(groups):
    """SpaceError naming the group or agent that breaks the protocol's limits."""
    names = [a for agents in groups.values() for a in agents]
    if not names:
        raise SpaceError("agents", "the env has no agents (possible_agents is empty)")
    if len(groups) > MAX_GROUPS:
        raise SpaceError("agents", f"{len(groups)} groups, more than the {MAX_GROUPS} a node may have")
    if len(names) > MAX_AGENTS:
        raise SpaceError("agents", f"{len(names)} agents, more than the {MAX_AGENTS} a node may have")
    if len(set(names)) != len(names):
        raise SpaceError("agents", "agent names are not unique")
    for a in names:
        if not isinstance(a, str) or not 1 <= len(a.encode()) <= MAX_NAME_BYTES:
            raise SpaceError("agents", f"agent {a!r} is not a name of 1 to {MAX_NAME_BYTES} bytes")
    for g in groups:
        if "." in g or g in _RESERVED:
            raise SpaceError(g, f"group `{g}` cannot name batch keys (a group holds no dot and is none of {', '.join(_RESERVED)})")


def group_spaces(groups, observation_space, action_space):
    """``{group: (observation space, action space)}`` of one agent of each group, SpaceError
    naming the group and the first agent whose spaces differ from the group's first agent's."""
    out = {}
    for g, agents in groups.items():
        obs, act = observation_space(agents[0]), action_space(agents[0])
        for a in agents[1:]:
            if observation_space(a) != obs:
                raise SpaceError(g, f"agent `{a}` observes {observation_space(a)}, agent `{agents[0]}` of its group {obs}: "
                                    "a group's agents share one observation space")
            if action_space(a) != act:
                raise SpaceError(g, f"agent `{a}` acts in {action_space(a)}, agent `{agents[0]}` of its group {act}: "
                                    "a group's agents share one action space")
        out[g] = (obs, act)
    return out


def specs(groups, per_group, double_to_float=False):
    """``ready.specs`` of a multi-agent env: a dict entry per group (its one agent's space)
    and ``agents``."""
    obs, act = {}, {}
    for g in sorted(groups):
        o, a = per_group[g]
        obs[g] = spaces.to_wire(o, f"{g}.observation", double_to_float)
        act[g] = spaces.to_wire(a, f"{g}.action", double_to_float)
        if act[g]["kind"] == "dict":
            raise SpaceError(f"{g}.action", f"{a}: a dict action space cannot be collected")
        if act[g]["kind"] == "box" and act[g]["dtype"] not in ("f32", "f64"):
            raise SpaceError(f"{g}.action", f"{a}: box actions are of floats")
    out = {"observation": {"kind": "dict", "spaces": obs}, "action": {"kind": "dict", "spaces": act},
           "agents": {g: list(groups[g]) for g in sorted(groups)}}
    used = 0
    for g in sorted(groups):
        used = spaces._count_values(obs[g], f"{g}.observation", used)
        used = spaces._count_values(act[g], f"{g}.action", used)
    return out


class Leaf(spaces.Leaf):
    """One observation entry of group ``group``: ``key`` (``g.observation.<name>...``), the
    agent's dict path, the wire dtype and the shape ``[n, *feature shape]``."""

    def __init__(self, group, leaf, n):
        super().__init__(leaf.suffix, leaf.path, leaf.dtype, (n,) + leaf.shape)
        self.group, self.n = group, n
        self.key = f"{group}.observation{leaf.suffix}"


def leaves(env_specs):
    """Every group's observation entries, groups in name order, a dict's leaves in name order."""
    out = []
    for g in sorted(env_specs["agents"]):
        n = len(env_specs["agents"][g])
        out += [Leaf(g, leaf, n) for leaf in spaces.leaves(env_specs["observation"]["spaces"][g])]
    return out


def layout(env_specs):
    """``{key: [dtype, shape]}`` of every batch of a multi-agent env (no recorded key)."""
    out = {}
    for leaf in leaves(env_specs):
        for head in ("", "next."):
            out[head + leaf.key] = [leaf.dtype, list(leaf.shape)]
    for g in sorted(env_specs["agents"]):
        n = len(env_specs["agents"][g])
        dtype, shape = spaces.entry(env_specs["action"]["spaces"][g], action=True)
        out[f"{g}.action"] = [dtype, [n, *shape]]
        out[f"{g}.mask"] = ["bool", [n]]
        out[f"next.{g}.mask"] = ["bool", [n]]
        out[f"next.{g}.reward"] = ["f32", [n, 1]]
        for flag in ("terminated", "truncated", "done"):
            out[f"next.{g}.{flag}"] = ["bool", [n, 1]]
    out.update({
        "next.done": ["bool", [1]], "next.terminated": ["bool", [1]], "next.truncated": ["bool", [1]],
        "collector.traj_ids": ["i64", []], "step_count": ["i64", [1]],
    })
    return out
