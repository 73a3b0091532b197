//! `rollout node`: join a trainer and serve it until it shuts down, or leave the run
//! cleanly (`leave`, exit 0) on SIGTERM or SIGINT.

use std::path::PathBuf;
use std::time::Duration;

use clap::Args;
use rollout_actors::remote::{read_token, run_node, JoinError, NodeOptions, NodeTls};

use crate::failure::{usage, Failure};

#[derive(Args, Debug)]
pub(crate) struct NodeArgs {
    /// The trainer's address, HOST:PORT.
    #[arg(long, value_name = "HOST:PORT")]
    join: String,
    /// File holding the shared token (else the ROLLOUT_TOKEN env var). Never pass it as an argument.
    #[arg(long, value_name = "PATH")]
    token_file: Option<PathBuf>,
    /// Accept a token file readable by group or others (refused by default, as ssh refuses such a key).
    #[arg(long)]
    allow_insecure_token_file: bool,
    /// Name shown in the trainer's logs [default: host:pid].
    #[arg(long)]
    name: Option<String>,
    /// Ask for this node index (a node rejoining its slot).
    #[arg(long, value_name = "I")]
    index: Option<usize>,
    /// Give up connecting after this many seconds.
    #[arg(long, default_value_t = 30.0, value_name = "SECS")]
    connect_timeout: f64,
    /// Join over TLS: the CA certificates (PEM) the trainer's certificate must chain to.
    #[arg(long, value_name = "PEM")]
    tls_ca: Option<PathBuf>,
    /// The name the trainer's certificate must hold [default: the host of --join].
    #[arg(long, value_name = "NAME", requires = "tls_ca")]
    tls_server_name: Option<String>,
    /// Mutual TLS: this node's certificate chain (PEM), with --tls-key.
    #[arg(long, value_name = "PEM", requires = "tls_ca")]
    tls_cert: Option<PathBuf>,
    /// Mutual TLS: this node's private key (PEM), with --tls-cert.
    #[arg(long, value_name = "PEM", requires = "tls_ca")]
    tls_key: Option<PathBuf>,
}

/// `rollout node`: join, serve until Shutdown (or leave on SIGTERM/SIGINT), exit 0.
pub(crate) fn node(args: &NodeArgs) -> Result<(), Failure> {
    let token =
        read_token(args.token_file.as_deref(), args.allow_insecure_token_file).map_err(|e| usage("token", e))?;
    let connect_timeout = Duration::try_from_secs_f64(args.connect_timeout).map_err(|_| {
        usage(
            "connect_timeout",
            format!("{} is not a number of seconds", args.connect_timeout),
        )
    })?;
    let mut opts = NodeOptions {
        index: args.index,
        connect_timeout,
        // Nodes come and go: SIGTERM or SIGINT sends `leave` and exits 0.
        leave_on_signals: true,
        ..NodeOptions::default()
    };
    if let Some(n) = &args.name {
        opts.name = n.clone();
    }
    if let Some(ca) = &args.tls_ca {
        let tls = NodeTls {
            ca: ca.clone(),
            server_name: args.tls_server_name.clone(),
            cert: args.tls_cert.clone(),
            key: args.tls_key.clone(),
        };
        // Every file read and checked before the node dials: a usage error.
        tls.check().map_err(|e| usage(e.field, e.reason))?;
        opts.tls = Some(tls);
    }
    run_node(&args.join, &token, opts).map_err(|e| match e {
        JoinError::Connect { .. } | JoinError::Rejected(_) => Failure::Runtime(e.to_string()),
        other => Failure::Runtime(other.to_string()),
    })
}
