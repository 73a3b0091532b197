//! A node of your own, with an env of your own: this binary registers `ShortCount-v0`
//! and serves it as a node. The trainer is plain `rollout collect`, which has never
//! heard of that env: it learns the env's specs from the first node to be ready
//! (every other node must report the same), checks every batch against the layout
//! they give, and builds the policy's weights from them.
//!
//! Run (two shells, one token file readable by its owner only):
//!
//! ```text
//! rollout collect --env ShortCount-v0 --launcher external --listen 127.0.0.1:7000 \
//!     --token-file tok --nodes 2 --frames-per-batch 40 --total-frames 400
//! cargo run -p rollout-actors --example custom_node -- --join 127.0.0.1:7000 --token-file tok
//! cargo run -p rollout-actors --example custom_node -- --join 127.0.0.1:7000 --token-file tok
//! ```
//!
//! It takes the arguments `rollout node` takes that a launcher passes (`--join ADDR`,
//! `--index I`, `--name N`, `--token-file F`; a leading `node` is skipped), so a
//! launcher that starts node programs can start it too.

use std::path::Path;

use rollout::env::{Counting, CountingConfig};
use rollout::{Env, EnvError, Registry};
use rollout_actors::remote::{read_token, run_node, NodeOptions};

/// This node's registry: the built-ins plus our env.
fn registry() -> Registry {
    let mut r = Registry::with_builtins();
    // A stand-in for a real custom env: counts to 3.
    r.register("ShortCount-v0", |_config| -> Result<Box<dyn Env>, EnvError> {
        Ok(Box::new(Counting::new(CountingConfig {
            max_steps: 3,
            ..CountingConfig::default()
        })?))
    });
    r
}

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let args = match args.first().map(String::as_str) {
        Some("node") => &args[1..],
        _ => &args[..],
    };
    let flag = |name: &str| args.iter().position(|a| a == name).and_then(|i| args.get(i + 1));
    let addr = flag("--join")
        .ok_or_else(|| anyhow::anyhow!("usage: custom_node --join ADDR [--token-file F] [--index I] [--name N]"))?;
    let index = match flag("--index") {
        Some(i) => Some(i.parse().map_err(|e| anyhow::anyhow!("--index {i}: {e}"))?),
        None => None,
    };
    let opts = NodeOptions {
        name: flag("--name").cloned().unwrap_or_else(|| "custom".into()),
        index,
        registry: registry(),
        ..NodeOptions::default()
    };
    // The token from --token-file, else from the environment (ROLLOUT_TOKEN), as `rollout node`.
    let token = read_token(flag("--token-file").map(Path::new), false)?;
    run_node(addr, &token, opts)?;
    Ok(())
}
