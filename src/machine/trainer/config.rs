//! What a run collects and how: the config and its up-front check.

use crate::shares::Shares;

pub use crate::config_error::ConfigError;

/// How the trainer collects; torchrl's argument names.
#[derive(Clone, Debug, PartialEq)]
pub struct TrainerConfig {
    /// The run's batch and each node's and env's share of it (which also say how many
    /// nodes, how many envs each, sync or async, and the total): checked when built.
    pub shares: Shares,
    /// Push the stored weights before each collection (sync: all nodes; async: the node that delivered).
    pub update_after_each_batch: bool,
    /// Push to a node that produced more than this many batches since its last update.
    pub max_weight_update_interval: Option<u64>,
    /// Push to all nodes every this many yielded batches.
    pub update_interval: Option<u64>,
}

impl TrainerConfig {
    /// A config collecting by `shares` with no automatic weight pushes.
    pub fn new(shares: Shares) -> TrainerConfig {
        TrainerConfig {
            shares,
            update_after_each_batch: false,
            max_weight_update_interval: None,
            update_interval: None,
        }
    }

    /// Checks the fields the shares do not, so that a run never fails halfway for a
    /// reason known up front.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.max_weight_update_interval == Some(0) {
            return Err(ConfigError::new(
                "max_weight_update_interval",
                "must be at least 1 (or unset)",
            ));
        }
        if self.update_interval == Some(0) {
            return Err(ConfigError::new("update_interval", "must be at least 1 (or unset)"));
        }
        Ok(())
    }

    /// Number of nodes (an elastic run: its slots).
    pub fn nodes(&self) -> usize {
        self.shares.nodes()
    }

    /// Sync or async collection.
    pub fn sync(&self) -> bool {
        self.shares.sync()
    }

    /// Frames of the run's batch.
    pub fn frames_per_batch(&self) -> usize {
        self.shares.frames_per_batch()
    }

    /// Frames to collect in all; `None` until shutdown.
    pub fn total_frames(&self) -> Option<u64> {
        self.shares.total_frames()
    }

    /// The envs of node `node`.
    pub fn envs(&self, node: usize) -> usize {
        self.shares.envs(node)
    }
}

#[cfg(test)]
mod tests {
    use super::super::test_support::config;

    fn field(cfg: super::TrainerConfig) -> Option<&'static str> {
        cfg.validate().err().map(|e| e.field)
    }

    #[test]
    fn a_valid_config_passes() {
        assert_eq!(field(config(2, 2, 8, Some(16), true)), None);
    }

    #[test]
    fn each_invalid_interval_is_named() {
        let mut c = config(1, 1, 4, None, false);
        c.max_weight_update_interval = Some(0);
        assert_eq!(field(c), Some("max_weight_update_interval"));
        let mut c = config(1, 1, 4, None, false);
        c.update_interval = Some(0);
        assert_eq!(field(c), Some("update_interval"));
    }
}
