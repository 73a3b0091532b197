//! The hot loop: a batch filled step by step, compiled for each env and policy type.
//!
//! [`Rollout::fill`] borrows the rollout apart into a [`Fill`] and runs one of two
//! loops over it: the one-env argmax loop (`fill_argmax2`) or the general one here,
//! whose step is four pieces: reset the envs whose episode ended, act, step the envs
//! and write the frames, and (after the steps) the log-probabilities left for one pass.
//! Every piece is inlined into the loop, which is compiled as one function per type.

use std::sync::atomic::{AtomicBool, Ordering};

use super::concrete::{EnvKind, PolicyKind};
use super::{record_sizes, Buffers, Recurrent, Rollout, RolloutError, TrajIds, STOP_CHECK_STEPS};
use crate::env::Action;
use crate::policy::{ActionsMut, Argmax2, ParamsMut, Policy, RandomPolicy, RecordMut, Recorded, StateIo};

/// What every step of one batch has in common, fixed before the first.
#[derive(Clone, Copy)]
pub(super) struct Shape {
    /// Values per observation.
    pub(super) d: usize,
    /// Values per continuous action.
    pub(super) a: usize,
    /// Steps of each env in the batch.
    pub(super) steps: usize,
    /// Envs stepped.
    pub(super) k_envs: usize,
    /// Whether actions are discrete.
    pub(super) discrete: bool,
    /// What the policy records, and its values per frame (log-probability, logits or loc, scale).
    pub(super) recorded: Recorded,
    pub(super) lp_w: usize,
    pub(super) pa_w: usize,
    pub(super) pb_w: usize,
    /// A NaN in an observation fails the batch.
    pub(super) nan_is_failure: bool,
    /// Frames after which a trajectory is cut (`u64::MAX`: never).
    pub(super) max_traj: u64,
    /// Frames (over the rollout) stepped with the random policy first.
    pub(super) init_random: u64,
}

/// Each env's episode in progress, one entry (one observation row) per env.
pub(super) struct Episodes<'a> {
    /// The observation each env's next action is taken in.
    pub(super) cur_obs: &'a mut [f32],
    pub(super) traj_id: &'a mut [i64],
    pub(super) step_count: &'a mut [i64],
    pub(super) needs_reset: &'a mut [bool],
    pub(super) pending_seed: &'a mut [Option<u64>],
    pub(super) ids: &'a mut [TrajIds],
}

/// The policy call's outputs of one step, one row per env: the actions, then what
/// the policy records (log-probabilities, logits or loc, scale).
pub(super) struct StepOut<'a> {
    pub(super) act_i: &'a mut [i64],
    pub(super) act_f: &'a mut [f32],
    pub(super) rec_lp: &'a mut [f32],
    pub(super) rec_a: &'a mut [f32],
    pub(super) rec_b: &'a mut [f32],
}

/// One batch being filled: the rollout's parts the loop uses, borrowed apart so the
/// compiler keeps them in registers across the env and policy calls, and the batch's
/// buffers.
pub(super) struct Fill<'a, E, P: ?Sized> {
    pub(super) envs: &'a mut [E],
    pub(super) policy: &'a mut P,
    pub(super) random: Option<&'a mut RandomPolicy>,
    pub(super) episodes: Episodes<'a>,
    pub(super) out: StepOut<'a>,
    /// A recurrent policy's state (`None`: a policy without state).
    pub(super) rec: Option<&'a mut Recurrent>,
    pub(super) b: &'a mut Buffers,
    /// Frames collected by the rollout so far.
    pub(super) frames: &'a mut u64,
    pub(super) s: Shape,
}

