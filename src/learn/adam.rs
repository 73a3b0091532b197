//! The Adam optimiser (Kingma & Ba), with optional gradient clipping by global norm.

use serde::{Deserialize, Serialize};

use super::LearnError;

/// Adam over a flat parameter vector.
#[derive(Clone, Debug, PartialEq)]
pub struct Adam {
    /// Learning rate.
    pub lr: f64,
    /// Decay of the first moment.
    pub beta1: f64,
    /// Decay of the second moment.
    pub beta2: f64,
    /// Added to the denominator.
    pub eps: f64,
    m: Vec<f64>,
    v: Vec<f64>,
    t: i32,
}

impl Adam {
    /// Adam for `n` parameters with torch's defaults (betas 0.9, 0.999, eps 1e-8).
    pub fn new(n: usize, lr: f64) -> Adam {
        Adam {
            lr,
            beta1: 0.9,
            beta2: 0.999,
            eps: 1e-8,
            m: vec![0.0; n],
            v: vec![0.0; n],
            t: 0,
        }
    }

    /// Steps taken so far.
    pub fn steps(&self) -> i32 {
        self.t
    }

    /// One step: `params -= lr * m_hat / (sqrt(v_hat) + eps)`.
    pub fn step(&mut self, params: &mut [f64], grad: &[f64]) {
        assert_eq!(params.len(), self.m.len(), "Adam built for another parameter count");
        self.t = self.t.saturating_add(1);
        let c1 = 1.0 - self.beta1.powi(self.t);
        let c2 = 1.0 - self.beta2.powi(self.t);
        for i in 0..params.len() {
            let g = grad[i];
            self.m[i] = self.beta1 * self.m[i] + (1.0 - self.beta1) * g;
            self.v[i] = self.beta2 * self.v[i] + (1.0 - self.beta2) * g * g;
            let mh = self.m[i] / c1;
            let vh = self.v[i] / c2;
            params[i] -= self.lr * mh / (vh.sqrt() + self.eps);
        }
    }
}

/// The part of an [`Adam`] that changes while training (moments and step count), for
/// checkpoints; the hyper-parameters come from the config the learner is rebuilt with.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct AdamState {
    m: Vec<f64>,
    v: Vec<f64>,
    t: i32,
}

impl Adam {
    /// The moments and step count.
    pub fn state(&self) -> AdamState {
        AdamState {
            m: self.m.clone(),
            v: self.v.clone(),
            t: self.t,
        }
    }

    /// Continues from `state`. It may come from a file, so it is checked first (one
    /// moment per parameter, a non-negative step count, finite moments, a non-negative
    /// second moment) and `self` is left untouched when it does not fit.
    pub fn restore(&mut self, state: AdamState) -> Result<(), LearnError> {
        let n = self.m.len();
        if state.m.len() != n || state.v.len() != n {
            return Err(LearnError::Checkpoint(format!(
                "Adam moments of lengths {} and {}, expected {n} (one per parameter)",
                state.m.len(),
                state.v.len()
            )));
        }
        if state.t < 0 {
            return Err(LearnError::Checkpoint(format!(
                "Adam step count {} is negative",
                state.t
            )));
        }
        if !state.m.iter().all(|x| x.is_finite()) || !state.v.iter().all(|x| x.is_finite() && *x >= 0.0) {
            return Err(LearnError::Checkpoint(
                "Adam moments must be finite, the second one non-negative".into(),
            ));
        }
        self.m = state.m;
        self.v = state.v;
        self.t = state.t;
        Ok(())
    }
}

/// Scales `grad` so that its Euclidean norm is at most `max_norm`; returns the norm before.
pub fn clip_grad_norm(grad: &mut [f64], max_norm: f64) -> f64 {
    let norm = grad.iter().map(|g| g * g).sum::<f64>().sqrt();
    if norm > max_norm && norm > 0.0 {
        let s = max_norm / norm;
        grad.iter_mut().for_each(|g| *g *= s);
    }
    norm
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn first_step_moves_by_lr_against_the_gradient_sign() {
        let mut p = vec![1.0, -2.0, 0.5];
        let mut a = Adam::new(3, 0.1);
        a.step(&mut p, &[3.0, -0.01, 0.0]);
        assert!((p[0] - 0.9).abs() < 1e-6, "{p:?}");
        assert!((p[1] + 1.9).abs() < 1e-5, "{p:?}");
        assert_eq!(p[2], 0.5);
        assert_eq!(a.steps(), 1);
    }

    #[test]
    fn minimises_a_quadratic() {
        let mut p = vec![5.0, -3.0];
        let mut a = Adam::new(2, 0.05);
        for _ in 0..2000 {
            let g = [2.0 * (p[0] - 1.0), 4.0 * (p[1] + 2.0)];
            a.step(&mut p, &g);
        }
        assert!((p[0] - 1.0).abs() < 1e-3 && (p[1] + 2.0).abs() < 1e-3, "{p:?}");
    }

    #[test]
    fn clipping_scales_to_the_norm() {
        let mut g = vec![3.0, 4.0];
        assert_eq!(clip_grad_norm(&mut g, 1.0), 5.0);
        assert!((g[0] - 0.6).abs() < 1e-12 && (g[1] - 0.8).abs() < 1e-12);
        let mut h = vec![0.3, 0.4];
        clip_grad_norm(&mut h, 1.0);
        assert_eq!(h, [0.3, 0.4]);
    }

    #[test]
    fn state_roundtrip_continues_the_same_steps_and_rejects_misfits() {
        let mut a = Adam::new(2, 0.1);
        let mut p = vec![1.0, 2.0];
        a.step(&mut p, &[0.5, -1.0]);
        let mut b = Adam::new(2, 0.1);
        b.restore(a.state()).unwrap();
        let mut q = p.clone();
        a.step(&mut p, &[0.3, 0.2]);
        b.step(&mut q, &[0.3, 0.2]);
        assert_eq!((p, a.steps()), (q, b.steps()));

        let mut c = Adam::new(3, 0.1);
        assert!(matches!(c.restore(a.state()), Err(LearnError::Checkpoint(_))));
        let mut bad = a.state();
        bad.t = -1;
        assert!(matches!(b.restore(bad), Err(LearnError::Checkpoint(_))));
        let mut bad = a.state();
        bad.v[0] = -1.0;
        assert!(matches!(b.restore(bad), Err(LearnError::Checkpoint(_))));
        assert_eq!(c, Adam::new(3, 0.1), "a failed restore changes nothing");
    }
}
