//! Restart intensity, as in Erlang/OTP: a supervised child may be restarted at most
//! `max_restarts` times within any `window`; one more failure inside the window escalates.
//!
//! Pure and clock-free: every call takes the time as a [`Duration`] since an origin the
//! caller picks (an actor passes `start.elapsed()`, a test passes literal values), so
//! the decisions are reproducible and testable without waiting.

use std::collections::VecDeque;
use std::fmt;
use std::time::Duration;

use serde::{Deserialize, Serialize};

/// Default [`RestartIntensity::max_restarts`]: 5, as in OTP and kameo.
pub const DEFAULT_MAX_RESTARTS: u32 = 5;
/// Default [`RestartIntensity::window`]: 5 s, as in OTP and kameo.
pub const DEFAULT_RESTART_WINDOW: Duration = Duration::from_secs(5);

/// How often a child may be restarted: at most `max_restarts` restarts within `window`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RestartIntensity {
    /// Restarts allowed within `window`; 0 escalates the first failure.
    pub max_restarts: u32,
    /// The sliding window the restarts are counted in; longer than zero.
    pub window: Duration,
}

impl Default for RestartIntensity {
    fn default() -> Self {
        RestartIntensity {
            max_restarts: DEFAULT_MAX_RESTARTS,
            window: DEFAULT_RESTART_WINDOW,
        }
    }
}

/// A restart intensity that cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum IntensityError {
    /// The window is zero: no restart could ever be counted in it.
    #[error("invalid `restart_window`: must be longer than zero")]
    ZeroWindow,
}

impl RestartIntensity {
    /// At most `max_restarts` restarts within `window` (which must be longer than zero).
    pub fn new(max_restarts: u32, window: Duration) -> Result<RestartIntensity, IntensityError> {
        if window.is_zero() {
            return Err(IntensityError::ZeroWindow);
        }
        Ok(RestartIntensity { max_restarts, window })
    }
}

impl fmt::Display for RestartIntensity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} restarts within {:.3} s",
            self.max_restarts,
            self.window.as_secs_f64()
        )
    }
}

/// One restart: when (since the caller's origin), which one, and what caused it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RestartRecord {
    /// The restart's number over the child's whole life, from 1.
    pub count: u32,
    /// When the failure that caused it was recorded.
    pub at: Duration,
    /// The failure.
    pub cause: String,
}

impl fmt::Display for RestartRecord {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "restart {} at {:.3} s after {}",
            self.count,
            self.at.as_secs_f64(),
            self.cause
        )
    }
}

/// A failure past the intensity: the child is not restarted and the failure goes up.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{cause}; not restarted: {} restarts within {:.3} s already (limit {intensity}){}",
    .history.len(), .intensity.window.as_secs_f64(), history_text(.history))]
pub struct Escalation {
    /// The failure that was one too many.
    pub cause: String,
    /// When it was recorded.
    pub at: Duration,
    /// The intensity it broke.
    pub intensity: RestartIntensity,
    /// The restarts inside the window, oldest first.
    pub history: Vec<RestartRecord>,
    /// Restarts over the child's whole life.
    pub total_restarts: u32,
}

/// Restarts shown in an [`Escalation`]'s message: the most recent ones.
pub const HISTORY_SHOWN: usize = 8;

fn history_text(history: &[RestartRecord]) -> String {
    if history.is_empty() {
        return String::new();
    }
    let skip = history.len().saturating_sub(HISTORY_SHOWN);
    let items: Vec<String> = history[skip..].iter().map(ToString::to_string).collect();
    let earlier = if skip > 0 {
        format!("{skip} earlier restarts not shown; ")
    } else {
        String::new()
    };
    format!("; history: {earlier}{}", items.join("; "))
}

/// The restart bookkeeping of one supervised child.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Restarts {
    intensity: RestartIntensity,
    recent: VecDeque<RestartRecord>,
    total: u32,
}

impl Restarts {
    /// No restarts yet.
    pub fn new(intensity: RestartIntensity) -> Restarts {
        Restarts {
            intensity,
            recent: VecDeque::new(),
            total: 0,
        }
    }

    /// The intensity enforced.
    pub fn intensity(&self) -> RestartIntensity {
        self.intensity
    }

    /// Restarts over the child's whole life.
    pub fn total(&self) -> u32 {
        self.total
    }

    /// The restarts still inside the window as of the last [`Self::record`], oldest first.
    pub fn history(&self) -> impl Iterator<Item = &RestartRecord> {
        self.recent.iter()
    }

    /// The child failed at `now` with `cause`. A restart counts while `now - at < window`.
    /// With fewer than `max_restarts` restarts in the window, the restart is recorded
    /// and its number over the child's life (from 1) returned; otherwise the failure
    /// escalates, with the restarts in the window as its history. A `now` earlier than
    /// a recorded restart counts as at the same time.
    pub fn record(&mut self, now: Duration, cause: impl Into<String>) -> Result<u32, Escalation> {
        let window = self.intensity.window;
        while self.recent.front().is_some_and(|r| now.saturating_sub(r.at) >= window) {
            self.recent.pop_front();
        }
        let cause = cause.into();
        if self.recent.len() >= self.intensity.max_restarts as usize {
            return Err(Escalation {
                cause,
                at: now,
                intensity: self.intensity,
                history: self.recent.iter().cloned().collect(),
                total_restarts: self.total,
            });
        }
        self.total += 1;
        self.recent.push_back(RestartRecord {
            count: self.total,
            at: now,
            cause,
        });
        Ok(self.total)
    }
}

