//! The `Process` launcher: child processes of the `rollout` binary that join the
//! trainer over loopback, and are reaped at shutdown, also when the trainer fails.

use std::io;
use std::net::SocketAddr;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Node processes started by this trainer.
#[derive(Debug, Default)]
pub struct Children {
    procs: Vec<Child>,
}

impl Children {
    /// Starts `n` × `program node --join ADDR --index i`, the token in `ROLLOUT_TOKEN`
    /// (never on the command line, where `ps` shows it).
    pub fn spawn(program: &Path, addr: SocketAddr, token: &[u8], n: usize) -> io::Result<Children> {
        let token = String::from_utf8_lossy(token).into_owned();
        let mut children = Children::default();
        for i in 0..n {
            let child = Command::new(program)
                .arg("node")
                .arg("--join")
                .arg(addr.to_string())
                .arg("--index")
                .arg(i.to_string())
                .arg("--name")
                .arg(format!("process-{i}"))
                .env("ROLLOUT_TOKEN", &token)
                .stdin(Stdio::null())
                .spawn()?;
            children.procs.push(child);
        }
        Ok(children)
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