impl Rollout {
    /// The hot loop, compiled for env type `E` and policy type `P` (`D` values per
    /// observation, 0 for any; `K` envs, 0 for any). `stop` is looked at every
    /// [`STOP_CHECK_STEPS`] steps.
    pub(super) fn fill<const D: usize, const K: usize, E: EnvKind, P: PolicyKind + ?Sized>(
        &mut self,
        b: &mut Buffers,
        stop: &AtomicBool,
    ) -> Result<(), RolloutError> {
        let Rollout {
            envs,
            policy,
            random,
            config,
            discrete,
            obs_dim,
            act_dim,
            steps,
            cur_obs,
            traj_id,
            step_count,
            needs_reset,
            pending_seed,
            act_i,
            act_f,
            recorded,
            rec_lp,
            rec_a,
            rec_b,
            ids,
            frames,
            batch_max_traj_id,
            recurrent,
            ..
        } = self;
        let internal = || RolloutError::Config {
            field: "buffers",
            reason: "internal: the env or policy type disagrees with the compiled loop".into(),
        };
        let envs = E::slice(envs).ok_or_else(internal)?;
        let policy = P::pick(policy).ok_or_else(internal)?;
        let (lp_w, pa_w, pb_w) = record_sizes(*recorded);
        let s = Shape {
            d: if D == 0 { *obs_dim } else { D },
            a: *act_dim,
            steps: *steps,
            k_envs: if K == 0 { envs.len() } else { K },
            discrete: *discrete,
            recorded: *recorded,
            lp_w,
            pa_w,
            pb_w,
            nan_is_failure: config.nan_is_failure,
            max_traj: config.max_frames_per_traj.unwrap_or(u64::MAX),
            init_random: config.init_random_frames,
        };
        let mut fill = Fill {
            envs,
            policy,
            random: random.as_mut(),
            episodes: Episodes {
                cur_obs,
                traj_id,
                step_count,
                needs_reset,
                pending_seed,
                ids,
            },
            out: StepOut {
                act_i,
                act_f,
                rec_lp,
                rec_a,
                rec_b,
            },
            rec: recurrent.as_mut(),
            b,
            frames,
            s,
        };
        if !fill.sizes_fit() {
            return Err(RolloutError::Config {
                field: "buffers",
                reason: "internal buffer sizes disagree with the batch shape".into(),
            });
        }
        // One env and a deterministic two-action linear policy (CartPole's argmax): the
        // observation stays in registers from the env's step to the next action. Through
        // `cur_obs` and the policy's action slice, each step waited on two stores being
        // read back, on the one dependency chain a single env's frames form.
        let argmax = if K == 1
            && fill.rec.is_none()
            && (fill.random.is_none() || *fill.frames >= s.init_random)
            && matches!(s.recorded, Recorded::Categorical { n: 2 } | Recorded::None)
        {
            fill.policy.argmax2::<D>()
        } else {
            None
        };
        if let Some(head) = argmax {
            let max_tid = if s.recorded == Recorded::None {
                fill.one_env_argmax2::<D, false>(head, stop)?
            } else {
                fill.one_env_argmax2::<D, true>(head, stop)?
            };
            *batch_max_traj_id = max_tid;
            return Ok(());
        }
        fill.general::<D>(stop)
    }
}

