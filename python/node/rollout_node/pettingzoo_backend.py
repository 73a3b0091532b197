"""PettingZoo multi-agent envs as the node's envs (issue 40; PROTOCOL.md §3, version 10).

``pettingzoo:<module>`` calls the module's ``parallel_env(**config)`` (a module with only
``env``, an AEC env, is converted with PettingZoo's ``aec_to_parallel``);
``pettingzoo:<module>:<factory>`` calls that factory, which returns a ParallelEnv or an
AECEnv (converted likewise). Agents are grouped as ``marl_spaces`` says.

Env ``k`` of the node is its own ParallelEnv, row ``k`` of every batch, first reset
``reset(seed=rollout.seed + k)``, later resets ``reset()``; it is reset before its next step
once no agent is left (``not env.agents``) or ``max_frames_per_traj`` cut the episode. Every
agent of ``possible_agents`` has its place on its group's agent axis at every frame:
``g.mask`` says whether it was in ``env.agents`` before the step (it observed and acted),
``next.g.mask`` whether it is after it; an agent not present has zeros for its observation,
action and records. What the step returned for an agent is its ``next.`` entries: its
observation and reward (zeros when it returned none) and its flags, an agent it returned no
flags for (gone, or not yet come) both terminated and truncated (torchrl's rule). The cut
(``max_frames_per_traj``) truncates every agent. The env's ``next.done``, ``next.terminated``
and ``next.truncated`` are each the flag of every agent (torchrl's ``done_on_any=False``), or,
where ``spec.env.done_on_any`` (version 12), of any agent (torchrl's ``done_on_any=True``:
``_aggregate_done`` over every agent of every group, an agent not present done); ``next.done``
also once no agent is left. The env is stepped with the actions of the present agents only.

An env that raises is rebuilt alone (its restart seed, ids moved past those delivered: as
``collect`` does for gymnasium's envs) and its row collected again from the batch's start;
the other rows keep theirs. Multi-agent envs are not checkpointed (``checkpoint_failed``).
"""

import importlib

import numpy as np

from . import marl_spaces, spaces
from .collect import _DIRECT_BYTES, _GOLDEN, _MASK64, STOP_CHECK_STEPS, BuildError, CheckpointError, NodeFailed, Stopped, Workers, _EnvFailed
from .marl_policy import RandomGroups, random_group_actions, random_group_record
from .policy import ActionSpace, Policy

#: The env id prefix that names this backend: ``pettingzoo:mpe2.simple_spread_v3``.
PREFIX = "pettingzoo:"


def is_pettingzoo(name):
    """Whether env id ``name`` names a PettingZoo env (``pettingzoo:<module>[:<factory>]``)."""
    return isinstance(name, str) and name.startswith(PREFIX)


def factory(name, config):
    """A function making one ParallelEnv of ``pettingzoo:`` id ``name`` with ``config`` (its
    keyword arguments); BuildError with a one-line reason for an id that names nothing usable."""
    module, _, fn_name = name[len(PREFIX):].partition(":")
    if not module:
        raise BuildError(f"env `{name}`: a PettingZoo id is `pettingzoo:<module>` or `pettingzoo:<module>:<factory>`")
    if config is None:
        config = {}
    if not isinstance(config, dict):
        raise BuildError(f"spec.env.config of `{name}` must be a map of keyword arguments or nil")
    try:
        mod = importlib.import_module(module)
    except Exception as e:
        raise BuildError(f"env `{name}`: cannot import `{module}`: {type(e).__name__}: {e}") from None
    if fn_name:
        fn = getattr(mod, fn_name, None)
        if not callable(fn):
            raise BuildError(f"env `{name}`: module `{module}` has no function `{fn_name}`")
    else:
        fn = getattr(mod, "parallel_env", None) or getattr(mod, "env", None)
        if not callable(fn):
            raise BuildError(f"env `{name}`: module `{module}` has neither `parallel_env` nor `env`")

    def make():
        return as_parallel(name, fn(**config))

    return make


