//! torchrl's epsilon-greedy exploration (`EGreedyModule`, DQN's) run by the node after
//! the `qvalue` head (PROTOCOL.md §8, Q-value actors).
//!
//! It keeps no state: each step draws, per env, whether to explore. Its `eps` is a
//! weight of the model, as Ornstein–Uhlenbeck's is, so the learner's annealing
//! (`step()`) reaches the nodes with `update_policy_weights_()`.

use rand::Rng;
use serde::{Deserialize, Serialize};

use super::sampler::Sampler;
use super::PolicyError;

/// torchrl's `EGreedyModule`, as a node runs it: the greedy action, or with
/// probability `eps` a uniform one.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct EpsilonGreedy {
    /// The model's f32 initializer holding the module's `eps` (one element).
    pub eps: String,
}

impl EpsilonGreedy {
    /// Checks the config, naming the field.
    pub fn check(&self) -> Result<(), PolicyError> {
        if self.eps.is_empty() {
            return Err(PolicyError::Spec(
                "exploration.eps: must name the model's initializer holding eps".into(),
            ));
        }
        Ok(())
    }
}

/// Replaces each of `actions` (indices in `0..n`) with a uniform index with
/// probability `eps`: one uniform draw per action, and a second where it explores.
pub(super) fn explore(actions: &mut [i64], n: u64, eps: f32, sampler: &mut Sampler) {
    if n == 0 {
        return;
    }
    for a in actions {
        if sampler.uniform() < eps {
            *a = sampler.rng().random_range(0..n) as i64;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn eps_zero_keeps_every_action_and_eps_one_draws_them_uniformly() {
        let mut s = Sampler::new(5);
        let mut a = vec![2i64; 1000];
        explore(&mut a, 4, 0.0, &mut s);
        assert!(a.iter().all(|&x| x == 2));
        let mut a = vec![2i64; 40_000];
        explore(&mut a, 4, 1.0, &mut s);
        let mut counts = [0usize; 4];
        for &x in &a {
            counts[usize::try_from(x).unwrap()] += 1;
        }
        // Each of 4 actions 10,000 times in expectation (sd ~87): a 6-sd band.
        for c in counts {
            assert!((9_480..=10_520).contains(&c), "{counts:?}");
        }
    }

    #[test]
    fn a_fraction_eps_of_the_actions_explore() {
        let mut s = Sampler::new(9);
        let mut a = vec![0i64; 40_000];
        explore(&mut a, 2, 0.5, &mut s);
        // Half explore, half of those draw the other action: a quarter move.
        let moved = a.iter().filter(|&&x| x == 1).count();
        assert!((9_480..=10_520).contains(&moved), "{moved}");
    }

    #[test]
    fn an_empty_eps_name_is_refused_naming_the_field() {
        let err = EpsilonGreedy { eps: String::new() }.check().unwrap_err();
        assert!(err.to_string().contains("exploration.eps"), "{err}");
    }
}
