//! What a scenario takes for itself: a port, a folder, a name.

use std::net::{SocketAddr, TcpListener};

/// A loopback address with a port free when asked (bound, then released).
pub fn free_addr() -> SocketAddr {
    let l = TcpListener::bind("127.0.0.1:0").expect("bind");
    l.local_addr().expect("addr")
}

/// A fresh folder under the system temp dir, removed (with its content) when dropped.
pub struct TempDir(std::path::PathBuf);

impl TempDir {
    /// `rollout-<name>-<pid>`, emptied first.
    pub fn new(name: &str) -> TempDir {
        let d = std::env::temp_dir().join(format!("rollout-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).expect("temp dir");
        TempDir(d)
    }

    /// `file` inside the folder.
    pub fn join(&self, file: &str) -> std::path::PathBuf {
        self.0.join(file)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// `rollout-<pid>-<n>-<name>` under the system temp dir: a path no other call in this
/// process gets (nothing is created).
pub fn temp_path(name: &str) -> std::path::PathBuf {
    static N: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    std::env::temp_dir().join(format!("rollout-{}-{n}-{name}", std::process::id()))
}

/// `kind-N`: a name no other call in this process gets, so a test's log lines (about
/// its node of that name) are told apart from those of the tests beside it.
pub fn unique_name(kind: &str) -> String {
    static NEXT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    format!("{kind}-{}", NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed))
}
