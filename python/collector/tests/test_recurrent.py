"""torchrl's recurrent actors (LSTMModule, GRUModule) as rollout's recurrent onnx
policy: the exported step against the module's own forward, whole runs replayed
frame by frame by the torchrl actor itself (the state carried from frame to frame,
zeroed at is_init, across batches and a weight push; Rust and Python nodes), the
batch's keys recomputed by torchrl's recurrent mode, torchrl's InitTracker and
primer on the env, and what is refused."""

import copy
import json
import warnings

import numpy as np
import pytest
from conftest import PYTHON_NODE, require_python_node

torch = pytest.importorskip("torch")
pytest.importorskip("tensordict")
pytest.importorskip("torchrl")
pytest.importorskip("onnx")

from tensordict import TensorDict  # noqa: E402
from tensordict.nn import NormalParamExtractor, TensorDictModule, TensorDictSequential  # noqa: E402
from torch import nn  # noqa: E402
from torchrl.data import OneHot  # noqa: E402
from torchrl.envs import Compose, GymEnv, InitTracker, StepCounter, TransformedEnv  # noqa: E402
from torchrl.envs.utils import ExplorationType, set_exploration_type  # noqa: E402
from torchrl.modules import (  # noqa: E402
    EGreedyModule,
    GRUModule,
    LSTMModule,
    OneHotCategorical,
    ProbabilisticActor,
    QValueModule,
    TanhNormal,
    set_recurrent_mode,
)

import rollout  # noqa: E402
from rollout import _native  # noqa: E402
from rollout._torch import export_policy  # noqa: E402

warnings.filterwarnings("ignore", category=UserWarning)

CARTPOLE = json.loads(_native.builtin_env_specs("CartPole-v1"))
PENDULUM = json.loads(_native.builtin_env_specs("Pendulum-v1"))
HIDDEN = 8


def rnn(kind, layers, in_key, out_key, **kw):
    cls = LSTMModule if kind == "lstm" else GRUModule
    return cls(input_size=kw.pop("input_size", 4), hidden_size=HIDDEN, num_layers=layers, in_key=in_key, out_key=out_key, **kw)


def state_names(kind):
    return ["recurrent_state_h", "recurrent_state_c"] if kind == "lstm" else ["recurrent_state"]


def categorical_actor(kind, layers=1, dist=torch.distributions.Categorical, encoder=False):
    """The recurrent layer on the observation (or on an MLP's features: ``encoder``),
    a linear layer to the logits, a categorical distribution."""
    torch.manual_seed(0)
    mods = []
    if encoder:
        mods.append(TensorDictModule(nn.Sequential(nn.Linear(4, 6), nn.Tanh()), in_keys=["observation"], out_keys=["features"]))
    mods.append(rnn(kind, layers, "features" if encoder else "observation", "embed", input_size=6 if encoder else 4))
    mods.append(TensorDictModule(nn.Linear(HIDDEN, 2), in_keys=["embed"], out_keys=["logits"]))
    return ProbabilisticActor(TensorDictSequential(*mods), in_keys=["logits"], distribution_class=dist, return_log_prob=True)


def tanh_normal_actor(kind="gru", layers=1):
    """Pendulum's Gaussian actor: the recurrent layer, loc and scale, a TanhNormal on [-2, 2]."""
    torch.manual_seed(0)
    body = TensorDictSequential(
        rnn(kind, layers, "observation", "embed", input_size=3),
        TensorDictModule(nn.Sequential(nn.Linear(HIDDEN, 2), NormalParamExtractor()), in_keys=["embed"], out_keys=["loc", "scale"]),
    )
    return ProbabilisticActor(
        body, in_keys=["loc", "scale"], distribution_class=TanhNormal, distribution_kwargs={"low": -2.0, "high": 2.0}, return_log_prob=True
    )


def run_onnx(model, feeds):
    ort = pytest.importorskip("onnxruntime")
    session = ort.InferenceSession(model)
    names = [o.name for o in session.get_outputs()]
    return dict(zip(names, session.run(None, feeds)))