impl<E: EnvKind, P: PolicyKind + ?Sized> Fill<'_, E, P> {
    /// Whether every buffer has the size the batch's shape says. Checked once before
    /// the loop, so the compiler can drop the per-frame bounds checks.
    #[inline(always)]
    fn sizes_fit(&self) -> bool {
        let Shape {
            d,
            a,
            steps,
            k_envs,
            discrete,
            lp_w,
            pa_w,
            pb_w,
            ..
        } = self.s;
        let Buffers {
            obs,
            next_obs,
            action_i,
            action_f,
            reward,
            done,
            terminated,
            truncated,
            traj_ids,
            step_count: step_counts,
            log_prob,
            param_a,
            param_b,
            ..
        } = &*self.b;
        let Episodes {
            cur_obs,
            traj_id,
            step_count,
            needs_reset,
            pending_seed,
            ids,
        } = &self.episodes;
        let StepOut {
            rec_lp, rec_a, rec_b, ..
        } = &self.out;
        let n = k_envs * steps;
        obs.len() == n * d
            && next_obs.len() == n * d
            && (if discrete {
                action_i.len() == n
            } else {
                action_f.len() == n * a
            })
            && [reward.len(), traj_ids.len(), step_counts.len()]
                .iter()
                .all(|&l| l == n)
            && [done.len(), terminated.len(), truncated.len()].iter().all(|&l| l == n)
            && log_prob.len() == n * lp_w
            && param_a.len() == n * pa_w
            && param_b.len() == n * pb_w
            && rec_lp.len() == k_envs * lp_w
            && rec_a.len() == k_envs * pa_w
            && rec_b.len() == k_envs * pb_w
            && cur_obs.len() == k_envs * d
            && self.envs.len() == k_envs
            && [
                traj_id.len(),
                step_count.len(),
                needs_reset.len(),
                pending_seed.len(),
                ids.len(),
            ]
            .iter()
            .all(|&l| l == k_envs)
    }

    /// The loop for any number of envs and any policy.
    #[inline(always)]
    fn general<const D: usize>(&mut self, stop: &AtomicBool) -> Result<(), RolloutError> {
        let s = self.s;
        // Two logits recorded by a policy whose log-probability is theirs: the main
        // policy's log-probabilities are computed after the steps, in one vectorised
        // pass over the batch. Per step, 16 rows are two vectors whose long chain of
        // dependent operations the next env steps could not hide (BENCHMARKS.md).
        let lp_after = s.recorded == (Recorded::Categorical { n: 2 })
            && s.lp_w == 1
            && s.pa_w == 2
            && self.policy.log_prob_of_two_logits();
        // The first step the main policy acted at: the random policy's frames
        // (`init_random_frames`) come first and keep their own log-probabilities.
        let mut main_from = None;
        for t in 0..s.steps {
            // Beside a policy call per step, one relaxed load per chunk costs nothing.
            if t % STOP_CHECK_STEPS == 0 && stop.load(Ordering::Relaxed) {
                return Err(RolloutError::Stopped);
            }
            self.reset_finished()?;
            if let Some(r) = self.rec.as_deref_mut() {
                r.begin_step(self.episodes.step_count);
            }
            self.act::<D>(t, lp_after, &mut main_from)?;
            let copy_lp = s.lp_w == 1 && !(lp_after && main_from.is_some());
            self.step_envs(t, copy_lp)?;
            if let Some(r) = self.rec.as_deref_mut() {
                r.advance();
            }
        }
        if let (true, Some(t0)) = (lp_after, main_from) {
            self.log_probs_after::<D>(t0);
        }
        Ok(())
    }

    /// Starts a new episode in every env whose last one ended (or that was never reset).
    #[inline(always)]
    fn reset_finished(&mut self) -> Result<(), RolloutError> {
        let Shape {
            d,
            k_envs,
            nan_is_failure,
            ..
        } = self.s;
        let Episodes {
            cur_obs,
            traj_id,
            step_count,
            needs_reset,
            pending_seed,
            ids,
        } = &mut self.episodes;
        let envs = &mut *self.envs;
        for k in 0..k_envs {
            if needs_reset[k] {
                let cur = &mut cur_obs[k * d..(k + 1) * d];
                envs[k]
                    .reset(pending_seed[k].take(), cur)
                    .map_err(|source| RolloutError::Env { env: k, source })?;
                if nan_is_failure && has_nan(cur) {
                    return Err(RolloutError::NanObservation { env: k });
                }
                traj_id[k] = ids[k].alloc();
                step_count[k] = 0;
                needs_reset[k] = false;
            }
        }
        Ok(())
    }

    /// Takes step `t`'s actions: the random policy's while the rollout is within its
    /// `init_random_frames`, else the policy's (noting the first step it acted at in
    /// `main_from`). With `lp_after`, the policy's log-probabilities are left for
    /// [`Fill::log_probs_after`].
    #[inline(always)]
    fn act<const D: usize>(
        &mut self,
        t: usize,
        lp_after: bool,
        main_from: &mut Option<usize>,
    ) -> Result<(), RolloutError> {
        let Shape {
            k_envs,
            discrete,
            recorded,
            init_random,
            ..
        } = self.s;
        let StepOut {
            act_i,
            act_f,
            rec_lp,
            rec_a,
            rec_b,
        } = &mut self.out;
        let cur_obs = &*self.episodes.cur_obs;
        let actions = if discrete {
            ActionsMut::Discrete(act_i)
        } else {
            ActionsMut::Continuous(act_f)
        };
        match &mut self.random {
            Some(r) if *self.frames < init_random => {
                // The main policy's keys, with the fill values of frames it did not act.
                let record = RecordMut {
                    log_prob: rec_lp,
                    params: ParamsMut::None,
                };
                r.act_recording(cur_obs, k_envs, actions, record)?;
                if let Some(rec) = self.rec.as_deref_mut() {
                    rec.hold();
                }
                match recorded {
                    Recorded::Categorical { .. } => rec_a.fill(0.0),
                    Recorded::Normal { .. } => {
                        rec_a.fill(f32::NAN);
                        rec_b.fill(f32::NAN);
                    }
                    // No model ran: no action values (the log-probability column
                    // holds the greedy value).
                    Recorded::QValue { .. } => {
                        rec_a.fill(f32::NAN);
                        rec_lp.fill(f32::NAN);
                    }
                    Recorded::None | Recorded::LogProb => {}
                }
            }
            _ => {
                let params = match recorded {
                    Recorded::Categorical { .. } | Recorded::QValue { .. } => ParamsMut::Logits(rec_a),
                    Recorded::Normal { .. } => ParamsMut::Normal {
                        loc: rec_a,
                        scale: rec_b,
                    },
                    Recorded::None | Recorded::LogProb => ParamsMut::None,
                };
                let record = RecordMut {
                    log_prob: if lp_after { &mut [] } else { &mut rec_lp[..] },
                    params,
                };
                main_from.get_or_insert(t);
                match self.rec.as_deref_mut() {
                    Some(rec) => {
                        let io = StateIo {
                            is_init: &rec.is_init,
                            before: &rec.cur,
                            after: &mut rec.next,
                        };
                        self.policy.act_recurrent(cur_obs, k_envs, io, actions, record)?
                    }
                    None => self.policy.act_fixed::<D>(cur_obs, k_envs, actions, record)?,
                }
            }
        }
        Ok(())
    }

    /// Steps every env with its action of step `t` and writes the frames into the
    /// batch (with the step's log-probabilities when `copy_lp`).
    #[inline(always)]
    fn step_envs(&mut self, t: usize, copy_lp: bool) -> Result<(), RolloutError> {
        let Shape {
            d,
            a,
            steps,
            k_envs,
            discrete,
            pa_w,
            pb_w,
            nan_is_failure,
            max_traj,
            ..
        } = self.s;
        let Buffers {
            obs,
            next_obs,
            action_i,
            action_f,
            reward,
            done,
            terminated,
            truncated,
            traj_ids,
            step_count: step_counts,
            log_prob,
            param_a,
            param_b,
            is_init,
            state,
            next_state,
        } = &mut *self.b;
        let Episodes {
            cur_obs,
            traj_id,
            step_count,
            needs_reset,
            ..
        } = &mut self.episodes;
        let rec = self.rec.as_deref();
        let StepOut {
            act_i,
            act_f,
            rec_lp,
            rec_a,
            rec_b,
        } = &self.out;
        let envs = &mut *self.envs;
        for k in 0..k_envs {
            let i = k * steps + t;
            let cur = &mut cur_obs[k * d..(k + 1) * d];
            copy_row(&mut obs[i * d..(i + 1) * d], cur);
            let action = if discrete {
                action_i[i] = act_i[k];
                Action::Discrete(act_i[k])
            } else {
                let src = &act_f[k * a..(k + 1) * a];
                copy_row(&mut action_f[i * a..(i + 1) * a], src);
                Action::Continuous(src)
            };
            // The env writes the next observation over the current one, which the
            // next step's policy call reads from there, and it is copied into the
            // batch after: stepping into the batch and copying it back would load
            // the row whole right after the env's narrow stores (a stalled store
            // forward, measured at about 6 % of the loop, see BENCHMARKS.md).
            let tr = match envs[k].step_fast(action, cur) {
                Ok(tr) => tr,
                Err(source) => return Err(RolloutError::Env { env: k, source }),
            };
            copy_row(&mut next_obs[i * d..(i + 1) * d], cur);
            if copy_lp {
                log_prob[i] = rec_lp[k];
            }
            // Through `copy_row`: a `copy_from_slice` of a length known only at run
            // time is a call to `memmove`, 3 % of a 64-64 MLP's collection.
            if pa_w > 0 {
                copy_row(&mut param_a[i * pa_w..(i + 1) * pa_w], &rec_a[k * pa_w..(k + 1) * pa_w]);
            }
            if pb_w > 0 {
                copy_row(&mut param_b[i * pb_w..(i + 1) * pb_w], &rec_b[k * pb_w..(k + 1) * pb_w]);
            }
            if let Some(r) = rec {
                r.record(k, i, is_init, state, next_state);
            }
            let sc = step_count[k];
            let cut = (sc + 1) as u64 >= max_traj && !tr.terminated;
            let trunc = tr.truncated || cut;
            let end = tr.terminated || trunc;
            reward[i] = tr.reward as f32;
            terminated[i] = tr.terminated;
            truncated[i] = trunc;
            done[i] = end;
            traj_ids[i] = traj_id[k];
            step_counts[i] = sc;
            step_count[k] = sc + 1;
            needs_reset[k] = end;
            if nan_is_failure && !end && has_nan(cur) {
                return Err(RolloutError::NanObservation { env: k });
            }
        }
        *self.frames += k_envs as u64;
        Ok(())
    }

    /// The policy's log-probabilities of the batch's steps from `t0` on (the first it
    /// acted at), in one vectorised pass over the logits and actions written.
    #[inline(always)]
    fn log_probs_after<const D: usize>(&mut self, t0: usize) {
        let Shape { steps, k_envs, .. } = self.s;
        let Buffers {
            action_i,
            log_prob,
            param_a,
            ..
        } = &mut *self.b;
        if t0 == 0 {
            Argmax2::<D>::log_probs(param_a, action_i, log_prob);
        } else {
            // Each env's frames are one row of the batch: its steps from `t0` on.
            for k in 0..k_envs {
                let (lo, hi) = (k * steps + t0, (k + 1) * steps);
                Argmax2::<D>::log_probs(&param_a[2 * lo..2 * hi], &action_i[lo..hi], &mut log_prob[lo..hi]);
            }
        }
    }
}

/// Copies one small row (an observation or an action). Constant lengths for the
/// common sizes let the compiler inline the copy instead of calling `memcpy`.
#[inline(always)]
fn copy_row(dst: &mut [f32], src: &[f32]) {
    match src.len() {
        1 => dst[..1].copy_from_slice(&src[..1]),
        2 => dst[..2].copy_from_slice(&src[..2]),
        3 => dst[..3].copy_from_slice(&src[..3]),
        4 => dst[..4].copy_from_slice(&src[..4]),
        _ => dst.copy_from_slice(src),
    }
}

/// Whether an observation holds a NaN.
#[inline]
pub(super) fn has_nan(v: &[f32]) -> bool {
    v.iter().any(|x| x.is_nan())
}
