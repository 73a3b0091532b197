//! The collector users touch: [`CollectorBuilder`] configures a run,
//! [`DistributedCollector`] runs it behind blocking calls, [`Embedded`] runs it inside
//! the caller's actix `System`.
//!
//! One job per file, each using only the ones listed after it: `builder` (the
//! setters, and the three entry points `build`, `start` and `start_embedded`, which
//! all go through one `Plan`), `facade` and `embedded` (a plan run behind
//! blocking calls, or in the caller's system), `plan` (settings checked and turned
//! into the trainer's machine, node specs and launch), `launcher` (launcher settings
//! turned into the `Launch` that starts the nodes), `tls` (the TLS settings checked and
//! their files read), `settings` (what the builder
//! recorded, plain data). `args` holds the plain settings as the CLI's flags and the
//! Python module's keyword arguments give them, and hands them to the builder. What
//! a batch goes through before its consumer sees it (split, postproc, replay buffer,
//! `batch_timeout`) is the crate's `delivery`, applied by the trainer on every start
//! path.

mod args;
mod builder;
mod embedded;
mod facade;
mod handle;
mod launcher;
mod plan;
mod settings;
mod tls;

pub use crate::delivery::Postproc;
pub use crate::launch::ListeningHook;
pub use args::{CollectorArgs, ExplorationName, Secs};
pub use builder::CollectorBuilder;
pub use embedded::Embedded;
pub use facade::DistributedCollector;
pub use handle::CollectorHandle;
pub use settings::NodeOverrides;
