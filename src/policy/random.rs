//! Uniform samples of the action spec, ignoring observations.

use rand::Rng;

use super::buffer_checks::check_actions;
use super::sampler::Sampler;
use super::{ActionsMut, ExplorationType, Policy, PolicyError, RecordMut, Recorded, SamplerState, Weights};
use crate::spec::Spec;

/// Uniform samples of the action spec (torchrl's `RandomPolicy`).
///
/// * `Discrete { n }`: uniform in `0..n`.
/// * `Box`: element `j` uniform in `[low[j], high[j]]`. If one of its bounds
///   is infinite, the value is drawn uniformly in `[-1, 1]` and then clipped
///   to the finite bound if there is one (so `[0, inf)` gives 0 half of the
///   time and `[5, inf)` always 5).
///
/// Observations are ignored (not even their length is checked, as the policy
/// does not know the observation spec). No weights: [`Policy::weights`] is
/// empty, and [`Policy::set_weights`] accepts only empty weights but adopts
/// their version. The exploration type has no effect. Sampling uses ChaCha8
/// seeded by `seed`.
///
/// It records [`Recorded::LogProb`]: the uniform log-density, the same for every
/// action: `-ln n` for `Discrete { n }`, `-sum_j ln(high[j] - low[j])` for a box
/// (f64, stored f32), where an element with an infinite bound counts `-ln 2`, the
/// density of the `[-1, 1]` it is drawn from (a value clipped to its finite bound
/// is recorded with that density too).
pub struct RandomPolicy {
    action: Spec,
    /// Element `j` is `offset[j] + scale[j] * u`, `u ~ U[0, 1)`, then clipped.
    offset: Vec<f64>,
    scale: Vec<f64>,
    sampler: Sampler,
    weights: Weights,
    /// The log-density of every action (see the type's doc).
    log_density: f32,
}

/// The uniform log-density of the random policy over `action` (see [`RandomPolicy`]).
pub(crate) fn uniform_log_density(action: &Spec) -> f32 {
    match action {
        Spec::Discrete { n } => -(*n as f64).ln() as f32,
        Spec::Box { low, high } => {
            let mut lp = 0.0f64;
            for (&l, &h) in low.iter().zip(high) {
                let (l, h) = (f64::from(l), f64::from(h));
                lp -= if l.is_finite() && h.is_finite() {
                    (h - l).ln()
                } else {
                    2.0f64.ln()
                };
            }
            lp as f32
        }
    }
}

impl RandomPolicy {
    /// A random policy over `action`, its generator seeded with `seed`.
    ///
    /// An invalid spec is not checked here (the signature cannot fail):
    /// [`PolicySpec::build`](super::PolicySpec::build) validates it, and `act`
    /// never panics on one: a `Discrete { n: 0 }` yields buffer-independent
    /// zeros, inverted bounds yield the clipped value, elements past the
    /// shorter of mismatched `low`/`high` are left untouched.
    pub fn new(action: Spec, seed: u64) -> RandomPolicy {
        let (mut offset, mut scale) = (Vec::new(), Vec::new());
        if let Spec::Box { low, high } = &action {
            for (&l, &h) in low.iter().zip(high) {
                let (l, h) = (l as f64, h as f64);
                if l.is_finite() && h.is_finite() {
                    offset.push(l);
                    scale.push(h - l);
                } else {
                    offset.push(-1.0);
                    scale.push(2.0);
                }
            }
        }
        RandomPolicy {
            log_density: uniform_log_density(&action),
            action,
            offset,
            scale,
            sampler: Sampler::new(seed),
            weights: Weights::default(),
        }
    }
}

impl Policy for RandomPolicy {
    fn act(&mut self, _obs: &[f32], k: usize, actions: ActionsMut<'_>) -> Result<(), PolicyError> {
        check_actions(&self.action, k, &actions)?;
        match (&self.action, actions) {
            (Spec::Discrete { n }, ActionsMut::Discrete(out)) => {
                let n = *n;
                for o in out {
                    *o = if n == 0 {
                        0
                    } else {
                        self.sampler.rng().random_range(0..n) as i64
                    };
                }
            }
            (Spec::Box { low, high }, ActionsMut::Continuous(out)) => {
                let d = low.len();
                if d == 0 {
                    return Ok(());
                }
                let params = self.offset.iter().zip(&self.scale).zip(low.iter().zip(high));
                for row in out.chunks_exact_mut(d) {
                    for (o, ((a, b), (&l, &h))) in row.iter_mut().zip(params.clone()) {
                        let u: f64 = self.sampler.rng().random();
                        let v = (a + b * u) as f32;
                        // max then min: never panics, even on inverted bounds.
                        *o = v.max(l).min(h);
                    }
                }
            }
            _ => return Err(PolicyError::Buffer("action buffer of the wrong kind".into())),
        }
        Ok(())
    }

    fn recorded(&self) -> Recorded {
        Recorded::LogProb
    }

    fn act_recording(
        &mut self,
        obs: &[f32],
        k: usize,
        actions: ActionsMut<'_>,
        record: RecordMut<'_>,
    ) -> Result<(), PolicyError> {
        let (want_lp, _) = super::logprob::wanted(&record, k, 0)?;
        self.act(obs, k, actions)?;
        if want_lp {
            record.log_prob.fill(self.log_density);
        }
        Ok(())
    }

    fn weights(&self) -> &Weights {
        &self.weights
    }

    fn set_weights(&mut self, weights: &Weights) -> Result<(), PolicyError> {
        self.weights.check_layout(weights)?;
        self.weights.version = weights.version;
        Ok(())
    }

