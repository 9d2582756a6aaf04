//! The command line, read the way batch scripts write it: rlaunch's own `--long-options`,
//! Hydra's single-dash spellings and Open MPI's, MPMD segments separated by `:`.
//!
//! ```text
//!   argv ──split()──► segments of Items (in order) ──options::fold()──► Options
//!                 └── the OPTIONS table: every spelling, its argument, its topic, its help
//! ```
//!
//! One table drives parsing, suggestions for misspelled options and both help screens
//! ([`crate::help`]), so a spelling cannot be accepted without being documented. Items keep
//! their order because order matters: a later `-genv` overrides an earlier `-x`, and
//! `-genvnone` then `-genv A 1` is not `-genv A 1` then `-genvnone`.

use std::ffi::OsString;
use std::os::unix::ffi::OsStrExt;

use crate::quote::cut;

/// What an option is, whichever way it was spelled.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Key {
    Np,
    Configfile,
    Timeout,
    HangReport,
    StallReport,
    KillGrace,
    MaxRestarts,
    RestartBackoff,
    SpareHosts,
    OnFailure,
    PmiPort,
    Pmi,
    Pset,
    Tracker,
    Bcast,
    BcastDir,
    Stdin,
    Hosts,
    Hostfile,
    Ppn,
    MapBy,
    Oversubscribe,
    Launcher,
    LauncherExec,
    ProxyPath,
    BindAddress,
    Iface,
    TreeWidth,
    Rmk,
    Heartbeat,
    SilenceTimeout,
    Genv,
    Genvall,
    Genvnone,
    Genvlist,
    Env,
    Envall,
    Envnone,
    Envlist,
    /// Open MPI's `-x NAME[=VALUE]`.
    Export,
    Wdir,
    PrependRank,
    PrependPattern,
    OutfilePattern,
    ErrfilePattern,
    OutputFilename,
    TagOutput,
    TimestampOutput,
    PrintAllExitCodes,
    Report,
    Timeline,
    BindTo,
    ReportBindings,
    GpusPerRank,
    GpuBind,
    GpuShare,
    Verbose,
    Help,
    HelpAll,
    Version,
    Info,
    /// Accepted so that scripts run, but meaningless here: the reason is printed once.
    NoEffect(&'static str),
    /// Open MPI's `--mca NAME VALUE`: `OMPI_MCA_NAME=VALUE` in every rank's environment, as
    /// mpirun passes it.
    Mca,
    /// Typed out of habit, asks for nothing rlaunch would not do anyway: accepted quietly
    /// (the reason is in `--help-all`), since a job that runs fine prints nothing of ours.
    Habit(&'static str),
}

/// What follows an option on the command line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Arg {
    None,
    /// One value, named for the help text.
    Value(&'static str),
    /// `NAME VALUE` or `NAME=VALUE` (Hydra's `-genv`/`-env`).
    Pair,
}

/// Where an option applies in an MPMD command line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scope {
    /// The whole job, wherever it is written.
    Global,
    /// The segment it is written in (`-n`, `-env`).
    Segment,
    /// Its segment; written before the first program it is also every segment's default
    /// (`-hosts`, `-wdir`: Hydra's global and local forms are spelled the same).
    Both,
}

/// Where an option is listed in the help, in this order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Topic {
    Job,
    Hosts,
    Environment,
    Output,
    Binding,
    Information,
    Compatibility,
}

pub struct Opt {
    /// rlaunch's own spelling first, then the aliases (Hydra's, Open MPI's).
    pub names: &'static [&'static str],
    pub arg: Arg,
    pub key: Key,
    pub scope: Scope,
    pub topic: Topic,
    pub help: &'static str,
    /// Shown by `--help`; everything is shown by `--help-all`.
    pub common: bool,
}

const fn opt(
    names: &'static [&'static str],
    arg: Arg,
    key: Key,
    scope: Scope,
    topic: Topic,
    common: bool,
    help: &'static str,
) -> Opt {
    Opt { names, arg, key, scope, topic, help, common }
}

use Arg::{None as Flag, Pair, Value};
use Scope::{Both, Global, Segment as Seg};
use Topic::*;

