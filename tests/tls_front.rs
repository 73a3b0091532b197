//! A TLS front to a trainer, for the hostile suites run over TLS: it listens on a
//! loopback port of its own for plain connections and carries each one's bytes, both
//! ways, over a TLS connection of its own to the trainer (the trainer's certificate
//! checked against the test CA). An attacker's raw bytes thus reach the trainer's login
//! inside TLS, as a hostile peer that completed the handshake would send them; when the
//! trainer closes, the front closes the plain side (after what the trainer sent) and
//! reads the attacker's side to its end, so a `reject` is not lost to a reset.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::{mpsc, Arc};
use std::thread;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio_rustls::TlsConnector;

/// A running front (its thread lives as long as the test process).
pub struct TlsFront {
    addr: SocketAddr,
}

impl TlsFront {
    /// Starts a front to `trainer`, whose certificate chains to the CA in `ca` (PEM).
    pub fn start(trainer: SocketAddr, ca: &Path) -> TlsFront {
        let mut roots = rustls::RootCertStore::empty();
        for c in CertificateDer::pem_file_iter(ca).expect("CA file") {
            roots.add(c.expect("CA certificate")).expect("CA added");
        }
        #[allow(deprecated)]
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let config = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .expect("versions")
            .with_root_certificates(roots)
            .with_no_client_auth();
        let connector = TlsConnector::from(Arc::new(config));
        let (tx, rx) = mpsc::channel();
        thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("runtime");
            rt.block_on(async move {
                let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
                tx.send(listener.local_addr().expect("addr")).expect("told");
                while let Ok((plain, _)) = listener.accept().await {
                    tokio::spawn(carry(plain, trainer, connector.clone()));
                }
            });
        });
        TlsFront {
            addr: rx.recv().expect("the front's address"),
        }
    }

    /// Where attackers connect.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }
}

/// Carries one plain connection's bytes to the trainer over TLS and back.
async fn carry(plain: TcpStream, trainer: SocketAddr, connector: TlsConnector) {
    let Ok(tcp) = TcpStream::connect(trainer).await else {
        return;
    };
    let _ = tcp.set_nodelay(true);
    let _ = plain.set_nodelay(true);
    let name = ServerName::IpAddress(trainer.ip().into());
    let Ok(tls) = connector.connect(name, tcp).await else {
        return;
    };
    let (mut pr, mut pw) = plain.into_split();
    let (mut tr, mut tw) = tokio::io::split(tls);
    let down = tokio::spawn(async move {
        let mut buf = vec![0u8; 64 << 10];
        while let Ok(n) = tr.read(&mut buf).await {
            if n == 0 || pw.write_all(&buf[..n]).await.is_err() {
                break;
            }
        }
        let _ = pw.shutdown().await;
    });
    let mut buf = vec![0u8; 64 << 10];
    let mut trainer_open = true;
    while let Ok(n) = pr.read(&mut buf).await {
        if n == 0 {
            break;
        }
        if trainer_open && tw.write_all(&buf[..n]).await.is_err() {
            trainer_open = false;
        }
    }
    if trainer_open {
        let _ = tw.shutdown().await;
    }
    let _ = down.await;
}
