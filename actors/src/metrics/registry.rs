//! The run's metrics, named by Prometheus' conventions (`rollout_` prefix, `_total`
//! counters, base units), their only label a node's index (and a reason from a fixed set).

use std::sync::Arc;

use std::fmt::Write as _;

use prometheus_client::encoding::{EncodeLabelSet, EncodeLabelValue, LabelValueEncoder};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::metrics::info::Info;
use prometheus_client::registry::{Registry, Unit};

/// A node's index: the only label a per-node series has (never a name or an address,
/// which would make series without bound).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct NodeLabel {
    /// The node's index.
    pub node: u32,
}

/// Why a node failed, as the trainer saw it (the label value is the name in snake case).
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
pub enum FailureReason {
    /// The node reported a failure, or its connection failed (closed, silent, cut).
    Failed,
    /// It broke the protocol (a batch nobody asked for, a bad batch or layout): cut off.
    Protocol,
    /// It could not be brought back by a restart.
    RestartFailed,
    /// The run gave it up and goes on without it.
    Lost,
}

impl FailureReason {
    /// The label value.
    pub fn as_str(self) -> &'static str {
        match self {
            FailureReason::Failed => "failed",
            FailureReason::Protocol => "protocol",
            FailureReason::RestartFailed => "restart_failed",
            FailureReason::Lost => "lost",
        }
    }
}

impl EncodeLabelValue for FailureReason {
    fn encode(&self, encoder: &mut LabelValueEncoder) -> Result<(), std::fmt::Error> {
        encoder.write_str(self.as_str())
    }
}

/// Every [`FailureReason`], in label order.
pub const FAILURE_REASONS: [FailureReason; 4] = [
    FailureReason::Failed,
    FailureReason::Protocol,
    FailureReason::RestartFailed,
    FailureReason::Lost,
];

/// A node's failure label: its index and why.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct FailureLabel {
    /// The node's index.
    pub node: u32,
    /// Why it failed.
    pub reason: FailureReason,
}

/// Why a join was refused at the door (the label value is the name in snake case).
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
pub enum RefusalReason {
    /// The TLS handshake failed (garbage, a certificate refused, no client certificate
    /// under mutual TLS).
    Tls,
    /// The login failed: a wrong token, protocol version or frame, or the connection.
    Login,
    /// The handshake was not done within its deadline.
    Timeout,
    /// Closed to make room for newer logins.
    Evicted,
    /// Logged in, but no slot was free or the slot asked for was held.
    Admission,
    /// Admitted, but the node did not take its `welcome`.
    Welcome,
}

impl RefusalReason {
    /// The label value.
    pub fn as_str(self) -> &'static str {
        match self {
            RefusalReason::Tls => "tls",
            RefusalReason::Login => "login",
            RefusalReason::Timeout => "timeout",
            RefusalReason::Evicted => "evicted",
            RefusalReason::Admission => "admission",
            RefusalReason::Welcome => "welcome",
        }
    }
}

/// Every [`RefusalReason`].
pub const REFUSAL_REASONS: [RefusalReason; 6] = [
    RefusalReason::Tls,
    RefusalReason::Login,
    RefusalReason::Timeout,
    RefusalReason::Evicted,
    RefusalReason::Admission,
    RefusalReason::Welcome,
];

impl EncodeLabelValue for RefusalReason {
    fn encode(&self, encoder: &mut LabelValueEncoder) -> Result<(), std::fmt::Error> {
        encoder.write_str(self.as_str())
    }
}

/// A refusal's label.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RefusalLabel {
    /// Why.
    pub reason: RefusalReason,
}

/// Why a node's batch was dropped unyielded (the label value is the name in snake case).
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
pub enum DropReason {
    /// Its weights lagged past the run's `max_policy_lag`.
    PolicyLag,
}

impl DropReason {
    /// The label value.
    pub fn as_str(self) -> &'static str {
        match self {
            DropReason::PolicyLag => "policy_lag",
        }
    }
}

