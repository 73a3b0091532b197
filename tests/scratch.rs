//! What a scenario takes for itself: a folder, a file, a name.

/// A fresh folder `rollout-<name>-XXXXXX` under the system temp dir (`tempfile`'s: a
/// name no other call gets, in this process or another), removed with its content when
/// dropped.
pub fn temp_dir(name: &str) -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix(&format!("rollout-{name}-"))
        .tempdir()
        .expect("temp dir")
}

/// A fresh empty file `rollout-XXXXXX-<name>` under the system temp dir (`tempfile`'s),
/// removed when dropped.
pub fn temp_file(name: &str) -> tempfile::NamedTempFile {
    tempfile::Builder::new()
        .prefix("rollout-")
        .suffix(&format!("-{name}"))
        .tempfile()
        .expect("temp file")
}

/// `kind-N`: a name no other call in this process gets, so a test's log lines (about
/// its node of that name) are told apart from those of the tests beside it.
pub fn unique_name(kind: &str) -> String {
    static NEXT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    format!("{kind}-{}", NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed))
}
