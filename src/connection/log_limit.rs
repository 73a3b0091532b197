//! Limits on what a peer can make the trainer log.
//!
//! Before login, [`LogLimit`]: a rate limit on log lines of one kind, the first at
//! once, then at most one per interval carrying the count of the ones held back. A
//! peer that makes the trainer log on every attempt (an accept loop out of file
//! descriptors, a flood of refused connections) then costs a line a second, not the
//! disk.
//!
//! After login, [`LogBudget`]: the bytes of log lines about one connection, at most
//! [`LogBudget::PER_CONNECTION`] over its life; what comes after is held back and
//! counted, and the count is told once, when the connection closes. With every
//! string of the peer's shown bounded ([`crate::peer_text`]), a line is at most a
//! few hundred bytes, so a connection's log is bounded whatever the peer repeats.

use std::time::{Duration, Instant};

/// Rate limit of one kind of log line; clock-free (`now` is passed in).
#[derive(Clone, Debug)]
pub struct LogLimit {
    every: Duration,
    last: Option<Instant>,
    held: u64,
}

impl LogLimit {
    /// At most one line per `every`.
    pub fn new(every: Duration) -> LogLimit {
        LogLimit {
            every,
            last: None,
            held: 0,
        }
    }

    /// One more event at `now`: `Some(held)` when a line goes out now, `held` being
    /// how many events since the last line were not logged; `None` when this one is
    /// held back.
    pub fn hit(&mut self, now: Instant) -> Option<u64> {
        match self.last {
            Some(t) if now.saturating_duration_since(t) < self.every => {
                self.held += 1;
                None
            }
            _ => {
                self.last = Some(now);
                Some(std::mem::take(&mut self.held))
            }
        }
    }
}

/// The bytes of log lines one connection may cause, once logged in.
#[derive(Clone, Debug)]
pub struct LogBudget {
    left: usize,
    held: u64,
}

impl LogBudget {
    /// The budget of one connection: 64 KiB of log lines.
    pub const PER_CONNECTION: usize = 64 * 1024;

    /// What a log line costs beyond its text: the time, level, target and the
    /// fields naming the node (a generous estimate, so the budget is not overrun).
    pub const LINE_OVERHEAD: usize = 160;

    /// Kept back for the last line, which tells how many were held back.
    const LAST_LINE: usize = 512;

    /// A budget of `bytes` (at least the last line's reserve is kept back of it).
    pub fn new(bytes: usize) -> LogBudget {
        LogBudget {
            left: bytes.saturating_sub(Self::LAST_LINE),
            held: 0,
        }
    }

    /// A line of `text_len` bytes of text is about to be logged: `true` if it may
    /// be (its cost, with [`LogBudget::LINE_OVERHEAD`], is taken from the budget),
    /// `false` if it is held back (and counted).
    pub fn spend(&mut self, text_len: usize) -> bool {
        let cost = text_len.saturating_add(Self::LINE_OVERHEAD);
        if cost <= self.left && self.held == 0 {
            self.left -= cost;
            true
        } else {
            self.held = self.held.saturating_add(1);
            false
        }
    }

    /// How many lines were held back so far.
    pub fn held(&self) -> u64 {
        self.held
    }
}

impl Default for LogBudget {
    fn default() -> LogBudget {
        LogBudget::new(LogBudget::PER_CONNECTION)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_connections_budget_holds_back_lines_past_it_and_counts_them() {
        let mut b = LogBudget::default();
        let line = 300;
        let mut logged = 0usize;
        for _ in 0..10_000 {
            if b.spend(line) {
                logged += 1;
            }
        }
        let spent = logged * (line + LogBudget::LINE_OVERHEAD);
        assert!(spent <= LogBudget::PER_CONNECTION - 512, "{spent} bytes logged");
        assert!(spent + line + LogBudget::LINE_OVERHEAD > LogBudget::PER_CONNECTION - 512);
        assert_eq!(b.held(), 10_000 - logged as u64);
        // Once a line is held back, a shorter one is too: the log does not skip lines.
        assert!(!b.spend(0));
        // A line larger than the whole budget is never logged.
        let mut small = LogBudget::new(1024);
        assert!(!small.spend(usize::MAX));
        assert_eq!(small.held(), 1);
    }

    #[test]
    fn one_line_per_interval_with_the_count_held_back() {
        let t0 = Instant::now();
        let ms = Duration::from_millis;
        let mut l = LogLimit::new(Duration::from_secs(1));
        assert_eq!(l.hit(t0), Some(0));
        assert_eq!(l.hit(t0 + ms(1)), None);
        assert_eq!(l.hit(t0 + ms(999)), None);
        assert_eq!(l.hit(t0 + ms(1000)), Some(2));
        assert_eq!(l.hit(t0 + ms(1500)), None);
        assert_eq!(l.hit(t0 + ms(5000)), Some(1));
        assert_eq!(l.hit(t0 + ms(7000)), Some(0));
    }
}
