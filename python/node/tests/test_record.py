"""``policy.record`` (PROTOCOL.md §3; version 9): off, the node's ``ready`` layout and batches
leave out what the policy records, and every other entry is the frame it collects with it on."""

import pytest

from conftest import linear_weights, node_spec, tensors

RECORDED = {"action_log_prob", "logits", "loc", "scale", "action_value", "chosen_action_value"}


def run(trainer, record, policy_kind="linear", exploration="deterministic", env="CartPole-v1"):
    trainer.start_node()
    policy = {"config": {"kind": policy_kind}, "exploration": exploration, "init_seed": 0}
    if record is not None:
        policy["record"] = record
    weights = linear_weights(2, 4) if policy_kind == "linear" else None
    ready = trainer.join(node_spec(env=env, policy=policy, frames_per_batch=40), weights=weights)
    assert ready["type"] == "ready", ready
    batches = []
    for seq in (1, 2):
        trainer.send({"type": "continue", "seq": seq, "frames": 40})
        batches.append(tensors(trainer.recv()))
    trainer.send({"type": "shutdown"})
    assert trainer.recv()["type"] == "down"
    assert trainer.finish()[0] == 0
    return ready["layout"], batches


@pytest.mark.parametrize("kind, exploration, env", [
    ("linear", "deterministic", "CartPole-v1"),
    ("linear", "random", "CartPole-v1"),
    ("random", "random", "CartPole-v1"),
])
def test_a_node_told_not_to_record_leaves_the_records_out_and_nothing_else(tmp_path, kind, exploration, env):
    from conftest import Trainer

    (tmp_path / "on").mkdir(), (tmp_path / "off").mkdir()
    on_t, off_t = Trainer(tmp_path / "on"), Trainer(tmp_path / "off")
    try:
        on_layout, on = run(on_t, None, kind, exploration, env)
        off_layout, off = run(off_t, False, kind, exploration, env)
    finally:
        on_t.close()
        off_t.close()
    assert RECORDED & set(on_layout), on_layout
    assert not RECORDED & set(off_layout), off_layout
    assert set(off_layout) == set(on_layout) - RECORDED
    for a, b in zip(on, off):
        assert set(b) == set(a) - RECORDED
        for key in b:
            assert (a[key] == b[key]).all(), key


def test_a_record_that_is_not_a_bool_fails_the_node_naming_the_field(trainer):
    trainer.start_node()
    policy = {"config": {"kind": "linear"}, "exploration": "deterministic", "init_seed": 0, "record": "no"}
    f = trainer.join(node_spec(policy=policy))
    assert f["type"] == "failed" and "record" in f["reason"], f
    assert trainer.finish()[0] == 1
