"""Multi-agent envs through ``rollout.DistributedCollector`` (issue 40): PettingZoo's envs
served by Python nodes, batches in torchrl's ``PettingZooEnv`` layout, a torchrl
multi-agent actor exported to the nodes, and every frame replaying through PettingZoo by
seed.

- Layout: one batch of torchrl's own ``Collector`` over ``PettingZooWrapper`` and one of
  rollout's over the same wrapper and actor have the same keys, dtypes and feature shapes
  (rollout adds ``step_count`` and which weights and node made each frame, as for one
  agent): on simple_spread with and without ``use_mask``, and on knights-archers-zombies,
  whose agents die (``use_mask=True, done_on_any=False``), where the masks and flags of the
  agents that left are torchrl's too.
- The actor: each frame's recorded ``("agent", "action_log_prob")`` is the log-probability
  of its recorded action under the actor, on its recorded observation.
- Replay: a sync and an async run of two nodes replay frame by frame through PettingZoo
  itself by seed (``rollout_node.marl_replay``: row ``r`` of the run first reset with
  ``seed + r``).
- An actor per group (MPE's simple_tag: adversaries and an agent), torchrl's policy for an
  env of several groups: exported as one model, torchrl's layout, each group's recorded
  log-probabilities its actor's, each actor's pushed weights used; and torchrl's MADDPG form
  (a TanhDelta actor under Gaussian noise per group), each group exploring with its own noise.
- ``done_on_any=True`` (torchrl's default for a parallel env): on KAZ the env's flags are,
  frame for frame, what torchrl's wrapper aggregates from the agents' flags, the env resets
  at the first agent's end, and the run replays through PettingZoo under that rule.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest

import rollout
from conftest import require_python_node

mpe2 = pytest.importorskip("mpe2")
torch = pytest.importorskip("torch")
pytest.importorskip("torchrl")

from tensordict.nn import TensorDictModule  # noqa: E402
from torch.distributions import Categorical  # noqa: E402

warnings.filterwarnings("ignore", category=UserWarning)
warnings.filterwarnings("ignore", category=DeprecationWarning)
warnings.filterwarnings("ignore", category=FutureWarning)

SPREAD = "pettingzoo:mpe2.simple_spread_v3"
SEED = 4


def spread(**kw):
    from mpe2 import simple_spread_v3

    return simple_spread_v3.parallel_env(N=3, max_cycles=25, **kw)


def kaz():
    from pettingzoo.butterfly import knights_archers_zombies_v11

    # Agents die one by one within a few hundred steps (measured: the first at ~130).
    return knights_archers_zombies_v11.parallel_env(spawn_delay=2, max_zombies=30, max_cycles=300)


def wrapper(pz, **kw):
    from torchrl.envs import PettingZooWrapper

    return PettingZooWrapper(env=pz, **kw)


def spread_actor(group="agent", n=3, obs=18, actions=5, **kw):
    """torchrl's multi-agent actor: a shared-parameter MLP per agent, categorical (``kw``:
    more of ``ProbabilisticActor``'s arguments)."""
    from torchrl.modules import MultiAgentMLP, ProbabilisticActor

    torch.manual_seed(0)
    net = MultiAgentMLP(n_agent_inputs=obs, n_agent_outputs=actions, n_agents=n, centralised=False, share_params=True, depth=2, num_cells=32)
    return ProbabilisticActor(
        TensorDictModule(net, in_keys=[(group, "observation")], out_keys=[(group, "logits")]),
        in_keys=[(group, "logits")],
        out_keys=[(group, "action")],
        distribution_class=Categorical,
        return_log_prob=True,
        **kw,
    )


def layout(td):
    """Leaf key -> (dtype, feature shape), the batch dims left out."""
    n = len(td.batch_size)
    return {k: (v.dtype, tuple(v.shape[n:])) for k, v in td.items(include_nested=True, leaves_only=True)}


def torchrl_batch(env, policy, frames):
    from torchrl.collectors import Collector

    c = Collector(env, policy, frames_per_batch=frames, total_frames=frames)
    try:
        return next(iter(c))
    finally:
        c.shutdown()


