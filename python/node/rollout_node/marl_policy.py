"""The ``random`` policy on a multi-agent env (PROTOCOL.md §8, version 10), and what a frame
acted at random records: the single-agent random policy's draw (``policy.random_actions``) and
log-density, once per agent.

Draws go env by env, then group by group in name order, then agent by agent in axis order, each
agent one draw of ``random_actions`` with the worker's generator, whether the agent is present
or not (the caller zeroes the actions of absent agents): a row's draws do not depend on which
agents are alive.
"""

import numpy as np

from .policy import Policy, random_actions, random_log_density


def random_group_actions(groups, rng, k):
    """``{g: [k, n, *shape]}`` uniform actions for ``k`` envs of ``groups`` (``[(g, action, n)]``
    in name order), drawn in the documented order."""
    if all(a.discrete and a.n <= 1 << 32 for g, a, n in groups):
        # One draw of every agent's bound in the documented order: numpy's bounded integers
        # draw element by element from the generator's stream, as the draws one by one do.
        highs = np.tile(np.concatenate([np.full(n, a.n, np.int64) for _, a, n in groups]), k)
        draws = rng.integers(0, highs, dtype=np.int64).reshape(k, -1)
        acts, j = {}, 0
        for g, a, n in groups:
            acts[g] = a.value(draws[:, j:j + n]).astype(a.dtype)
            j += n
        return acts
    acts = {g: np.zeros((k, n) + a.shape, a.dtype) for g, a, n in groups}
    for i in range(k):
        for g, a, n in groups:
            out = acts[g]
            for j in range(n):
                out[i, j] = random_actions(a, rng, 1)[0]
    return acts


def random_group_record(groups, recorded, k):
    """What ``k`` frames acted at random record under the keys of ``recorded`` (the policy's
    ``{g.key: [dtype, shape]}``): each agent's uniform log-density, ``logits`` 0 (the uniform
    categorical), anything else NaN (no distribution was used), as ``policy.fill_recorded``."""
    density = {g: random_log_density(a) for g, a, _ in groups}
    out = {}
    for key, (_, shape) in recorded.items():
        g, name = key.rsplit(".", 1)
        if name == "action_log_prob":
            out[key] = np.full((k, *shape), density[g], np.float32)
        else:
            out[key] = np.full((k, *shape), 0.0 if name == "logits" else np.nan, np.float32)
    return out


class RandomGroups(Policy):
    """``random`` for a multi-agent env of ``groups`` (``[(g, action, n)]``, name order)."""

    def __init__(self, spec, groups, seed):
        super().__init__(spec, None, groups[0][1], seed)
        self.groups = groups

    def recorded_layout(self):
        """``g.action_log_prob`` f32 ``[n]`` per group."""
        return {f"{g}.action_log_prob": ["f32", [n]] for g, _, n in self.groups}

    def act_groups(self, obs, k):
        """``({g: [k, n, ...]}, {g.action_log_prob: [k, n]})`` for ``k`` envs (``obs`` unused)."""
        return random_group_actions(self.groups, self.rng, k), random_group_record(self.groups, self.recorded_layout(), k)
