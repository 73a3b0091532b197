//! [`NodeCommand`]: the command the `Process` and `Slurm` launchers run to start one
//! node, and the flags they append to it.
//!
//! Any program that serves `--join ADDR --index I --name NAME [--token-file PATH]` the
//! way `rollout node` does can be a node: `rollout node` itself (the default), the
//! Python node (`python -m rollout_node`), a user's binary calling `run_node`.

use std::ffi::{OsStr, OsString};
use std::net::SocketAddr;
use std::os::unix::process::CommandExt as _;
use std::path::PathBuf;
use std::process::{Command, Stdio};

use crate::remote::tls::NodeTls;

/// How the `Process` and `Slurm` launchers start a node: a program and its first
/// arguments, to which the launcher appends `--join ADDR --index I --name NAME` and the
/// token (`ROLLOUT_TOKEN` for child processes, `--token-file PATH` for SLURM tasks).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct NodeCommand {
    /// The program, then its first arguments.
    argv: Vec<OsString>,
    /// The builder setting it came from, named in errors.
    field: &'static str,
    /// The node's TLS flags, appended after the others (`--tls-ca PATH`, ...; empty
    /// for plain TCP).
    tls: Vec<OsString>,
}

impl NodeCommand {
    /// `program node`: the `rollout` binary, or one that serves `node --join` as it does
    /// (the builder's `node_program`).
    pub(crate) fn rollout(program: impl Into<PathBuf>) -> NodeCommand {
        NodeCommand {
            argv: vec![program.into().into_os_string(), "node".into()],
            field: "node_program",
            tls: Vec::new(),
        }
    }

    /// Any command (the builder's `node_command`): an argv whose first element is the
    /// program. Checked by [`Self::check`].
    pub(crate) fn new(argv: Vec<OsString>) -> NodeCommand {
        NodeCommand {
            argv,
            field: "node_command",
            tls: Vec::new(),
        }
    }

    /// The same command, its nodes told to join over TLS with `tls` (`--tls-ca PATH`,
    /// `--tls-server-name NAME`, `--tls-cert PATH --tls-key PATH`): flags `rollout node`
    /// and the Python node both take.
    pub(crate) fn with_tls(mut self, tls: &NodeTls) -> NodeCommand {
        let mut flags: Vec<OsString> = vec!["--tls-ca".into(), tls.ca.clone().into_os_string()];
        if let Some(n) = &tls.server_name {
            flags.extend(["--tls-server-name".into(), n.into()]);
        }
        if let Some(c) = &tls.cert {
            flags.extend(["--tls-cert".into(), c.clone().into_os_string()]);
        }
        if let Some(k) = &tls.key {
            flags.extend(["--tls-key".into(), k.clone().into_os_string()]);
        }
        self.tls = flags;
        self
    }

    /// The TLS flags, quoted for `sh` (empty for plain TCP): what a SLURM batch script
    /// appends to a task's command line.
    pub(crate) fn tls_shown(&self) -> String {
        self.tls
            .iter()
            .map(|w| format!(" {}", sh_quote(&w.to_string_lossy())))
            .collect()
    }