def rollout_batches(env, policy, frames, total=None, **kw):
    require_python_node()
    with rollout.DistributedCollector(env, policy, frames_per_batch=frames, total_frames=total or frames, seed=SEED, **kw) as c:
        return list(c)


def dotted(batch):
    """A plain batch's entries by dotted key (``next.agent.reward``), as NumPy arrays."""
    d = {}

    def walk(x, prefix=""):
        for k, v in x.items():
            if isinstance(v, dict):
                walk(v, prefix + k + ".")
            else:
                d[prefix + k] = np.array(v)

    walk(batch.to_dict())
    return d


def ours_less_rollouts_own(td):
    """rollout's layout less what it adds for every env (``step_count``, which weights and
    node made each frame)."""
    ours = layout(td)
    assert ours.pop("step_count") == (torch.int64, (1,))
    assert ours.pop(("collector", "weights_version")) == (torch.int64, ())
    assert ours.pop(("collector", "node")) == (torch.int64, ())
    return ours


@pytest.mark.parametrize("use_mask", [False, True])
def test_simple_spread_batches_have_torchrls_pettingzoo_layout(use_mask):
    actor = spread_actor()
    theirs = layout(torchrl_batch(wrapper(spread(), use_mask=use_mask), actor, 50))
    (td,) = rollout_batches(wrapper(spread(), use_mask=use_mask), actor, 50)
    assert td.batch_size == torch.Size([50])
    ours = ours_less_rollouts_own(td)
    assert ours == theirs, {k: (ours.get(k), theirs.get(k)) for k in set(ours) | set(theirs) if ours.get(k) != theirs.get(k)}
    assert (("agent", "mask") in ours) == use_mask
    # max_cycles 25: every agent and the env truncated at the 25th step, reset after it.
    ends = torch.nonzero(td["next", "done"][:, 0]).squeeze(1).tolist()
    assert ends == [24, 49]
    assert td["next", "agent", "truncated"][ends].all() and not td["next", "terminated"].any()
    assert not td["agent", "done"].any(), "every agent is present at every step"


def test_recorded_log_probs_are_the_actors_on_the_recorded_frames():
    actor = spread_actor()
    batches = rollout_batches(wrapper(spread()), actor, 100, total=300, nodes=2)
    for td in batches:
        with torch.no_grad():
            lp = actor.get_dist(td.select(("agent", "observation"))).log_prob(td["agent", "action"])
        assert td["agent", "action_log_prob"].shape == (100, 3)
        assert torch.allclose(lp, td["agent", "action_log_prob"], atol=1e-5), (lp - td["agent", "action_log_prob"]).abs().max()
    # Sampled, not the mode: some action is not its logits' argmax.
    td = batches[0]
    assert (td["agent", "action"] != td["agent", "logits"].argmax(-1)).any()


def test_agents_that_die_are_masked_and_flagged_as_torchrl_masks_and_flags_them():
    from torchrl.envs.utils import RandomPolicy

    env = wrapper(kaz(), use_mask=True, done_on_any=False)
    theirs = layout(torchrl_batch(env, RandomPolicy(env.full_action_spec), 400))
    (td,) = rollout_batches(wrapper(kaz(), use_mask=True, done_on_any=False), "random", 400, record=False, tensordict=True)
    ours = ours_less_rollouts_own(td)
    assert ours == theirs, {k: (ours.get(k), theirs.get(k)) for k in set(ours) | set(theirs) if ours.get(k) != theirs.get(k)}
    for g in ("archer", "knight"):
        mask, nxt_mask = td[g, "mask"], td["next", g, "mask"]
        assert mask.dtype == torch.bool and mask.shape == (400, 2)
        # An agent not present: zeros, and done, terminated and truncated at the step's start
        # and after it (torchrl's rule for an agent the step returned nothing for).
        gone = ~mask
        assert not td[g, "observation"][gone].any()
        for flag in ("done", "terminated", "truncated"):
            assert td[g, flag][..., 0][gone].all() and not td[g, flag][..., 0][mask].any()
            assert td["next", g, flag][..., 0][gone].all()
        # Within an episode, the mask after a step is the mask at the next step.
        same = ~td["next", "done"][:-1, 0]
        assert torch.equal(nxt_mask[:-1][same], mask[1:][same])
    partial = td["archer", "mask"].any(-1) | td["knight", "mask"].any(-1)
    alive = torch.cat([td["archer", "mask"], td["knight", "mask"]], -1)
    assert (partial & ~alive.all(-1)).any(), "some agent died while others played on"
    # The env's flags are every agent's: it ends once none is left.
    ends = td["next", "done"][:, 0]
    after = torch.cat([td["next", "archer", "mask"], td["next", "knight", "mask"]], -1)
    assert torch.equal(ends, ~after.any(-1))


