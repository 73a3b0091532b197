//! [`ConfigError`]: a setting a run cannot be planned with, naming the setting. One
//! type for every rule about settings in the core (the shares, the trainer's config,
//! the run plan), so each rule says which setting is at fault the same way.

/// A config the run cannot be planned or run with, naming the field.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("invalid `{field}`: {reason}")]
pub struct ConfigError {
    /// The field (a builder method name).
    pub field: &'static str,
    /// Why.
    pub reason: String,
}

impl ConfigError {
    /// The error naming `field`, for `reason`.
    pub fn new(field: &'static str, reason: impl Into<String>) -> ConfigError {
        ConfigError {
            field,
            reason: reason.into(),
        }
    }
}