def random_inputs(obs, names, layers, k=6):
    """k rows: observations, is_init on rows 0 and 3, random states."""
    gen = torch.Generator().manual_seed(1)
    is_init = torch.zeros(k, 1, dtype=torch.bool)
    is_init[[0, 3]] = True
    state = {n: torch.randn(k, layers, HIDDEN, generator=gen) for n in names}
    return TensorDict({"observation": torch.randn(k, obs, generator=gen), "is_init": is_init, **state}, batch_size=[k])


# ---- export
@pytest.mark.parametrize("kind,layers,encoder", [("lstm", 1, False), ("lstm", 2, False), ("gru", 1, False), ("gru", 2, True), ("lstm", 2, True)])
def test_the_exported_step_is_the_modules_own_forward_with_its_next_state(kind, layers, encoder):
    actor = categorical_actor(kind, layers, encoder=encoder)
    exported = export_policy(actor, CARTPOLE)
    names = state_names(kind)
    assert exported.head == "categorical"
    assert exported.state == [(n, (layers, HIDDEN)) for n in names]
    td = random_inputs(4, names, layers)
    got = run_onnx(exported.model, {k: td[k].numpy() for k in ["observation", "is_init", *names]})
    assert sorted(got) == sorted(["logits"] + [f"next.{n}" for n in names])
    with torch.no_grad():
        want = actor.module[0](td.clone())  # torchrl's non-recurrent mode: one step per row
    np.testing.assert_allclose(got["logits"], want["logits"].numpy(), atol=1e-5)
    for n in names:
        np.testing.assert_allclose(got[f"next.{n}"], want["next", n].numpy(), atol=1e-5)
    # is_init zeroes the state in the model itself: rows 0 and 3 read no state.
    zeroed = td.clone()
    for n in names:
        zeroed[n][[0, 3]] = 123.0
    again = run_onnx(exported.model, {k: zeroed[k].numpy() for k in ["observation", "is_init", *names]})
    np.testing.assert_allclose(again["logits"], got["logits"], atol=1e-6)


def test_the_model_declares_its_state_inputs_with_a_dynamic_batch_and_the_actors_parameter_names():
    import onnx

    actor = categorical_actor("lstm", 2)
    exported = export_policy(actor, CARTPOLE)
    graph = onnx.load_from_string(exported.model).graph
    inits = {i.name for i in graph.initializer}

    def dims(v):
        return [d.dim_param or d.dim_value for d in v.type.tensor_type.shape.dim]

    inputs = {i.name: (i.type.tensor_type.elem_type, dims(i)) for i in graph.input if i.name not in inits}
    assert inputs["is_init"][0] == onnx.TensorProto.BOOL and inputs["is_init"][1][1:] == [1]
    for n in state_names("lstm"):
        elem, shape = inputs[n]
        assert elem == onnx.TensorProto.FLOAT and isinstance(shape[0], str) and shape[1:] == [2, HIDDEN]
    outputs = {o.name: dims(o) for o in graph.output}
    assert outputs["next.recurrent_state_h"][1:] == [2, HIDDEN]
    lstm_params = {n for n in actor.state_dict() if ".lstm." in n}
    assert len(lstm_params) == 8 and lstm_params <= set(exported.name_map)
    pushed = exported.weights(actor.state_dict())
    np.testing.assert_array_equal(pushed["module.0.module.0.lstm.weight_hh_l1"], actor.state_dict()["module.0.module.0.lstm.weight_hh_l1"].numpy())


def test_a_gaussian_recurrent_actor_exports_loc_scale_and_its_state():
    actor = tanh_normal_actor("gru", 2)
    exported = export_policy(actor, PENDULUM)
    assert exported.head == "tanh_normal"
    td = random_inputs(3, ["recurrent_state"], 2)
    got = run_onnx(exported.model, {k: td[k].numpy() for k in ["observation", "is_init", "recurrent_state"]})
    with torch.no_grad():
        want = actor.module[0](td.clone())
    for key in ["loc", "scale"]:
        np.testing.assert_allclose(got[key], want[key].numpy(), atol=1e-5)
    np.testing.assert_allclose(got["next.recurrent_state"], want["next", "recurrent_state"].numpy(), atol=1e-5)