    /// The builder setting this command came from (`node_program` or `node_command`).
    pub(crate) fn field(&self) -> &'static str {
        self.field
    }

    /// `Err(reason)` when there is no program to run.
    pub(crate) fn check(&self) -> Result<(), String> {
        match self.argv.first() {
            None => Err("empty: give the program, then its arguments".into()),
            Some(p) if p.is_empty() => Err("the program is an empty string".into()),
            Some(_) => Ok(()),
        }
    }

    /// The command, quoted as a shell would need it, for messages.
    pub(crate) fn shown(&self) -> String {
        self.words().iter().map(|w| sh_quote(w)).collect::<Vec<_>>().join(" ")
    }

    /// Each word, as text (lossy for words that are not UTF-8).
    pub(crate) fn words(&self) -> Vec<String> {
        self.argv.iter().map(|w| w.to_string_lossy().into_owned()).collect()
    }

    /// Node `index`'s child process: the command, then `--join addr --index index
    /// --name process-<index>` and the TLS flags, if any, the token in `ROLLOUT_TOKEN` (never on the command
    /// line, where `ps` shows it), stdin closed; stdout and stderr are this process's.
    ///
    /// The child leads a process group of its own, out of the terminal's foreground
    /// group: Ctrl-C (SIGINT to that group) reaches the trainer alone, which stops its
    /// nodes itself (`shutdown`), instead of every node leaving the run before the
    /// trainer's program sees the signal. A trainer that dies leaves none behind
    /// either: its nodes see the connection close (or its heartbeats stop) and exit.
    pub(crate) fn child(&self, addr: SocketAddr, token: &str, index: usize) -> Command {
        let (program, args) = self
            .argv
            .split_first()
            .map_or((OsStr::new(""), &[][..]), |(p, a)| (p.as_os_str(), a));
        let mut c = Command::new(program);
        c.args(args)
            .arg("--join")
            .arg(addr.to_string())
            .arg("--index")
            .arg(index.to_string())
            .arg("--name")
            .arg(format!("process-{index}"))
            .args(&self.tls)
            .env("ROLLOUT_TOKEN", token)
            .stdin(Stdio::null())
            .process_group(0);
        c
    }
}

/// `s` quoted for `sh`: one word whatever it holds.
pub(crate) fn sh_quote(s: &str) -> String {
    if !s.is_empty() && s.bytes().all(|b| b.is_ascii_alphanumeric() || b"-_./:,+@".contains(&b)) {
        return s.to_string();
    }
    format!("'{}'", s.replace('\'', r"'\''"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_rollout_binary_runs_its_node_subcommand() {
        let c = NodeCommand::rollout("/bin/rollout");
        assert_eq!(c.words(), ["/bin/rollout", "node"]);
        assert_eq!(c.field(), "node_program");
    }

    #[test]
    fn the_flags_follow_the_command() {
        let c = NodeCommand::new(vec!["python".into(), "-m".into(), "rollout_node".into()]);
        let cmd = c.child("127.0.0.1:9".parse().expect("addr"), "t", 3);
        assert_eq!(cmd.get_program(), "python");
        let args: Vec<_> = cmd.get_args().map(|a| a.to_string_lossy().into_owned()).collect();
        assert_eq!(
            args,
            [
                "-m",
                "rollout_node",
                "--join",
                "127.0.0.1:9",
                "--index",
                "3",
                "--name",
                "process-3"
            ]
        );
    }

    #[test]
    fn the_tls_flags_come_last() {
        let tls = NodeTls {
            ca: "/etc/ca.pem".into(),
            server_name: Some("trainer".into()),
            cert: Some("/n.pem".into()),
            key: Some("/n key.pem".into()),
        };
        let c = NodeCommand::rollout("/bin/rollout").with_tls(&tls);
        let cmd = c.child("127.0.0.1:9".parse().expect("addr"), "t", 0);
        let args: Vec<_> = cmd.get_args().map(|a| a.to_string_lossy().into_owned()).collect();
        assert_eq!(
            args[args.len() - 8..],
            [
                "--tls-ca",
                "/etc/ca.pem",
                "--tls-server-name",
                "trainer",
                "--tls-cert",
                "/n.pem",
                "--tls-key",
                "/n key.pem"
            ]
        );
        assert_eq!(
            c.tls_shown(),
            " --tls-ca /etc/ca.pem --tls-server-name trainer --tls-cert /n.pem --tls-key '/n key.pem'"
        );
        assert_eq!(NodeCommand::rollout("/bin/rollout").tls_shown(), "");
    }

    #[test]
    fn an_empty_command_or_program_is_refused() {
        assert!(NodeCommand::new(vec![]).check().is_err());
        assert!(NodeCommand::new(vec!["".into()]).check().is_err());
        assert!(NodeCommand::new(vec!["x".into()]).check().is_ok());
    }

    #[test]
    fn quoting_keeps_every_word_one_word() {
        assert_eq!(sh_quote("plain/path-1.x"), "plain/path-1.x");
        assert_eq!(sh_quote("a b"), "'a b'");
        assert_eq!(sh_quote("it's"), r"'it'\''s'");
        assert_eq!(sh_quote(""), "''");
        assert_eq!(sh_quote("$HOME"), "'$HOME'");
    }
}
