//! A bare CartPole loop that owes nothing to the project's code: gymnasium's CartPole-v1
//! dynamics (f64, Euler, the same constants and thresholds, truncated at 500 steps)
//! and a deterministic two-logit linear policy, written out here, with the same
//! columns written per frame as a batch has (the eight of the env and the action, and
//! what the policy records: its two logits and the action's log-probability, computed
//! the plain way, `-ln(1 + exp(-|z0 - z1|))` in f64 for the argmax). It is the baseline `Rollout` is held to
//! for CartPole: a baseline that calls the project's own step cannot show that the
//! step is slow.

use std::hint::black_box;

const GRAVITY: f64 = 9.8;
const MASS_CART: f64 = 1.0;
const MASS_POLE: f64 = 0.1;
const TOTAL_MASS: f64 = MASS_CART + MASS_POLE;
const LENGTH: f64 = 0.5;
const POLE_MASS_LENGTH: f64 = MASS_POLE * LENGTH;
const FORCE_MAG: f64 = 10.0;
const TAU: f64 = 0.02;
const THETA_LIMIT: f64 = 12.0 * 2.0 * std::f64::consts::PI / 360.0;
const X_LIMIT: f64 = 2.4;
const MAX_STEPS: i64 = 500;

/// One CartPole, its policy's weights and the batch columns it writes.
pub struct Independent {
    state: [f64; 4],
    rng: u64,
    w: [[f32; 4]; 2],
    b: [f32; 2],
    steps: i64,
    traj: i64,
    obs: Vec<f32>,
    next_obs: Vec<f32>,
    action: Vec<i64>,
    reward: Vec<f32>,
    done: Vec<bool>,
    terminated: Vec<bool>,
    truncated: Vec<bool>,
    traj_ids: Vec<i64>,
    step_count: Vec<i64>,
    logits: Vec<f32>,
    log_prob: Vec<f32>,
}

impl Independent {
    /// A loop of `frames` frames a call with the linear policy's weights `w` and `b`.
    pub fn new(frames: usize, w: [[f32; 4]; 2], b: [f32; 2]) -> Independent {
        let mut s = Independent {
            state: [0.0; 4],
            rng: 0x9e37_79b9_7f4a_7c15,
            w,
            b,
            steps: 0,
            traj: 0,
            obs: vec![0.0; frames * 4],
            next_obs: vec![0.0; frames * 4],
            action: vec![0; frames],
            reward: vec![0.0; frames],
            done: vec![false; frames],
            terminated: vec![false; frames],
            truncated: vec![false; frames],
            traj_ids: vec![0; frames],
            step_count: vec![0; frames],
            logits: vec![0.0; frames * 2],
            log_prob: vec![0.0; frames],
        };
        s.reset();
        s
    }

    /// Uniform in [-0.05, 0.05) from a xorshift generator.
    fn uniform(&mut self) -> f64 {
        self.rng ^= self.rng << 13;
        self.rng ^= self.rng >> 7;
        self.rng ^= self.rng << 17;
        (self.rng >> 11) as f64 / (1u64 << 53) as f64 * 0.1 - 0.05
    }

    fn reset(&mut self) {
        for i in 0..4 {
            self.state[i] = self.uniform();
        }
        self.steps = 0;
        self.traj += 1;
    }

    /// One batch of frames.
    pub fn run(&mut self) {
        let n = self.action.len();
        for i in 0..n {
            let o = self.state.map(|v| v as f32);
            let z0 = self.b[0] + self.w[0][0] * o[0] + self.w[0][1] * o[1] + self.w[0][2] * o[2] + self.w[0][3] * o[3];
            let z1 = self.b[1] + self.w[1][0] * o[0] + self.w[1][1] * o[1] + self.w[1][2] * o[2] + self.w[1][3] * o[3];
            let a = (z1 > z0) as i64;
            let [x, x_dot, theta, theta_dot] = self.state;
            let force = if a == 1 { FORCE_MAG } else { -FORCE_MAG };
            let (sin, cos) = (theta.sin(), theta.cos());
            let temp = (force + POLE_MASS_LENGTH * theta_dot * theta_dot * sin) / TOTAL_MASS;
            let theta_acc = (GRAVITY * sin - cos * temp) / (LENGTH * (4.0 / 3.0 - MASS_POLE * cos * cos / TOTAL_MASS));
            let x_acc = temp - POLE_MASS_LENGTH * theta_acc * cos / TOTAL_MASS;
            self.state = [
                x + TAU * x_dot,
                x_dot + TAU * x_acc,
                theta + TAU * theta_dot,
                theta_dot + TAU * theta_acc,
            ];
            self.steps += 1;
            let term = self.state[0].abs() > X_LIMIT || self.state[2].abs() > THETA_LIMIT;
            let trunc = !term && self.steps >= MAX_STEPS;
            self.obs[i * 4..i * 4 + 4].copy_from_slice(&o);
            for (d, v) in self.next_obs[i * 4..i * 4 + 4].iter_mut().zip(self.state) {
                *d = v as f32;
            }
            self.action[i] = a;
            self.reward[i] = 1.0;
            self.terminated[i] = term;
            self.truncated[i] = trunc;
            self.done[i] = term || trunc;
            self.traj_ids[i] = self.traj;
            self.step_count[i] = self.steps - 1;
            self.logits[i * 2] = z0;
            self.logits[i * 2 + 1] = z1;
            self.log_prob[i] = -(1.0 + (-(f64::from(z0) - f64::from(z1)).abs()).exp()).ln() as f32;
            if term || trunc {
                self.reset();
            }
        }
        black_box(&self.obs);
        black_box(&self.next_obs);
        black_box(&self.log_prob);
    }
}
