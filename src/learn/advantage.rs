//! Returns and advantages along one lane of a batch (one env's frames in time order).
//!
//! A lane may hold the end of one episode, whole episodes and the start of another.
//! `done[t]` ends an episode after frame `t` (the next frame starts a new one);
//! `terminated[t]` says that the end is a real terminal state (value 0 after it),
//! while a truncated end (time limit) or the end of the lane bootstraps with the
//! value of the next observation.

/// Generalised advantage estimation (Schulman et al. 2016) over one lane.
///
/// `value[t]` = V(observation t), `next_value[t]` = V(next observation t).
/// `delta[t] = r[t] + gamma * (1 - terminated[t]) * next_value[t] - value[t]`,
/// `adv[t] = delta[t] + gamma * lambda * (1 - done[t]) * adv[t + 1]`, with nothing after
/// the lane's last frame. Returns `(advantages, value targets = advantages + values)`.
pub fn gae(
    reward: &[f64],
    value: &[f64],
    next_value: &[f64],
    done: &[bool],
    terminated: &[bool],
    gamma: f64,
    lambda: f64,
) -> (Vec<f64>, Vec<f64>) {
    let t_len = reward.len();
    let mut adv = vec![0.0; t_len];
    let mut next_adv = 0.0;
    for t in (0..t_len).rev() {
        let boot = if terminated[t] { 0.0 } else { gamma * next_value[t] };
        let delta = reward[t] + boot - value[t];
        let carry = if done[t] { 0.0 } else { gamma * lambda * next_adv };
        adv[t] = delta + carry;
        next_adv = adv[t];
    }
    let ret = adv.iter().zip(value).map(|(a, v)| a + v).collect();
    (adv, ret)
}

/// Discounted returns-to-go within episodes (no bootstrap): `G[t] = r[t] + gamma * (1 - done[t]) * G[t + 1]`.
/// This is [`gae`] with zero values and `lambda = 1`.
pub fn discounted_returns(reward: &[f64], done: &[bool], gamma: f64) -> Vec<f64> {
    let mut g = vec![0.0; reward.len()];
    let mut next = 0.0;
    for t in (0..reward.len()).rev() {
        next = reward[t] + if done[t] { 0.0 } else { gamma * next };
        g[t] = next;
    }
    g
}

/// Shifts and scales `x` in place to mean 0 and standard deviation 1 (left centred when the std is ~0).
pub fn normalize(x: &mut [f64]) {
    if x.is_empty() {
        return;
    }
    let n = x.len() as f64;
    let mean = x.iter().sum::<f64>() / n;
    let var = x.iter().map(|v| (v - mean) * (v - mean)).sum::<f64>() / n;
    let std = var.sqrt();
    for v in x.iter_mut() {
        *v = (*v - mean) / (std + 1e-8);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn close(a: &[f64], b: &[f64]) {
        assert_eq!(a.len(), b.len());
        for (x, y) in a.iter().zip(b) {
            assert!((x - y).abs() < 1e-12, "{a:?} vs {b:?}");
        }
    }

    /// Lane: an episode ends (terminated) after frame 1, the next runs to the lane end.
    /// gamma = 0.5, rewards all 1:
    /// G = [1 + 0.5 * 1, 1, 1 + 0.5 * 1, 1] = [1.5, 1, 1.5, 1].
    #[test]
    fn discounted_returns_by_hand() {
        let r = [1.0, 1.0, 1.0, 1.0];
        let done = [false, true, false, false];
        close(&discounted_returns(&r, &done, 0.5), &[1.5, 1.0, 1.5, 1.0]);
        // A truncated (done) end stops the sum as well.
        close(&discounted_returns(&[2.0, 4.0], &[true, false], 0.9), &[2.0, 4.0]);
    }

    /// gamma = 0.5, lambda = 0.5; values V = [1, 2, 3, 4], next values V' = [2, 9, 4, 8].
    /// frame 3 (lane end, bootstrap):  delta = 1 + 0.5*8 - 4 = 1            adv = 1
    /// frame 2:                        delta = 1 + 0.5*4 - 3 = 0            adv = 0 + 0.25*1 = 0.25
    /// frame 1 (terminated):           delta = 1 + 0 - 2 = -1               adv = -1 (chain cut)
    /// frame 0:                        delta = 1 + 0.5*2 - 1 = 1            adv = 1 + 0.25*(-1) = 0.75
    /// targets = adv + V = [1.75, 1, 3.25, 5].
    #[test]
    fn gae_by_hand() {
        let (adv, ret) = gae(
            &[1.0; 4],
            &[1.0, 2.0, 3.0, 4.0],
            &[2.0, 9.0, 4.0, 8.0],
            &[false, true, false, false],
            &[false, true, false, false],
            0.5,
            0.5,
        );
        close(&adv, &[0.75, -1.0, 0.25, 1.0]);
        close(&ret, &[1.75, 1.0, 3.25, 5.0]);
        // Truncated instead of terminated: frame 1 bootstraps with V' = 9: delta = 1 + 4.5 - 2 = 3.5.
        let (adv, _) = gae(
            &[1.0; 4],
            &[1.0, 2.0, 3.0, 4.0],
            &[2.0, 9.0, 4.0, 8.0],
            &[false, true, false, false],
            &[false; 4],
            0.5,
            0.5,
        );
        close(&adv, &[1.0 + 0.25 * 3.5, 3.5, 0.25, 1.0]);
    }

    #[test]
    fn gae_with_zero_values_and_lambda_one_is_the_discounted_return() {
        let r = [0.5, 1.0, -2.0, 3.0, 1.0];
        let done = [false, false, true, false, false];
        let (adv, _) = gae(&r, &[0.0; 5], &[0.0; 5], &done, &done, 0.9, 1.0);
        close(&adv, &discounted_returns(&r, &done, 0.9));
    }

    #[test]
    fn normalize_gives_mean_zero_std_one() {
        let mut x = vec![1.0, 2.0, 3.0, 4.0];
        normalize(&mut x);
        let mean: f64 = x.iter().sum::<f64>() / 4.0;
        let var: f64 = x.iter().map(|v| v * v).sum::<f64>() / 4.0;
        assert!(mean.abs() < 1e-12 && (var - 1.0).abs() < 1e-6, "{x:?}");
        let mut c = vec![3.0; 3];
        normalize(&mut c);
        assert_eq!(c, [0.0; 3]);
    }
}
