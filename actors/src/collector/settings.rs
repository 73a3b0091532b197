//! [`Settings`]: every setting of a collector as the builder recorded it, plain data
//! that `plan` checks and turns into a run. The builder is the only writer, `plan` and
//! `launcher` the only readers.

use std::time::Duration;

use rollout::checkpoint::Checkpoint;
use rollout::machine::NodeSupervision;
pub use rollout::run_plan::NodeOverrides;
use rollout::run_plan::RunSettings;
use rollout::Registry;

use crate::delivery::Postproc;
use crate::launch::node_command::NodeCommand;
use crate::launch::{Launcher, ListeningHook};
use crate::replay::SharedReplayBuffer;

/// Every setting of a collector, torchrl's defaults where it has them (see
/// [`CollectorBuilder`](crate::CollectorBuilder) for what each means).
pub(super) struct Settings {
    /// What the core plans the run from (every rule about them lives there).
    pub(super) run: RunSettings,
    pub(super) registry: Registry,
    pub(super) nodes: usize,
    /// `nodes` was called (an elastic run sizes itself by `min_nodes` and `max_nodes`).
    pub(super) nodes_set: bool,
    pub(super) min_nodes: Option<usize>,
    pub(super) max_nodes: Option<usize>,
    pub(super) seed: Option<u64>,
    pub(super) launcher: Launcher,
    pub(super) allow_nonfinite_weights: bool,
    pub(super) split_trajs: bool,
    pub(super) postproc: Option<Box<dyn Postproc>>,
    pub(super) replay_buffer: Option<SharedReplayBuffer>,
    pub(super) batch_timeout: Option<Duration>,
    pub(super) shutdown_timeout: Duration,
    pub(super) listen: String,
    pub(super) on_listening: Option<ListeningHook>,
    pub(super) token: Option<Vec<u8>>,
    /// TLS settings, checked when the run is planned (`launcher.rs`).
    pub(super) tls: TlsSettings,
    pub(super) join_timeout: Duration,
    pub(super) heartbeat: Duration,
    pub(super) heartbeat_timeout: Duration,
    pub(super) handshake_timeout: Duration,
    pub(super) node_command: Option<NodeCommand>,
    pub(super) advertise: Option<String>,
    pub(super) node_supervision: Option<NodeSupervision>,
    pub(super) resume: Option<Checkpoint>,
    pub(super) request_timeout: Option<Duration>,
    pub(super) seed_timeout: Option<Duration>,
    pub(super) update_weights_timeout: Option<Duration>,
    pub(super) snapshot_timeout: Option<Duration>,
    pub(super) continue_timeout: Option<Duration>,
    pub(super) shutdown_ack_timeout: Option<Duration>,
    pub(super) metrics: Option<String>,
    pub(super) metrics_linger: Duration,
    /// Where the run counts, once its endpoint serves (set by the builder).
    pub(super) run_metrics: Option<crate::metrics::RunMetrics>,
}

/// The builder's TLS settings as given, each by its setter's name: the trainer's
/// certificate, key and client CA, and what the nodes it starts are told (their CA for
/// the trainer's certificate, the name to check, their own certificate and key).
#[derive(Clone, Debug, Default)]
pub(super) struct TlsSettings {
    pub(super) cert: Option<std::path::PathBuf>,
    pub(super) key: Option<std::path::PathBuf>,
    pub(super) client_ca: Option<std::path::PathBuf>,
    pub(super) ca: Option<std::path::PathBuf>,
    pub(super) server_name: Option<String>,
    pub(super) node_cert: Option<std::path::PathBuf>,
    pub(super) node_key: Option<std::path::PathBuf>,
}

/// Default of [`CollectorBuilder::request_timeout`](crate::CollectorBuilder::request_timeout)
/// when `batch_timeout` is at least twice as long: how long a node may take to answer
/// `seed`, `update_weights`, `snapshot` or `restore`.
pub(crate) const DEFAULT_REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

/// Default of [`CollectorBuilder::heartbeat`](crate::CollectorBuilder::heartbeat): the
/// interval, and the silence after which a remote peer is gone.
pub(crate) const DEFAULT_HEARTBEAT: (Duration, Duration) = (Duration::from_secs(1), Duration::from_secs(5));

/// Default of [`CollectorBuilder::batch_timeout`](crate::CollectorBuilder::batch_timeout)
/// when no deadline set asks for more.
pub(crate) const DEFAULT_BATCH_TIMEOUT: Duration = Duration::from_secs(60);

impl Default for Settings {
    fn default() -> Self {
        Settings {
            run: RunSettings::default(),
            registry: Registry::with_builtins(),
            nodes: 1,
            nodes_set: false,
            min_nodes: None,
            max_nodes: None,
            seed: None,
            launcher: Launcher::Local,
            allow_nonfinite_weights: false,
            split_trajs: false,
            postproc: None,
            replay_buffer: None,
            batch_timeout: None,
            shutdown_timeout: Duration::from_secs(10),
            listen: "127.0.0.1:0".into(),
            on_listening: None,
            token: None,
            tls: TlsSettings::default(),
            join_timeout: Duration::from_secs(60),
            heartbeat: DEFAULT_HEARTBEAT.0,
            heartbeat_timeout: DEFAULT_HEARTBEAT.1,
            handshake_timeout: Duration::from_secs(5),
            node_command: None,
            advertise: None,
            node_supervision: None,
            resume: None,
            request_timeout: None,
            seed_timeout: None,
            update_weights_timeout: None,
            snapshot_timeout: None,
            continue_timeout: None,
            shutdown_ack_timeout: None,
            metrics: None,
            metrics_linger: Duration::ZERO,
            run_metrics: None,
        }
    }
}