def test_done_on_any_ends_the_episode_at_the_first_agent_done_by_torchrls_own_rule():
    # torchrl's default for a parallel env, done_on_any=True: the env ends (and resets) once any
    # agent is done. On KAZ, whose agents die one by one, the first death ends the episode.
    from torchrl.envs.utils import RandomPolicy

    env = wrapper(kaz(), use_mask=True)
    assert env.done_on_any
    theirs = layout(torchrl_batch(env, RandomPolicy(env.full_action_spec), 400))
    (td,) = rollout_batches(wrapper(kaz(), use_mask=True), "random", 400, record=False, tensordict=True)
    ours = ours_less_rollouts_own(td)
    assert ours == theirs, {k: (ours.get(k), theirs.get(k)) for k in set(ours) | set(theirs) if ours.get(k) != theirs.get(k)}
    # Every frame's env flags are what torchrl's wrapper aggregates from its agents' flags.
    for t in range(400):
        want = [bool(x) for x in env._aggregate_done(td["next"][t], use_any=True)]
        got = [bool(td["next", k][t, 0]) for k in ("done", "terminated", "truncated")]
        assert got == want, (t, got, want)
    agents_done = torch.cat([td["next", "archer", "done"], td["next", "knight", "done"]], -2)[..., 0]
    ends = td["next", "done"][:, 0]
    assert (agents_done.any(-1) & ~agents_done.all(-1)).any(), "an agent died while others played on"
    assert torch.equal(ends, agents_done.any(-1))
    # Each end is followed by a fresh episode with every agent present.
    after = torch.nonzero(ends[:-1]).squeeze(1) + 1
    assert len(after) >= 1
    assert not td["step_count"][after].any()
    assert td["archer", "mask"][after].all() and td["knight", "mask"][after].all()
    # So no step starts with an agent gone.
    assert td["archer", "mask"].all() and td["knight", "mask"].all()


def test_done_on_any_is_the_wrappers_or_the_keyword_and_the_two_must_agree():
    with pytest.raises(rollout.ConfigError, match="done_on_any") as e:
        rollout.DistributedCollector(wrapper(kaz(), use_mask=True), "random", frames_per_batch=10, total_frames=10, done_on_any=False)
    assert "contradicts" in str(e.value)
    with pytest.raises(rollout.ConfigError, match="done_on_any"):
        rollout.DistributedCollector(SPREAD, "random", frames_per_batch=10, total_frames=10, done_on_any="yes")
    # Said in both places alike, or for an env that is no PettingZooWrapper (one agent: the
    # rule changes nothing), it is taken.
    from torchrl.envs import GymEnv

    for env, on_any in ((wrapper(spread(), done_on_any=False), False), ("CartPole-v1", True), (GymEnv("CartPole-v1"), True)):
        (b,) = rollout_batches(env, "random", 20, done_on_any=on_any, tensordict=False)
        assert b.batch_size[-1] == 20


