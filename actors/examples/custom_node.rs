//! Custom envs on remote nodes: a binary of your own that registers its env on
//! both sides. The trainer (`custom_node trainer`) starts two node processes of
//! this same binary (`custom_node node --join ADDR ...`, exactly the arguments
//! `rollout node` takes), which build the env from the registry they were given.
//!
//! Run: `cargo run -p rollout-actors --example custom_node -- trainer`

use std::time::Duration;

use rollout::env::{Counting, CountingConfig};
use rollout::{Env, EnvError, PolicyConfig, Registry};
use rollout_actors::remote::{read_token, run_node, NodeOptions};
use rollout_actors::{DistributedCollector, Launcher};

/// The registry both the trainer and the nodes use: the built-ins plus our env.
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
    let args: Vec<String> = std::env::args().collect();
    match args.get(1).map(String::as_str) {
        // Started by the Process launcher: `node --join ADDR --index I --name N`.
        Some("node") => {
            let flag = |name: &str| args.iter().position(|a| a == name).and_then(|i| args.get(i + 1));
            let addr = flag("--join").ok_or_else(|| anyhow::anyhow!("node needs --join ADDR"))?;
            let opts = NodeOptions {
                name: flag("--name").cloned().unwrap_or_else(|| "custom".into()),
                index: flag("--index").and_then(|i| i.parse().ok()),
                registry: registry(),
                ..NodeOptions::default()
            };
            run_node(addr, &read_token(None, false)?, opts)?;
            Ok(())
        }
        _ => {
            let mut c = DistributedCollector::builder()
                .env("ShortCount-v0")
                .registry(registry())
                .policy(PolicyConfig::Constant { value: 1.0 })
                .nodes(2)
                .frames_per_batch(40)
                .total_frames(400)
                .launcher(Launcher::Process)
                .join_timeout(Duration::from_secs(30))
                .build()?;
            while let Some(b) = c.next_batch()? {
                println!("batch {} from node {:?}: {} frames", b.index, b.node, b.data.numel());
            }
            c.shutdown()?;
            Ok(())
        }
    }
}
