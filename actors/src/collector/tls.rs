//! The builder's TLS settings checked and read: the trainer's acceptor (its
//! certificate, key and, for mutual TLS, the client CA), and the TLS settings the
//! nodes it starts are given. Every error names the builder's setting and the file.

use tokio_rustls::TlsAcceptor;

use crate::error::CollectError;
use crate::launch::{config_error, Launcher};
use crate::remote::tls::{NodeTls, TlsError, TrainerTls};

use super::settings::TlsSettings;

/// What TLS a run's door and its started nodes use (`None`s: plain TCP).
pub(super) struct RunTls {
    /// The door's acceptor.
    pub(super) acceptor: Option<TlsAcceptor>,
    /// What the nodes this trainer starts (`Process`, `Slurm`) are told.
    pub(super) nodes: Option<NodeTls>,
}

impl TlsSettings {
    /// The run's TLS, every file read and checked now; a setting that makes no sense
    /// alone (a key without a certificate, a node CA without a trainer certificate) is
    /// refused naming it. `launcher` says whether this trainer starts its nodes.
    pub(super) fn check(&self, launcher: &Launcher) -> Result<RunTls, CollectError> {
        let trainer = match (&self.cert, &self.key) {
            (Some(cert), Some(key)) => Some(TrainerTls {
                cert: cert.clone(),
                key: key.clone(),
                client_ca: self.client_ca.clone(),
            }),
            (Some(_), None) => return Err(config_error("tls_key", "required with tls_cert")),
            (None, Some(_)) => return Err(config_error("tls_cert", "required with tls_key")),
            (None, None) => None,
        };
        let Some(trainer) = trainer else {
            let stray = [
                ("tls_client_ca", self.client_ca.is_some()),
                ("tls_ca", self.ca.is_some()),
                ("tls_server_name", self.server_name.is_some()),
                ("node_tls_cert", self.node_cert.is_some()),
                ("node_tls_key", self.node_key.is_some()),
            ];
            if let Some((field, _)) = stray.iter().find(|(_, set)| *set) {
                return Err(config_error(
                    field,
                    "set without tls_cert and tls_key: the trainer has no certificate, its links are plain TCP",
                ));
            }
            return Ok(RunTls {
                acceptor: None,
                nodes: None,
            });
        };
        let acceptor = trainer.acceptor().map_err(setting)?;
        let starts_nodes = matches!(launcher, Launcher::Process | Launcher::Slurm(_));
        let nodes = match &self.ca {
            Some(ca) => Some(NodeTls {
                ca: ca.clone(),
                server_name: self.server_name.clone(),
                cert: self.node_cert.clone(),
                key: self.node_key.clone(),
            }),
            None if starts_nodes => return Err(config_error(
                "tls_ca",
                "required with tls_cert when this trainer starts its nodes: the CA they check its certificate against",
            )),
            None => None,
        };
        if let Some(n) = &nodes {
            if trainer.client_ca.is_some() && starts_nodes && n.cert.is_none() {
                return Err(config_error(
                    "node_tls_cert",
                    "required with tls_client_ca when this trainer starts its nodes: they must show a certificate",
                ));
            }
            // The nodes' files are checked here too, named by the builder's settings.
            n.check().map_err(|e| {
                let field = match e.field {
                    "tls_cert" => "node_tls_cert",
                    "tls_key" => "node_tls_key",
                    f => f,
                };
                config_error(field, e.reason)
            })?;
        }
        Ok(RunTls {
            acceptor: Some(acceptor),
            nodes,
        })
    }
}

/// A [`TlsError`] as the builder's error naming the setting.
fn setting(e: TlsError) -> CollectError {
    config_error(e.field, e.reason)
}
