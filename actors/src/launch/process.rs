//! The `Process` launcher: child processes of the `rollout` binary that join the
//! trainer over loopback, and are reaped at shutdown, also when the trainer fails.

use std::io;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Node processes started by this trainer.
#[derive(Debug, Default)]
pub struct Children {
    procs: Vec<Child>,
    /// How to start node `i` again: program, address, token.
    how: Option<(PathBuf, SocketAddr, String)>,
}

fn spawn_one(program: &Path, addr: SocketAddr, token: &str, i: usize) -> io::Result<Child> {
    Command::new(program)
        .arg("node")
        .arg("--join")
        .arg(addr.to_string())
        .arg("--index")
        .arg(i.to_string())
        .arg("--name")
        .arg(format!("process-{i}"))
        .env("ROLLOUT_TOKEN", token)
        .stdin(Stdio::null())
        .spawn()
}

impl Children {
    /// Starts `n` × `program node --join ADDR --index i`, the token in `ROLLOUT_TOKEN`
    /// (never on the command line, where `ps` shows it).
    pub(crate) fn spawn(program: &Path, addr: SocketAddr, token: &[u8], n: usize) -> io::Result<Children> {
        let token = String::from_utf8_lossy(token).into_owned();
        let mut children = Children::default();
        for i in 0..n {
            children.procs.push(spawn_one(program, addr, &token, i)?);
        }
        children.how = Some((program.to_path_buf(), addr, token));
        Ok(children)
    }

    /// Kills node `i`'s process (SIGKILL: also one that is stopped) and starts a new
    /// one with the same `--index`, which joins again. Returns its process id.
    pub(crate) fn respawn(&mut self, i: usize) -> io::Result<u32> {
        let Some((program, addr, token)) = self.how.clone() else {
            return Err(io::Error::other("these children cannot be started again"));
        };
        let Some(old) = self.procs.get_mut(i) else {
            return Err(io::Error::other(format!("no node process {i}")));
        };
        let _ = old.kill();
        let _ = old.wait();
        let child = spawn_one(&program, addr, &token, i)?;
        let pid = child.id();
        self.procs[i] = child;
        Ok(pid)
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
