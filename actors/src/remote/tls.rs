//! TLS settings of the trainer–node links, read from PEM files once, when a run or a
//! node is built: the trainer's certificate and key (and, for mutual TLS, the CA its
//! nodes' certificates must chain to), the node's CA for the trainer's certificate
//! (and, for mutual TLS, its own certificate and key). rustls on the `ring` provider;
//! nothing here touches a socket (see `stream` for the links themselves).
//!
//! Every error names the setting and the file: a missing, unreadable or oversized file,
//! a file with no certificate or no key in it, a key that does not match.

use std::fmt;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use rustls::server::WebPkiClientVerifier;
use rustls::{CipherSuite, ClientConfig, RootCertStore, ServerConfig};
use tokio_rustls::{TlsAcceptor, TlsConnector};

use crate::bounded_file::{read_bounded, shown, FileLimit};

/// The most bytes a PEM file (a certificate chain, a key, a CA bundle) may hold: 1 MiB,
/// far above any real chain or bundle.
fn pem_limit(setting: &'static str) -> FileLimit {
    FileLimit {
        setting,
        limit: 1 << 20,
    }
}

/// A TLS setting that cannot be used, naming the setting (`tls_cert`, `tls_ca`, ...)
/// and, when a file is at fault, the file.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {reason}")]
pub struct TlsError {
    /// The setting (the builder's method, the flag without its dashes, in snake case).
    pub field: &'static str,
    /// Why, naming the file.
    pub reason: String,
}

impl TlsError {
    fn new(field: &'static str, reason: impl Into<String>) -> TlsError {
        TlsError {
            field,
            reason: reason.into(),
        }
    }
}

/// The trainer's side of TLS: it serves its certificate to every node; with
/// `client_ca`, it also requires each node's certificate, signed by that CA.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TrainerTls {
    /// The trainer's certificate chain, PEM (the leaf first).
    pub cert: PathBuf,
    /// Its private key, PEM (PKCS#8, PKCS#1 or SEC1).
    pub key: PathBuf,
    /// Mutual TLS: the CA certificates (PEM) a node's certificate must chain to.
    pub client_ca: Option<PathBuf>,
}

/// The node's side of TLS: it verifies the trainer's certificate against `ca`, for the
/// host it dials (or `server_name`); with `cert` and `key` it shows a certificate of its
/// own (mutual TLS).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NodeTls {
    /// The CA certificates (PEM) the trainer's certificate must chain to.
    pub ca: PathBuf,
    /// The name the trainer's certificate must hold; default: the host of the address
    /// the node dials (a DNS name or an IP address).
    pub server_name: Option<String>,
    /// Mutual TLS: the node's certificate chain, PEM.
    pub cert: Option<PathBuf>,
    /// Mutual TLS: the node's private key, PEM.
    pub key: Option<PathBuf>,
}

/// The rustls provider every config uses: `ring` (a light build with no C toolchain
/// beyond ring's own; aws-lc-rs, rustls's default, needs cmake). rustls deprecates
/// it for lacking the post-quantum key exchange, which `ring` does not implement.
///
/// AES-128-GCM comes first: as safe for this use as AES-256 and a third fewer AES
/// rounds per byte of every batch (the trainer also prefers it over a client's order,
/// see [`TrainerTls::acceptor`]).
#[allow(deprecated)]
fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    let mut p = rustls::crypto::ring::default_provider();
    p.cipher_suites.sort_by_key(|s| {
        !matches!(
            s.suite(),
            CipherSuite::TLS13_AES_128_GCM_SHA256
                | CipherSuite::TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256
                | CipherSuite::TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256
        )
    });
    Arc::new(p)
}

/// The certificates of the PEM file `path`, at least one.
fn certs(field: &'static str, path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let bytes = read_bounded(path, pem_limit(field)).map_err(|e| TlsError::new(field, e.to_string()))?;
    let certs: Vec<_> = CertificateDer::pem_slice_iter(&bytes)
        .collect::<Result<_, _>>()
        .map_err(|e| TlsError::new(field, format!("{} is not PEM certificates: {e}", shown(path))))?;
    if certs.is_empty() {
        return Err(TlsError::new(
            field,
            format!("{} holds no PEM certificate (-----BEGIN CERTIFICATE-----)", shown(path)),
        ));
    }
    Ok(certs)
}