def test_a_deterministic_recurrent_module_and_two_recurrent_modules_with_their_own_keys():
    torch.manual_seed(0)
    first = LSTMModule(
        input_size=3, hidden_size=HIDDEN, in_keys=["observation", "lstm_h", "lstm_c"], out_keys=["mid", ("next", "lstm_h"), ("next", "lstm_c")]
    )
    second = GRUModule(input_size=HIDDEN, hidden_size=5, num_layers=2, in_keys=["mid", ("gru", "h")], out_keys=["embed", ("next", "gru", "h")])
    actor = TensorDictSequential(first, second, TensorDictModule(nn.Linear(5, 1), in_keys=["embed"], out_keys=["action"]))
    exported = export_policy(actor, PENDULUM)
    assert exported.head == "deterministic"
    assert exported.state == [("lstm_h", (1, HIDDEN)), ("lstm_c", (1, HIDDEN)), ("gru.h", (2, 5))]
    gen = torch.Generator().manual_seed(2)
    td = TensorDict(
        {
            "observation": torch.randn(4, 3, generator=gen),
            "is_init": torch.tensor([[False], [True], [False], [True]]),
            "lstm_h": torch.randn(4, 1, HIDDEN, generator=gen),
            "lstm_c": torch.randn(4, 1, HIDDEN, generator=gen),
            "gru": {"h": torch.randn(4, 2, 5, generator=gen)},
        },
        batch_size=[4],
    )
    feeds = {"observation": td["observation"].numpy(), "is_init": td["is_init"].numpy(), "lstm_h": td["lstm_h"].numpy(), "lstm_c": td["lstm_c"].numpy(), "gru.h": td["gru", "h"].numpy()}
    got = run_onnx(exported.model, feeds)
    with torch.no_grad():
        want = actor(td.clone())
    np.testing.assert_allclose(got["action"], want["action"].numpy(), atol=1e-5)
    for name, key in [("lstm_h", ("next", "lstm_h")), ("lstm_c", ("next", "lstm_c")), ("gru.h", ("next", "gru", "h"))]:
        np.testing.assert_allclose(got[f"next.{name}"], want[key].numpy(), atol=1e-5)


def test_torchrls_python_based_lstm_exports_as_its_forward():
    torch.manual_seed(0)
    body = TensorDictSequential(
        rnn("lstm", 2, "observation", "embed", python_based=True), TensorDictModule(nn.Linear(HIDDEN, 2), in_keys=["embed"], out_keys=["logits"])
    )
    actor = ProbabilisticActor(body, in_keys=["logits"], distribution_class=torch.distributions.Categorical)
    exported = export_policy(actor, CARTPOLE)
    td = random_inputs(4, state_names("lstm"), 2)
    got = run_onnx(exported.model, {k: td[k].numpy() for k in ["observation", "is_init", *state_names("lstm")]})
    with torch.no_grad():
        want = body(td.clone())
    np.testing.assert_allclose(got["logits"], want["logits"].numpy(), atol=1e-5)
    np.testing.assert_allclose(got["next.recurrent_state_c"], want["next", "recurrent_state_c"].numpy(), atol=1e-5)


def test_a_recurrent_q_value_actor_with_egreedy_exports_the_greedy_action_and_its_state():
    torch.manual_seed(0)
    q = TensorDictSequential(
        rnn("lstm", 1, "observation", "embed"),
        TensorDictModule(nn.Linear(HIDDEN, 2), in_keys=["embed"], out_keys=["action_value"]),
        QValueModule(spec=OneHot(2)),
    )
    actor = TensorDictSequential(q, EGreedyModule(spec=OneHot(2), eps_init=0.1, eps_end=0.1))
    exported = export_policy(actor, CARTPOLE)
    assert exported.head == "qvalue" and exported.state == [(n, (1, HIDDEN)) for n in state_names("lstm")]
    assert exported.exploration["kind"] == "epsilon_greedy"
    td = random_inputs(4, state_names("lstm"), 1)
    got = run_onnx(exported.model, {k: td[k].numpy() for k in ["observation", "is_init", *state_names("lstm")]})
    with torch.no_grad():
        want = q(td.clone())
    np.testing.assert_allclose(got["action_value"], want["action_value"].numpy(), atol=1e-5)
    np.testing.assert_array_equal(got["action_value"].argmax(-1), want["action"].argmax(-1).numpy())
    np.testing.assert_allclose(got["egreedy_eps"], 0.1, atol=1e-7)
    np.testing.assert_allclose(got["next.recurrent_state_h"], want["next", "recurrent_state_h"].numpy(), atol=1e-5)


