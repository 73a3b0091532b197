#!/usr/bin/env python3
"""Exports the small PyTorch actors the ONNX policy is tested with, and what torch says
about them, into tests/fixtures/onnx/.

Every model is exported as docs/policies.md tells users to (`dynamo=False,
do_constant_folding=False`, so the initializers keep the state_dict's names). Beside
each `NAME.onnx`, `NAME.json` holds fixed observations, the module's outputs for them,
and torch.distributions' log-probabilities of given actions (computed in float64), which
the Rust tests compare against. A few deliberately broken models test the errors.

Run with a Python that has torch and onnx: `python scripts/export-test-models.py`;
`--big DIR` writes instead the 10 M-parameter model of `benches/benches/onnx.rs` into DIR;
`--recurrent` only the recurrent actors (LSTM, GRU).
"""

import json
import sys
from pathlib import Path

import onnx
import torch
from onnx import TensorProto, helper
from torch import nn
from torch.distributions import Categorical, Normal, TransformedDistribution
from torch.distributions.transforms import AffineTransform, TanhTransform

OUT = Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "onnx"


def export(module, obs_dim, outputs, name, batch_outputs=None):
    """Exports `module` (observation [K, obs_dim] -> `outputs`) to OUT/name.onnx."""
    batch_outputs = outputs if batch_outputs is None else batch_outputs
    axes = {"observation": {0: "batch"}}
    for o in batch_outputs:
        axes[o] = {0: "batch"}
    torch.onnx.export(
        module,
        (torch.zeros(2, obs_dim),),
        str(OUT / f"{name}.onnx"),
        input_names=["observation"],
        output_names=outputs,
        dynamic_axes=axes,
        dynamo=False,
        do_constant_folding=False,
    )


def observations(obs_dim, rows=6, scale=1.0):
    g = torch.Generator().manual_seed(obs_dim * 7 + rows)
    return torch.randn(rows, obs_dim, generator=g, dtype=torch.float32) * scale


def rows(t):
    return t.detach().to(torch.float64).tolist()


def write(name, data):
    (OUT / f"{name}.json").write_text(json.dumps(data, indent=1) + "\n")


class Categorical4(nn.Module):
    """A ReLU MLP over CartPole's 4 observations giving 2 logits."""

    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(4, 16), nn.ReLU(), nn.Linear(16, 16), nn.ReLU(), nn.Linear(16, 2))

    def forward(self, observation):
        return self.net(observation)


class TanhMlp(nn.Module):
    """rollout's built-in `mlp --hidden 64,64` shape: tanh hidden layers, linear output."""

    def __init__(self, obs_dim, hidden, out):
        super().__init__()
        dims = [obs_dim, *hidden]
        layers = []
        for a, b in zip(dims, dims[1:]):
            layers += [nn.Linear(a, b), nn.Tanh()]
        layers.append(nn.Linear(dims[-1], out))
        self.net = nn.Sequential(*layers)

    def forward(self, observation):
        return self.net(observation)


class Gaussian(nn.Module):
    """loc from a ReLU MLP; a state-independent log-std parameter as the second output
    (named apart from the output: torch renames an initializer that shares an output's name)."""

    def __init__(self, obs_dim, d):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(obs_dim, 16), nn.ReLU(), nn.Linear(16, d))
        self.actor_log_std = nn.Parameter(torch.full((d,), -0.5))

    def forward(self, observation):
        return self.net(observation), self.actor_log_std * 1.0


class GaussianScale(nn.Module):
    """loc and a state-dependent scale (softplus), both [K, d]."""

    def __init__(self, obs_dim, d):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(obs_dim, 16), nn.Tanh())
        self.loc = nn.Linear(16, d)
        self.scale = nn.Linear(16, d)

    def forward(self, observation):
        h = self.body(observation)
        return self.loc(h), nn.functional.softplus(self.scale(h)) + 1e-3


class Deterministic(nn.Module):
    """The action itself: 2 tanh(mlp(obs)) for Pendulum's [-2, 2] box."""

    def __init__(self, obs_dim, d):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(obs_dim, 16), nn.ReLU(), nn.Linear(16, d))

    def forward(self, observation):
        return 2.0 * torch.tanh(self.net(observation))


