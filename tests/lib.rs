//! Helpers shared by the integration scenarios in `tests/tests/`, each kept once here
//! (a scenario file holds only what it alone needs). Everything is re-exported at the
//! crate root: `use rollout_tests::{drain, temp_dir, ...}`.

#![warn(missing_docs)]

mod attack;
mod batches;
mod certs;
mod faults;
mod hosts;
mod http;
mod logs;
mod messages;
mod process;
mod prometheus;
mod python_nodes;
mod raw_node;
mod records;
mod recurrent_replay;
mod scratch;
mod scripted;
mod setups;
mod tls_front;
mod wait;

pub use attack::{
    attacker, fixstr, framed, hello_body, send_all, vm_hwm_kib, wait_closed, AttackedTrainer, Closed, RunEnd,
    TrainerSetup, ATTACK_TOKEN,
};
pub use batches::{assert_unique_traj_ids, assert_unique_traj_ids_in_records, cut_trajectories, drain};
pub use certs::{test_certs, TestCerts};
pub use faults::{flaky_registry, panicky_registry, Panicky};
pub use hosts::{hosts_sh, HostProcess, Hosts, HostsTurn, HOSTS_SLURM_CONF};
pub use http::{http_get, http_raw, url_encode, HttpAnswer};
pub use logs::{log_text, logs, OwnLog};
pub use messages::{describe_sent, only_batch};
pub use process::{
    actors_example_bin, alive, children, node_with_index, process_group, rollout_bin, rollout_release_bin, run_bounded,
    signal, signal_group, wait_with_deadline, Finished, Running,
};
pub use prometheus::{require_prometheus, Prometheus, Sample};
pub use python_nodes::{venv_python, Mark, MarkedPythonNodes};
pub use raw_node::{
    connect, good_node, good_node_named, good_node_over, handshake, hello, logged_in, real_batch, real_data, recv,
    send, try_send,
};
pub use records::{read_output, OutputRecord};
pub use recurrent_replay::assert_recurrent_replay;
pub use scratch::{temp_dir, temp_file, unique_name};
pub use scripted::{scripted_join, scripted_node_result, Scripted, SCRIPTED_DEADLINE};
pub use setups::{
    built_on_a_thread, cartpole_sync_builder, counting_process_builder, external_counting_builder,
    listening_on_a_thread, panicky_builder, trainer_config, value_weights,
};
pub use tls_front::TlsFront;
pub use wait::{holds_for, poll_until, wait_for, wait_until};
