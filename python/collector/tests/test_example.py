"""The NumPy policy-gradient example trains CartPole through the module."""

import pg_cartpole


def test_policy_gradient_improves_the_return():
    lengths = pg_cartpole.train(iterations=40, seed=0)
    assert len(lengths) == 40
    first, last = sum(lengths[:3]) / 3, sum(lengths[-5:]) / 5
    assert last > 2 * first, f"mean episode length {first:.1f} -> {last:.1f}"
