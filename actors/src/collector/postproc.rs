//! [`Postproc`]: what the facade applies to every batch before yielding it.

use rollout::postproc;
use rollout::TensorDict;

/// A transformation applied to every yielded batch (torchrl's `postproc`), e.g. n-step returns.
pub trait Postproc: Send {
    /// Transforms one batch.
    fn apply(&self, batch: TensorDict) -> Result<TensorDict, String>;
}

impl<F> Postproc for F
where
    F: Fn(TensorDict) -> Result<TensorDict, String> + Send,
{
    fn apply(&self, batch: TensorDict) -> Result<TensorDict, String> {
        self(batch)
    }
}

impl Postproc for postproc::MultiStep {
    fn apply(&self, batch: TensorDict) -> Result<TensorDict, String> {
        postproc::MultiStep::apply(self, &batch).map_err(|e| e.to_string())
    }
}
