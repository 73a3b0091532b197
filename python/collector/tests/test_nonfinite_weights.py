"""Weights holding NaN or infinity are refused before they are stored, naming the tensor
and its first bad element, unless the collector allows them (``allow_nonfinite_weights``);
either way a refused push takes no version and the run goes on."""

import numpy as np
import pytest

import rollout

GOOD = {"weight": np.zeros((2, 4), dtype=np.float32), "bias": np.zeros(2, dtype=np.float32)}


@pytest.mark.parametrize("bad, shown", [(np.nan, "NaN"), (np.inf, "inf"), (-np.inf, "-inf")])
def test_numpy_weights_holding_nan_or_infinity_are_refused_naming_the_tensor(bad, shown):
    weight = GOOD["weight"].copy()
    weight[1, 3] = bad
    weight[1, 2] = bad  # the first in C order is named
    with rollout.DistributedCollector("CartPole-v1", frames_per_batch=10, total_frames=-1, seed=1) as c:
        with pytest.raises(rollout.ConfigError) as e:
            c.update_policy_weights_({**GOOD, "weight": weight})
        assert e.value.field == "weights"
        assert f"tensor `weight` holds {shown} at [1, 2]" in str(e.value), str(e.value)
        assert "allow_nonfinite_weights" in str(e.value)
        assert c.next().weights_version == 0, "nothing was stored"
        assert c.update_policy_weights_(GOOD) == 1, "the refused push took no version"


def test_allow_nonfinite_weights_stores_and_pushes_them():
    weight = GOOD["weight"].copy()
    weight[0, 0] = np.nan
    with rollout.DistributedCollector(
        "CartPole-v1", frames_per_batch=10, total_frames=-1, seed=1, allow_nonfinite_weights=True
    ) as c:
        assert c.update_policy_weights_({**GOOD, "weight": weight}) == 1
        for _ in range(20):  # a deadline in batches: the push reaches the node between two of them
            if c.next().weights_version == 1:
                break
        else:
            pytest.fail("no batch with the pushed version in 20 batches")


def test_allow_nonfinite_weights_must_be_a_bool():
    with pytest.raises(rollout.ConfigError) as e:
        rollout.DistributedCollector("CartPole-v1", frames_per_batch=10, allow_nonfinite_weights="yes")
    assert e.value.field == "allow_nonfinite_weights"


def test_a_torch_state_dict_holding_nan_is_refused_naming_the_parameter():
    torch = pytest.importorskip("torch")
    pytest.importorskip("tensordict")
    pytest.importorskip("torchrl")
    pytest.importorskip("onnx")
    from tensordict.nn import TensorDictModule
    from torch import nn
    from torchrl.modules import OneHotCategorical, ProbabilisticActor

    torch.manual_seed(0)
    actor = ProbabilisticActor(
        TensorDictModule(nn.Sequential(nn.Linear(4, 16), nn.Tanh(), nn.Linear(16, 2)), in_keys=["observation"], out_keys=["logits"]),
        in_keys=["logits"],
        distribution_class=OneHotCategorical,
        return_log_prob=True,
    )
    with rollout.DistributedCollector("CartPole-v1", actor, frames_per_batch=32, total_frames=-1, seed=5) as c:
        c.next()
        with torch.no_grad():
            actor.module[0].module[2].bias[1] = float("nan")
        with pytest.raises(rollout.ConfigError) as e:
            c.update_policy_weights_(actor)
        assert e.value.field == "weights"
        assert "tensor `module.0.module.2.bias` holds NaN at [1]" in str(e.value), str(e.value)
        with torch.no_grad():
            actor.module[0].module[2].bias[1] = 0.0
        assert c.update_policy_weights_(actor) == 1, "the refused push took no version"
        c.next()  # the run goes on
