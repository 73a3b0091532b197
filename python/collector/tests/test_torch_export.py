"""A torch actor as the onnx policy: the head each actor kind gets, the model's
outputs against the module's own (onnxruntime), what is refused by name, and the
weights taken from the module by its own parameter names."""

import json
import math
import warnings

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("tensordict")
pytest.importorskip("torchrl")
pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")

from tensordict import TensorDict  # noqa: E402
from tensordict.nn import NormalParamExtractor, TensorDictModule  # noqa: E402
from torch import nn  # noqa: E402
from torchrl.data import Categorical as CategoricalSpec  # noqa: E402
from torchrl.data import OneHot  # noqa: E402
from torchrl.modules import (  # noqa: E402
    Delta,
    IndependentNormal,
    OneHotCategorical,
    ProbabilisticActor,
    TanhDelta,
    TanhNormal,
)

import rollout  # noqa: E402
from rollout import _native  # noqa: E402
from rollout._torch import export_policy  # noqa: E402

warnings.filterwarnings("ignore", category=UserWarning)

CARTPOLE = json.loads(_native.builtin_env_specs("CartPole-v1"))
PENDULUM = json.loads(_native.builtin_env_specs("Pendulum-v1"))


def mlp(i, o, *tail):
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(i, 16), nn.Tanh(), nn.Linear(16, o), *tail)


def categorical_actor(dist=torch.distributions.Categorical, spec=None):
    return ProbabilisticActor(
        TensorDictModule(mlp(4, 2), in_keys=["observation"], out_keys=["logits"]),
        in_keys=["logits"],
        distribution_class=dist,
        return_log_prob=True,
        spec=spec,
    )


def gaussian_actor(dist, **kwargs):
    return ProbabilisticActor(
        TensorDictModule(mlp(3, 2, NormalParamExtractor()), in_keys=["observation"], out_keys=["loc", "scale"]),
        in_keys=["loc", "scale"],
        distribution_class=dist,
        distribution_kwargs=kwargs,
        return_log_prob=True,
    )


class LogStdActor(nn.Module):
    """A Gaussian body with a state-independent log-std (a parameter of its own)."""

    def __init__(self):
        super().__init__()
        self.net = mlp(3, 1)
        self.log_std = nn.Parameter(torch.full((1,), -0.5))

    def forward(self, obs):
        loc = self.net(obs)
        return loc, self.log_std.exp().expand_as(loc)


