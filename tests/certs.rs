//! Throwaway TLS certificates made at run time (none is checked in): a CA, the
//! trainer's certificate for `localhost` and `127.0.0.1` signed by it, a node's client
//! certificate signed by it, and a second CA that signed nothing here (the "wrong CA").

use std::path::{Path, PathBuf};

use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, DnType, IsCa, KeyPair, KeyUsagePurpose};

/// PEM files in a temporary folder, removed when this is dropped.
pub struct TestCerts {
    /// The CA that signed the trainer's and the node's certificates.
    pub ca: PathBuf,
    /// The trainer's certificate (SANs `localhost`, `127.0.0.1`).
    pub trainer_cert: PathBuf,
    /// Its key.
    pub trainer_key: PathBuf,
    /// A node's client certificate.
    pub node_cert: PathBuf,
    /// Its key.
    pub node_key: PathBuf,
    /// A CA that signed none of these.
    pub other_ca: PathBuf,
    dir: tempfile::TempDir,
}

impl TestCerts {
    /// The folder the files are in.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }
}

/// A CA named `name`, self-signed.
fn ca(name: &str) -> CertifiedIssuer<'static, KeyPair> {
    let mut params = CertificateParams::new(Vec::<String>::new()).expect("CA params");
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    params.distinguished_name.push(DnType::CommonName, name);
    CertifiedIssuer::self_signed(params, KeyPair::generate().expect("CA key")).expect("CA certificate")
}

/// A leaf certificate for `names`, signed by `issuer`: its PEM and its key's PEM.
fn leaf(names: &[&str], issuer: &CertifiedIssuer<'static, KeyPair>) -> (String, String) {
    let params = CertificateParams::new(names.iter().map(|n| n.to_string()).collect::<Vec<_>>()).expect("leaf params");
    let key = KeyPair::generate().expect("leaf key");
    let cert = params.signed_by(&key, issuer).expect("leaf certificate");
    (cert.pem(), key.serialize_pem())
}

/// Makes a fresh set of [`TestCerts`] (ECDSA P-256, in a temporary folder).
pub fn test_certs() -> TestCerts {
    let dir = tempfile::Builder::new()
        .prefix("rollout-tls")
        .tempdir()
        .expect("temp dir");
    let write = |name: &str, pem: &str| {
        let p = dir.path().join(name);
        std::fs::write(&p, pem).expect("write PEM");
        p
    };
    let authority = ca("rollout test CA");
    let (trainer_cert, trainer_key) = leaf(&["localhost", "127.0.0.1"], &authority);
    let (node_cert, node_key) = leaf(&["node.rollout.test"], &authority);
    let other = ca("another CA");
    TestCerts {
        ca: write("ca.pem", &authority.pem()),
        trainer_cert: write("trainer.pem", &trainer_cert),
        trainer_key: write("trainer.key", &trainer_key),
        node_cert: write("node.pem", &node_cert),
        node_key: write("node.key", &node_key),
        other_ca: write("other-ca.pem", &other.pem()),
        dir,
    }
}