def as_parallel(name, env):
    """``env`` as a ParallelEnv: an AECEnv through PettingZoo's ``aec_to_parallel``."""
    from pettingzoo.utils.conversions import aec_to_parallel
    from pettingzoo.utils.env import AECEnv, ParallelEnv

    if isinstance(env, ParallelEnv):
        return env
    if isinstance(env, AECEnv):
        return aec_to_parallel(env)
    raise BuildError(f"env `{name}`: the factory returned a {type(env).__name__}, not a PettingZoo ParallelEnv or AECEnv")


class _Envs:
    """The node's envs, one ParallelEnv per row (``envs``, as a vector env's)."""

    def __init__(self, envs):
        self.envs = envs

    def close(self):
        for e in self.envs:
            try:
                e.close()
            except Exception:
                pass


class PettingZooWorkers(Workers):
    """:class:`Workers` whose envs are PettingZoo ParallelEnvs (see the module's doc)."""

    def _build_envs(self, config):
        self._make_env = factory(self.env_name, config)
        #: PettingZoo envs end their episodes themselves (``max_cycles``): no node limit.
        self.time_limit = None
        self.vec = _Envs([])
        for _ in range(self.E):
            self.vec.envs.append(self._make_env())

    def _factory(self, k):
        return self._make_env

    def refuse_checkpoint(self):
        raise CheckpointError(f"env `{self.env_name}` is a PettingZoo env: the Python node does not checkpoint multi-agent envs")

    def _build_policy(self, spec, double_to_float):
        env = self.vec.envs[0]
        try:
            groups = marl_spaces.group_map(list(env.possible_agents))
            marl_spaces.check_agents(groups)
            per = marl_spaces.group_spaces(groups, env.observation_space, env.action_space)
        except spaces.SpaceError as e:
            raise BuildError(f"env `{self.env_name}`: {e}") from None
        #: ``{group: [agents]}``, groups in name order.
        self.groups = {g: list(groups[g]) for g in sorted(groups)}
        self.specs = marl_spaces.specs(self.groups, per, double_to_float)
        self.leaves = marl_spaces.leaves(self.specs)
        self.single = False
        self._floats = [i for i, leaf in enumerate(self.leaves) if leaf.dtype in ("f32", "f64")]
        self.actions = {g: ActionSpace.of(per[g][1]) for g in self.groups}
        #: ``[(group, action space, n)]`` in name order: what the policies take.
        self.group_list = [(g, self.actions[g], len(a)) for g, a in self.groups.items()]
        #: ``[(group, axis index, agent)]`` of every agent.
        self.agents = [(g, j, a) for g, agents in self.groups.items() for j, a in enumerate(agents)]
        self._known = {a for _, _, a in self.agents}
        self._leaves_of = {g: [(i, leaf) for i, leaf in enumerate(self.leaves) if leaf.group == g] for g in self.groups}
        #: Whether each agent is in ``env.agents``, per group ``[E, n]``.
        self.alive = {g: np.zeros((self.E, len(a)), bool) for g, a in self.groups.items()}
        #: Per group, what ``_step`` reads and writes, looked up once: the group, its agents,
        #: its observation leaves ``[(index in self.leaves, leaf, whether the leaf is the
        #: whole observation, an agent's zeros when the leaf is small (None: written straight
        #: into the batch))]`` and its batch keys.
        self._plan = [
            (g, agents, [(i, leaf, not leaf.path,
                          None if np.prod(leaf.shape[1:]) * np.dtype(leaf.np).itemsize >= _DIRECT_BYTES
                          else np.zeros(leaf.shape[1:], leaf.np))
                         for i, leaf in self._leaves_of[g]],
             f"{g}.action", f"{g}.mask", f"next.{g}.mask", f"next.{g}.reward",
             f"next.{g}.terminated", f"next.{g}.truncated", f"next.{g}.done")
            for g, agents in self.groups.items()
        ]
        #: Per group, the flags of a step where every agent is on (``_step_all_on``): all
        #: false, all true. Read only (``_flush`` copies them into the batch).
        self._all_on = {g: ([False] * len(a), [True] * len(a)) for g, a in self.groups.items()}
        self.recurrent = None
        pol = spec.get("policy") or {}
        config = pol.get("config") if isinstance(pol.get("config"), dict) else {}
        kind = config.get("kind")
        seed = (self.seed * _GOLDEN) & _MASK64 ^ 1
        if kind in spaces.WEIGHTED:
            raise BuildError(f"policy {kind} serves single-agent envs; `{self.env_name}` is a multi-agent env (random and onnx serve it)")
        if kind == "onnx":
            from .onnx_policy import OnnxPolicy

            self.policy = OnnxPolicy(pol, self.leaves, None, seed, env_keys=marl_spaces.layout(self.specs), groups=self.group_list)
        elif kind == "random":
            self.policy = RandomGroups(pol, self.group_list, seed)
        else:
            self.policy = Policy(pol, None, self.group_list[0][1], seed)  # refuses the kind, naming it
        self._withhold_records(pol)

    def layout(self):
        """The ``ready`` layout: the env's keys (``marl_spaces.layout``) and the policy's records."""
        return {**marl_spaces.layout(self.specs), **self.recording()}

    def _new_batch(self, T):
        new = self._array
        return {key: new((self.E, T, *shape), np.bool_ if dtype == "bool" else spaces.NUMPY[dtype])
                for key, (dtype, shape) in self.layout().items()}

    def _write_obs(self, k, obs, present):
        """Row ``k``'s current observations and ``alive`` from ``obs`` (agent -> observation)
        for the agents of ``present``; zeros for the others."""
        stranger = present - self._known
        if stranger:
            raise NodeFailed(f"env worker {k}: agent `{sorted(stranger)[0]}` is not one of the env's possible_agents")
        for g, agents in self.groups.items():
            alive = self.alive[g]
            for j, a in enumerate(agents):
                here = a in present and a in obs
                alive[k, j] = a in present
                for i, leaf in self._leaves_of[g]:
                    self.cur[i][k, j] = leaf.get(obs[a]) if here else 0

    def _reset(self, rows):
        """Starts a new episode in every env of ``rows``, each reset with its pending seed
        (None: ``reset()``, the env's generator going on)."""
        for k in rows:
            k = int(k)
            seed, self.pending_seed[k] = self.pending_seed[k], None
            env = self.vec.envs[k]
            try:
                obs, _ = env.reset(seed=seed)
                present = set(env.agents)
            except Exception as e:
                raise _EnvFailed(k, e) from e
            self._write_obs(k, obs, present)
            self.traj_id[k] = self.next_id[k]
            self.next_id[k] += self.lanes
            self.step_count[k] = 0
            self.needs_reset[k] = False
            self.fresh[k] = False

    def _group_actions(self, rows, obs):
        """``({g: [k, n, ...]}, {key: [k, n, ...]})`` of ``rows`` (whose current observations
        are ``obs``): the policy's, or the random policy's for a worker within
        ``init_random_frames``; absent agents' zeroed."""
        k = len(rows)
        random = self._random_rows(rows, 0) if self.init_random else np.zeros(k, bool)
        if random.all():
            acts = random_group_actions(self.group_list, self.policy.rng, k)
            rec = random_group_record(self.group_list, self.recorded, k)
        else:
            acts, rec = self.policy.act_groups(obs, k)
            for key in self._withheld:
                rec.pop(key, None)
            if random.any():
                n = int(random.sum())
                for g, v in random_group_actions(self.group_list, self.policy.rng, n).items():
                    acts[g][random] = v
                for key, v in random_group_record(self.group_list, self.recorded, n).items():
                    rec[key][random] = v
        for g in self.groups:
            alive = self.alive[g][rows]
            if alive.all():
                continue
            absent = ~alive
            acts[g][absent] = 0
            for key in rec:
                if key.rsplit(".", 1)[0] == g:
                    rec[key][absent] = 0
        return acts, rec

    def _write_column(self, b, rows, cols, obs, acts, rec):
        """What the frames of ``rows`` (at columns ``cols``) hold before their step: the
        current observations ``obs``, actions, records, masks, trajectory ids and step counts.
        A row that does not step now (a failing env, and those after it) writes its frame
        again when it does."""
        for key, v in rec.items():
            b[key][rows, cols] = v
        for leaf, o in zip(self.leaves, obs):
            b[leaf.key][rows, cols] = o
        for g, _, _, k_act, k_mask, *_ in self._plan:
            b[k_act][rows, cols] = acts[g]
            b[k_mask][rows, cols] = self.alive[g][rows]
        b["collector.traj_ids"][rows, cols] = self.traj_id[rows]
        b["step_count"][rows, cols, 0] = self.step_count[rows]

    def collect(self, frames, stop=None):
        """One batch of ``frames`` frames, ``[E, T, ...]``: each column one policy call for every
        row still collecting, then each row's env stepped with its present agents' actions."""
        E = self.E
        if frames == 0 or frames % E:
            raise NodeFailed(f"{frames} frames do not split evenly over {E} env workers")
        T = frames // E
        if self.reset_each:
            self.needs_reset[:] = True
        b = self._new_batch(T)
        pos = np.zeros(E, np.int64)
        steps = 0
        while (pos < T).any():
            if stop is not None and steps % STOP_CHECK_STEPS == 0 and stop.is_set():
                raise Stopped()
            steps += 1
            rows = np.nonzero(pos < T)[0]
            stepped = []
            try:
                resets = [int(k) for k in rows if self.needs_reset[k]]
                if resets:
                    self._reset(resets)
                obs = [c[rows] for c in self.cur]
                acts, rec = self._group_actions(rows, obs)
                cols = pos[rows]
                self._write_column(b, rows, cols, obs, acts, rec)
                for i, (k, t) in enumerate(zip(rows.tolist(), cols.tolist())):
                    stepped.append(self._step(b, k, t, i, acts))
                    pos[k] += 1
                self._flush(b, stepped)
            except _EnvFailed as f:
                # Rows stepped before the failing one keep this column; the others step it
                # again with new actions; the failed row is rebuilt and starts over.
                self._flush(b, stepped)
                self._restart(f.k, f.cause)
                pos[f.k] = 0
        for k in range(E):
            self.delivered_max_id[k] = max(self.delivered_max_id[k], int(b["collector.traj_ids"][k].max()))
            self.delivered_frames[k] += T
        return b

    def _step(self, b, k, t, i, acts):
        """Steps row ``k`` with row ``i`` of ``acts``. Writes the step's large observations
        (images) into column ``t`` of its frame and into row ``k``'s current ones; returns the
        rest, which ``_flush`` writes for every row of the column at once:
        ``(k, t, done, truncated, terminated, [per group: (small observations, rewards,
        terminated, truncated, done, in env.agents, agents that observed but left)])``."""
        env = self.vec.envs[k]
        alive = self.alive
        action = {}
        for g, agents, *_ in self._plan:
            a_k = acts[g][i]
            # An action as the env takes it: a Python int for a scalar one, the array otherwise.
            if a_k.ndim == 1:
                vals = a_k.tolist() if a_k.dtype.kind in "iu" else [int(v) for v in a_k]
            else:
                vals = list(a_k)
            for a, v, here in zip(agents, vals, alive[g][k].tolist()):
                if here:
                    action[a] = v
        try:
            o, r, te, tr, _ = env.step(action)
            ag = env.agents
        except Exception as e:
            raise _EnvFailed(k, e) from e
        known = self._known
        cut = self.max_traj is not None and int(self.step_count[k]) + 1 >= self.max_traj
        if (not cut and len(ag) == len(known) and set(ag) == known and o.keys() == known and te.keys() == known
                and tr.keys() == known and not any(te.values()) and not any(tr.values())):
            return self._step_all_on(b, k, t, o, r)
        after = set(ag)
        stranger = after - known
        if stranger:
            raise NodeFailed(f"env worker {k}: agent `{sorted(stranger)[0]}` is not one of the env's possible_agents")
        all_term = all_trunc = all_done = True
        any_term = any_trunc = any_done = False
        per_group = []
        for g, agents, leaves, *_ in self._plan:
            # One pass over the agents (a comprehension each costs a call): whether each
            # observed, is still in env.agents, its flags and reward. An agent the step
            # returned no flags for has left (or not come): terminated and truncated.
            seen, here, left, term, trunc, done, rew = [], [], [], [], [], [], []
            for j, a in enumerate(agents):
                s_, h_ = a in o, a in after
                seen.append(s_)
                here.append(h_)
                if s_ and not h_:
                    # Observed, but no longer in env.agents: no current observation.
                    left.append(j)
                x = bool(te.get(a, True))
                y = True if cut else bool(tr.get(a, True))
                term.append(x)
                trunc.append(y)
                done.append(x or y)
                rew.append(r.get(a, 0.0))
            small = []
            for li, leaf, whole, zero in leaves:
                if zero is not None:
                    small.append([(o[a] if whole else leaf.get(o[a])) if s_ else zero for a, s_ in zip(agents, seen)])
                    continue
                dst = b["next." + leaf.key][k, t]
                for j, a in enumerate(agents):
                    dst[j] = (o[a] if whole else leaf.get(o[a])) if seen[j] else 0
                c = self.cur[li][k]
                c[...] = dst
                for j in left:
                    c[j] = 0
            per_group.append((small, rew, term, trunc, done, here, left))
            all_term = all_term and all(term)
            all_trunc = all_trunc and all(trunc)
            all_done = all_done and all(done)
            any_term = any_term or any(term)
            any_trunc = any_trunc or any(trunc)
            any_done = any_done or any(done)
        if self.done_on_any:
            done = not after or cut or any_done
            return k, t, done, done and any_trunc, done and any_term, per_group
        done = not after or cut or all_done
        return k, t, done, done and all_trunc, done and all_term, per_group

    def _step_all_on(self, b, k, t, o, r):
        """``_step``'s result for the common step: every agent observed, still in the env,
        neither terminated nor truncated, the trajectory not cut (so the env goes on). The
        same values as the general pass over the agents, with the flags' lists made once."""
        per_group = []
        for g, agents, leaves, *_ in self._plan:
            small = []
            for li, leaf, whole, zero in leaves:
                if zero is not None:
                    small.append([o[a] for a in agents] if whole else [leaf.get(o[a]) for a in agents])
                    continue
                dst = b["next." + leaf.key][k, t]
                for j, a in enumerate(agents):
                    dst[j] = o[a] if whole else leaf.get(o[a])
                self.cur[li][k][...] = dst
            no, yes = self._all_on[g]
            per_group.append((small, [r.get(a, 0.0) for a in agents], no, no, no, yes, ()))
        return k, t, False, False, False, per_group

    def _flush(self, b, stepped):
        """Writes what ``_step`` returned for the rows ``stepped`` of a column: their frames'
        ``next.`` entries, then their current observations, ``alive``, step counts and whether
        they reset before their next step."""
        if not stepped:
            return
        ks = np.array([s[0] for s in stepped], np.int64)
        ts = np.array([s[1] for s in stepped], np.int64)
        cur = self.cur
        for gi, (g, agents, leaves, _, _, k_nmask, k_rew, k_term, k_trunc, k_done) in enumerate(self._plan):
            per = [s[5][gi] for s in stepped]
            si = 0
            for li, leaf, _, zero in leaves:
                if zero is None:
                    continue
                x = np.array([p[0][si] for p in per])
                si += 1
                b["next." + leaf.key][ks, ts] = x
                cur[li][ks] = x
                for k, p in zip(ks.tolist(), per):
                    for j in p[6]:
                        cur[li][k, j] = 0
            b[k_rew][ks, ts, :, 0] = [p[1] for p in per]
            b[k_term][ks, ts, :, 0] = [p[2] for p in per]
            b[k_trunc][ks, ts, :, 0] = [p[3] for p in per]
            b[k_done][ks, ts, :, 0] = [p[4] for p in per]
            here = [p[5] for p in per]
            b[k_nmask][ks, ts] = here
            self.alive[g][ks] = here
        done = [s[2] for s in stepped]
        b["next.done"][ks, ts, 0] = done
        b["next.truncated"][ks, ts, 0] = [s[3] for s in stepped]
        b["next.terminated"][ks, ts, 0] = [s[4] for s in stepped]
        self.step_count[ks] += 1
        self.needs_reset[ks] = done
        self.frames[ks] += 1
        if self.nan_is_failure:
            for k, d in zip(ks.tolist(), done):
                if not d and self._has_nan([c[k] for c in cur]):
                    raise NodeFailed(f"env worker {k} produced a NaN observation")
