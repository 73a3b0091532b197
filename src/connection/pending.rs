//! The connections that have not logged in yet, capped: anyone can open them, so
//! when one more arrives at the cap, the oldest is closed to make room (an idle or
//! slow connection is the oldest; a real node logs in within a round trip or two).

use std::collections::VecDeque;

/// Connections not logged in, oldest first, each with what the shell needs to
/// close it (`T`).
#[derive(Debug)]
pub struct PendingLogins<T> {
    cap: usize,
    next: u64,
    queue: VecDeque<(u64, T)>,
}

impl<T> PendingLogins<T> {
    /// At most `cap` (at least 1) connections waiting to log in at once.
    pub fn new(cap: usize) -> PendingLogins<T> {
        PendingLogins {
            cap: cap.max(1),
            next: 0,
            queue: VecDeque::new(),
        }
    }

    /// A new connection: its id, and the oldest one's handle when it must go to make room.
    pub fn arrive(&mut self, handle: T) -> (u64, Option<T>) {
        let evicted = if self.queue.len() >= self.cap {
            self.queue.pop_front().map(|(_, h)| h)
        } else {
            None
        };
        let id = self.next;
        self.next += 1;
        self.queue.push_back((id, handle));
        (id, evicted)
    }

    /// Connection `id` logged in or closed: it no longer counts (its handle back, if
    /// it was not evicted).
    pub fn leave(&mut self, id: u64) -> Option<T> {
        let i = self.queue.iter().position(|(j, _)| *j == id)?;
        self.queue.remove(i).map(|(_, h)| h)
    }

    /// The oldest connection still waiting: the one the next arrival at the cap closes.
    /// The shell may hold its handle's arrival time, to give a burst of real nodes a
    /// moment to log in before closing any of them.
    pub fn oldest(&self) -> Option<&T> {
        self.queue.front().map(|(_, h)| h)
    }

    /// True at the cap: the next arrival closes the oldest.
    pub fn is_full(&self) -> bool {
        self.queue.len() >= self.cap
    }

    /// Connections waiting now.
    pub fn len(&self) -> usize {
        self.queue.len()
    }

    /// True when none waits.
    pub fn is_empty(&self) -> bool {
        self.queue.is_empty()
    }

    /// The cap.
    pub fn cap(&self) -> usize {
        self.cap
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn at_the_cap_the_oldest_goes_first() {
        let mut p = PendingLogins::new(2);
        let (a, none) = p.arrive("a");
        assert_eq!(none, None);
        let (b, _) = p.arrive("b");
        let (c, evicted) = p.arrive("c");
        assert_eq!((evicted, p.len()), (Some("a"), 2));
        assert_eq!(p.leave(a), None, "an evicted connection is gone already");
        assert_eq!(p.leave(b), Some("b"));
        let (_, evicted) = p.arrive("d");
        assert_eq!((evicted, p.len()), (None, 2));
        let (_, evicted) = p.arrive("e");
        assert_eq!(evicted, Some("c"));
        assert_eq!(p.leave(c), None);
        assert!(!p.is_empty());
        assert_eq!(PendingLogins::<()>::new(0).cap(), 1);
    }

    #[test]
    fn the_oldest_is_the_one_the_next_arrival_at_the_cap_closes() {
        let mut p = PendingLogins::new(2);
        assert_eq!(p.oldest(), None);
        let (a, _) = p.arrive("a");
        assert!(!p.is_full());
        p.arrive("b");
        assert!(p.is_full());
        assert_eq!(p.oldest(), Some(&"a"));
        let (_, evicted) = p.arrive("c");
        assert_eq!((evicted, p.oldest()), (Some("a"), Some(&"b")));
        assert_eq!(p.leave(a), None);
        let (b, c) = (1, 2);
        assert_eq!(p.leave(b), Some("b"));
        assert!(!p.is_full());
        assert_eq!(p.oldest(), Some(&"c"));
        assert_eq!(p.leave(c), Some("c"));
        assert_eq!(p.oldest(), None);
    }
}
