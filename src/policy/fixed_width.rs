//! The collection loop's compiled path for a one-layer network on observations of a
//! constant width `D`: [`Net::act_fixed`] and the two-action argmax [`Argmax2`] that a
//! loop stepping one env keeps in registers. The same sums in the same order as
//! [`Net::act`], so the same actions bit for bit.

use super::action_head::Head;
use super::logprob::{log_softmax2, log_softmax2_batch, wanted};
use super::net::Net;
use super::record::{ParamsMut, RecordMut};
use super::{ActionsMut, ExplorationType, PolicyError};

impl Net {
    /// [`Net::act`] for observations of `D` values (a constant), written for the
    /// collection loop's compiled path: a single layer to two logits, or to a box, is
    /// evaluated with fixed-length rows (no loop over the input, no per-row checks),
    /// with the same operations in the same order, so the actions are bit for bit
    /// those of `act`. Anything else (hidden layers, a large network read from its
    /// named tensors, `D` = 0) is `act` itself.
    #[inline(always)]
    pub(super) fn act_fixed<const D: usize>(
        &mut self,
        obs: &[f32],
        k: usize,
        actions: ActionsMut<'_>,
        record: RecordMut<'_>,
    ) -> Result<(), PolicyError> {
        let [layer] = self.layout.layers() else {
            return self.act(obs, k, actions, record);
        };
        if D == 0 || self.named || self.obs_dim != D || Some(obs.len()) != k.checked_mul(D) {
            return self.act(obs, k, actions, record);
        }
        let random = self.exploration == ExplorationType::Random;
        let params = &self.params[layer.w..layer.b + layer.n_out];
        match (&self.head, actions) {
            (Head::Discrete { n: 2 }, ActionsMut::Discrete(out)) if out.len() == k && params.len() == 2 * D + 2 => {
                let (want_lp, want_logits) = wanted(&record, k, 2)?;
                let RecordMut { log_prob, params: rec } = record;
                let mut logits_out = match rec {
                    ParamsMut::Logits(z) if want_logits => Some(z),
                    _ => None,
                };
                let (w0, rest) = params.split_at(D);
                let (w1, bias) = rest.split_at(D);
                for (r, o) in out.iter_mut().enumerate() {
                    let x = &obs[r * D..(r + 1) * D];
                    let z0 = dot::<D>(w0, x, bias[0]);
                    let z1 = dot::<D>(w1, x, bias[1]);
                    let i = if random {
                        let p1 = 1.0 / (1.0 + (z0 - z1).exp());
                        self.sampler.uniform() < p1
                    } else {
                        // The argmax, the first one on ties (a NaN first logit wins, as there).
                        z1 > z0
                    };
                    *o = i as i64;
                    if want_lp {
                        log_prob[r] = log_softmax2(z0, z1, i as usize);
                    }
                    if let Some(z) = logits_out.as_deref_mut() {
                        z[2 * r] = z0;
                        z[2 * r + 1] = z1;
                    }
                }
                Ok(())
            }
            (_, actions) => self.act(obs, k, actions, record),
        }
    }

    /// What [`Net::act_fixed`] computes for observations of `D` values when it is the
    /// deterministic argmax of a one-layer, two-action network: its weights, copied out,
    /// so that a loop stepping one env can pick actions without going through memory.
    pub(super) fn argmax2<const D: usize>(&self) -> Option<Argmax2<D>> {
        let [layer] = self.layout.layers() else {
            return None;
        };
        if D == 0 || self.named || self.obs_dim != D || self.exploration == ExplorationType::Random {
            return None;
        }
        let params = &self.params[layer.w..layer.b + layer.n_out];
        if !matches!(self.head, Head::Discrete { n: 2 }) || params.len() != 2 * D + 2 {
            return None;
        }
        let (w0, rest) = params.split_at(D);
        let (w1, bias) = rest.split_at(D);
        Some(Argmax2 {
            w0: w0.try_into().ok()?,
            w1: w1.try_into().ok()?,
            bias: [bias[0], bias[1]],
        })
    }
}

/// A one-layer, two-action network's deterministic argmax over observations of `D`
/// values, its weights held by value: the same sums in the same order as
/// [`Net::act_fixed`], so the same actions bit for bit.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Argmax2<const D: usize> {
    w0: [f32; D],
    w1: [f32; D],
    bias: [f32; 2],
}

impl<const D: usize> Argmax2<D> {
    /// The action for observation `x` (1 if its logit is the larger, else 0: the
    /// first one on ties; a NaN first logit wins) and its two logits.
    #[inline(always)]
    pub(crate) fn logits(&self, x: &[f32; D]) -> (i64, f32, f32) {
        let z0 = dot::<D>(&self.w0, x, self.bias[0]);
        let z1 = dot::<D>(&self.w1, x, self.bias[1]);
        ((z1 > z0) as i64, z0, z1)
    }

    /// The log-probabilities of `actions` under their rows of two `logits` (as every
    /// path records them), after the loop: off its dependency chain, and vectorised.
    #[inline(always)]
    pub(crate) fn log_probs(logits: &[f32], actions: &[i64], out: &mut [f32]) {
        log_softmax2_batch(logits, actions, out);
    }
}

/// `b + w . x` over exactly `D` values, summed in [`dense_cols`]'s order.
#[inline(always)]
fn dot<const D: usize>(w: &[f32], x: &[f32], b: f32) -> f32 {
    let (w, x) = (&w[..D], &x[..D]);
    let mut s = b;
    for i in 0..D {
        s += w[i] * x[i];
    }
    s
}