def test_a_done_on_any_run_replays_through_pettingzoo_by_seed_under_its_rule():
    from rollout_node.marl_replay import check_rows

    E, T = 2, 150
    kaz_id = "pettingzoo:pettingzoo.butterfly.knights_archers_zombies_v11"
    config = {"spawn_delay": 2, "max_zombies": 30, "max_cycles": 300}
    batches = rollout_batches(
        kaz_id, "random", E * T, total=2 * E * T, nodes=1, envs_per_node=E, env_config=config, done_on_any=True,
        record=False, tensordict=False,
    )
    rows = {e: {} for e in range(E)}
    for b in batches:
        d = dotted(b)
        for e in range(E):
            for k, v in d.items():
                rows[e].setdefault(k, []).append(v[e])
    rows = {e: {k: np.concatenate(v) for k, v in r.items()} for e, r in rows.items()}
    ends = sum(int(r["next.done"].sum()) for r in rows.values())
    early = sum(int((r["next.archer.done"].any(-2) | r["next.knight.done"].any(-2)).sum()) for r in rows.values())
    assert ends >= 1 and early == ends, "episodes ended at an agent's end"
    assert check_rows(rows, kaz_id, SEED, config, done_on_any=True) == ([], 2 * E * T)
    # The same frames under the other rule do not replay: the rule is what the node followed.
    problems, _ = check_rows(rows, kaz_id, SEED, config)
    assert problems and "next.done" in problems[0], problems


@pytest.mark.parametrize("sync", [True, False])
def test_every_frame_of_a_run_replays_through_pettingzoo_by_seed(sync):
    from rollout_node.marl_replay import check_rows

    E, T = 2, 40
    batches = rollout_batches(SPREAD, "random", 2 * E * T, total=4 * 2 * E * T, nodes=2, envs_per_node=E, sync=sync, tensordict=False)
    rows: dict = {}
    for b in batches:
        d = dotted(b)
        if sync:  # [nodes, E, T, ...]: row node * E + env
            shares = [(n, {k: v[n] for k, v in d.items()}) for n in range(2)]
        else:  # one node's [E, T, ...]
            shares = [(b.node, d)]
        for node, share in shares:
            for e in range(E):
                rows.setdefault(node * E + e, []).append({k: v[e] for k, v in share.items()})
    rows = {r: {k: np.concatenate([p[k] for p in parts]) for k in parts[0]} for r, parts in rows.items()}
    assert sorted(rows) == [0, 1, 2, 3]
    problems, frames = check_rows(rows, SPREAD, SEED, {})
    assert (problems, frames) == ([], 4 * 2 * E * T)
    # And a frame changed is named.
    rows[2]["next.agent.reward"][7, 1, 0] += 0.5
    problems, _ = check_rows(rows, SPREAD, SEED, {})
    assert len(problems) == 1 and problems[0].startswith("row 2 frame 7: reward of agent_1"), problems


def tag():
    from mpe2 import simple_tag_v3

    # Two groups: 3 adversaries (observation [16]) chasing 1 agent ([14]).
    return simple_tag_v3.parallel_env(max_cycles=25)


def tag_policy():
    """torchrl's competitive multi-agent policy: an actor per group, as its MPE tutorials
    build it, in one TensorDictSequential."""
    from tensordict.nn import TensorDictSequential

    # The agent's actor writes its log-probability under a key of its own.
    return TensorDictSequential(spread_actor("adversary", n=3, obs=16), spread_actor("agent", n=1, obs=14, log_prob_key=("agent", "lp")))


def test_an_actor_per_group_is_exported_as_one_model_and_records_each_groups_log_probs():
    policy = tag_policy()
    theirs = layout(torchrl_batch(wrapper(tag()), policy, 50))
    batches = rollout_batches(wrapper(tag()), policy, 50, total=150, nodes=2)
    ours = ours_less_rollouts_own(batches[0])
    assert ours == theirs, {k: (ours.get(k), theirs.get(k)) for k in set(ours) | set(theirs) if ours.get(k) != theirs.get(k)}
    assert ("agent", "lp") in ours and ("agent", "action_log_prob") not in ours
    for td in batches:
        for g, n, actor, key in (("adversary", 3, policy[0], "action_log_prob"), ("agent", 1, policy[1], "lp")):
            with torch.no_grad():
                lp = actor.get_dist(td.select((g, "observation"))).log_prob(td[g, "action"])
            assert td[g, key].shape == (50, n)
            assert torch.allclose(lp, td[g, key], atol=1e-5), (g, (lp - td[g, key]).abs().max())
    assert any((td["adversary", "action"] != td["adversary", "logits"].argmax(-1)).any() for td in batches), "sampled"


