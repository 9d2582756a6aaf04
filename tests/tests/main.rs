//! rlaunch's integration tests, one module per topic, in one binary: one link step, and the
//! topics' tests share the test threads (`--test-threads`), so a topic that waits (on a
//! cluster's daemons, a silence timeout) lets others run. Two suites are binaries of their
//! own, run alone after or before this one: `chaos.rs` times proxies' silence to the second
//! under faults it injects, and `under_load.rs` makes the load it measures the teardown
//! against; another topic's load beside them would be measured too.
//!
//! Run one topic with its module's name: `cargo test -p rlaunch-tests --test integration
//! -- signals::`.

mod allocation;
mod bad_input;
mod bcast;
mod binding;
mod cli;
mod exit_status;
mod fakessh;
mod frameworks;
mod gpus;
mod hangs;
mod launch;
mod lost_proxies;
mod mpich;
mod multihost;
mod openmpi;
mod output_files;
mod output_relay;
mod pmi;
mod pmix_server;
mod progress;
mod rankprog;
mod report;
mod restarts;
mod sge;
mod signals;
mod slurm;
mod spawn;
mod stdin;
mod structure;
mod timeline;