impl EncodeLabelValue for DropReason {
    fn encode(&self, encoder: &mut LabelValueEncoder) -> Result<(), std::fmt::Error> {
        encoder.write_str(self.as_str())
    }
}

/// Every [`DropReason`].
pub const DROP_REASONS: [DropReason; 1] = [DropReason::PolicyLag];

/// A drop's label.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct DropLabel {
    /// Why.
    pub reason: DropReason,
}

/// The upper bounds of the policy-lag histogram's buckets, in versions: every small
/// lag its own bucket, then doubling.
const LAG_BUCKETS: [f64; 10] = [0.0, 1.0, 2.0, 3.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0];

/// The build's version, the label of `rollout_build_info`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct BuildLabel {
    version: &'static str,
}

/// Every metric of one run, shared: cloning it is one reference count. The per-node
/// handles are made once per node by [`RunMetrics::node`].
#[derive(Clone, Debug)]
pub struct RunMetrics(Arc<Families>);

/// The metrics of [`RunMetrics`], each registered once in `registry`.
#[derive(Debug)]
pub struct Families {
    registry: Registry,
    frames: Family<NodeLabel, Counter>,
    batches: Family<NodeLabel, Counter>,
    node_weights: Family<NodeLabel, Gauge>,
    restarts: Family<NodeLabel, Counter>,
    failures: Family<FailureLabel, Counter>,
    /// Asked → whole, one observation per batch.
    pub(crate) latency: Histogram,
    /// Versions a yielded batch's oldest weights were behind the stored ones.
    pub(crate) policy_lag: Histogram,
    dropped_batches: Family<DropLabel, Counter>,
    dropped_frames: Family<DropLabel, Counter>,
    /// The stored weights' version.
    pub(crate) weights_version: Gauge,
    /// Nodes not down (restarting ones included).
    pub(crate) nodes_up: Gauge,
    /// Nodes that joined a running elastic run.
    pub(crate) joined: Counter,
    /// Nodes that left on their own.
    pub(crate) left: Counter,
    refusals: Family<RefusalLabel, Counter>,
    /// Bytes read from nodes' connections.
    pub(crate) bytes_in: Counter,
    /// Bytes written to nodes' connections.
    pub(crate) bytes_out: Counter,
    /// `total_frames` (-1: no end).
    pub(crate) target_frames: Gauge,
    /// Frames yielded so far, a resumed run's earlier ones included.
    pub(crate) collected_frames: Gauge,
}

/// One node's handles, made once: counting its batch touches no lock.
#[derive(Clone, Debug)]
pub struct NodeMetrics {
    /// Frames it delivered.
    pub frames: Counter,
    /// Batches it delivered.
    pub batches: Counter,
    /// The weights version of its latest batch or update.
    pub weights_version: Gauge,
    /// Times it was restarted.
    pub restarts: Counter,
    /// Its failures, one per [`FailureReason`] in [`FAILURE_REASONS`] order.
    pub failures: [Counter; 4],
}

impl std::ops::Deref for RunMetrics {
    type Target = Families;

    fn deref(&self) -> &Families {
        &self.0
    }
}

impl Default for RunMetrics {
    fn default() -> Self {
        RunMetrics::new()
    }
}

