//! The `Process` launcher: child processes running the node command (`rollout node`
//! by default, see [`NodeCommand`]) that join the trainer over loopback, and are reaped
//! at shutdown, also when the trainer fails.

use std::io;
use std::net::SocketAddr;
use std::process::Child;
use std::time::{Duration, Instant};

use super::node_command::NodeCommand;

/// Node processes started by this trainer.
#[derive(Debug, Default)]
pub struct Children {
    procs: Vec<Child>,
    /// How to start node `i` again: command, address, token.
    how: Option<(NodeCommand, SocketAddr, String)>,
}

impl Children {
    /// Starts `n` × `COMMAND --join ADDR --index i --name process-i`, the token in
    /// `ROLLOUT_TOKEN` (never on the command line, where `ps` shows it). When one cannot
    /// be started, the ones already started are reaped (on drop).
    pub(crate) fn spawn(command: &NodeCommand, addr: SocketAddr, token: &[u8], n: usize) -> io::Result<Children> {
        let token = String::from_utf8_lossy(token).into_owned();
        let mut children = Children::default();
        for i in 0..n {
            children.procs.push(command.child(addr, &token, i).spawn()?);
        }
        children.how = Some((command.clone(), addr, token));
        Ok(children)
    }

    /// Kills node `i`'s process (SIGKILL: also one that is stopped) and starts a new
    /// one with the same `--index`, which joins again. Returns its process id.
    pub(crate) fn respawn(&mut self, i: usize) -> io::Result<u32> {
        let Some((command, addr, token)) = self.how.clone() else {
            return Err(io::Error::other("these children cannot be started again"));
        };
        let Some(old) = self.procs.get_mut(i) else {
            return Err(io::Error::other(format!("no node process {i}")));
        };
        let _ = old.kill();
        let _ = old.wait();
        let child = command.child(addr, &token, i).spawn()?;
        let pid = child.id();
        self.procs[i] = child;
        Ok(pid)
    }

    /// The processes of `which` nodes that have exited, each as `node i (pid P) exited
    /// with STATUS`: they will not join by themselves.
    pub(crate) fn exited(&mut self, which: &[usize]) -> Vec<String> {
        self.procs
            .iter_mut()
            .enumerate()
            .filter(|(i, _)| which.contains(i))
            .filter_map(|(i, c)| {
                let status = c.try_wait().ok().flatten()?;
                Some(format!("node process {i} (pid {}) exited ({status})", c.id()))
            })
            .collect()
    }

    /// Process ids, by node index.
    pub fn pids(&self) -> Vec<u32> {
        self.procs.iter().map(Child::id).collect()
    }

    /// Waits up to `grace` for every child to exit by itself, then kills the rest
    /// (SIGKILL) and waits for them: no child is left behind, none a zombie.
    pub fn reap(&mut self, grace: Duration) {
        let deadline = Instant::now() + grace;
        for c in &mut self.procs {
            loop {
                match c.try_wait() {
                    Ok(Some(_)) => break,
                    Ok(None) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(5)),
                    _ => {
                        let _ = c.kill();
                        let _ = c.wait();
                        break;
                    }
                }
            }
        }
        self.procs.clear();
    }
}

impl Drop for Children {
    fn drop(&mut self) {
        self.reap(Duration::from_secs(2));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The process group of process `pid` (`"self"`: this one), field 5 of its stat.
    fn process_group(pid: &str) -> Option<u32> {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
        // The fields after the command name, which may hold spaces: state, ppid, pgrp.
        let rest = &stat[stat.rfind(')')? + 2..];
        rest.split(' ').nth(2)?.parse().ok()
    }

    fn alive(pid: u32) -> bool {
        std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| !s.contains(") Z "))
    }

    #[test]
    fn each_node_process_leads_a_process_group_of_its_own() {
        // `sh -c 'exec sleep 30' --join ...`: the appended flags are the script's $0 and
        // arguments, so the child is a sleep that waits to be reaped.
        let command = NodeCommand::new(vec!["sh".into(), "-c".into(), "exec sleep 30".into()]);
        let addr = "127.0.0.1:9".parse().expect("an address");
        let mut children = Children::spawn(&command, addr, b"token", 2).expect("spawn sh");
        let pids = children.pids();
        let ours = process_group("self").expect("this process's group");
        for &pid in &pids {
            // Set between fork and exec: in place once `spawn` returned.
            assert_eq!(
                process_group(&pid.to_string()),
                Some(pid),
                "node process {pid} leads its own group"
            );
            assert_ne!(pid, ours, "not this process's group, which a terminal signals");
        }
        children.reap(Duration::ZERO);
        assert!(pids.iter().all(|&p| !alive(p)), "reaped: {pids:?}");
    }
}
