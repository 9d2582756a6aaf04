//! The command line: clap's definition, then a validated [`Options`].

use std::ffi::OsString;
use std::time::Duration;

use clap::{ArgAction, Parser, ValueEnum};

const EXIT_CODES: &str = "\
Exit status:
  0        every rank exited with code 0
  N        the first failing rank exited with code N
  128+S    the first failing rank was killed by signal S (also after Ctrl-C: 130)
  124      --timeout expired
  126/127  a program could not be started (not executable / not found)
  141      rlaunch's stdout was closed (e.g. piped into `head`)
  255      a proxy or node was lost, or rlaunch itself failed
  2        bad command line";

/// Launches a parallel job through a tree of proxies, one per node.
#[derive(Debug, Parser)]
#[command(
    name = "rlaunch",
    version,
    about = "Launch an MPI-style parallel job: one proxy per node, ranks under the proxies.",
    after_help = EXIT_CODES,
    override_usage = "rlaunch [OPTIONS] -n N PROGRAM [ARGS]..."
)]
pub struct Cli {
    /// Number of ranks to start.
    #[arg(short = 'n', long = "np", visible_alias = "n", value_name = "N", help_heading = "Job")]
    pub np: Option<u32>,

    /// Hosts to run on, with optional slot counts: `a,b:2,c`.
    #[arg(long, value_name = "LIST", help_heading = "Hosts")]
    pub hosts: Option<String>,

    /// How proxies are started on the hosts.
    #[arg(long, value_enum, value_name = "KIND", help_heading = "Hosts")]
    pub launcher: Option<LauncherKind>,

    /// Fan-out of the proxy tree; 0 starts every proxy from rlaunch itself.
    #[arg(long, value_name = "K", default_value_t = 32, help_heading = "Hosts")]
    pub tree_width: u32,

    /// Prefix every output line with `[rank] `.
    #[arg(short = 'l', long, help_heading = "Output")]
    pub prepend_rank: bool,

    /// Which ranks read rlaunch's stdin: a rank number, `all` or `none`.
    #[arg(long, value_name = "WHO", default_value = "0", help_heading = "Input")]
    pub stdin: String,

    /// Print every rank's exit status at the end.
    #[arg(long, alias = "print-all-exitcodes", help_heading = "Output")]
    pub print_all_exit_codes: bool,

    /// Seconds between SIGTERM and SIGKILL when the job is torn down.
    #[arg(long, value_name = "SECONDS", default_value_t = 1.0, help_heading = "Job")]
    pub kill_grace: f64,

    /// Kill the job after this many seconds (exit 124). Also MPIEXEC_TIMEOUT.
    #[arg(long, value_name = "SECONDS", help_heading = "Job")]
    pub timeout: Option<f64>,

    /// Serve PMI on a loopback TCP port (PMI_PORT, PMI_ID) instead of a socketpair (PMI_FD).
    #[arg(long, alias = "pmi-port", help_heading = "Job")]
    pub pmi_port: bool,

    /// More log output (repeat for more); RLAUNCH_LOG=debug does the same.
    #[arg(short = 'v', long = "verbose", action = ArgAction::Count, help_heading = "Output")]
    pub verbose: u8,

    /// The program and its arguments.
    #[arg(
        trailing_var_arg = true,
        allow_hyphen_values = true,
        required = true,
        value_name = "PROGRAM"
    )]
    pub command: Vec<OsString>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum LauncherKind {
    Fork,
    Ssh,
    Rsh,
}

/// Hydra's single-dash spellings that mean the same as ours.
fn translate_hydra(arg: OsString) -> OsString {
    match arg.to_str() {
        Some("-print-all-exitcodes") => "--print-all-exit-codes".into(),
        Some("-prepend-rank") => "--prepend-rank".into(),
        Some("-hosts") => "--hosts".into(),
        Some("-launcher") => "--launcher".into(),
        Some("-np") => "--np".into(),
        Some("-pmi-port") => "--pmi-port".into(),
        _ => arg,
    }
}

impl Cli {
    /// Parses rlaunch's own argv, accepting Hydra's spellings for the options before the
    /// program name.
    pub fn parse_args() -> Cli {
        let mut seen_program = false;
        let mut expect_value = false;
        let args = std::env::args_os().enumerate().map(|(i, a)| {
            if i == 0 || seen_program {
                return a;
            }
            let s = a.to_string_lossy();
            if expect_value {
                expect_value = false;
                return a;
            }
            if !s.starts_with('-') {
                seen_program = true;
                return a;
            }
            let takes_value = matches!(
                s.as_ref(),
                "-n" | "--np"
                    | "-np"
                    | "--hosts"
                    | "-hosts"
                    | "--launcher"
                    | "-launcher"
                    | "--tree-width"
                    | "--stdin"
                    | "--kill-grace"
                    | "--timeout"
            );
            expect_value = takes_value;
            translate_hydra(a)
        });
        Cli::parse_from(args.collect::<Vec<_>>())
    }

    pub fn timeout(&self) -> Result<Option<Duration>, String> {
        let secs = match self.timeout {
            Some(t) => Some(t),
            None => match std::env::var("MPIEXEC_TIMEOUT") {
                Ok(v) if !v.trim().is_empty() => Some(
                    v.trim()
                        .parse::<f64>()
                        .map_err(|_| format!("MPIEXEC_TIMEOUT={v} is not a number of seconds"))?,
                ),
                _ => None,
            },
        };
        match secs {
            Some(s) if s.is_finite() && s > 0.0 => Ok(Some(Duration::from_secs_f64(s))),
            Some(s) => Err(format!("timeout {s} is not a positive number of seconds")),
            None => Ok(None),
        }
    }
}