class Argmax(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = mlp(4, 2)

    def forward(self, obs):
        return self.net(obs).argmax(-1)


def run_onnx(exported, x):
    s = ort.InferenceSession(exported.model)
    names = [o.name for o in s.get_outputs()]
    return dict(zip(names, s.run(None, {"observation": x})))


def reference(actor, x):
    """The module's own distribution parameters (or action) on `x`."""
    with torch.no_grad():
        if isinstance(actor, ProbabilisticActor):
            td = TensorDict(observation=torch.from_numpy(x), batch_size=[len(x)])
            for m in list(actor.module)[:-1]:
                td = m(td)
            return td
        if isinstance(actor, TensorDictModule):
            return actor(TensorDict(observation=torch.from_numpy(x), batch_size=[len(x)]))
        return {"action": actor(torch.from_numpy(x))}


CASES = [
    # id, actor factory, specs, head, encoding, outputs
    ("nn.Module box", lambda: mlp(3, 1), PENDULUM, "deterministic", None, ["action"]),
    ("nn.Module discrete", Argmax, CARTPOLE, "deterministic", None, ["action"]),
    ("TensorDictModule", lambda: TensorDictModule(mlp(3, 1), in_keys=["observation"], out_keys=["action"]), PENDULUM, "deterministic", None, ["action"]),
    ("Categorical", categorical_actor, CARTPOLE, "categorical", "index", ["logits"]),
    ("OneHotCategorical", lambda: categorical_actor(OneHotCategorical), CARTPOLE, "categorical", "one_hot", ["logits"]),
    ("torch Normal", lambda: gaussian_actor(torch.distributions.Normal), PENDULUM, "normal", None, ["loc", "scale"]),
    ("IndependentNormal", lambda: gaussian_actor(IndependentNormal), PENDULUM, "normal", None, ["loc", "scale"]),
    ("TanhNormal", lambda: gaussian_actor(TanhNormal, low=-2.0, high=2.0), PENDULUM, "tanh_normal", None, ["loc", "scale"]),
    (
        "log-std Normal",
        lambda: ProbabilisticActor(
            TensorDictModule(LogStdActor(), in_keys=["observation"], out_keys=["loc", "scale"]),
            in_keys=["loc", "scale"],
            distribution_class=torch.distributions.Normal,
        ),
        PENDULUM,
        "normal",
        None,
        ["loc", "scale"],
    ),
    (
        "Delta",
        lambda: ProbabilisticActor(
            TensorDictModule(mlp(3, 1), in_keys=["observation"], out_keys=["param"]),
            in_keys=["param"],
            distribution_class=Delta,
        ),
        PENDULUM,
        "deterministic",
        None,
        ["action"],
    ),
]


@pytest.mark.parametrize("name,make,specs,head,encoding,outputs", CASES, ids=[c[0] for c in CASES])
def test_each_actor_kind_gets_its_head_and_the_model_computes_what_the_module_does(name, make, specs, head, encoding, outputs):
    actor = make()
    exported = export_policy(actor, specs)
    assert exported.head == head
    assert exported.action_encoding == encoding
    assert exported.input_names == ["observation"]
    d = specs["observation"]["shape"][0]
    x = np.random.default_rng(1).standard_normal((7, d)).astype(np.float32)  # batch 7: the axis is dynamic
    got = run_onnx(exported, x)
    assert list(got) == outputs
    want = reference(actor, x)
    source = {"action": "param"} if name == "Delta" else {}
    for out in outputs:
        expected = want[source.get(out, out)].numpy() if hasattr(want[source.get(out, out)], "numpy") else want[out]
        if name == "nn.Module discrete":
            np.testing.assert_array_equal(got[out], expected)
        else:
            np.testing.assert_allclose(got[out], expected, atol=1e-5, rtol=0)
    # Every float initializer is one of the actor's own parameters, under its own name.
    params = dict(actor.state_dict())
    assert exported.fixed == {}
    assert set(exported.name_map) == {n for n, p in params.items() if p.dtype == torch.float32}
    assert all(exported.name_map[n] == n for n in exported.name_map)


def test_a_probabilistic_actor_keeps_its_prefixed_names():
    exported = export_policy(categorical_actor(OneHotCategorical), CARTPOLE)
    assert sorted(exported.name_map) == [
        "module.0.module.0.bias",
        "module.0.module.0.weight",
        "module.0.module.2.bias",
        "module.0.module.2.weight",
    ]


def test_tanh_loc_is_part_of_the_exported_loc():
    actor = gaussian_actor(TanhNormal, low=-2.0, high=2.0, tanh_loc=True, upscale=3.0)
    x = np.random.default_rng(2).standard_normal((5, 3)).astype(np.float32)
    got = run_onnx(export_policy(actor, PENDULUM), x)
    loc = reference(actor, x)["loc"]
    np.testing.assert_allclose(got["loc"], (3.0 * torch.tanh(loc / 3.0)).numpy(), atol=1e-5)


# ---- refusals, by name
def refused(actor, specs, *words):
    with pytest.raises(rollout.ConfigError) as e:
        export_policy(actor, specs)
    assert e.value.field == "policy"
    for w in words:
        assert w in str(e.value), str(e.value)


def test_a_recurrent_module_inside_a_sequential_is_refused_by_its_path():
    refused(nn.Sequential(nn.Linear(4, 8), nn.GRU(8, 8)), CARTPOLE, "`1`", "GRU", "recurrent", "LSTMModule or GRUModule")


def test_an_unsupported_distribution_is_refused_by_name():
    actor = ProbabilisticActor(
        TensorDictModule(mlp(3, 2), in_keys=["observation"], out_keys=["concentration1"]),
        in_keys=["concentration1"],
        distribution_class=torch.distributions.Exponential,
    )
    refused(actor, PENDULUM, "Exponential", "no ONNX head")


def test_in_keys_the_env_does_not_have_are_refused():
    refused(TensorDictModule(mlp(4, 2), in_keys=["pixels"], out_keys=["action"]), CARTPOLE, "'pixels'")
    refused(
        TensorDictModule(mlp(4, 2), in_keys=[("observation", "position")], out_keys=["action"]),
        CARTPOLE,
        "observation",
        "position",
    )


def test_tanh_normal_bounds_other_than_the_envs_are_refused():
    refused(gaussian_actor(TanhNormal), PENDULUM, "TanhNormal", "low=[-2.0]", "high=[2.0]")


def test_an_action_spec_that_does_not_fit_the_env_is_refused():
    refused(categorical_actor(OneHotCategorical, spec=OneHot(3)), CARTPOLE, "OneHot", "2 actions")
    refused(categorical_actor(OneHotCategorical, spec=CategoricalSpec(2)), CARTPOLE, "index", "one-hot")


def test_a_head_that_does_not_fit_the_envs_action_is_refused():
    refused(categorical_actor(), PENDULUM, "categorical", "box")
    refused(gaussian_actor(IndependentNormal), CARTPOLE, "normal", "discrete")
    refused(mlp(4, 2), CARTPOLE, "float", "discrete")


def test_float64_parameters_are_refused_by_name():
    refused(mlp(3, 1).double(), PENDULUM, "`0.weight`", "float64")


# ---- weights by the module's names
def same_memory(a, t):
    return a.__array_interface__["data"][0] == t.data_ptr()


@pytest.mark.parametrize("source", ["module", "state_dict", "from_module", "none"])
def test_weights_from_the_module_are_its_parameters_by_name_without_a_copy(source):
    actor = categorical_actor(OneHotCategorical)
    exported = export_policy(actor, CARTPOLE)
    with torch.no_grad():  # the learner steps: the weights read now are the new ones
        for p in actor.parameters():
            p.add_(0.25)
    arg = {
        "module": actor,
        "state_dict": actor.state_dict(),
        "from_module": TensorDict.from_module(actor),
        "none": None,
    }[source]
    w = exported.weights(arg)
    params = dict(actor.named_parameters())
    assert set(w) == set(params)
    for name, p in params.items():
        np.testing.assert_array_equal(w[name], p.detach().numpy())
        assert w[name].dtype == np.float32
        assert same_memory(w[name], p), f"{name}: viewed, not copied"


def bad_weights(actor):
    sd = {k: v.detach().clone() for k, v in actor.state_dict().items()}
    yield "missing", {k: v for k, v in sd.items() if k != "module.0.module.2.bias"}, "missing tensor `module.0.module.2.bias`"
    yield "extra", dict(sd, **{"module.0.module.9.weight": torch.zeros(2)}), "unexpected tensor `module.0.module.9.weight`"
    yield "shape", dict(sd, **{"module.0.module.0.bias": torch.zeros(17)}), "`module.0.module.0.bias` must be float32 [16], got float32 [17]"
    yield "dtype", dict(sd, **{"module.0.module.0.bias": torch.zeros(16, dtype=torch.float64)}), "`module.0.module.0.bias` must be float32 [16], got float64 [16]"
    w = torch.zeros(4, 16).t()  # [16, 4], a transposed view
    yield "non-contiguous", dict(sd, **{"module.0.module.0.weight": w}), "`module.0.module.0.weight` is not contiguous"
    yield "numpy dtype", dict(sd, **{"module.0.module.0.bias": np.zeros(16, dtype=np.float16)}), "`module.0.module.0.bias` must be float32"


@pytest.mark.parametrize("case", [c[0] for c in bad_weights(categorical_actor())])
def test_bad_weights_are_a_config_error_naming_the_tensor(case):
    actor = categorical_actor(OneHotCategorical)
    exported = export_policy(actor, CARTPOLE)
    _, weights, message = next(c for c in bad_weights(actor) if c[0] == case)
    with pytest.raises(rollout.ConfigError) as e:
        exported.weights(weights)
    assert e.value.field == "weights"
    assert message in str(e.value), str(e.value)


DICT_ENV = {
    "observation": {
        "kind": "dict",
        "spaces": {
            "pos": {"kind": "box", "dtype": "f32", "shape": [2]},
            "vel": {"kind": "box", "dtype": "f32", "shape": [3]},
        },
    },
    "action": {"kind": "discrete", "n": 2},
}


class Concat(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = mlp(5, 2)

    def forward(self, pos, vel):
        return self.net(torch.cat([pos, vel], -1))


def test_a_dict_observation_is_one_input_per_leaf_named_with_dots():
    actor = ProbabilisticActor(
        TensorDictModule(Concat(), in_keys=[("observation", "pos"), ("observation", "vel")], out_keys=["logits"]),
        in_keys=["logits"],
        distribution_class=torch.distributions.Categorical,
    )
    exported = export_policy(actor, DICT_ENV)
    assert exported.input_names == ["observation.pos", "observation.vel"]
    rng = np.random.default_rng(3)
    pos, vel = rng.standard_normal((6, 2)).astype(np.float32), rng.standard_normal((6, 3)).astype(np.float32)
    got = ort.InferenceSession(exported.model).run(None, {"observation.pos": pos, "observation.vel": vel})[0]
    with torch.no_grad():
        want = actor.module[0].module(torch.from_numpy(pos), torch.from_numpy(vel))
    np.testing.assert_allclose(got, want.numpy(), atol=1e-5)


def test_a_dict_observation_entry_the_env_lacks_is_refused():
    actor = TensorDictModule(Concat(), in_keys=[("observation", "pos"), ("observation", "acc")], out_keys=["action"])
    refused(actor, DICT_ENV, "'acc'", "no entry")
    refused(TensorDictModule(mlp(5, 2), in_keys=["observation"], out_keys=["action"]), DICT_ENV, "dict observation", "leaves")


def _group_actor(g, n, obs):
    """torchrl's multi-agent actor for group ``g``, built from seed 0 (so two groups of the
    same shapes start with equal parameters)."""
    from torchrl.modules import MultiAgentMLP

    torch.manual_seed(0)
    net = MultiAgentMLP(n_agent_inputs=obs, n_agent_outputs=5, n_agents=n, centralised=False, share_params=True, depth=1, num_cells=8)
    return ProbabilisticActor(
        TensorDictModule(net, in_keys=[(g, "observation")], out_keys=[(g, "logits")]),
        in_keys=[(g, "logits")], out_keys=[(g, "action")], distribution_class=torch.distributions.Categorical,
        return_log_prob=True,
    )


TWO_EQUAL_GROUPS = {
    "observation": {"kind": "dict", "spaces": {"blue": {"kind": "box", "dtype": "f32", "shape": [6]},
                                               "red": {"kind": "box", "dtype": "f32", "shape": [6]}}},
    "action": {"kind": "dict", "spaces": {"blue": {"kind": "discrete", "n": 5}, "red": {"kind": "discrete", "n": 5}}},
    "agents": {"blue": ["blue_0", "blue_1"], "red": ["red_0"]},
}


def test_tensors_of_equal_values_stay_weights_of_their_own():
    # torch's exporter merges initializers of equal values: two groups' actors from one seed
    # (and a LayerNorm's ones and zeros, a noise module's sigma) would then share the first
    # one's tensor in the model, the second's never pushed.
    from tensordict.nn import TensorDictSequential
    from torchrl.modules import MLP

    policy = TensorDictSequential(_group_actor("blue", 2, 6), _group_actor("red", 1, 6))
    exported = export_policy(policy, TWO_EQUAL_GROUPS)
    floats = {n for n, p in policy.state_dict().items() if torch.is_floating_point(p)}
    assert set(exported.name_map) == floats and exported.fixed == {}
    # Run as it is, the model gives each group's logits.
    x = {"blue.observation": np.random.default_rng(2).standard_normal((3, 2, 6)).astype(np.float32),
         "red.observation": np.random.default_rng(3).standard_normal((3, 1, 6)).astype(np.float32)}
    session = ort.InferenceSession(exported.model, providers=["CPUExecutionProvider"])
    got = dict(zip([o.name for o in session.get_outputs()], session.run(None, x)))
    td = TensorDict({("blue", "observation"): torch.from_numpy(x["blue.observation"]),
                     ("red", "observation"): torch.from_numpy(x["red.observation"])}, batch_size=[3])
    with torch.no_grad():
        want = policy(td)
    for g in ("blue", "red"):
        np.testing.assert_allclose(got[f"{g}.logits"], want[g, "logits"].numpy(), atol=1e-5, rtol=0)
    # A single actor with two LayerNorms at their initial values alike.
    torch.manual_seed(0)
    net = MLP(in_features=4, out_features=2, depth=2, num_cells=8, norm_class=nn.LayerNorm, norm_kwargs={"normalized_shape": 8})
    actor = ProbabilisticActor(TensorDictModule(net, in_keys=["observation"], out_keys=["logits"]), in_keys=["logits"],
                               distribution_class=torch.distributions.Categorical, return_log_prob=True)
    exported = export_policy(actor, CARTPOLE)
    assert set(exported.name_map) == {n for n, p in actor.state_dict().items() if torch.is_floating_point(p)}
    # A TD3 actor whose noise starts at sigma 1, its std: sigma is a weight of its own (its
    # annealing is pushed).
    from torchrl.data import Bounded
    from torchrl.modules import AdditiveGaussianModule, TanhModule
    from tensordict.nn import TensorDictSequential as Seq

    spec = Bounded(-2.0, 2.0, (1,))
    td3 = Seq(TensorDictModule(mlp(3, 1), in_keys=["observation"], out_keys=["param"]),
              TanhModule(in_keys=["param"], out_keys=["action"], spec=spec),
              AdditiveGaussianModule(spec=spec, sigma_init=1.0, sigma_end=0.1, annealing_num_steps=10))
    exported = export_policy(td3, PENDULUM)
    assert {"module.2.sigma", "module.2.mean", "module.2.std"} <= set(exported.name_map), sorted(exported.name_map)


def test_export_leaves_every_module_in_its_own_mode():
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.Tanh(), nn.Linear(8, 2))
    actor = ProbabilisticActor(TensorDictModule(net, in_keys=["observation"], out_keys=["logits"]), in_keys=["logits"],
                               distribution_class=torch.distributions.Categorical, return_log_prob=True)
    actor.eval()
    net[0].train()  # one module's own mode, unlike its parent's
    exported = export_policy(actor, CARTPOLE)
    assert not actor.training and not net[1].training and net[0].training
    # And the model is the module in eval mode (BatchNorm's running statistics).
    actor.eval()
    x = np.random.default_rng(1).standard_normal((5, 4)).astype(np.float32)
    np.testing.assert_allclose(run_onnx(exported, x)["logits"], reference(actor, x)["logits"].numpy(), atol=1e-5, rtol=0)


def _with_weights(exported, tensors):
    """``exported``'s model with its initializers set to ``tensors`` (by parameter name),
    as a node's session is after a push."""
    import onnx
    from onnx import numpy_helper

    proto = onnx.load_from_string(exported.model)
    by_init = {exported.name_map[n]: t for n, t in tensors.items() if n in exported.name_map}
    for i, init in enumerate(proto.graph.initializer):
        if init.name in by_init:
            proto.graph.initializer[i].CopyFrom(numpy_helper.from_array(by_init[init.name].detach().numpy(), init.name))
    return proto.SerializeToString()


def test_a_safe_modules_projection_is_in_the_model_whatever_the_example_gave():
    from torchrl.data import Bounded
    from torchrl.modules import SafeModule

    # Bounds narrower than the env's [-2, 2], so the nodes' clip to the env cannot hide a
    # missing one; at export the outputs are well inside them (no projection on the example).
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(3, 16), nn.Tanh(), nn.Linear(16, 1))
    with torch.no_grad():
        net[2].weight.mul_(0.01)
    actor = SafeModule(net, in_keys=["observation"], out_keys=["action"], spec=Bounded(-0.5, 0.5, shape=(1,)), safe=True)
    exported = export_policy(actor, PENDULUM)
    # The learner's weights then push the outputs past the bounds: torchrl projects them.
    with torch.no_grad():
        net[2].weight.mul_(1000.0)
    x = np.random.default_rng(1).standard_normal((64, 3)).astype(np.float32) * 3
    s = ort.InferenceSession(_with_weights(exported, dict(actor.state_dict())))
    got = s.run(None, {"observation": x})[0]
    want = reference(actor, x)["action"].numpy()
    assert np.abs(want).max() == pytest.approx(0.5)  # some outputs were projected
    assert (np.abs(net(torch.from_numpy(x)).detach().numpy()) > 0.5).any()
    np.testing.assert_allclose(got, want, atol=1e-5, rtol=0)


