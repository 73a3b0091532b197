//! A rate limit on log lines of one kind: the first at once, then at most one per
//! interval carrying the count of the ones held back. A peer that makes the trainer
//! log on every attempt (an accept loop out of file descriptors, a flood of refused
//! connections) then costs a line a second, not the disk.

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

#[cfg(test)]
mod tests {
    use super::*;

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
