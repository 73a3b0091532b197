//! Which node slots are taken: decides admission of authenticated nodes.

/// Which node slots are taken; decides admission of authenticated nodes.
#[derive(Clone, Debug)]
pub struct Admission {
    taken: Vec<bool>,
}

impl Admission {
    /// Slots for `nodes` nodes, all free.
    pub fn new(nodes: usize) -> Admission {
        Admission {
            taken: vec![false; nodes],
        }
    }

    /// Gives the node its asked-for slot, or the lowest free one; or says why not.
    pub fn admit(&mut self, requested: Option<usize>) -> Result<usize, String> {
        let n = self.taken.len();
        let slot = match requested {
            Some(i) if i >= n => return Err(format!("node index {i} does not exist (the trainer expects {n} nodes)")),
            Some(i) if self.taken[i] => return Err(format!("node index {i} is already taken")),
            Some(i) => i,
            None => match self.taken.iter().position(|t| !t) {
                Some(i) => i,
                None => return Err(format!("all {n} node slots are taken")),
            },
        };
        self.taken[slot] = true;
        Ok(slot)
    }

    /// Frees a slot (its node left).
    pub fn release(&mut self, slot: usize) {
        if let Some(t) = self.taken.get_mut(slot) {
            *t = false;
        }
    }

    /// True when every slot is taken.
    pub fn full(&self) -> bool {
        self.taken.iter().all(|t| *t)
    }

    /// Number of slots taken.
    pub fn count(&self) -> usize {
        self.taken.iter().filter(|t| **t).count()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn admission_by_request_and_lowest_free_slot() {
        let mut a = Admission::new(3);
        assert_eq!((a.count(), a.full()), (0, false));
        assert_eq!(a.admit(Some(1)), Ok(1));
        let err = a.admit(Some(1)).unwrap_err();
        assert!(err.contains("node index 1 is already taken"), "{err}");
        let err = a.admit(Some(3)).unwrap_err();
        assert!(
            err.contains("node index 3 does not exist") && err.contains("3 nodes"),
            "{err}"
        );
        assert_eq!(a.admit(None), Ok(0));
        assert_eq!(a.admit(None), Ok(2));
        assert_eq!((a.count(), a.full()), (3, true));
        let err = a.admit(None).unwrap_err();
        assert!(err.contains("all 3 node slots are taken"), "{err}");
        a.release(1);
        a.release(99);
        assert_eq!((a.count(), a.full()), (2, false));
        assert_eq!(a.admit(None), Ok(1));
        a.release(2);
        assert_eq!(a.admit(Some(2)), Ok(2));
        let mut none = Admission::new(0);
        assert!(none.full());
        assert!(none.admit(None).is_err());
        assert!(none.admit(Some(0)).is_err());
    }
}