def _changed(module, scale=3.0, seed=5):
    """Every float parameter and buffer of ``module`` moved, as training moves them."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for t in list(module.parameters()) + list(module.buffers()):
            if torch.is_floating_point(t):
                t.add_(torch.randn(t.shape, generator=g) * scale * (t.abs().mean() + 0.1))


def test_noisy_linear_is_exported_with_its_noise_and_every_noise_tensor_is_pushed():
    # Rainbow's NoisyLinear adds its noise only under ExplorationType.RANDOM, the collector's
    # default: the export follows the run's exploration type.
    from torchrl.modules import NoisyLinear, QValueActor, reset_noise

    torch.manual_seed(0)
    actor = QValueActor(nn.Sequential(NoisyLinear(4, 16), nn.ReLU(), NoisyLinear(16, 2)), in_keys=["observation"], spec=OneHot(2))
    exported = export_policy(actor, CARTPOLE)
    assert set(exported.name_map) == {n for n, p in actor.state_dict().items() if torch.is_floating_point(p)}
    assert any(n.endswith("weight_epsilon") for n in exported.name_map)
    actor.apply(reset_noise)  # the learner draws new noise; its buffers are pushed
    x = np.random.default_rng(3).standard_normal((7, 4)).astype(np.float32)
    got = ort.InferenceSession(_with_weights(exported, dict(actor.state_dict()))).run(None, {"observation": x})[0]
    from torchrl.envs.utils import ExplorationType, set_exploration_type

    with set_exploration_type(ExplorationType.RANDOM), torch.no_grad():
        want = actor(TensorDict(observation=torch.from_numpy(x), batch_size=[7]))["action_value"].numpy()
    np.testing.assert_allclose(got, want, atol=1e-5, rtol=0)
    # Collecting deterministically, the noise is left out, as torchrl leaves it out.
    exported = export_policy(actor, CARTPOLE, "deterministic")
    got = run_onnx(exported, x)["action_value"]
    with set_exploration_type(ExplorationType.DETERMINISTIC), torch.no_grad():
        want = actor(TensorDict(observation=torch.from_numpy(x), batch_size=[7]))["action_value"].numpy()
    np.testing.assert_allclose(got, want, atol=1e-5, rtol=0)


def test_tanh_delta_acts_as_torchrl_computes_it_on_bounds_not_centred_on_zero():
    # torchrl's TanhDelta shifts its parameter by the box's centre before the tanh.
    unit = json.loads(json.dumps(PENDULUM))
    unit["action"]["low"], unit["action"]["high"] = [0.0], [1.0]
    torch.manual_seed(0)
    actor = ProbabilisticActor(TensorDictModule(mlp(3, 1), in_keys=["observation"], out_keys=["param"]), in_keys=["param"],
                               distribution_class=TanhDelta, distribution_kwargs={"low": 0.0, "high": 1.0})
    exported = export_policy(actor, unit)
    x = np.random.default_rng(1).standard_normal((9, 3)).astype(np.float32)
    with torch.no_grad():
        want = actor(TensorDict(observation=torch.from_numpy(x), batch_size=[9]))["action"].numpy()
    np.testing.assert_allclose(run_onnx(exported, x)["action"], want, atol=1e-6, rtol=0)


def test_a_safe_probabilistic_actors_projection_is_exported_or_refused():
    from torchrl.data import Bounded

    # Delta: torchrl clamps the action onto the spec; so does the model, whatever weights come.
    torch.manual_seed(0)
    net = mlp(3, 1)
    with torch.no_grad():
        net[2].weight.mul_(0.01)
    actor = ProbabilisticActor(TensorDictModule(net, in_keys=["observation"], out_keys=["param"]), in_keys=["param"],
                               distribution_class=Delta, spec=Bounded(-0.5, 0.5, (1,)), safe=True)
    exported = export_policy(actor, PENDULUM)
    with torch.no_grad():
        net[2].weight.mul_(1000.0)
    x = np.random.default_rng(1).standard_normal((64, 3)).astype(np.float32) * 3
    got = ort.InferenceSession(_with_weights(exported, dict(actor.state_dict()))).run(None, {"observation": x})[0]
    with torch.no_grad():
        want = actor(TensorDict(observation=torch.from_numpy(x), batch_size=[64]))["action"].numpy()
    assert np.abs(want).max() == pytest.approx(0.5)
    np.testing.assert_allclose(got, want, atol=1e-5, rtol=0)
    # A drawn action: torchrl clamps it to the spec, the nodes clip it to the env's box.
    def normal(spec):
        return ProbabilisticActor(TensorDictModule(mlp(3, 2, NormalParamExtractor()), in_keys=["observation"], out_keys=["loc", "scale"]),
                                  in_keys=["loc", "scale"], distribution_class=torch.distributions.Normal, spec=spec, safe=True)

    refused(normal(Bounded(-0.5, 0.5, (1,))), PENDULUM, "safe=True", "[-0.5]", "[-2.0]", "env's action spec")
    assert export_policy(normal(Bounded(-2.0, 2.0, (1,))), PENDULUM).head == "normal"


class _Scaled(nn.Module):
    """Scales by the batch size, read as a Python number: a trace fixes it at the example's."""

    def __init__(self):
        super().__init__()
        self.net = mlp(3, 1)

    def forward(self, obs):
        return self.net(obs) * float(len(obs))


