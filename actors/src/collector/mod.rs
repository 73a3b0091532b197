//! The collector users touch: [`CollectorBuilder`] configures a run,
//! [`DistributedCollector`] runs it behind blocking calls, [`Embedded`] runs it inside
//! the caller's actix `System`.
//!
//! One job per file: `builder` (settings and entry points), `plan` (settings checked
//! and turned into the trainer's machine and node specs), `launcher` (launcher
//! settings turned into the `Launch` that starts the nodes), `facade`, `embedded`,
//! `postproc`.

mod builder;
mod embedded;
mod facade;
mod launcher;
mod plan;
mod postproc;

pub use builder::{CollectorBuilder, ListeningHook, NodeOverrides};
pub use embedded::Embedded;
pub use facade::DistributedCollector;
pub use postproc::Postproc;