def fitted(module, sign):
    """`module` fitted to logits +-8 (theta + theta_dot) (sign -1: the opposite choice), so
    that its argmax depends on the observation: both actions occur on CartPole, and an
    update from one fit to the other changes them."""
    g = torch.Generator().manual_seed(11)
    opt = torch.optim.Adam(module.parameters(), lr=0.01)
    for _ in range(400):
        x = torch.randn(256, 4, generator=g) * torch.tensor([0.5, 0.5, 0.1, 0.5])
        s = sign * 8.0 * (x[:, 2] + x[:, 3])
        target = torch.stack([-s, s], dim=1)
        loss = ((module(x) - target) ** 2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    return module.eval()


def categorical_case():
    torch.manual_seed(0)
    m = fitted(Categorical4(), 1.0)
    export(m, 4, ["logits"], "cartpole_categorical")
    obs = observations(4)
    logits = m(obs).to(torch.float64)
    dist = Categorical(logits=logits)
    log_prob = [[dist.log_prob(torch.full((len(obs),), a)).tolist()[i] for a in range(2)] for i in range(len(obs))]
    write(
        "cartpole_categorical",
        {
            "head": "categorical",
            "observation": rows(obs),
            "logits": rows(logits),
            "mode": logits.argmax(-1).tolist(),
            "log_prob": log_prob,
            "state_dict": {k: rows(v.reshape(-1)) for k, v in m.state_dict().items()},
        },
    )
    # An update: the same architecture with other weights, for the weight-update tests.
    torch.manual_seed(1)
    other = fitted(Categorical4(), -1.0)
    write(
        "cartpole_categorical_update",
        {
            "observation": rows(obs),
            "logits": rows(other(obs)),
            "state_dict": {k: {"shape": list(v.shape), "data": rows(v.reshape(-1))} for k, v in other.state_dict().items()},
        },
    )


def tanh_mlp_case():
    torch.manual_seed(3)
    m = TanhMlp(4, [64, 64], 2).eval()
    export(m, 4, ["logits"], "cartpole_tanh_mlp_64")
    obs = observations(4)
    write("cartpole_tanh_mlp_64", {"head": "categorical", "observation": rows(obs), "logits": rows(m(obs))})


def normal_actions(loc, scale, low, high):
    """Actions to ask log-probs of: the mode, and loc +- scale clipped to the box."""
    return [loc, (loc + scale).clamp(low, high), (loc - 0.7 * scale).clamp(low, high)]


def normal_case():
    torch.manual_seed(0)
    m = Gaussian(3, 1).eval()
    export(m, 3, ["loc", "log_std"], "pendulum_normal", batch_outputs=["loc"])
    obs = observations(3, scale=2.0)
    loc, log_std = (t.to(torch.float64) for t in m(obs))
    scale = log_std.exp().expand_as(loc)
    actions = normal_actions(loc, scale, -2.0, 2.0)
    write(
        "pendulum_normal",
        {
            "head": "normal",
            "observation": rows(obs),
            "loc": rows(loc),
            "scale": rows(scale),
            "actions": [rows(a) for a in actions],
            "log_prob": [Normal(loc, scale).log_prob(a).sum(-1).tolist() for a in actions],
        },
    )


def tanh_normal_case():
    torch.manual_seed(0)
    m = GaussianScale(3, 1).eval()
    export(m, 3, ["loc", "scale"], "pendulum_tanh_normal")
    obs = observations(3, scale=2.0)
    loc, scale = (t.to(torch.float64) for t in m(obs))
    low, high = -2.0, 2.0
    c, h = (high + low) / 2, (high - low) / 2
    dist = TransformedDistribution(Normal(loc, scale), [TanhTransform(), AffineTransform(c, h)])
    pre = [loc, loc + 0.5 * scale, loc - 1.3 * scale]
    actions = [c + h * torch.tanh(u) for u in pre]
    write(
        "pendulum_tanh_normal",
        {
            "head": "tanh_normal",
            "observation": rows(obs),
            "loc": rows(loc),
            "scale": rows(scale),
            "pre_tanh": [rows(u) for u in pre],
            "actions": [rows(a) for a in actions],
            "log_prob": [dist.log_prob(a).sum(-1).tolist() for a in actions],
        },
    )


def deterministic_case():
    torch.manual_seed(0)
    m = Deterministic(3, 1).eval()
    export(m, 3, ["action"], "pendulum_deterministic")
    obs = observations(3, scale=2.0)
    write(
        "pendulum_deterministic",
        {"head": "deterministic", "observation": rows(obs), "action": rows(m(obs))},
    )


def broken_models():
    """Models that must be refused, each for one reason."""
    torch.manual_seed(0)
    # Five observations where CartPole has four.
    export(TanhMlp(5, [8], 2).eval(), 5, ["logits"], "bad_input_shape")
    # Three logits where CartPole has two actions.
    export(TanhMlp(4, [8], 3).eval(), 4, ["logits"], "bad_output_shape")
    # An op no runtime knows.
    x = helper.make_tensor_value_info("observation", TensorProto.FLOAT, ["batch", 4])
    y = helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", 2])
    w = helper.make_tensor("w", TensorProto.FLOAT, [4, 2], [0.1] * 8)
    nodes = [
        helper.make_node("MatMul", ["observation", "w"], ["z"], name="matmul"),
        helper.make_node("FrobnicateLogits", ["z"], ["logits"], name="frobnicate"),
    ]
    graph = helper.make_graph(nodes, "unknown_op", [x], [y], initializer=[w])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.save(model, str(OUT / "bad_unknown_op.onnx"))


class Residual(nn.Module):
    """A tanh MLP with a skip connection: not a plain chain of layers (runs on tract)."""

    def __init__(self):
        super().__init__()
        self.inp = nn.Linear(4, 16)
        self.mid = nn.Linear(16, 16)
        self.out = nn.Linear(16, 2)

    def forward(self, observation):
        h = torch.tanh(self.inp(observation))
        return self.out(h + torch.tanh(self.mid(h)))


def residual_case():
    torch.manual_seed(4)
    m = Residual().eval()
    export(m, 4, ["logits"], "cartpole_residual")
    obs = observations(4)
    write("cartpole_residual", {"head": "categorical", "observation": rows(obs), "logits": rows(m(obs))})


def matmul_case():
    """Dense layers written as `MatMul` by an `[in, out]` weight then `Add` of the bias
    (as torch writes `nn.Linear` on inputs of more than two dimensions), a ReLU, and a
    last `MatMul` without bias; built by hand, its outputs computed by torch."""
    g = torch.Generator().manual_seed(5)
    w0, b0 = torch.randn(4, 8, generator=g), torch.randn(8, generator=g)
    w1 = torch.randn(8, 2, generator=g)
    x = helper.make_tensor_value_info("observation", TensorProto.FLOAT, ["batch", 4])
    y = helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", 2])
    inits = [
        helper.make_tensor(name, TensorProto.FLOAT, list(t.shape), t.reshape(-1).tolist())
        for name, t in [("l0.weight", w0), ("l0.bias", b0), ("l1.weight", w1)]
    ]
    nodes = [
        helper.make_node("MatMul", ["observation", "l0.weight"], ["h0"], name="l0_matmul"),
        helper.make_node("Add", ["h0", "l0.bias"], ["h1"], name="l0_add"),
        helper.make_node("Relu", ["h1"], ["h2"], name="relu"),
        helper.make_node("MatMul", ["h2", "l1.weight"], ["logits"], name="l1_matmul"),
    ]
    graph = helper.make_graph(nodes, "matmul_add", [x], [y], initializer=inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    onnx.save(model, str(OUT / "cartpole_matmul_add.onnx"))
    obs = observations(4)
    logits = torch.relu(obs @ w0 + b0) @ w1
    write("cartpole_matmul_add", {"head": "categorical", "observation": rows(obs), "logits": rows(logits)})


class ImageCnn(nn.Module):
    """uint8 images [K, 12, 12, 3] -> 3 logits: the cast to float inside the model."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, kernel_size=3, stride=2)
        self.head = nn.Linear(4 * 5 * 5, 3)

    def forward(self, observation):
        x = observation.permute(0, 3, 1, 2).float() / 255.0
        return self.head(torch.relu(self.conv(x)).flatten(1))


def image_case():
    """A CNN over uint8 images (an env only Python nodes run): its input stays uint8."""
    torch.manual_seed(0)
    torch.onnx.export(
        ImageCnn().eval(),
        (torch.zeros(2, 12, 12, 3, dtype=torch.uint8),),
        str(OUT / "image_u8_cnn.onnx"),
        input_names=["observation"],
        output_names=["logits"],
        dynamic_axes={"observation": {0: "batch"}, "logits": {0: "batch"}},
        dynamo=False,
        do_constant_folding=False,
    )


def big_model(out_dir):
    """The 10 M-parameter 4-3162-3162-2 tanh MLP of the ONNX bench (40 MB: not committed)."""
    global OUT
    OUT = Path(out_dir)
    OUT.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(0)
    export(TanhMlp(4, [3162, 3162], 2).eval(), 4, ["logits"], "cartpole_tanh_mlp_3162")


class RecurrentStep(nn.Module):
    """One step of an LSTM or GRU actor as rollout runs it (PROTOCOL.md §8, Recurrent):
    the state rows zeroed where `is_init`, one `nn.LSTM`/`nn.GRU` step (batch first,
    torchrl's state layout `[K, layers, hidden]`), a linear head."""

    def __init__(self, kind, obs_dim, hidden, layers, out, outputs=1):
        super().__init__()
        cls = nn.LSTM if kind == "lstm" else nn.GRU
        self.kind = kind
        self.rnn = cls(obs_dim, hidden, num_layers=layers, batch_first=True)
        self.heads = nn.ModuleList(nn.Linear(hidden, out) for _ in range(outputs))

    def forward(self, observation, is_init, *state):
        keep = (~is_init).to(observation.dtype).unsqueeze(-1)
        st = [(x * keep).transpose(0, 1).contiguous() for x in state]
        if self.kind == "lstm":
            y, (h, c) = self.rnn(observation.unsqueeze(1), (st[0], st[1]))
            nxt = (h.transpose(0, 1), c.transpose(0, 1))
        else:
            y, h = self.rnn(observation.unsqueeze(1), st[0])
            nxt = (h.transpose(0, 1),)
        y = y.squeeze(1)
        return tuple(head(y) for head in self.heads) + nxt


def recurrent_case(kind, layers, name, obs_dim, heads, head_name, hidden=8):
    """Exports a recurrent actor and steps it in torch over 8 steps of 3 rows, `is_init`
    set at steps 0 and now and then, the state carried from one step to the next: the
    Rust tests step the ONNX policy the same way and compare every output and state."""
    torch.manual_seed(5 + layers)
    m = RecurrentStep(kind, obs_dim, hidden, layers, 2 if heads[0] == "logits" else 1, len(heads)).eval()
    names = ["recurrent_state_h", "recurrent_state_c"] if kind == "lstm" else ["recurrent_state"]
    inputs = ["observation", "is_init", *names]
    outputs = [*heads, *(f"next.{n}" for n in names)]
    k = 3
    example = (torch.zeros(k, obs_dim), torch.ones(k, 1, dtype=torch.bool), *(torch.zeros(k, layers, hidden) for _ in names))
    torch.onnx.export(
        m,
        example,
        str(OUT / f"{name}.onnx"),
        input_names=inputs,
        output_names=outputs,
        dynamic_axes={n: {0: "batch"} for n in inputs + outputs},
        dynamo=False,
        do_constant_folding=False,
        opset_version=18,
    )
    g = torch.Generator().manual_seed(17)
    state = [torch.zeros(k, layers, hidden) for _ in names]
    steps = []
    for t in range(8):
        obs = torch.randn(k, obs_dim, generator=g)
        init = torch.tensor([[t == 0 or (t * 3 + r) % 5 == 0] for r in range(k)])
        with torch.no_grad():
            out = m(obs, init, *state)
        steps.append(
            {
                "observation": rows(obs),
                "is_init": [bool(x) for x in init[:, 0]],
                "state": [rows(s.reshape(k, -1)) for s in state],
                "outputs": {h: rows(o) for h, o in zip(heads, out)},
                "next_state": [rows(o.reshape(k, -1)) for o in out[len(heads):]],
            }
        )
        state = [o.detach() for o in out[len(heads):]]
    write(name, {"head": head_name, "state": [{"name": n, "shape": [layers, hidden]} for n in names], "steps": steps})


def recurrent_cases():
    recurrent_case("lstm", 1, "cartpole_lstm", 4, ["logits"], "categorical")
    recurrent_case("lstm", 2, "cartpole_lstm_2", 4, ["logits"], "categorical")
    recurrent_case("gru", 2, "pendulum_gru_2", 3, ["loc", "log_std"], "normal")
    # The benchmark's actor (benches/benches/onnx.rs): a 64-unit LSTM on CartPole.
    recurrent_case("lstm", 1, "cartpole_lstm_64", 4, ["logits"], "categorical", hidden=64)


def main():
    if len(sys.argv) == 3 and sys.argv[1] == "--big":
        big_model(sys.argv[2])
        return
    OUT.mkdir(parents=True, exist_ok=True)
    if sys.argv[1:] == ["--recurrent"]:
        recurrent_cases()
        return
    categorical_case()
    tanh_mlp_case()
    normal_case()
    tanh_normal_case()
    deterministic_case()
    residual_case()
    matmul_case()
    broken_models()
    image_case()
    recurrent_cases()
    print(f"wrote {sorted(p.name for p in OUT.iterdir())}")


if __name__ == "__main__":
    main()