#[rustfmt::skip]
pub const OPTIONS: &[Opt] = &[
    opt(&["--np", "-n", "-np", "-c", "--n"], Value("N"), Key::Np, Seg, Job, true,
        "number of ranks (default: the hosts' slots; 1 without hosts)"),
    opt(&["--configfile", "-configfile"], Value("FILE"), Key::Configfile, Global, Job, true,
        "read the MPMD segments from FILE, one per line (# comments, \\ continues a line)"),
    opt(&["--timeout", "-timeout"], Value("SECONDS"), Key::Timeout, Global, Job, true,
        "kill the job after SECONDS, exit 124 (also RLAUNCH_TIMEOUT, MPIEXEC_TIMEOUT)"),
    opt(&["--hang-report"], Value("WHAT"), Key::HangReport, Global, Job, false,
        "what a job that times out says before it is killed: stacks (each fence's missing \
         ranks, each rank's process state, and every rank's stacks merged: the default), \
         fences (without the stacks) or none"),
    opt(&["--report-state-on-timeout"], Flag, Key::HangReport, Global, Job, false,
        "same as --hang-report fences (Open MPI's spelling)"),
    opt(&["--get-stack-traces"], Flag, Key::HangReport, Global, Job, false,
        "same as --hang-report stacks (Open MPI's spelling)"),
    opt(&["--stall-report"], Value("SECONDS"), Key::StallReport, Global, Job, false,
        "once no rank has written output, spoken PMI or used CPU for SECONDS, say where the \
         job is (as at a timeout), once, and let it run"),
    opt(&["--kill-grace"], Value("SECONDS"), Key::KillGrace, Global, Job, false,
        "seconds between SIGTERM and SIGKILL when the job is torn down (default 1)"),
    opt(&["--max-restarts", "--max_restarts"], Value("N"), Key::MaxRestarts, Global, Job, false,
        "when a rank fails or a node is lost, start the whole job again, up to N times \
         (TORCHELASTIC_RESTART_COUNT, RLAUNCH_RESTART_COUNT count the attempts); a failure \
         before any rank started is not retried"),
    opt(&["--restart-backoff"], Value("SECONDS"), Key::RestartBackoff, Global, Job, false,
        "wait SECONDS before the first restart, twice as long before each next (default 0)"),
    opt(&["--on-failure"], Value("WHAT"), Key::OnFailure, Global, Job, false,
        "what a failed rank or lost node does to the job: end it (the default), or continue: \
         its ranks end alone and the others run on, told (PMI_dead_processes, \
         RLAUNCH_DEAD_RANKS_FILE, a PMIx event)"),
    opt(&["--disable-auto-cleanup", "-disable-auto-cleanup"], Flag, Key::OnFailure, Global, Job,
        false, "same as --on-failure continue (Hydra's spelling)"),
    opt(&["--spare-hosts"], Value("LIST"), Key::SpareHosts, Global, Job, false,
        "hosts that take a lost node's ranks when the job restarts (a,b); hosts given that no \
         rank was placed on are spares too"),
    opt(&["--stdin"], Value("WHO"), Key::Stdin, Global, Job, false,
        "which ranks read rlaunch's stdin: a rank number (default 0), all or none"),
    opt(&["--pmi-port", "-pmi-port"], Flag, Key::PmiPort, Global, Job, false,
        "serve PMI on a loopback port (PMI_PORT, PMI_ID) instead of a socketpair (PMI_FD)"),
    opt(&["--pmi"], Value("KIND"), Key::Pmi, Global, Job, false,
        "which PMI the ranks are served: auto (PMI-1, PMI-2, and PMIx unless the programs \
         cannot use it: the default), all, simple (PMI-1 and PMI-2 only) or pmix"),
    opt(&["--bcast"], Value("FILE[:DEST]"), Key::Bcast, Global, Job, false,
        "copy FILE to every node through the proxy tree before the ranks start, as DEST (a \
         relative name; default FILE's name) in a directory of the node's own that the \
         ranks find in RLAUNCH_BCAST_DIR, removed at the end; the ranks of a program sent so \
         run its copy (repeatable)"),
    opt(&["--bcast-dir"], Value("DIR"), Key::BcastDir, Global, Job, false,
        "where each node makes its directory for --bcast (%h: the node's name; default the \
         node's TMPDIR or /tmp)"),
    opt(&["--tracker"], Value("KIND"), Key::Tracker, Global, Job, false,
        "be the job's tracker: rabit (XGBoost 1.x to 3.x, dmlc-core; DMLC_TRACKER_URI ...)"),
    opt(&["--pset"], Value("NAME=RANKS"), Key::Pset, Global, Job, false,
        "a PMIx process set of these ranks (0-3,8), besides rlaunch://app/N and \
         rlaunch://node/HOST"),
    opt(&["--hosts", "-hosts", "--host", "-H", "-host"], Value("LIST"), Key::Hosts, Both, Hosts,
        true, "hosts to run on, with slot counts: a,b:2,c (a host named twice adds up)"),
    opt(&["--hostfile", "-f", "-hostfile", "-machinefile", "--machinefile", "--default-hostfile"],
        Value("FILE"), Key::Hostfile, Both, Hosts, true,
        "hostfile: `host`, `host:N` or `host slots=N` per line (also RLAUNCH_HOSTFILE, \
         HYDRA_HOST_FILE)"),
    opt(&["--ppn", "-ppn", "--npernode", "-npernode", "-N"], Value("N"), Key::Ppn, Global, Hosts,
        true, "ranks per host, whatever the host list says"),
    opt(&["--map-by", "-map-by"], Value("HOW"), Key::MapBy, Global, Hosts, true,
        "placement: slot (fill each host in turn, default), node (round-robin), ppr:N:node; \
         in each host: core, socket, numa, l3cache, hwthread, ppr:N:UNIT, :PE=n"),
    opt(&["--bynode", "-bynode"], Flag, Key::MapBy, Global, Hosts, false,
        "same as --map-by node"),
    opt(&["--byslot", "-byslot"], Flag, Key::MapBy, Global, Hosts, false,
        "same as --map-by slot"),
    opt(&["--oversubscribe", "-oversubscribe"], Flag, Key::Oversubscribe, Global, Hosts, false,
        "more ranks than slots wrap around the hosts (always so in rlaunch, as in Hydra)"),
    opt(&["--launcher", "-launcher", "-bootstrap", "--bootstrap"], Value("KIND"), Key::Launcher,
        Global, Hosts, true,
        "fork, ssh, rsh, slurm, sge or lsf (default: fork here, else the scheduler's or \
         ssh; also RLAUNCH_LAUNCHER, HYDRA_LAUNCHER)"),
    opt(&["--launcher-exec", "-launcher-exec", "-bootstrap-exec"], Value("COMMAND"),
        Key::LauncherExec, Global, Hosts, false,
        "the remote shell with its arguments: 'ssh -p 2222' (also RLAUNCH_LAUNCHER_EXEC, \
         HYDRA_LAUNCHER_EXEC)"),
    opt(&["--bind-address"], Value("ADDR"), Key::BindAddress, Global, Hosts, false,
        "the address rlaunch listens on for proxies that dial in (default: the one that \
         reaches the first node)"),
    opt(&["--iface", "-iface"], Value("NAME"), Key::Iface, Global, Hosts, false,
        "listen for proxies that dial in on this network interface's IPv4 address; the MPI's \
         own network is the MPI's to choose (e.g. UCX_NET_DEVICES)"),
    opt(&["--proxy-path"], Value("PATH"), Key::ProxyPath, Global, Hosts, false,
        "path of rlaunch-proxy on the remote hosts (default: the one next to rlaunch)"),
    opt(&["--tree-width"], Value("K"), Key::TreeWidth, Global, Hosts, false,
        "fan-out of the proxy tree (default 32); 0 starts every proxy from rlaunch"),
    opt(&["--rmk", "-rmk"], Value("KIND"), Key::Rmk, Global, Hosts, false,
        "take the hosts and slots from the batch scheduler's allocation: slurm, sge, pbs, lsf, \
         or none (default: the one rlaunch runs in, if any); --hosts and --hostfile win"),
    opt(&["--heartbeat"], Value("SECONDS"), Key::Heartbeat, Global, Hosts, false,
        "seconds between heartbeats on every link of the proxy tree (default 2)"),
    opt(&["--silence-timeout"], Value("SECONDS"), Key::SilenceTimeout, Global, Hosts, false,
        "a proxy not heard from for SECONDS is lost and the job ends (default 10; longer than \
         --heartbeat)"),
    opt(&["--genv", "-genv"], Pair, Key::Genv, Global, Environment, true,
        "set NAME=VALUE for every rank (also written NAME=VALUE)"),
    opt(&["-x"], Value("NAME[=VALUE]"), Key::Export, Global, Environment, true,
        "Open MPI: set NAME=VALUE, or pass NAME's value here, to every rank"),
    opt(&["--genvall", "-genvall"], Flag, Key::Genvall, Global, Environment, false,
        "pass rlaunch's whole environment to the ranks (the default)"),
    opt(&["--genvnone", "-genvnone"], Flag, Key::Genvnone, Global, Environment, true,
        "pass none of rlaunch's environment, only what is named with -genv/-env/-x"),
    opt(&["--genvlist", "-genvlist"], Value("A,B,.."), Key::Genvlist, Global, Environment, false,
        "pass only these variables of rlaunch's environment (and what is named)"),
    opt(&["--env", "-env"], Pair, Key::Env, Seg, Environment, true,
        "set NAME=VALUE for this segment's ranks (also written NAME=VALUE)"),
    opt(&["--envall", "-envall"], Flag, Key::Envall, Seg, Environment, false,
        "this segment gets rlaunch's whole environment"),
    opt(&["--envnone", "-envnone"], Flag, Key::Envnone, Seg, Environment, false,
        "this segment gets none of rlaunch's environment, only what is named"),
    opt(&["--envlist", "-envlist"], Value("A,B,.."), Key::Envlist, Seg, Environment, false,
        "this segment gets only these variables of rlaunch's environment"),
    opt(&["--wdir", "-wdir", "-wd", "--wd"], Value("DIR"), Key::Wdir, Both, Environment, true,
        "working directory of the ranks (default: the current one)"),
    opt(&["--prepend-rank", "-l", "-prepend-rank"], Flag, Key::PrependRank, Global, Output, true,
        "prefix every output line with [rank]"),
    opt(&["--prepend-pattern", "-prepend-pattern"], Value("PAT"), Key::PrependPattern, Global,
        Output, false, "prefix every output line with PAT: %r rank, %g pid, %h host, %t job id, \
        %% a percent sign; in output files too. Several prefixes: timestamp, tag, then PAT"),
    opt(&["--tag-output", "-tag-output"], Flag, Key::TagOutput, Global, Output, false,
        "Open MPI: prefix lines with [1,rank]<stdout>: or <stderr>:"),
    opt(&["--timestamp-output", "-timestamp-output"], Flag, Key::TimestampOutput, Global, Output,
        false, "prefix lines with the UTC time rlaunch received them"),
    opt(&["--outfile-pattern", "-outfile-pattern"], Value("PAT"), Key::OutfilePattern, Global,
        Output, true, "each rank's stdout to the file PAT names (%r %g %h %t) instead of the \
        terminal, on rlaunch's machine"),
    opt(&["--errfile-pattern", "-errfile-pattern"], Value("PAT"), Key::ErrfilePattern, Global,
        Output, true, "each rank's stderr to the file PAT names"),
    opt(&["--output-filename", "-output-filename"], Value("DIR[:nocopy]"), Key::OutputFilename,
        Global, Output, false,
        "Open MPI: also write DIR/1/rank.R/stdout and stderr (:nocopy only there, :nojobid \
         without the job level)"),
    opt(&["--print-all-exit-codes", "-print-all-exitcodes", "--print-all-exitcodes"], Flag,
        Key::PrintAllExitCodes, Global, Output, false, "print every rank's exit status at the end"),
    opt(&["--report"], Value("FILE"), Key::Report, Global, Output, false,
        "write FILE, a JSON report of the job and of every rank's run: host, pid, times, exit, \
         CPU time, peak memory, bytes of output (docs/report.md)"),
    opt(&["--timeline"], Value("FILE"), Key::Timeline, Global, Output, false,
        "write FILE, the job's launch as a Chrome trace (Perfetto, chrome://tracing): a track \
         per node, spans for bootstrap, launch, PMI init, fences, ranks; `rlaunch timeline \
         FILE -o PAGE.html` draws it"),
    opt(&["--bind-to", "-bind-to", "-binding"], Value("UNIT[:N]"), Key::BindTo, Global, Binding,
        true, "pin each rank to N (default 1) of: none, hwthread, core, l3cache, numa, socket \
         (default: a share of the cores each)"),
    opt(&["--report-bindings", "-report-bindings"], Flag, Key::ReportBindings, Global, Binding,
        false, "print the CPUs and GPUs of each rank"),
    opt(&["--gpus-per-rank", "-gpus-per-proc", "--gpus-per-proc", "--gpus-per-task"],
        Value("N"), Key::GpusPerRank, Both, Binding, true,
        "give each rank N GPUs (0: none), the free ones nearest its CPUs: \
         CUDA_VISIBLE_DEVICES, ROCR_VISIBLE_DEVICES, ZE_AFFINITY_MASK"),
    opt(&["--gpu-bind"], Value("HOW"), Key::GpuBind, Global, Binding, false,
        "how ranks get GPUs: closest (default), map:LIST (local rank i gets GPU LIST[i]), \
         none (rlaunch sets no GPU variable)"),
    opt(&["--gpu-share"], Flag, Key::GpuShare, Global, Binding, false,
        "more ranks than GPUs share them, in turn, instead of failing"),
    opt(&["--verbose", "-v", "-verbose"], Flag, Key::Verbose, Global, Information, true,
        "more log output (repeat for more); RLAUNCH_LOG=debug does the same"),
    opt(&["--help", "-h", "-help"], Flag, Key::Help, Global, Information, true,
        "the common options"),
    opt(&["--help-all"], Flag, Key::HelpAll, Global, Information, true,
        "every option and every spelling"),
    opt(&["--version", "-version", "-V"], Flag, Key::Version, Global, Information, true,
        "print the version"),
    opt(&["--info", "-info"], Flag, Key::Info, Global, Information, true,
        "how rlaunch was built: launchers, PMI versions, binding"),
    opt(&["-nameserver"], Value("HOST"), Key::NoEffect(
        "rlaunch serves publish/lookup itself, per job"),
        Global, Compatibility, false, "Hydra: name server"),
    opt(&["-demux"], Value("KIND"), Key::NoEffect("rlaunch always uses epoll"),
        Global, Compatibility, false, "Hydra: I/O demultiplexer"),
    opt(&["-disable-x", "-enable-x"], Flag, Key::NoEffect("ssh always runs with -x"),
        Global, Compatibility, false, "Hydra: X forwarding"),
    opt(&["--mca", "-mca", "--gmca", "-gmca"], Pair, Key::Mca, Global, Compatibility, false,
        "Open MPI's MCA parameter: OMPI_MCA_NAME=VALUE in every rank's environment, as mpirun \
         passes it (MPICH reads MPIR_CVAR_* variables instead: use -genv)"),
    opt(&["--allow-run-as-root"], Flag, Key::Habit("rlaunch runs as root without it"),
        Global, Compatibility, false, "Open MPI's permission for root: accepted, rlaunch needs none"),
    opt(&["-q", "--quiet"], Flag, Key::Habit("rlaunch prints only errors unless -v"),
        Global, Compatibility, false, "Open MPI's quiet: accepted, rlaunch prints only errors"),
    opt(&["--display-map", "-display-map"], Flag, Key::NoEffect(
        "use -v to see the placement"),
        Global, Compatibility, false, "Open MPI: print the map"),
];