class _SplitRows(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = mlp(3, 1)

    def forward(self, obs):
        return torch.cat([self.net(row) for row in obs.split(1, 0)])


class _ExpTemperature(nn.Module):
    """Reads a parameter as a Python number: the model keeps its value at export."""

    def __init__(self):
        super().__init__()
        self.net = mlp(3, 1)
        self.log_t = nn.Parameter(torch.zeros(()))

    def forward(self, obs):
        return self.net(obs) * math.exp(self.log_t)


def test_a_model_that_computes_otherwise_than_the_module_is_refused():
    # Checked in onnxruntime at another batch than the export's example.
    refused(TensorDictModule(_Scaled(), in_keys=["observation"], out_keys=["action"]), PENDULUM, "`action`", "random observations", "differs")
    refused(TensorDictModule(_SplitRows(), in_keys=["observation"], out_keys=["action"]), PENDULUM, "fails on 3 random observations")
    # tensordict's own expln mapping assigns through a boolean mask: its count is fixed.
    expln = ProbabilisticActor(TensorDictModule(mlp(3, 2, NormalParamExtractor(scale_mapping="expln")), in_keys=["observation"], out_keys=["loc", "scale"]),
                               in_keys=["loc", "scale"], distribution_class=torch.distributions.Normal)
    refused(expln, PENDULUM, "boolean mask")


def test_a_parameter_the_model_does_not_hold_is_named_in_a_warning():
    with pytest.warns(UserWarning, match=r"`module.log_t`.*float\(p\)"):
        export_policy(TensorDictModule(_ExpTemperature(), in_keys=["observation"], out_keys=["action"]), PENDULUM)


def test_gaussian_noise_clamped_to_other_bounds_than_the_envs_is_refused():
    from tensordict.nn import TensorDictSequential
    from torchrl.data import Bounded
    from torchrl.modules import AdditiveGaussianModule

    def td3(low, high):
        body = TensorDictModule(mlp(3, 1), in_keys=["observation"], out_keys=["action"])
        return TensorDictSequential(body, AdditiveGaussianModule(spec=Bounded(low, high, (1,)), sigma_init=0.5, sigma_end=0.1, annealing_num_steps=10))

    refused(td3(-1.0, 1.0), PENDULUM, "AdditiveGaussianModule's spec", "[-1.0]", "[-2.0]")
    assert export_policy(td3(-2.0, 2.0), PENDULUM).head == "normal"


class _PosOnly(nn.Module):
    """Reads two leaves, uses one: the exporter drops the other input."""

    def __init__(self):
        super().__init__()
        self.net = mlp(2, 2)

    def forward(self, pos, vel):
        return self.net(pos)


def test_a_module_that_ignores_an_input_is_checked_on_the_inputs_the_model_takes():
    actor = ProbabilisticActor(
        TensorDictModule(_PosOnly(), in_keys=[("observation", "pos"), ("observation", "vel")], out_keys=["logits"]),
        in_keys=["logits"],
        distribution_class=torch.distributions.Categorical,
    )
    exported = export_policy(actor, DICT_ENV)
    pos = np.random.default_rng(3).standard_normal((6, 2)).astype(np.float32)
    got = ort.InferenceSession(exported.model).run(None, {"observation.pos": pos})[0]
    with torch.no_grad():
        np.testing.assert_allclose(got, actor.module[0].module.net(torch.from_numpy(pos)).numpy(), atol=1e-5)
