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
  255      a proxy or node was lost, an output file could not be written, or rlaunch
           itself failed
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

    /// A hostfile: `host`, `host:N` or `host slots=N` per line (also HYDRA_HOST_FILE).
    #[arg(
        short = 'f',
        long,
        visible_alias = "machinefile",
        value_name = "FILE",
        help_heading = "Hosts"
    )]
    pub hostfile: Option<std::path::PathBuf>,

    /// Ranks per host, whatever the host list says.
    #[arg(long, value_name = "N", help_heading = "Hosts")]
    pub ppn: Option<u32>,

    /// Placement: `slot` fills each host's slots in turn, `node` deals ranks round-robin.
    #[arg(long, value_enum, value_name = "HOW", default_value = "slot", help_heading = "Hosts")]
    pub map_by: MapBy,

    /// How proxies are started on the hosts (default: ssh for other hosts, fork for this one).
    #[arg(long, value_enum, value_name = "KIND", help_heading = "Hosts")]
    pub launcher: Option<LauncherKind>,

    /// The remote-shell command, with its arguments: `--launcher-exec 'ssh -F cfg -p 2222'`.
    #[arg(long, value_name = "COMMAND", help_heading = "Hosts")]
    pub launcher_exec: Option<String>,

    /// Path of rlaunch-proxy on the remote hosts (default: the one next to this rlaunch).
    #[arg(long, value_name = "PATH", help_heading = "Hosts")]
    pub proxy_path: Option<String>,

    /// Fan-out of the proxy tree; 0 starts every proxy from rlaunch itself.
    #[arg(long, value_name = "K", default_value_t = 32, help_heading = "Hosts")]
    pub tree_width: u32,

    /// Prefix every output line with `[rank] ` (the same as `--prepend-pattern '[%r] '`).
    #[arg(short = 'l', long, help_heading = "Output")]
    pub prepend_rank: bool,

    /// Prefix every output line with PAT, expanded per rank (escapes as for --outfile-pattern).
    ///
    /// Prefixes go into output files too. With several, a line starts with the timestamp,
    /// then the tag, then this pattern.
    #[arg(long, value_name = "PAT", help_heading = "Output")]
    pub prepend_pattern: Option<String>,

    /// Write each rank's stdout to the file PAT names, not to the terminal.
    ///
    /// Escapes: %r the rank, %g its pid, %h its host, %t the job id, %% a percent sign. Ranks
    /// whose PAT expands to the same file share it, line by line. Files are created (or
    /// truncated) in rlaunch's directory on rlaunch's machine as their ranks start; one that
    /// cannot be created ends the job. Takes precedence over --output-filename for stdout.
    #[arg(long, value_name = "PAT", help_heading = "Output")]
    pub outfile_pattern: Option<String>,

    /// Write each rank's stderr to the file PAT names, as --outfile-pattern does for stdout.
    #[arg(long, value_name = "PAT", help_heading = "Output")]
    pub errfile_pattern: Option<String>,

    /// Prefix every output line with `[1,RANK]<stdout>:` or `[1,RANK]<stderr>:` (Open MPI's).
    ///
    /// Spawned jobs count on from 2: `[2,RANK]`. In files too.
    #[arg(long, help_heading = "Output")]
    pub tag_output: bool,

    /// Prefix every output line with the UTC time rlaunch received it.
    ///
    /// As `[2026-11-22T10:00:00.123Z] `. The time never goes back, even if the system clock
    /// does. In files too.
    #[arg(long, help_heading = "Output")]
    pub timestamp_output: bool,

    /// Also write each rank's output to DIR/1/rank.R/stdout and DIR/1/rank.R/stderr.
    ///
    /// As Open MPI 4 does: R is zero-padded to the width of the job size, spawned jobs go to
    /// DIR/2, DIR/3, ...; directories are created as needed. The output still goes to the
    /// terminal unless DIR ends with `:nocopy`; `:nojobid` leaves out the job level, and both
    /// combine as `:nocopy,nojobid`.
    #[arg(long, value_name = "DIR[:nocopy]", help_heading = "Output")]
    pub output_filename: Option<String>,

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
    #[arg(trailing_var_arg = true, required = true, value_name = "PROGRAM")]
    pub command: Vec<OsString>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum MapBy {
    Slot,
    Node,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum LauncherKind {
    Fork,
    Ssh,
    Rsh,
}

/// Hydra's (and Open MPI's) single-dash spellings that mean the same as ours, and whether
/// they take a value.
const HYDRA: &[(&str, &str, bool)] = &[
    ("-np", "--np", true),
    ("-hosts", "--hosts", true),
    ("-f", "--hostfile", true),
    ("-hostfile", "--hostfile", true),
    ("-machinefile", "--hostfile", true),
    ("-ppn", "--ppn", true),
    ("-map-by", "--map-by", true),
    ("-launcher", "--launcher", true),
    ("-bootstrap", "--launcher", true),
    ("-launcher-exec", "--launcher-exec", true),
    ("-bootstrap-exec", "--launcher-exec", true),
    ("-prepend-rank", "--prepend-rank", false),
    ("-print-all-exitcodes", "--print-all-exit-codes", false),
    ("-pmi-port", "--pmi-port", false),
    ("-prepend-pattern", "--prepend-pattern", true),
    ("-outfile-pattern", "--outfile-pattern", true),
    ("-errfile-pattern", "--errfile-pattern", true),
    ("-tag-output", "--tag-output", false),
    ("-timestamp-output", "--timestamp-output", false),
    ("-output-filename", "--output-filename", true),
];

/// Our options that take a value, so that their value is not taken for the program.
const TAKES_VALUE: &[&str] = &[
    "-n",
    "--np",
    "--hosts",
    "--hostfile",
    "--machinefile",
    "--ppn",
    "--map-by",
    "--launcher",
    "--launcher-exec",
    "--proxy-path",
    "--tree-width",
    "--stdin",
    "--kill-grace",
    "--timeout",
    "--prepend-pattern",
    "--outfile-pattern",
    "--errfile-pattern",
    "--output-filename",
];

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
            if std::mem::take(&mut expect_value) {
                return a;
            }
            let Some(s) = a.to_str() else { return a };
            if !s.starts_with('-') {
                seen_program = true;
                return a;
            }
            if let Some((_, ours, value)) = HYDRA.iter().find(|(h, _, _)| *h == s) {
                expect_value = *value;
                return ours.into();
            }
            expect_value = TAKES_VALUE.contains(&s);
            a
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