def test_each_groups_actor_takes_the_weights_pushed_to_it():
    policy = tag_policy()
    with rollout.DistributedCollector(wrapper(tag()), policy, frames_per_batch=25, total_frames=200, seed=SEED) as c:
        it = iter(c)
        next(it)
        with torch.no_grad():
            for p in policy[1].parameters():
                p.mul_(3.0)  # the agent's actor only
        c.update_policy_weights_()
        # The first batch collected with the pushed weights (one already on its way has the old).
        td = next(td for td in it if (td["collector", "weights_version"] >= 1).all())
        with torch.no_grad():
            for g, actor in (("adversary", policy[0]), ("agent", policy[1])):
                want = actor(td.select((g, "observation")).clone())[g, "logits"]
                assert torch.allclose(td[g, "logits"], want, atol=1e-5), g


def test_a_deterministic_actor_per_group_under_gaussian_noise_explores_within_the_box():
    # torchrl's competitive MPE policy for continuous actions (its MADDPG tutorial): per group
    # a TanhDelta actor and an AdditiveGaussianModule, each group's noise its own.
    from tensordict.nn import TensorDictSequential
    from torchrl.modules import AdditiveGaussianModule, MultiAgentMLP, ProbabilisticActor, TanhDelta

    def make():
        from mpe2 import simple_tag_v3

        return wrapper(simple_tag_v3.parallel_env(max_cycles=25, continuous_actions=True))

    spec_of = make().full_action_spec

    def actor(g, n, obs, sigma):
        torch.manual_seed(0)
        net = MultiAgentMLP(n_agent_inputs=obs, n_agent_outputs=5, n_agents=n, centralised=False, share_params=True, depth=1, num_cells=16)
        spec = spec_of[g, "action"]
        det = ProbabilisticActor(
            TensorDictModule(net, in_keys=[(g, "observation")], out_keys=[(g, "param")]), in_keys=[(g, "param")],
            out_keys=[(g, "action")], distribution_class=TanhDelta,
            distribution_kwargs={"low": spec.space.low, "high": spec.space.high}, spec=spec,
        )
        noise = AdditiveGaussianModule(spec=spec, annealing_num_steps=1000, action_key=(g, "action"), sigma_init=sigma, sigma_end=sigma)
        return TensorDictSequential(det, noise), det

    (adv, adv_det), (agent, agent_det) = actor("adversary", 3, 16, 0.5), actor("agent", 1, 14, 1e-4)
    policy = TensorDictSequential(adv, agent)
    theirs = layout(torchrl_batch(make(), policy, 50))
    (td,) = rollout_batches(make(), policy, 50)
    ours = ours_less_rollouts_own(td)
    # The TanhDelta's `param` (its input, which a DDPG loss computes again) is torchrl's only.
    assert set(theirs) - set(ours) == {("adversary", "param"), ("agent", "param")}
    assert ours == {k: v for k, v in theirs.items() if k in ours}
    with torch.no_grad():
        for g, det, sigma in (("adversary", adv_det, 0.5), ("agent", agent_det, 1e-4)):
            a = td[g, "action"]
            assert ((a >= 0) & (a <= 1)).all(), g
            mode = det(td.select((g, "observation")).clone())[g, "action"]
            # Each group's own noise: the adversaries' visible, the agent's all but none.
            off = (a - mode).abs()
            if sigma > 0.1:
                assert off.max() > 0.05, (g, off.max())
            else:
                assert off.max() < 1e-2, (g, off.max())


def test_what_is_not_served_is_refused_before_any_node_starts_naming_it():
    from pettingzoo.butterfly import knights_archers_zombies_v11

    with pytest.raises(rollout.ConfigError, match="categorical_actions"):
        rollout.DistributedCollector(wrapper(spread(), categorical_actions=False), "random", frames_per_batch=10, total_frames=10)
    with pytest.raises(rollout.ConfigError, match="group_map"):
        rollout.DistributedCollector(
            wrapper(spread(), group_map={"a": ["agent_0"], "b": ["agent_1", "agent_2"]}), "random", frames_per_batch=10, total_frames=10
        )
    # A torch actor for one group of an env of two: an actor per group is needed.
    with pytest.raises(rollout.ConfigError, match="groups \\['archer', 'knight'\\]: give one actor per group"):
        rollout.DistributedCollector(
            wrapper(knights_archers_zombies_v11.parallel_env()), spread_actor("archer", n=2, obs=135), frames_per_batch=10, total_frames=10
        )
    from tensordict.nn import TensorDictSequential

    with pytest.raises(rollout.ConfigError, match="this one reads \\['adversary'\\]"):
        rollout.DistributedCollector(
            wrapper(tag()), TensorDictSequential(spread_actor("adversary", n=3, obs=16), spread_actor("adversary", n=3, obs=16)),
            frames_per_batch=10, total_frames=10,
        )