/// One option as written, in command-line order.
#[derive(Debug, Clone, PartialEq)]
pub struct Item {
    pub key: Key,
    /// The spelling used, for messages.
    pub name: &'static str,
    pub scope: Scope,
    /// Its value; `NAME=VALUE` for pairs; for flags, the spelling (`--bynode`).
    pub value: Option<OsString>,
}

/// One `:`-separated part of the command line: its options, then its program and arguments.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Part {
    pub items: Vec<Item>,
    pub command: Vec<OsString>,
}

/// A command line that does not split into options and programs.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ArgsError {
    #[error("unknown option '{}'{} (rlaunch --help-all lists all)", cut(.name), did_you_mean(*.suggestion))]
    Unknown {
        name: String,
        /// The closest spelling, if one is close.
        suggestion: Option<&'static str>,
    },
    /// `what`: the argument's name (`N`), or what is missing (`a value after NAME`).
    #[error("{option} needs {}", cut(.what))]
    NeedsValue { option: &'static str, what: String },
    #[error("{option} takes no value")]
    TakesNoValue { option: &'static str },
    #[error("':' must follow a program: rlaunch -n 1 ./a : -n 2 ./b")]
    ColonFirst,
    #[error("a ':' must be followed by a program")]
    NothingAfterColon,
    #[error("'--' must be followed by a program")]
    NothingAfterDashes,
}

fn did_you_mean(suggestion: Option<&str>) -> String {
    suggestion.map(|s| format!("; did you mean '{s}'?")).unwrap_or_default()
}

/// Finds an option by any of its spellings.
fn lookup(name: &str) -> Option<(&'static Opt, &'static str)> {
    OPTIONS.iter().find_map(|o| o.names.iter().find(|n| **n == name).map(|n| (o, *n)))
}

/// Splits argv (without the program name) into `:`-separated parts. Each part's options
/// end at its first word that is not an option (its program); from there up to the next
/// lone `:` everything is the program's.
pub fn split(args: &[OsString]) -> Result<Vec<Part>, ArgsError> {
    let mut parts = vec![Part::default()];
    let mut i = 0;
    while i < args.len() {
        let part = parts.last_mut().expect("never empty");
        let word = &args[i];
        i += 1;
        if word == ":" {
            if part.command.is_empty() {
                return Err(ArgsError::ColonFirst);
            }
            parts.push(Part::default());
            continue;
        }
        if !part.command.is_empty() {
            part.command.push(word.clone());
            continue;
        }
        let text = word.to_str().unwrap_or("");
        if !text.starts_with('-') || text == "-" {
            part.command.push(word.clone());
            continue;
        }
        if text == "--" {
            // Whatever follows is the program, even if it starts with a dash.
            match args.get(i) {
                Some(program) => {
                    part.command.push(program.clone());
                    i += 1;
                }
                None => return Err(ArgsError::NothingAfterDashes),
            }
            continue;
        }
        // `--name=value` for options that take a value.
        let (name, inline) = match text.split_once('=') {
            Some((n, v)) if n.starts_with("--") => (n, Some(OsString::from(v))),
            _ => (text, None),
        };
        // `-vv`, `-vvv`: as many `-v`s.
        if name.len() > 2 && name[1..].bytes().all(|b| b == b'v') {
            let (opt, spelled) = lookup("-v").expect("-v is an option");
            for _ in 1..name.len() {
                let value = Some(OsString::from(spelled));
                part.items.push(Item { key: opt.key, name: spelled, scope: opt.scope, value });
            }
            continue;
        }
        let Some((opt, spelled)) = lookup(name) else {
            return Err(unknown_option(name));
        };
        let mut take = |what: String| -> Result<OsString, ArgsError> {
            let needs = || ArgsError::NeedsValue { option: spelled, what };
            let v = args.get(i).cloned().ok_or_else(needs)?;
            i += 1;
            Ok(v)
        };
        let value = match opt.arg {
            Flag if inline.is_some() => return Err(ArgsError::TakesNoValue { option: spelled }),
            Flag => None,
            Value(what) => Some(match inline {
                Some(v) => v,
                None => take(what.into())?,
            }),
            Pair => {
                let first = match inline {
                    Some(v) => v,
                    None => take("NAME VALUE".into())?,
                };
                if first.as_bytes().contains(&b'=') {
                    Some(first)
                } else {
                    let value = take(format!("a value after {}", first.to_string_lossy()))?;
                    let mut pair = first;
                    pair.push("=");
                    pair.push(value);
                    Some(pair)
                }
            }
        };
        let value = value.or_else(|| Some(spelled.into()).filter(|_| opt.arg == Flag));
        part.items.push(Item { key: opt.key, name: spelled, scope: opt.scope, value });
    }
    let last = parts.last().expect("never empty");
    if parts.len() > 1 && last.command.is_empty() {
        return Err(ArgsError::NothingAfterColon);
    }
    Ok(parts)
}

/// `unknown option '-hostz'; did you mean '-hosts'?`
fn unknown_option(name: &str) -> ArgsError {
    let best = OPTIONS
        .iter()
        .flat_map(|o| o.names.iter())
        .map(|n| {
            let d = distance(name.trim_start_matches('-'), n.trim_start_matches('-'));
            // On a tie, the spelling of the same family (-hydra, --ours) reads best.
            let dashes = |s: &str| s.len() - s.trim_start_matches('-').len();
            (d, dashes(name) != dashes(n), name.len().abs_diff(n.len()), *n)
        })
        .min();
    let suggestion = best.filter(|(d, ..)| *d <= 2.max(name.len() / 3)).map(|(.., n)| n);
    ArgsError::Unknown { name: name.to_string(), suggestion }
}

/// Levenshtein distance, for suggestions.
fn distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut prev = row[0];
        row[0] = i + 1;
        for (j, cb) in b.iter().enumerate() {
            let cur = row[j + 1];
            row[j + 1] = (prev + usize::from(ca != *cb)).min(row[j] + 1).min(cur + 1);
            prev = cur;
        }
    }
    row[b.len()]
}
#[cfg(test)]
/// The words of `s` as a program's argv would carry them.
pub fn os(s: &str) -> OsString {
    OsString::from(s)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(line: &str) -> Vec<OsString> {
        line.split_whitespace().map(os).collect()
    }

    #[test]
    fn every_spelling_is_unique() {
        let mut all: Vec<&str> = OPTIONS.iter().flat_map(|o| o.names.iter().copied()).collect();
        let count = all.len();
        all.sort();
        all.dedup();
        assert_eq!(all.len(), count);
    }

    #[test]
    fn parts_split_at_colons_and_programs_keep_their_dashes() {
        let parts = split(&args("-np 2 -genv A 1 ./a -n x : -n 3 -env B=2 ./b :x")).unwrap();
        assert_eq!(parts.len(), 2);
        assert_eq!(parts[0].command, args("./a -n x"));
        assert_eq!(parts[0].items[0].key, Key::Np);
        assert_eq!(parts[0].items[1].value, Some(os("A=1")));
        assert_eq!(parts[1].items[1].value, Some(os("B=2")));
        assert_eq!(parts[1].command, args("./b :x"));
    }

    #[test]
    fn bad_command_lines_get_one_line() {
        let error = |line: &str| split(&args(line)).unwrap_err().to_string();
        assert_eq!(
            error("-hostz a ./x"),
            "unknown option '-hostz'; did you mean '-hosts'? (rlaunch --help-all lists all)"
        );
        assert_eq!(error("-n"), "-n needs N");
        assert_eq!(error("-genv A"), "-genv needs a value after A");
        assert_eq!(error("./a :"), "a ':' must be followed by a program");
        assert_eq!(error("-n 1 : ./b"), "':' must follow a program: rlaunch -n 1 ./a : -n 2 ./b");
        assert_eq!(error("--"), "'--' must be followed by a program");
        assert!(split(&args("--np=2 ./a")).is_ok());
        assert_eq!(error("--genvnone=1 ./a"), "--genvnone takes no value");
    }

    #[test]
    fn suggestions_are_close_or_absent() {
        assert_eq!(
            unknown_option("--tree-wdith"),
            ArgsError::Unknown { name: "--tree-wdith".into(), suggestion: Some("--tree-width") }
        );
        assert_eq!(
            unknown_option("--zzzzzzzzzzzz").to_string(),
            "unknown option '--zzzzzzzzzzzz' (rlaunch --help-all lists all)"
        );
    }

    #[test]
    fn repeated_vs_count_as_many_verbose_flags() {
        let parts = split(&args("-vv -v ./a")).unwrap();
        assert_eq!(parts[0].items.iter().filter(|i| i.key == Key::Verbose).count(), 3);
        assert!(split(&args("-vx ./a")).is_err());
    }
}
