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
    /// Async: the most versions a batch's weights may be behind the stored ones when
    /// it is yielded; a batch further behind is dropped (counted) and its node sent
    /// the stored weights and asked again, or delivered flagged with `deliver_lagging`.
    pub max_policy_lag: Option<u64>,
    /// Deliver batches past `max_policy_lag` flagged ([`Collected::lagging`]) instead
    /// of dropping them.
    ///
    /// [`Collected::lagging`]: super::Collected::lagging
    pub deliver_lagging: bool,
    /// Async: batches each node may collect ahead of the consumer (0, torchrl's
    /// semantics: a node goes on once its batch is yielded).
    pub prefetch: usize,
}

/// The most batches a node may collect ahead of the consumer: each is held in the
/// trainer's memory until it is taken.
pub const MAX_PREFETCH: usize = 16;

impl TrainerConfig {
    /// A config collecting by `shares` with no automatic weight pushes.
    pub fn new(shares: Shares) -> TrainerConfig {
        TrainerConfig {
            shares,
            update_after_each_batch: false,
            max_weight_update_interval: None,
            update_interval: None,
            max_policy_lag: None,
            deliver_lagging: false,
            prefetch: 0,
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
        if self.sync() && self.max_policy_lag.is_some() {
            return Err(ConfigError::new(
                "max_policy_lag",
                "only for async collection (sync=False): a sync round is collected with the weights \
                 pushed before it",
            ));
        }
        if self.deliver_lagging && self.max_policy_lag.is_none() {
            return Err(ConfigError::new(
                "deliver_lagging",
                "flags batches past max_policy_lag: set max_policy_lag too",
            ));
        }
        if self.prefetch > 0 && self.sync() {
            return Err(ConfigError::new(
                "prefetch",
                "only for async collection (sync=False): a sync round waits for every node",
            ));
        }
        if self.prefetch > MAX_PREFETCH {
            return Err(ConfigError::new(
                "prefetch",
                format!(
                    "at most {MAX_PREFETCH} batches ahead (each is held until taken), not {}",
                    self.prefetch
                ),
            ));
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

    #[test]
    fn lag_cap_and_prefetch_are_async_settings_named_when_misused() {
        let mut c = config(1, 1, 4, None, true);
        c.max_policy_lag = Some(1);
        assert_eq!(field(c), Some("max_policy_lag"), "sync");
        let mut c = config(1, 1, 4, None, true);
        c.prefetch = 1;
        assert_eq!(field(c), Some("prefetch"), "sync");
        let mut c = config(1, 1, 4, None, false);
        c.deliver_lagging = true;
        assert_eq!(field(c), Some("deliver_lagging"), "without a cap");
        let mut c = config(1, 1, 4, None, false);
        c.prefetch = super::MAX_PREFETCH + 1;
        assert_eq!(field(c), Some("prefetch"), "too many ahead");
        let mut c = config(1, 1, 4, None, false);
        c.max_policy_lag = Some(0);
        c.deliver_lagging = true;
        c.prefetch = super::MAX_PREFETCH;
        assert_eq!(field(c), None);
    }
}
