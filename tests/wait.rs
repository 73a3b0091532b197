//! Waiting for an event, always with a deadline: a test never sleeps and hopes.

use std::thread;
use std::time::{Duration, Instant};

/// How often a condition is looked at again.
const POLL: Duration = Duration::from_millis(10);

/// The value `found` gives, looking again every 10 ms; `None` once `deadline` passed
/// first (for a caller that explains the failure itself).
pub fn poll_until<T>(deadline: Instant, mut found: impl FnMut() -> Option<T>) -> Option<T> {
    loop {
        if let Some(v) = found() {
            return Some(v);
        }
        let now = Instant::now();
        if now >= deadline {
            return None;
        }
        thread::sleep(POLL.min(deadline - now));
    }
}

/// Waits until `found` gives a value and returns it; panics past `deadline` naming
/// `what` was awaited and for how long.
pub fn wait_for<T>(deadline: Instant, what: &str, found: impl FnMut() -> Option<T>) -> T {
    let start = Instant::now();
    poll_until(deadline, found).unwrap_or_else(|| panic!("waited {:?} for {what}: it never came", start.elapsed()))
}

/// Waits until `cond` holds; panics past `deadline` naming `what` was awaited and for
/// how long.
pub fn wait_until(deadline: Instant, what: &str, mut cond: impl FnMut() -> bool) {
    wait_for(deadline, what, || cond().then_some(()));
}

/// Watches `holds` for `span` (the span itself is the condition under test, such as a
/// node left waiting), looking every 10 ms; panics naming `what` the moment it stops
/// holding.
pub fn holds_for(span: Duration, what: &str, mut holds: impl FnMut() -> bool) {
    let start = Instant::now();
    let end = start + span;
    loop {
        assert!(holds(), "{what} stopped holding after {:?}", start.elapsed());
        let now = Instant::now();
        if now >= end {
            return;
        }
        thread::sleep(POLL.min(end - now));
    }
}
