//! The loop of one env stepped by a deterministic two-action argmax (CartPole's
//! linear policy): the observation stays in registers from the env's step to the next
//! action, and the log-probabilities are computed after the steps.

use std::sync::atomic::{AtomicBool, Ordering};

use super::concrete::{EnvKind, PolicyKind};
use super::fill::{has_nan, Episodes, Fill, Shape};
use super::{Buffers, RolloutError, STOP_CHECK_STEPS};
use crate::env::Action;
use crate::policy::Argmax2;

impl<E: EnvKind, P: PolicyKind + ?Sized> Fill<'_, E, P> {
    /// Fills the batch of the one env with `head`'s actions. Through `cur_obs` and the
    /// policy's action slice, each step waited on two stores being read back, on the
    /// one dependency chain a single env's frames form. Returns the largest trajectory
    /// id written (`None` for an empty batch), kept as they are written: the node's
    /// next-id bookkeeping then need not scan the batch for it. `RECORD`: the logits
    /// and log-probabilities are written (a run that records; else they are not
    /// computed into anything, and the batch has no such keys).
    #[inline(always)]
    pub(super) fn one_env_argmax2<const D: usize, const RECORD: bool>(
        &mut self,
        head: Argmax2<D>,
        stop: &AtomicBool,
    ) -> Result<Option<i64>, RolloutError> {
        let Shape {
            steps,
            nan_is_failure,
            max_traj,
            ..
        } = self.s;
        let Buffers {
            obs,
            next_obs,
            action_i,
            reward,
            done,
            terminated,
            truncated,
            traj_ids,
            step_count: step_counts,
            log_prob,
            param_a,
            ..
        } = &mut *self.b;
        let Episodes {
            cur_obs,
            traj_id,
            step_count,
            needs_reset,
            pending_seed,
            ids,
        } = &mut self.episodes;
        let act_i = &mut *self.out.act_i;
        let frames = &mut *self.frames;
        let env = &mut self.envs[0];
        let cur = &mut cur_obs[..D];
        let mut x = [0.0f32; D];
        x.copy_from_slice(cur);
        // The env's bookkeeping in locals too, written back however the batch ends.
        let (mut reset, mut tid, mut sc, mut done_frames) = (needs_reset[0], traj_id[0], step_count[0], *frames);
        let first_frame = done_frames;
        let mut max_tid = i64::MIN;
        let result = 'batch: {
            let mut start = 0;
            while start < steps {
                // One look at the stop flag per chunk of steps: the loop inside is
                // the hot loop as it was, with no test of its own.
                if stop.load(Ordering::Relaxed) {
                    break 'batch Err(RolloutError::Stopped);
                }
                let end = steps.min(start + STOP_CHECK_STEPS);
                for i in start..end {
                    if reset {
                        if let Err(source) = env.reset(pending_seed[0].take(), cur) {
                            break 'batch Err(RolloutError::Env { env: 0, source });
                        }
                        if nan_is_failure && has_nan(cur) {
                            break 'batch Err(RolloutError::NanObservation { env: 0 });
                        }
                        x.copy_from_slice(cur);
                        tid = ids[0].alloc();
                        sc = 0;
                        reset = false;
                    }
                    let (action, z0, z1) = head.logits(&x);
                    act_i[0] = action;
                    obs[i * D..(i + 1) * D].copy_from_slice(&x);
                    action_i[i] = action;
                    // The log-probabilities are computed after the loop, from these:
                    // a call to `exp` here would spill the observation off its registers.
                    if RECORD {
                        param_a[2 * i] = z0;
                        param_a[2 * i + 1] = z1;
                    }
                    let tr = env.step_fast(Action::Discrete(action), &mut x);
                    // Stored, never read back in the loop: `cur_obs` is what the env wrote,
                    // as on the general path, whether or not the step failed.
                    cur.copy_from_slice(&x);
                    let tr = match tr {
                        Ok(tr) => tr,
                        Err(source) => break 'batch Err(RolloutError::Env { env: 0, source }),
                    };
                    next_obs[i * D..(i + 1) * D].copy_from_slice(&x);
                    let cut = (sc + 1) as u64 >= max_traj && !tr.terminated;
                    let trunc = tr.truncated || cut;
                    let end = tr.terminated || trunc;
                    reward[i] = tr.reward as f32;
                    terminated[i] = tr.terminated;
                    truncated[i] = trunc;
                    done[i] = end;
                    traj_ids[i] = tid;
                    max_tid = max_tid.max(tid);
                    step_counts[i] = sc;
                    sc += 1;
                    reset = end;
                    if nan_is_failure && !end && has_nan(&x) {
                        break 'batch Err(RolloutError::NanObservation { env: 0 });
                    }
                    done_frames += 1;
                }
                start = end;
            }
            Ok(())
        };
        (needs_reset[0], traj_id[0], step_count[0], *frames) = (reset, tid, sc, done_frames);
        let written = usize::try_from(done_frames - first_frame).unwrap_or(0).min(steps);
        if RECORD {
            Argmax2::<D>::log_probs(&param_a[..2 * written], &action_i[..written], &mut log_prob[..written]);
        }
        result.map(|()| (steps > 0).then_some(max_tid))
    }
}