# ---- runs, replayed by torchrl
def collect(env, actor, batches, push_at, change, **kw):
    """``batches`` batches of a deterministic run of 3 envs, 16 frames each, episodes
    cut at 25 frames; after batch ``push_at`` the actor's parameters are changed by
    ``change`` and pushed. Returns the batches and the parameters of each version."""
    versions = {0: copy.deepcopy(actor.state_dict())}
    out = []
    with rollout.DistributedCollector(
        env, actor, frames_per_batch=48, total_frames=-1, envs_per_node=3, max_frames_per_traj=25,
        exploration_type="deterministic", record=True, seed=7, **kw,
    ) as c:
        for i in range(batches):
            out.append(c.next())
            if i == push_at:
                with torch.no_grad():
                    change(actor)
                versions[c.update_policy_weights_()] = copy.deepcopy(actor.state_dict())
    return out, versions


def replay(actor, batches, versions, names, compare):
    """Runs ``actor`` (torchrl's own module, non-recurrent mode) over every frame of
    ``batches`` in order, each env with its own state carried from frame to frame and
    from batch to batch, zeroed where ``is_init``, with the parameters of the batch's
    weights version; asserts every recorded ``is_init``, state and next state and the
    ``compare`` keys (actions, log-probs, distribution parameters) are the actor's.
    Returns the versions the batches were collected with, in order."""
    envs = batches[0].batch_size[0]
    state = {n: torch.zeros(envs, *batches[0][n].shape[2:]) for n in names}
    seen = []
    step = 0
    for b, td in enumerate(batches):
        v = td["collector", "weights_version"]
        assert (v == v[0, 0]).all(), "one version per batch"
        seen.append(int(v[0, 0]))
        actor.load_state_dict(versions[seen[-1]])
        for t in range(td.shape[1]):
            frame = td[:, t]
            is_init = frame["is_init"]
            assert is_init.shape == (envs, 1) and is_init.dtype == torch.bool
            assert torch.equal(is_init, frame["step_count"] == 0), (b, t)
            assert step > 0 or is_init.all(), "the run starts with new episodes"
            assert not frame["next", "is_init"].any()
            for n in names:
                state[n] = torch.where(is_init.unsqueeze(-1), torch.zeros(()), state[n])
                torch.testing.assert_close(frame[n], state[n], atol=1e-5, rtol=0, msg=f"batch {b} frame {t}: {n}")
            with torch.no_grad(), set_exploration_type(ExplorationType.DETERMINISTIC):
                want = actor(TensorDict({"observation": frame["observation"], "is_init": is_init, **state}, batch_size=[envs]))
            for key in compare:
                torch.testing.assert_close(frame[key], want[key].to(frame[key].dtype), atol=1e-5, rtol=0, msg=f"batch {b} frame {t}: {key}")
            for n in names:
                torch.testing.assert_close(frame["next", n], want["next", n], atol=1e-5, rtol=0, msg=f"batch {b} frame {t}: next {n}")
                state[n] = want["next", n]
            step += 1
    return seen


def recompute_in_recurrent_mode(body, batches, keys):
    """torchrl's recurrent mode over each batch's time axis (as a learner runs its
    loss), from the batch's first state of each row and its ``is_init``, gives back
    the ``keys`` the nodes recorded frame by frame."""
    for td in batches:
        with torch.no_grad(), set_recurrent_mode(True):
            again = body(td.exclude(*keys))
        for key in keys:
            torch.testing.assert_close(again[key], td[key], atol=1e-5, rtol=0)