impl Restarts {
    /// The child failed at `now` with `cause` and is restarted whatever the intensity
    /// (a slot whose nodes join on their own: the failure was the peer's): recorded in
    /// the history and the total like any restart; its number returned.
    pub fn record_unlimited(&mut self, now: Duration, cause: impl Into<String>) -> u32 {
        let window = self.intensity.window;
        while self.recent.front().is_some_and(|r| now.saturating_sub(r.at) >= window) {
            self.recent.pop_front();
        }
        self.total = self.total.saturating_add(1);
        self.recent.push_back(RestartRecord {
            count: self.total,
            at: now,
            cause: cause.into(),
        });
        self.total
    }
}

/// The seed of restart `restart` of a child whose own seed is `seed`: a fixed mix
/// (splitmix64), so a rerun restarts with the same seeds, and restarts of different
/// children or of the same child never share one by construction of the inputs.
pub fn restart_seed(seed: u64, restart: u32) -> u64 {
    let mut z = seed ^ (restart as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(secs: f64) -> Duration {
        Duration::from_secs_f64(secs)
    }

    #[test]
    fn an_unlimited_record_never_escalates_but_counts_and_shows_in_the_history() {
        let mut r = Restarts::new(RestartIntensity::new(1, s(10.0)).unwrap());
        for i in 0..5u32 {
            assert_eq!(r.record_unlimited(s(f64::from(i)), format!("c{i}")), i + 1);
        }
        assert_eq!(r.total(), 5);
        assert_eq!(r.history().last().map(|h| h.cause.as_str()), Some("c4"));
        // The intensity still holds for an ordinary record.
        assert!(r.record(s(5.0), "d").is_err());
    }

    #[test]
    fn default_is_five_in_five_seconds() {
        let i = RestartIntensity::default();
        assert_eq!((i.max_restarts, i.window), (5, Duration::from_secs(5)));
        assert_eq!(
            RestartIntensity::new(1, Duration::ZERO),
            Err(IntensityError::ZeroWindow)
        );
        assert!(RestartIntensity::new(0, s(1.0)).is_ok());
    }

    #[test]
    fn restarts_up_to_the_limit_then_escalates_with_the_history() {
        let mut r = Restarts::new(RestartIntensity::new(3, s(10.0)).unwrap());
        assert_eq!(r.record(s(0.0), "a"), Ok(1));
        assert_eq!(r.record(s(1.0), "b"), Ok(2));
        assert_eq!(r.record(s(2.0), "c"), Ok(3));
        let e = r.record(s(3.0), "d").unwrap_err();
        assert_eq!(e.cause, "d");
        assert_eq!(e.total_restarts, 3);
        let causes: Vec<&str> = e.history.iter().map(|h| h.cause.as_str()).collect();
        assert_eq!(causes, ["a", "b", "c"]);
        let text = e.to_string();
        assert!(
            text.starts_with("d; not restarted: 3 restarts within 10.000 s"),
            "{text}"
        );
        assert!(text.contains("restart 2 at 1.000 s after b"), "{text}");
        // An escalation records nothing: the same failure escalates again.
        assert_eq!(r.total(), 3);
        assert!(r.record(s(3.0), "d").is_err());
    }

    #[test]
    fn restarts_older_than_the_window_no_longer_count() {
        let mut r = Restarts::new(RestartIntensity::new(2, s(5.0)).unwrap());
        assert_eq!(r.record(s(0.0), "a"), Ok(1));
        assert_eq!(r.record(s(4.0), "b"), Ok(2));
        assert!(r.record(s(4.9), "c").is_err());
        // At 5.0 the restart at 0.0 is exactly one window old: it no longer counts.
        assert_eq!(r.record(s(5.0), "c"), Ok(3));
        let h: Vec<u32> = r.history().map(|h| h.count).collect();
        assert_eq!(h, [2, 3]);
        // Steady failures slower than the intensity never escalate.
        for i in 0..100u32 {
            assert!(r.record(s(10.0 + 2.6 * i as f64), "slow").is_ok());
        }
        assert_eq!(r.total(), 103);
    }

    #[test]
    fn a_long_history_shows_the_most_recent_restarts() {
        let mut r = Restarts::new(RestartIntensity::new(20, s(100.0)).unwrap());
        for i in 0..20 {
            r.record(s(i as f64), format!("f{i}")).unwrap();
        }
        let e = r.record(s(20.0), "last").unwrap_err();
        assert_eq!(e.history.len(), 20, "the value keeps all of it");
        let text = e.to_string();
        assert!(
            text.contains("history: 12 earlier restarts not shown; restart 13 at 12.000 s after f12;"),
            "{text}"
        );
        assert!(text.ends_with("restart 20 at 19.000 s after f19"), "{text}");
        assert!(!text.contains("after f11"), "{text}");
    }

    #[test]
    fn zero_restarts_escalates_the_first_failure() {
        let mut r = Restarts::new(RestartIntensity::new(0, s(1.0)).unwrap());
        let e = r.record(s(0.0), "boom").unwrap_err();
        assert!(e.history.is_empty());
        assert_eq!(
            e.to_string(),
            "boom; not restarted: 0 restarts within 1.000 s already (limit 0 restarts within 1.000 s)"
        );
    }

    #[test]
    fn time_going_backwards_counts_as_now() {
        let mut r = Restarts::new(RestartIntensity::new(1, s(1.0)).unwrap());
        assert_eq!(r.record(s(5.0), "a"), Ok(1));
        assert!(r.record(s(1.0), "b").is_err());
    }

    #[test]
    fn restart_seeds_are_fixed_and_distinct() {
        assert_eq!(restart_seed(7, 1), restart_seed(7, 1));
        let mut seen = std::collections::HashSet::new();
        for seed in 0..50u64 {
            for restart in 1..20u32 {
                assert!(
                    seen.insert(restart_seed(seed, restart)),
                    "seed {seed} restart {restart}"
                );
            }
        }
    }
}
