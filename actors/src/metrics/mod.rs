//! Prometheus metrics of a running collection: what the trainer counts
//! ([`registry`]), how its actor feeds the counts as events pass (`observe`), and
//! the `/metrics` endpoint a Prometheus scrapes ([`server`]).
//!
//! Off unless [`CollectorBuilder::metrics`](crate::CollectorBuilder::metrics) names an
//! address. Every per-node handle is created once, so counting a batch is a few atomic
//! additions: no lock, no allocation on the batch path. The endpoint runs on a thread
//! of its own, so a scrape never waits on the trainer nor the trainer on a scrape.

pub(crate) mod observe;
pub mod registry;
pub mod server;

pub use registry::{DropReason, FailureReason, RefusalReason, RunMetrics};
pub use server::{MetricsServer, ServeError};