/// The private key of the PEM file `path`.
fn key(field: &'static str, path: &Path) -> Result<PrivateKeyDer<'static>, TlsError> {
    let bytes = read_bounded(path, pem_limit(field)).map_err(|e| TlsError::new(field, e.to_string()))?;
    PrivateKeyDer::from_pem_slice(&bytes)
        .map_err(|e| TlsError::new(field, format!("{} holds no usable PEM private key: {e}", shown(path))))
}

/// A store of the CA certificates in `path`.
fn roots(field: &'static str, path: &Path) -> Result<RootCertStore, TlsError> {
    let mut store = RootCertStore::empty();
    for c in certs(field, path)? {
        store
            .add(c)
            .map_err(|e| TlsError::new(field, format!("{}: not a usable CA certificate: {e}", shown(path))))?;
    }
    Ok(store)
}

impl TrainerTls {
    /// The acceptor the trainer's door runs every connection through, its files read
    /// and checked now.
    pub(crate) fn acceptor(&self) -> Result<TlsAcceptor, TlsError> {
        let chain = certs("tls_cert", &self.cert)?;
        let key = key("tls_key", &self.key)?;
        let builder = ServerConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .map_err(|e| TlsError::new("tls_cert", e.to_string()))?;
        let builder = match &self.client_ca {
            None => builder.with_no_client_auth(),
            Some(ca) => {
                let verifier =
                    WebPkiClientVerifier::builder_with_provider(Arc::new(roots("tls_client_ca", ca)?), provider())
                        .build()
                        .map_err(|e| TlsError::new("tls_client_ca", format!("{}: {e}", shown(ca))))?;
                builder.with_client_cert_verifier(verifier)
            }
        };
        let mut config = builder.with_single_cert(chain, key).map_err(|e| {
            TlsError::new(
                "tls_key",
                format!(
                    "{} does not go with the certificate {}: {e}",
                    shown(&self.key),
                    shown(&self.cert)
                ),
            )
        })?;
        // The provider's order (AES-128-GCM first), whatever a client prefers.
        config.ignore_client_order = true;
        Ok(TlsAcceptor::from(Arc::new(config)))
    }
}

impl NodeTls {
    /// The connector the node dials the trainer through, its files read and checked now.
    pub(crate) fn connector(&self) -> Result<TlsConnector, TlsError> {
        let roots = roots("tls_ca", &self.ca)?;
        let builder = ClientConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .map_err(|e| TlsError::new("tls_ca", e.to_string()))?
            .with_root_certificates(roots);
        let config = match (&self.cert, &self.key) {
            (None, None) => builder.with_no_client_auth(),
            (Some(cert), Some(key_path)) => builder
                .with_client_auth_cert(certs("tls_cert", cert)?, key("tls_key", key_path)?)
                .map_err(|e| {
                    TlsError::new(
                        "tls_key",
                        format!(
                            "{} does not go with the certificate {}: {e}",
                            shown(key_path),
                            shown(cert)
                        ),
                    )
                })?,
            (Some(_), None) => return Err(TlsError::new("tls_key", "required with tls_cert")),
            (None, Some(_)) => return Err(TlsError::new("tls_cert", "required with tls_key")),
        };
        Ok(TlsConnector::from(Arc::new(config)))
    }

    /// The name the trainer's certificate must hold when the node dials `addr`
    /// (`HOST:PORT`): `server_name` if set, else `HOST` (an IP address or a DNS name).
    pub(crate) fn server_name(&self, addr: &str) -> Result<ServerName<'static>, TlsError> {
        let name = match &self.server_name {
            Some(n) => n.clone(),
            None => host_of(addr).to_string(),
        };
        if let Ok(ip) = name.parse::<IpAddr>() {
            return Ok(ServerName::IpAddress(ip.into()));
        }
        ServerName::try_from(name.clone()).map_err(|e| {
            TlsError::new(
                "tls_server_name",
                format!("{name:?} is not a DNS name or an IP address: {e}"),
            )
        })
    }

    /// Reads and checks every file now (what a node does before it dials).
    pub fn check(&self) -> Result<(), TlsError> {
        self.connector().map(|_| ())
    }
}

impl TrainerTls {
    /// Reads and checks every file now (what the builder does when it plans a run).
    pub fn check(&self) -> Result<(), TlsError> {
        self.acceptor().map(|_| ())
    }
}

/// The host of `HOST:PORT` (`[v6]:PORT` without its brackets); the whole of `addr`
/// when it has no port.
fn host_of(addr: &str) -> &str {
    if let Some(rest) = addr.strip_prefix('[') {
        return rest.split(']').next().unwrap_or(rest);
    }
    match addr.rsplit_once(':') {
        Some((host, _)) if !host.contains(':') => host,
        _ => addr,
    }
}

impl fmt::Display for TrainerTls {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "certificate {}", shown(&self.cert))?;
        if let Some(ca) = &self.client_ca {
            write!(f, ", node certificates checked against {}", shown(ca))?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_server_name_is_the_host_the_node_dials_unless_given() {
        assert_eq!(host_of("trainer.example:7000"), "trainer.example");
        assert_eq!(host_of("[::1]:7000"), "::1");
        assert_eq!(host_of("10.0.0.1:1"), "10.0.0.1");
        assert_eq!(host_of("host"), "host");
        let tls = NodeTls::default();
        assert_eq!(
            tls.server_name("127.0.0.1:5").ok(),
            Some(ServerName::IpAddress("127.0.0.1".parse::<IpAddr>().expect("ip").into()))
        );
        let named = NodeTls {
            server_name: Some("trainer.internal".into()),
            ..NodeTls::default()
        };
        assert_eq!(
            named.server_name("127.0.0.1:5").ok(),
            ServerName::try_from("trainer.internal").ok()
        );
        let bad = NodeTls {
            server_name: Some("not a name".into()),
            ..NodeTls::default()
        };
        assert_eq!(bad.server_name("x:1").map_err(|e| e.field), Err("tls_server_name"));
    }

    #[test]
    fn a_missing_file_names_the_setting_and_the_path() {
        let tls = TrainerTls {
            cert: "/nonexistent/cert.pem".into(),
            key: "/nonexistent/key.pem".into(),
            client_ca: None,
        };
        let e = tls.check().expect_err("no such file");
        assert_eq!(e.field, "tls_cert");
        assert!(e.reason.contains("/nonexistent/cert.pem"), "{e}");
        let node = NodeTls {
            ca: "/nonexistent/ca.pem".into(),
            ..NodeTls::default()
        };
        let e = node.check().expect_err("no such file");
        assert_eq!(e.field, "tls_ca");
        assert!(e.reason.contains("/nonexistent/ca.pem"), "{e}");
    }
}
