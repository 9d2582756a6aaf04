//! rlaunch: an MPI process launcher (`mpiexec`). This library is everything the `rlaunch`
//! binary does; `main.rs` only wires it to the process and maps failures to exit statuses.
//!
//! ```text
//!  argv ─args::split─► parts ─options::parse─► Options ─plan::build─► job::Plan ─job::run─► status
//!        (OPTIONS table;        (configfile        (host lists,          (proxies, output,
//!         help renders it)       lines join)        placement, tree)      stdin, signals)
//! ```
//!
//! Start reading at [`options::parse`] for the command line, [`plan::build`] for how a job is
//! laid out over hosts and proxies, and [`job::run`] for how it runs. [`exit`] is the table of
//! every status rlaunch ends with; [`help`] says what the user sees of each option, and [`docs`]
//! writes the same table as a manual page and shell completions.

mod allocation;
pub mod args;
mod configfile;
pub mod ctl;
pub mod docs;
pub mod error;
pub mod exit;
#[doc(hidden)]
pub mod fuzzing;
pub mod help;
mod hosts;
#[expect(
    private_interfaces,
    reason = "job::Plan's public fields name output's crate-private types; the binary only \
              passes a Plan from plan::build to job::run"
)]
pub mod job;
pub mod options;
mod output;
mod place;
pub mod plan;
pub mod process;
mod quote;
mod stdin;
mod textfile;
pub mod timeline_page;
mod tracker;