impl RunMetrics {
    /// Every metric registered, all zero.
    pub fn new() -> RunMetrics {
        let mut r = Registry::with_prefix("rollout");
        let m = Families {
            registry: Registry::default(),
            frames: Family::default(),
            batches: Family::default(),
            node_weights: Family::default(),
            restarts: Family::default(),
            failures: Family::default(),
            // 1 ms to about 65 s.
            latency: Histogram::new(exponential_buckets(0.001, 2.0, 17)),
            policy_lag: Histogram::new(LAG_BUCKETS),
            dropped_batches: Family::default(),
            dropped_frames: Family::default(),
            weights_version: Gauge::default(),
            nodes_up: Gauge::default(),
            joined: Counter::default(),
            left: Counter::default(),
            refusals: Family::default(),
            bytes_in: Counter::default(),
            bytes_out: Counter::default(),
            target_frames: Gauge::default(),
            collected_frames: Gauge::default(),
        };
        r.register("frames", "Frames each node delivered", m.frames.clone());
        r.register("batches", "Batches each node delivered", m.batches.clone());
        r.register_with_unit(
            "batch_latency",
            "From asking a node for a batch to the batch whole at the trainer",
            Unit::Seconds,
            m.latency.clone(),
        );
        r.register(
            "policy_lag",
            "Versions the weights of each yielded batch were behind the stored ones when it was yielded",
            m.policy_lag.clone(),
        );
        r.register(
            "dropped_batches",
            "Batches dropped unyielded, by reason (their frames asked again)",
            m.dropped_batches.clone(),
        );
        r.register(
            "dropped_frames",
            "Frames of the batches dropped unyielded, by reason",
            m.dropped_frames.clone(),
        );
        r.register(
            "node_weights_version",
            "The weights version of each node's latest batch or update",
            m.node_weights.clone(),
        );
        r.register(
            "weights_version",
            "The stored weights' version",
            m.weights_version.clone(),
        );
        r.register("node_restarts", "Restarts of each node", m.restarts.clone());
        r.register("node_failures", "Failures of each node, by reason", m.failures.clone());
        r.register(
            "nodes_up",
            "Nodes not down (restarting ones included)",
            m.nodes_up.clone(),
        );
        r.register("nodes_joined", "Nodes that joined the running run", m.joined.clone());
        r.register("nodes_left", "Nodes that left the run on their own", m.left.clone());
        r.register(
            "login_refusals",
            "Joins refused at the door, by reason",
            m.refusals.clone(),
        );
        r.register_with_unit("received", "Bytes read from nodes", Unit::Bytes, m.bytes_in.clone());
        r.register_with_unit("sent", "Bytes written to nodes", Unit::Bytes, m.bytes_out.clone());
        r.register(
            "target_frames",
            "The run's total_frames (-1: no end)",
            m.target_frames.clone(),
        );
        r.register(
            "collected_frames",
            "Frames yielded to the consumer so far",
            m.collected_frames.clone(),
        );
        r.register(
            "build",
            "The build of rollout serving these metrics",
            Info::new(BuildLabel {
                version: env!("CARGO_PKG_VERSION"),
            }),
        );
        // Every reason's series from the start, at zero.
        for reason in REFUSAL_REASONS {
            drop(m.refusals.get_or_create(&RefusalLabel { reason }));
        }
        for reason in DROP_REASONS {
            drop(m.dropped_batches.get_or_create(&DropLabel { reason }));
            drop(m.dropped_frames.get_or_create(&DropLabel { reason }));
        }
        RunMetrics(Arc::new(Families { registry: r, ..m }))
    }

    /// Node `node`'s handles (made on the first call for it; keep them).
    pub fn node(&self, node: usize) -> NodeMetrics {
        let label = NodeLabel { node: node as u32 };
        NodeMetrics {
            frames: self.frames.get_or_create(&label).clone(),
            batches: self.batches.get_or_create(&label).clone(),
            weights_version: self.node_weights.get_or_create(&label).clone(),
            restarts: self.restarts.get_or_create(&label).clone(),
            failures: FAILURE_REASONS.map(|reason| {
                self.failures
                    .get_or_create(&FailureLabel {
                        node: node as u32,
                        reason,
                    })
                    .clone()
            }),
        }
    }

    /// Counts a batch of `frames` frames dropped for `reason`.
    pub fn dropped(&self, reason: DropReason, frames: u64) {
        let label = DropLabel { reason };
        self.dropped_batches.get_or_create(&label).inc();
        self.dropped_frames.get_or_create(&label).inc_by(frames);
    }

    /// Counts a join refused for `reason`.
    pub fn refused(&self, reason: RefusalReason) {
        self.refusals.get_or_create(&RefusalLabel { reason }).inc();
    }

    /// Every metric in the OpenMetrics text format (what `/metrics` answers).
    pub fn encode(&self) -> String {
        let mut s = String::with_capacity(8 << 10);
        // Writing into a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut s, &self.registry);
        s
    }
}