def perturb(actor):
    for p in actor.parameters():
        p.add_(0.3 * torch.randn_like(p))


@pytest.mark.parametrize("kind,layers", [("lstm", 1), ("lstm", 2), ("gru", 1)])
def test_a_cartpole_run_is_the_torchrl_actors_own_frame_by_frame_across_resets_batches_and_a_weight_push(kind, layers):
    actor = categorical_actor(kind, layers, dist=OneHotCategorical)
    torch.manual_seed(1)
    batches, versions = collect("CartPole-v1", actor, 12, 4, perturb)
    names = state_names(kind)
    td = batches[0]
    assert td.batch_size == (3, 16)
    for n in names:
        assert td[n].shape == td["next", n].shape == (3, 16, layers, HIDDEN) and td[n].dtype == torch.float32
    assert td["action"].shape == (3, 16, 2)  # one-hot, as the actor's distribution
    resets = sum(int(b["is_init"][:, 1:].sum()) for b in batches)
    assert resets >= 6, "episodes end inside batches"

    seen = replay(actor, batches, versions, names, ["action", "logits", "action_log_prob"])
    assert seen[0] == 0 and seen[-1] == 1 and seen == sorted(seen), seen
    first = seen.index(1)
    carried = ~batches[first]["is_init"][:, 0, 0]
    assert carried.any(), "an episode goes on across the push"
    assert (batches[first][names[0]][carried, 0].abs().sum(-1).sum(-1) > 0).all(), "with the state it had"
    actor.load_state_dict(versions[1])
    recompute_in_recurrent_mode(actor.module[0], batches[first:], ["logits"])


@pytest.mark.parametrize("kind", ["lstm", "gru"])
def test_a_run_of_python_nodes_is_the_torchrl_actors_own_frame_by_frame(kind):
    require_python_node()
    actor = categorical_actor(kind, 2, encoder=True)
    torch.manual_seed(1)
    batches, versions = collect("CartPole-v1", actor, 10, 3, perturb, launcher="process", node_command=PYTHON_NODE)
    seen = replay(actor, batches, versions, state_names(kind), ["action", "logits", "action_log_prob"])
    assert seen[-1] == 1


def test_a_gaussian_gru_on_pendulum_is_the_torchrl_actors_own_frame_by_frame():
    actor = tanh_normal_actor("gru", 2)
    torch.manual_seed(1)
    batches, versions = collect("Pendulum-v1", actor, 10, 3, perturb)
    seen = replay(actor, batches, versions, ["recurrent_state"], ["action", "loc", "scale", "action_log_prob"])
    assert seen[-1] == 1
    assert (batches[-1]["action"].abs() <= 2.0).all()
    actor.load_state_dict(versions[1])
    recompute_in_recurrent_mode(actor.module[0], batches[seen.index(1):], ["loc", "scale"])


# ---- torchrl's env transforms for recurrent actors
def cartpole_env(*transforms):
    return TransformedEnv(GymEnv("CartPole-v1"), Compose(StepCounter(), InitTracker(), *transforms))


def first_batch(env, actor, **kw):
    kw = {"frames_per_batch": 48, "total_frames": 48, "envs_per_node": 3, "seed": 7, "exploration_type": "deterministic", "record": True, **kw}
    with rollout.DistributedCollector(create_env_fn=env, policy=actor, **kw) as c:
        return c.next()


def test_an_env_with_init_tracker_and_the_actors_primer_collects_what_the_id_collects():
    actor = categorical_actor("lstm", 2)
    primer = actor.module[0].module[0].make_tensordict_primer()
    td = first_batch(cartpole_env(primer), actor)
    want = first_batch("CartPole-v1", actor)
    assert set(td.keys(True, True)) == set(want.keys(True, True))
    for key in want.keys(True, True):
        assert torch.equal(td[key], want[key]), key


