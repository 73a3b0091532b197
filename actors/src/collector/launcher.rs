//! The builder's launcher settings checked and turned into the [`Launch`] that starts
//! the nodes: one launcher type per [`Launcher`].

use std::net::SocketAddr;

use rollout::wire::{AdmitVersions, MIN_TOKEN_LEN};

use crate::error::CollectError;

use crate::launch::node_command::NodeCommand;
use crate::launch::slurm::{self, SlurmOptions};
use crate::launch::{
    config_error, ExternalLaunch, JoinDoor, Launch, Launcher, LocalLaunch, ProcessLaunch, SlurmLaunch,
};
use crate::remote::listener::DoorConfig;
use crate::remote::timing::PeerTiming;
use crate::remote::tls::NodeTls;

use super::settings::Settings;

impl Settings {
    /// The launcher that starts this run's nodes, its settings checked: a token for
    /// nodes that join from outside (drawn at random for the ones this trainer starts),
    /// TLS (files read now),
    /// the frame limit, the `Slurm` options and `advertise`, the node command;
    /// the door admits nodes of `versions` (those that can serve the run) only.
    pub(super) fn launch(&self, versions: AdmitVersions) -> Result<Box<dyn Launch>, CollectError> {
        if self.launcher == Launcher::Local {
            return Ok(Box::new(LocalLaunch));
        }
        let token = match (&self.token, &self.launcher) {
            (Some(t), _) if t.len() >= MIN_TOKEN_LEN => t.clone(),
            (Some(t), _) if !t.is_empty() => {
                return Err(config_error(
                    "token",
                    format!("{} bytes; at least {MIN_TOKEN_LEN} are required", t.len()),
                ))
            }
            (_, Launcher::Process | Launcher::Slurm(_)) => random_token(),
            _ => return Err(config_error("token", "required for nodes that join from outside")),
        };
        let tls = self.tls.check(&self.launcher)?;
        if self.run.max_frame < 1024 {
            return Err(config_error("max_frame", "must be at least 1024 bytes"));
        }
        let slurm = match &self.launcher {
            Launcher::Slurm(o) => Some((o.clone(), self.slurm_advertise(o)?)),
            _ => None,
        };
        let door = JoinDoor {
            listen: self.listen.clone(),
            on_listening: self.on_listening.clone(),
            door: DoorConfig {
                token,
                timing: PeerTiming {
                    heartbeat: self.heartbeat,
                    timeout: self.heartbeat_timeout,
                    max_frame: self.run.max_frame,
                },
                handshake_timeout: self.handshake_timeout,
                versions,
                metrics: self.run_metrics.clone(),
                tls: tls.acceptor,
            },
            join_timeout: self.join_timeout,
        };
        Ok(match slurm {
            Some((options, advertise)) => Box::new(SlurmLaunch {
                door,
                command: self.node_command(tls.nodes.as_ref())?,
                options,
                advertise,
            }),
            None if self.launcher == Launcher::Process => Box::new(ProcessLaunch {
                door,
                command: self.node_command(tls.nodes.as_ref())?,
            }),
            None => Box::new(ExternalLaunch { door }),
        })
    }

    /// The command that starts a node, checked: the one set, else `rollout node` from
    /// this executable; its nodes told to join over TLS when `tls`.
    fn node_command(&self, tls: Option<&NodeTls>) -> Result<NodeCommand, CollectError> {
        let command = match &self.node_command {
            Some(c) => c.clone(),
            None => NodeCommand::rollout(
                std::env::current_exe()
                    .map_err(|e| config_error("node_program", format!("cannot find this executable: {e}")))?,
            ),
        };
        command
            .check()
            .map_err(|reason| config_error(command.field(), reason))?;
        Ok(match tls {
            Some(t) => command.with_tls(t),
            None => command,
        })
    }

    /// Checks the `Slurm` launcher's settings; returns the `advertise` address.
    fn slurm_advertise(&self, o: &SlurmOptions) -> Result<String, CollectError> {
        o.validate().map_err(|(field, reason)| config_error(field, reason))?;
        let advertise = match self.advertise.as_deref().map(str::trim) {
            Some(a) if !a.is_empty() && !a.contains(char::is_whitespace) => a.to_string(),
            Some(a) => return Err(config_error("advertise", format!("{a:?} is not HOST[:PORT]"))),
            None => {
                return Err(config_error(
                    "advertise",
                    "required for the Slurm launcher: the HOST[:PORT] its tasks dial",
                ))
            }
        };
        let host = slurm::advertise_host(&advertise);
        let listen_loopback = self.listen.parse::<SocketAddr>().is_ok_and(|l| l.ip().is_loopback());
        let host_loopback = host == "localhost" || host.parse::<std::net::IpAddr>().is_ok_and(|ip| ip.is_loopback());
        if listen_loopback && !host_loopback {
            return Err(config_error(
                "listen",
                format!(
                    "{} accepts loopback only but tasks dial {advertise}: listen on 0.0.0.0:0 or that host's address",
                    self.listen
                ),
            ));
        }
        Ok(advertise)
    }
}

/// A random token for nodes this trainer starts itself.
fn random_token() -> Vec<u8> {
    (0..32)
        .map(|_| format!("{:02x}", rand::random::<u8>()))
        .collect::<String>()
        .into_bytes()
}