def iql_actor(eps_init):
    """torchrl's IQL/VDN/QMIX actor for one group: a MultiAgentMLP of action values, a
    QValueModule, an EGreedyModule on the group's action."""
    from tensordict.nn import TensorDictSequential
    from torchrl.modules import EGreedyModule, MultiAgentMLP, QValueModule

    # As torchrl's qmix_vdn example: the env's whole (unbatched) action spec.
    spec = wrapper(spread()).full_action_spec_unbatched
    torch.manual_seed(0)
    net = MultiAgentMLP(n_agent_inputs=18, n_agent_outputs=5, n_agents=3, centralised=False, share_params=True, depth=2, num_cells=32)
    q = TensorDictSequential(
        TensorDictModule(net, in_keys=[("agent", "observation")], out_keys=[("agent", "action_value")]),
        QValueModule(action_value_key=("agent", "action_value"), spec=spec, action_space=None,
                     out_keys=[("agent", "action"), ("agent", "action_value"), ("agent", "chosen_action_value")]),
    )
    greedy = EGreedyModule(spec=spec, eps_init=eps_init, eps_end=0.0, annealing_num_steps=1000, action_key=("agent", "action"))
    return net, q, greedy, TensorDictSequential(q, greedy)


def test_a_q_value_actor_of_a_group_is_epsilon_greedy_per_agent_and_its_annealed_eps_reaches_the_nodes():
    require_python_node()
    net, q, greedy, actor = iql_actor(eps_init=1.0)
    theirs = layout(torchrl_batch(wrapper(spread()), actor, 50))

    def agreement(td):
        return (td["agent", "action"] == td["agent", "action_value"].argmax(-1)).float().mean().item()

    with rollout.DistributedCollector(wrapper(spread()), actor, frames_per_batch=800, total_frames=-1, seed=SEED, envs_per_node=8) as c:
        td = c.next()
        assert ours_less_rollouts_own(td) == theirs
        # The Q-network's values for each agent's observation, and the greedy one's.
        with torch.no_grad():
            want = net(td["agent", "observation"])
        torch.testing.assert_close(td["agent", "action_value"], want, atol=1e-5, rtol=1e-5)
        chosen = want.gather(-1, want.argmax(-1, keepdim=True))
        torch.testing.assert_close(td["agent", "chosen_action_value"], chosen, atol=1e-5, rtol=1e-5)
        # eps = 1: uniform over 5 actions per agent (2,400 draws: sd 0.008).
        assert abs(agreement(td) - 0.2) < 0.04, agreement(td)
        counts = torch.bincount(td["agent", "action"].flatten(), minlength=5)
        assert (counts > 400).all(), counts
        greedy.step(600)  # eps 0.4: the greedy action 1 - 0.4 + 0.4 / 5 = 0.68 of the time
        version = c.update_policy_weights_()
        td = next(td for td in iter(c.next, None) if (td["collector", "weights_version"] == version).all())
        assert abs(agreement(td) - 0.68) < 0.04, agreement(td)
        greedy.step(10_000)  # eps_end: greedy
        version = c.update_policy_weights_()
        td = next(td for td in iter(c.next, None) if (td["collector", "weights_version"] == version).all())
        assert agreement(td) == 1.0
    # Collecting deterministically: greedy whatever eps is (a deterministic run records no
    # action values unless asked: the greedy actions from the network itself).
    net, _, _, actor = iql_actor(eps_init=1.0)
    (td,) = rollout_batches(wrapper(spread()), actor, 200, exploration_type="deterministic")
    with torch.no_grad():
        assert (td["agent", "action"] == net(td["agent", "observation"]).argmax(-1)).all()