def test_init_tracker_gives_a_feed_forward_actor_is_init_from_the_episodes_starts():
    torch.manual_seed(0)
    actor = ProbabilisticActor(
        TensorDictModule(nn.Linear(4, 2), in_keys=["observation"], out_keys=["logits"]), in_keys=["logits"], distribution_class=OneHotCategorical
    )
    td = first_batch(cartpole_env(), actor, max_frames_per_traj=10)
    assert td["is_init"].dtype == torch.bool and td["is_init"].shape == (3, 16, 1)
    assert torch.equal(td["is_init"], td["step_count"] == 0) and td["is_init"][:, 1:].any()
    assert not td["next", "is_init"].any()
    assert "is_init" not in first_batch("CartPole-v1", actor).keys()


def test_a_primer_the_actor_does_not_read_or_of_random_states_is_refused_naming_the_env():
    actor = categorical_actor("gru")
    other = LSTMModule(input_size=4, hidden_size=HIDDEN, in_key="observation", out_key="x").make_tensordict_primer()
    with pytest.raises(rollout.ConfigError) as e:
        first_batch(cartpole_env(other), actor)
    assert e.value.field == "create_env_fn" and "`recurrent_state_c`" in str(e.value) and "['recurrent_state']" in str(e.value)
    primer = actor.module[0].module[0].make_tensordict_primer()
    primer.random = True
    with pytest.raises(rollout.ConfigError, match="random or non-zero initial states") as e:
        first_batch(cartpole_env(primer), actor)
    assert e.value.field == "create_env_fn"


# ---- refusals
def refused(actor, specs, *words):
    with pytest.raises(rollout.ConfigError) as e:
        export_policy(actor, specs)
    assert e.value.field == "policy", e.value
    for w in words:
        assert w in str(e.value), (w, str(e.value))
    return str(e.value)


def categorical_over(module, in_key="embed"):
    return ProbabilisticActor(
        TensorDictSequential(module, TensorDictModule(nn.Linear(HIDDEN, 2), in_keys=[in_key], out_keys=["logits"])),
        in_keys=["logits"],
        distribution_class=torch.distributions.Categorical,
    )


def test_a_bidirectional_lstm_is_refused_naming_policy_and_why():
    bi = LSTMModule(lstm=nn.LSTM(4, HIDDEN // 2, batch_first=True, bidirectional=True), in_key="observation", out_key="embed")
    refused(categorical_over(bi), CARTPOLE, "`module.0.module.0` (LSTMModule) is bidirectional", "one frame at a time")


def test_an_lstm_with_projections_is_refused():
    proj = LSTMModule(input_size=4, hidden_size=HIDDEN, proj_size=3, in_key="observation", out_key="embed")
    refused(categorical_over(proj), CARTPOLE, "proj_size=3")


def test_a_state_not_written_back_to_next_is_refused():
    lstm = LSTMModule(input_size=4, hidden_size=HIDDEN, in_keys=["observation", "h", "c"], out_keys=["embed", "h_out", ("next", "c")])
    refused(categorical_over(lstm), CARTPOLE, "'h_out'", "(\"next\", 'h')")


def test_two_recurrent_modules_on_the_same_state_are_refused():
    first = GRUModule(input_size=4, hidden_size=HIDDEN, in_key="observation", out_key="mid")
    second = GRUModule(input_size=HIDDEN, hidden_size=HIDDEN, in_key="mid", out_key="embed")
    refused(categorical_over(TensorDictSequential(first, second)), CARTPOLE, "two recurrent modules", "'recurrent_state'")


class Wrapper(nn.Module):
    def __init__(self, inner):
        super().__init__()
        self.inner = inner

    def forward(self, td):
        return self.inner(td)


def test_a_recurrent_module_inside_a_plain_module_is_refused_by_its_path():
    lstm = rnn("lstm", 1, "observation", "embed")
    hidden = TensorDictModule(Wrapper(lstm), in_keys=lstm.in_keys, out_keys=["embed"])
    refused(categorical_over(hidden), CARTPOLE, "`module.0.module.0.module.inner` (LSTMModule)", "cannot open")