    fn set_exploration(&mut self, _exploration: ExplorationType) {}

    fn reseed(&mut self, seed: u64) {
        self.sampler.reseed(seed);
    }

    fn sampler_state(&self) -> Result<Option<SamplerState>, PolicyError> {
        Ok(Some(self.sampler.state()))
    }

    fn set_sampler_state(&mut self, state: Option<&SamplerState>) -> Result<(), PolicyError> {
        self.sampler.set_state(state)
    }
}

#[cfg(test)]
mod tests {
    use super::super::test_util::{t, w};
    use super::*;

    #[test]
    fn discrete_is_uniform_and_seeded() {
        let mut p = RandomPolicy::new(Spec::Discrete { n: 4 }, 3);
        let mut counts = [0usize; 4];
        let mut first = Vec::new();
        for _ in 0..2500 {
            let mut out = [-1i64; 4];
            p.act(&[], 4, ActionsMut::Discrete(&mut out)).unwrap();
            first.extend_from_slice(&out);
            for a in out {
                counts[a as usize] += 1;
            }
        }
        for c in counts {
            assert!((2250..2750).contains(&c), "{counts:?}");
        }
        p.reseed(3);
        let mut again = Vec::new();
        for _ in 0..2500 {
            let mut out = [-1i64; 4];
            p.act(&[], 4, ActionsMut::Discrete(&mut out)).unwrap();
            again.extend_from_slice(&out);
        }
        assert_eq!(first, again);
        let mut other = RandomPolicy::new(Spec::Discrete { n: 4 }, 4);
        let mut out = [-1i64; 64];
        other.act(&[], 64, ActionsMut::Discrete(&mut out)).unwrap();
        assert_ne!(out[..], first[..64]);
    }

    #[test]
    fn box_samples_fill_the_bounds() {
        let spec = Spec::Box {
            low: vec![-2.0, 10.0, f32::NEG_INFINITY, 0.0, 5.0, -f32::MAX],
            high: vec![2.0, 10.0, f32::INFINITY, f32::INFINITY, f32::INFINITY, f32::MAX],
        };
        let mut p = RandomPolicy::new(spec, 0);
        let n = 4000;
        let mut out = vec![0f32; n * 6];
        p.act(&[0.0; 3], n, ActionsMut::Continuous(&mut out)).unwrap();
        let col = |j: usize| out.iter().skip(j).step_by(6).copied().collect::<Vec<f32>>();
        let c0 = col(0);
        assert!(c0.iter().all(|v| (-2.0..=2.0).contains(v)));
        let mean0 = c0.iter().sum::<f32>() / n as f32;
        assert!(mean0.abs() < 0.15, "{mean0}");
        assert!(c0.iter().any(|&v| v > 1.9) && c0.iter().any(|&v| v < -1.9));
        assert!(col(1).iter().all(|&v| v == 10.0));
        let c2 = col(2);
        assert!(c2.iter().all(|v| (-1.0..=1.0).contains(v)));
        assert!(c2.iter().any(|&v| v > 0.9) && c2.iter().any(|&v| v < -0.9));
        let c3 = col(3);
        assert!(c3.iter().all(|v| (0.0..=1.0).contains(v)));
        let zeros = c3.iter().filter(|&&v| v == 0.0).count();
        assert!((1800..2200).contains(&zeros), "{zeros}");
        assert!(col(4).iter().all(|&v| v == 5.0));
        assert!(col(5).iter().all(|v| v.is_finite()));
    }

    #[test]
    fn weights_are_empty() {
        let mut p = RandomPolicy::new(Spec::Discrete { n: 2 }, 0);
        assert_eq!(p.weights(), &Weights::default());
        p.set_weights(&Weights::default().with_version(12)).unwrap();
        assert_eq!(p.weights().version, 12);
        let bad = w(13, vec![("weight", t(&[1], &[0.0]))]);
        assert!(matches!(p.set_weights(&bad), Err(PolicyError::Weights(_))));
        assert_eq!(p.weights().version, 12);
    }

    #[test]
    fn bad_buffers_are_errors() {
        let mut p = RandomPolicy::new(Spec::uniform_box(2, 0.0, 1.0), 0);
        let buffer = |r: Result<(), PolicyError>| matches!(r, Err(PolicyError::Buffer(_)));
        assert!(buffer(p.act(&[], 2, ActionsMut::Continuous(&mut [0.0; 3]))));
        assert!(buffer(p.act(&[], 2, ActionsMut::Discrete(&mut [0; 2]))));
        let mut p = RandomPolicy::new(Spec::Discrete { n: 2 }, 0);
        assert!(buffer(p.act(&[], 2, ActionsMut::Discrete(&mut [0; 3]))));
        assert!(buffer(p.act(&[], 1, ActionsMut::Continuous(&mut [0.0; 1]))));
    }

    #[test]
    fn invalid_specs_do_not_panic() {
        let mut p = RandomPolicy::new(Spec::Discrete { n: 0 }, 0);
        let mut d = [5i64; 2];
        p.act(&[], 2, ActionsMut::Discrete(&mut d)).unwrap();
        assert_eq!(d, [0, 0]);
        let mut p = RandomPolicy::new(
            Spec::Box {
                low: vec![1.0],
                high: vec![0.0],
            },
            0,
        );
        p.act(&[], 1, ActionsMut::Continuous(&mut [0.0])).unwrap();
        let mut p = RandomPolicy::new(
            Spec::Box {
                low: vec![],
                high: vec![],
            },
            0,
        );
        p.act(&[], 3, ActionsMut::Continuous(&mut [])).unwrap();
    }
}
