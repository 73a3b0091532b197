//! What a run collects and how: the config and its up-front check.

/// How the trainer collects; torchrl's argument names.
#[derive(Clone, Debug, PartialEq)]
pub struct TrainerConfig {
    /// Number of nodes.
    pub nodes: usize,
    /// Env workers of each node (one entry per node).
    pub envs_per_node: Vec<usize>,
    /// Frames per yielded batch.
    pub frames_per_batch: usize,
    /// Frames to yield in all; `None` collects until shutdown.
    pub total_frames: Option<u64>,
    /// Sync (every node collects a share of each batch) or async (first ready, first served).
    pub sync: bool,
    /// Push the stored weights before each collection (sync: all nodes; async: the node that delivered).
    pub update_after_each_batch: bool,
    /// Push to a node that produced more than this many batches since its last update.
    pub max_weight_update_interval: Option<u64>,
    /// Push to all nodes every this many yielded batches.
    pub update_interval: Option<u64>,
}

/// A config the trainer cannot run, naming the field.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("invalid `{field}`: {reason}")]
pub struct ConfigError {
    /// The field (a builder method name).
    pub field: &'static str,
    /// Why.
    pub reason: String,
}

fn cfg_err(field: &'static str, reason: impl Into<String>) -> ConfigError {
    ConfigError {
        field,
        reason: reason.into(),
    }
}

impl TrainerConfig {
    /// Checks every field, so that a run never fails halfway for a reason known up front.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let n = self.nodes;
        if n == 0 {
            return Err(cfg_err("nodes", "must be at least 1"));
        }
        if self.envs_per_node.len() != n {
            return Err(cfg_err(
                "envs_per_node",
                format!("{} entries for {n} nodes", self.envs_per_node.len()),
            ));
        }
        if let Some(i) = self.envs_per_node.iter().position(|&k| k == 0) {
            return Err(cfg_err("envs_per_node", format!("node {i} has no env")));
        }
        let f = self.frames_per_batch;
        if f == 0 {
            return Err(cfg_err("frames_per_batch", "must be at least 1"));
        }
        if self.total_frames == Some(0) {
            return Err(cfg_err("total_frames", "must be at least 1 (or endless)"));
        }
        if self.max_weight_update_interval == Some(0) {
            return Err(cfg_err("max_weight_update_interval", "must be at least 1 (or unset)"));
        }
        if self.update_interval == Some(0) {
            return Err(cfg_err("update_interval", "must be at least 1 (or unset)"));
        }
        let tail = self.total_frames.map_or(0, |t| (t % f as u64) as usize);
        if self.sync {
            if !f.is_multiple_of(n) {
                return Err(cfg_err(
                    "frames_per_batch",
                    format!("sync collection splits {f} frames evenly over {n} nodes, and {n} does not divide {f}"),
                ));
            }
            let share = f / n;
            if let Some(i) = self.envs_per_node.iter().position(|&k| !share.is_multiple_of(k)) {
                return Err(cfg_err(
                    "frames_per_batch",
                    format!(
                        "each node's share of {share} frames must divide over its {} envs (node {i})",
                        self.envs_per_node[i]
                    ),
                ));
            }
            if self.envs_per_node.iter().any(|&k| k != self.envs_per_node[0]) {
                return Err(cfg_err(
                    "envs_per_node",
                    "sync collection stacks node shares, so every node needs the same env count",
                ));
            }
            if tail != 0 && (!tail.is_multiple_of(n) || !(tail / n).is_multiple_of(self.envs_per_node[0])) {
                return Err(cfg_err(
                    "total_frames",
                    format!(
                        "the last batch of {tail} frames cannot be split evenly over {n} nodes x {} envs",
                        self.envs_per_node[0]
                    ),
                ));
            }
        } else {
            if let Some(i) = self.envs_per_node.iter().position(|&k| !f.is_multiple_of(k)) {
                return Err(cfg_err(
                    "frames_per_batch",
                    format!(
                        "{f} frames do not divide over the {} envs of node {i}",
                        self.envs_per_node[i]
                    ),
                ));
            }
            if let Some(i) = self.envs_per_node.iter().position(|&k| !tail.is_multiple_of(k)) {
                return Err(cfg_err(
                    "total_frames",
                    format!(
                        "the last batch of {tail} frames cannot be split over the {} envs of node {i}",
                        self.envs_per_node[i]
                    ),
                ));
            }
        }
        Ok(())
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
        assert_eq!(field(config(3, 2, 4, None, false)), None);
    }

    #[test]
    fn each_invalid_setting_is_named() {
        assert_eq!(field(config(0, 1, 4, None, false)), Some("nodes"));
        assert_eq!(field(config(1, 0, 4, None, false)), Some("envs_per_node"));
        assert_eq!(field(config(1, 1, 0, None, false)), Some("frames_per_batch"));
        assert_eq!(field(config(1, 1, 4, Some(0), false)), Some("total_frames"));
        let mut c = config(1, 1, 4, None, false);
        c.envs_per_node = vec![1, 1];
        assert_eq!(field(c), Some("envs_per_node"));
        let mut c = config(1, 1, 4, None, false);
        c.max_weight_update_interval = Some(0);
        assert_eq!(field(c), Some("max_weight_update_interval"));
        let mut c = config(1, 1, 4, None, false);
        c.update_interval = Some(0);
        assert_eq!(field(c), Some("update_interval"));
    }

    #[test]
    fn sync_needs_even_shares_over_equal_nodes() {
        assert_eq!(field(config(3, 1, 8, None, true)), Some("frames_per_batch"));
        assert_eq!(field(config(2, 3, 8, None, true)), Some("frames_per_batch"));
        let mut c = config(2, 1, 8, None, true);
        c.envs_per_node = vec![1, 2];
        assert_eq!(field(c), Some("envs_per_node"));
        assert_eq!(field(config(2, 2, 8, Some(10), true)), Some("total_frames"));
    }

    #[test]
    fn async_batches_and_the_last_one_divide_over_each_nodes_envs() {
        assert_eq!(field(config(1, 3, 8, None, false)), Some("frames_per_batch"));
        assert_eq!(field(config(1, 2, 8, Some(9), false)), Some("total_frames"));
    }
}
