//! Files a user names are bounded input (issue 37): the `rollout` CLI reads `--policy-file`,
//! `--env-spec @FILE`, `--token-file` and `--resume` only if they are regular files, at
//! most up to their limit. A FIFO (which would block the reader forever), `/dev/zero`
//! (which would be read until memory runs out), a directory and a sparse file one byte
//! over the limit (refused from its size, nothing read) each end the CLI at once with one
//! line and exit 2, naming the file and the flag. Every child runs under a deadline.

use std::fs::File;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use rollout_tests::{rollout_bin, run_bounded, temp_dir};
use tempfile::TempDir;

/// Far above what a refusal takes (milliseconds), far below "forever".
const DEADLINE: Duration = Duration::from_secs(60);

/// The bad files of one case, in `dir`: a FIFO, a directory, `/dev/zero` and a sparse
/// file of `limit + 1` bytes, each with what the error must say of it.
fn bad_files(dir: &TempDir, limit: u64) -> Vec<(PathBuf, String)> {
    let fifo = dir.path().join("fifo");
    let made = Command::new("mkfifo")
        .args(["-m", "600"])
        .arg(&fifo)
        .status()
        .expect("mkfifo runs");
    assert!(made.success(), "mkfifo {}", fifo.display());
    let folder = dir.path().join("folder");
    std::fs::create_dir(&folder).expect("mkdir");
    std::fs::set_permissions(&folder, std::fs::Permissions::from_mode(0o700)).expect("chmod");
    let sparse = dir.path().join("sparse");
    File::create(&sparse)
        .and_then(|f| f.set_len(limit + 1))
        .expect("a sparse file");
    std::fs::set_permissions(&sparse, std::fs::Permissions::from_mode(0o600)).expect("chmod");
    vec![
        (
            fifo.clone(),
            format!("{} is a FIFO, not a regular file", fifo.display()),
        ),
        (
            folder.clone(),
            format!("{} is a directory, not a regular file", folder.display()),
        ),
        (
            PathBuf::from("/dev/zero"),
            "/dev/zero is a character device, not a regular file".to_string(),
        ),
        (
            sparse.clone(),
            format!("{} holds {} bytes", sparse.display(), limit + 1),
        ),
    ]
}

/// Runs `rollout ARGS` with `path` spliced in for `{}`; asserts exit 2 with one stderr line
/// starting `error: {prefix}` and holding `says`, well within the deadline.
fn refused(args: &[&str], path: &Path, prefix: &str, says: &str) {
    let path = path.to_string_lossy();
    let args: Vec<String> = args.iter().map(|a| a.replace("{}", &path)).collect();
    // Built once per test process (the first call may compile it): not timed.
    let bin = rollout_bin();
    let started = Instant::now();
    let run = run_bounded(
        Command::new(bin)
            .args(&args)
            .env_remove("RUST_LOG")
            .env_remove("ROLLOUT_TOKEN"),
        DEADLINE,
    )
    .expect("spawn rollout");
    let cmd = args.join(" ");
    let err = run.stderr_text();
    assert!(run.status.is_some(), "`rollout {cmd}` hung past {DEADLINE:?}");
    assert_eq!(run.code(), Some(2), "`rollout {cmd}`: {err}");
    let lines: Vec<&str> = err.lines().collect();
    assert_eq!(lines.len(), 1, "`rollout {cmd}`: one line expected:\n{err}");
    assert!(
        lines[0].starts_with(&format!("error: {prefix}")),
        "`rollout {cmd}`: {}",
        lines[0]
    );
    assert!(lines[0].contains(says), "`rollout {cmd}`: `{says}` not in {}", lines[0]);
    assert!(
        started.elapsed() < Duration::from_secs(30),
        "`rollout {cmd}` took {:?}",
        started.elapsed()
    );
}

#[test]
fn a_bad_policy_file_is_one_line_and_exit_2() {
    let dir = temp_dir("hostile-policy-file");
    for (file, says) in bad_files(&dir, 128 << 20) {
        refused(
            &[
                "collect",
                "--policy",
                "onnx",
                "--onnx-head",
                "categorical",
                "--policy-file",
                "{}",
            ],
            &file,
            "invalid `policy_file`: ",
            &says,
        );
    }
    // The limit and the setting are named.
    refused(
        &[
            "collect",
            "--policy",
            "onnx",
            "--onnx-head",
            "categorical",
            "--policy-file",
            "{}",
        ],
        &dir.path().join("sparse"),
        "invalid `policy_file`: ",
        "over the limit of 134217728 bytes (128 MiB) for `policy_file`",
    );
}

#[test]
fn a_bad_env_spec_file_is_one_line_and_exit_2() {
    let dir = temp_dir("hostile-env-spec");
    for (file, says) in bad_files(&dir, 1 << 20) {
        let arg = format!("@{}", file.display());
        refused(
            &[
                "collect",
                "--env",
                "Foo-v0",
                "--launcher",
                "external",
                "--env-spec",
                &arg,
            ],
            Path::new(""),
            "invalid `env_spec`: ",
            &says,
        );
    }
}

#[test]
fn env_spec_json_with_a_key_twice_or_a_number_out_of_range_is_one_line_and_exit_2() {
    let obs = r#""observation": {"kind": "box", "dtype": "f32", "shape": [4]}"#;
    for (spec, says) in [
        (
            format!(r#"{{{obs}, "action": {{"kind": "discrete", "n": 2, "n": 3}}}}"#),
            "key `action.n` given twice",
        ),
        (
            format!(r#"{{{obs}, {obs}, "action": {{"kind": "discrete", "n": 2}}}}"#),
            "key `observation` given twice",
        ),
        (
            format!(r#"{{{obs}, "action": {{"kind": "discrete", "n": 9223372036854775808}}}}"#),
            "action: choices 0 + 9223372036854775808 overflow i64",
        ),
    ] {
        refused(
            &[
                "collect",
                "--env",
                "Foo-v0",
                "--launcher",
                "external",
                "--env-spec",
                &spec,
            ],
            Path::new(""),
            "invalid `env_spec`: ",
            says,
        );
    }
}

#[test]
fn a_bad_token_file_is_one_line_and_exit_2_for_the_trainer_and_the_node() {
    let dir = temp_dir("hostile-token-file");
    for (file, says) in bad_files(&dir, 64 << 10) {
        // /dev/zero is readable by all: that is allowed here, so its type is what refuses it.
        refused(
            &[
                "collect",
                "--launcher",
                "external",
                "--allow-insecure-token-file",
                "--token-file",
                "{}",
            ],
            &file,
            "invalid `token`: the token file: ",
            &says,
        );
        refused(
            &[
                "node",
                "--join",
                "127.0.0.1:9",
                "--allow-insecure-token-file",
                "--token-file",
                "{}",
            ],
            &file,
            "invalid `token`: the token file: ",
            &says,
        );
    }
}

#[test]
fn a_bad_checkpoint_to_resume_from_is_one_line_and_exit_2() {
    let dir = temp_dir("hostile-resume");
    for (file, says) in bad_files(&dir, 16 << 30) {
        refused(&["collect", "--resume", "{}"], &file, "invalid `resume`: ", &says);
        refused(
            &["train", "--quiet", "--max-frames", "100", "--resume", "{}"],
            &file,
            "checkpoint ",
            &says,
        );
    }
}
