//! The command line, read the way batch scripts write it: rlaunch's own `--long-options`,
//! Hydra's single-dash spellings and Open MPI's, MPMD segments separated by `:`.
//!
//! ```text
//!   argv ──split()──► segments of Items (in order) ──options::fold()──► Options
//!                 └── the OPTIONS table: every spelling, its argument, its topic, its help
//! ```
//!
//! One table drives parsing, suggestions for misspelled options and both help screens, so a
//! spelling cannot be accepted without being documented. Items keep their order because
//! order matters: a later `-genv` overrides an earlier `-x`, and `-genvnone` then `-genv A 1`
//! is not `-genv A 1` then `-genvnone`.

use std::ffi::OsString;
use std::os::unix::ffi::OsStrExt;

/// What an option is, whichever way it was spelled.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Key {
    Np,
    Configfile,
    Timeout,
    KillGrace,
    PmiPort,
    Stdin,
    Hosts,
    Hostfile,
    Ppn,
    MapBy,
    Oversubscribe,
    Launcher,
    LauncherExec,
    ProxyPath,
    TreeWidth,
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
    BindTo,
    ReportBindings,
    Verbose,
    Help,
    HelpAll,
    Version,
    Info,
    /// Accepted so that scripts run, but meaningless here: the reason is printed once.
    NoEffect(&'static str),
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

impl Topic {
    fn title(self) -> &'static str {
        match self {
            Topic::Job => "Job",
            Topic::Hosts => "Hosts and launching",
            Topic::Environment => "Environment and working directory",
            Topic::Output => "Output",
            Topic::Binding => "CPU binding",
            Topic::Information => "Information",
            Topic::Compatibility => "Accepted for compatibility, no effect",
        }
    }
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
    opt(&["--kill-grace"], Value("SECONDS"), Key::KillGrace, Global, Job, false,
        "seconds between SIGTERM and SIGKILL when the job is torn down (default 1)"),
    opt(&["--stdin"], Value("WHO"), Key::Stdin, Global, Job, false,
        "which ranks read rlaunch's stdin: a rank number (default 0), all or none"),
    opt(&["--pmi-port", "-pmi-port"], Flag, Key::PmiPort, Global, Job, false,
        "serve PMI on a loopback port (PMI_PORT, PMI_ID) instead of a socketpair (PMI_FD)"),
    opt(&["--hosts", "-hosts", "--host", "-H", "-host"], Value("LIST"), Key::Hosts, Both, Hosts,
        true, "hosts to run on, with slot counts: a,b:2,c (a host named twice adds up)"),
    opt(&["--hostfile", "-f", "-hostfile", "-machinefile", "--machinefile", "--default-hostfile"],
        Value("FILE"), Key::Hostfile, Both, Hosts, true,
        "hostfile: `host`, `host:N` or `host slots=N` per line (also RLAUNCH_HOSTFILE, \
         HYDRA_HOST_FILE)"),
    opt(&["--ppn", "-ppn", "--npernode", "-npernode", "-N"], Value("N"), Key::Ppn, Global, Hosts,
        true, "ranks per host, whatever the host list says"),
    opt(&["--map-by", "-map-by"], Value("HOW"), Key::MapBy, Global, Hosts, true,
        "placement: slot (fill each host in turn, default), node (round-robin), ppr:N:node"),
    opt(&["--bynode", "-bynode"], Flag, Key::MapBy, Global, Hosts, false,
        "same as --map-by node"),
    opt(&["--byslot", "-byslot"], Flag, Key::MapBy, Global, Hosts, false,
        "same as --map-by slot"),
    opt(&["--oversubscribe", "-oversubscribe"], Flag, Key::Oversubscribe, Global, Hosts, false,
        "more ranks than slots wrap around the hosts (always so in rlaunch, as in Hydra)"),
    opt(&["--launcher", "-launcher", "-bootstrap", "--bootstrap"], Value("KIND"), Key::Launcher,
        Global, Hosts, true,
        "how proxies start: fork, ssh or rsh (default: fork here, ssh elsewhere; also \
         RLAUNCH_LAUNCHER, HYDRA_LAUNCHER)"),
    opt(&["--launcher-exec", "-launcher-exec", "-bootstrap-exec"], Value("COMMAND"),
        Key::LauncherExec, Global, Hosts, false,
        "the remote shell with its arguments: 'ssh -p 2222' (also RLAUNCH_LAUNCHER_EXEC, \
         HYDRA_LAUNCHER_EXEC)"),
    opt(&["--proxy-path"], Value("PATH"), Key::ProxyPath, Global, Hosts, false,
        "path of rlaunch-proxy on the remote hosts (default: the one next to rlaunch)"),
    opt(&["--tree-width"], Value("K"), Key::TreeWidth, Global, Hosts, false,
        "fan-out of the proxy tree (default 32); 0 starts every proxy from rlaunch"),
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
    opt(&["--bind-to", "-bind-to", "-binding"], Value("UNIT[:N]"), Key::BindTo, Global, Binding,
        true, "pin each rank to N (default 1) of: none (default), hwthread, core, socket, numa"),
    opt(&["--report-bindings", "-report-bindings"], Flag, Key::ReportBindings, Global, Binding,
        false, "print the CPUs each rank is bound to"),
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
    opt(&["-iface", "--iface"], Value("IFACE"), Key::NoEffect(
        "proxies talk over their launcher's pipes, not a network interface; choose the MPI \
         network with the MPI's own variables (e.g. UCX_NET_DEVICES)"),
        Global, Compatibility, false, "Hydra: network interface"),
    opt(&["-nameserver"], Value("HOST"), Key::NoEffect(
        "rlaunch serves publish/lookup itself, per job"),
        Global, Compatibility, false, "Hydra: name server"),
    opt(&["-rmk"], Value("KIND"), Key::NoEffect(
        "give hosts with --hosts or --hostfile"),
        Global, Compatibility, false, "Hydra: resource manager"),
    opt(&["-demux"], Value("KIND"), Key::NoEffect("rlaunch always uses epoll"),
        Global, Compatibility, false, "Hydra: I/O demultiplexer"),
    opt(&["-disable-x", "-enable-x"], Flag, Key::NoEffect("ssh always runs with -x"),
        Global, Compatibility, false, "Hydra: X forwarding"),
    opt(&["--mca", "-mca", "--gmca", "-gmca"], Pair, Key::NoEffect(
        "MCA parameters belong to Open MPI; MPICH reads MPIR_CVAR_* variables (use -genv)"),
        Global, Compatibility, false, "Open MPI: MCA parameter"),
    opt(&["--allow-run-as-root"], Flag, Key::NoEffect("rlaunch runs as root without it"),
        Global, Compatibility, false, "Open MPI: allow root"),
    opt(&["-q", "--quiet"], Flag, Key::NoEffect("rlaunch prints only errors unless -v"),
        Global, Compatibility, false, "Open MPI: quiet"),
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

/// Finds an option by any of its spellings.
pub fn lookup(name: &str) -> Option<(&'static Opt, &'static str)> {
    OPTIONS.iter().find_map(|o| o.names.iter().find(|n| **n == name).map(|n| (o, *n)))
}

/// Splits argv (without the program name) into `:`-separated parts. Each part's options
/// end at its first word that is not an option (its program); from there up to the next
/// lone `:` everything is the program's.
pub fn split(args: &[OsString]) -> Result<Vec<Part>, String> {
    let mut parts = vec![Part::default()];
    let mut i = 0;
    while i < args.len() {
        let part = parts.last_mut().expect("never empty");
        let word = &args[i];
        i += 1;
        if word == ":" {
            if part.command.is_empty() {
                return Err("':' must follow a program: rlaunch -n 1 ./a : -n 2 ./b".into());
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
                None => return Err("'--' must be followed by a program".into()),
            }
            continue;
        }
        // `--name=value` for options that take a value.
        let (name, inline) = match text.split_once('=') {
            Some((n, v)) if n.starts_with("--") => (n, Some(OsString::from(v))),
            _ => (text, None),
        };
        let Some((opt, spelled)) = lookup(name) else {
            return Err(unknown_option(name));
        };
        let mut take = |what: &str| -> Result<OsString, String> {
            let v = args.get(i).cloned().ok_or_else(|| format!("{spelled} needs {what}"))?;
            i += 1;
            Ok(v)
        };
        let value = match opt.arg {
            Flag if inline.is_some() => return Err(format!("{spelled} takes no value")),
            Flag => None,
            Value(what) => Some(match inline {
                Some(v) => v,
                None => take(what)?,
            }),
            Pair => {
                let first = match inline {
                    Some(v) => v,
                    None => take("NAME VALUE")?,
                };
                if first.as_bytes().contains(&b'=') {
                    Some(first)
                } else {
                    let value = take(&format!("a value after {}", first.to_string_lossy()))?;
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
        return Err("a ':' must be followed by a program".into());
    }
    Ok(parts)
}

/// `unknown option '-hostz'; did you mean '-hosts'?`
fn unknown_option(name: &str) -> String {
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
    match best {
        Some((d, _, _, n)) if d <= 2.max(name.len() / 3) => {
            format!("unknown option '{name}'; did you mean '{n}'? (rlaunch --help-all lists all)")
        }
        _ => format!("unknown option '{name}' (rlaunch --help-all lists all)"),
    }
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

/// A configfile line's number and words.
pub type ConfigLine = (usize, Vec<OsString>);

/// Splits a configfile into parts: one per line, `#` comments, `\` at the end of a line
/// continues it, words split like a shell would (quotes and backslashes, no expansion).
/// Errors carry the file's 1-based line number.
pub fn split_configfile(text: &str) -> Result<Vec<ConfigLine>, (usize, String)> {
    let mut lines = Vec::new();
    let mut pending = String::new();
    let mut start = 0;
    for (i, raw) in text.lines().enumerate() {
        if pending.is_empty() {
            start = i + 1;
        }
        match raw.strip_suffix('\\') {
            Some(head) => {
                pending.push_str(head);
                pending.push(' ');
            }
            None => {
                pending.push_str(raw);
                let words = shell_words(&pending).map_err(|e| (start, e))?;
                if !words.is_empty() {
                    lines.push((start, words));
                }
                pending.clear();
            }
        }
    }
    if !pending.is_empty() {
        let words = shell_words(&pending).map_err(|e| (start, e))?;
        if !words.is_empty() {
            lines.push((start, words));
        }
    }
    Ok(lines)
}

/// Words of one line: 'single' and "double" quotes, backslash escapes, `#` starts a comment
/// outside quotes at the start of a word.
fn shell_words(line: &str) -> Result<Vec<OsString>, String> {
    let mut words = Vec::new();
    let mut word: Option<String> = None;
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        match c {
            c if c.is_whitespace() => {
                if let Some(w) = word.take() {
                    words.push(w.into());
                }
            }
            '#' if word.is_none() => break,
            '\'' => {
                let w = word.get_or_insert_with(String::new);
                loop {
                    match chars.next() {
                        Some('\'') => break,
                        Some(c) => w.push(c),
                        None => return Err("unterminated ' quote".into()),
                    }
                }
            }
            '"' => {
                let w = word.get_or_insert_with(String::new);
                loop {
                    match chars.next() {
                        Some('"') => break,
                        Some('\\') => match chars.next() {
                            Some(c) => w.push(c),
                            None => return Err("unterminated \" quote".into()),
                        },
                        Some(c) => w.push(c),
                        None => return Err("unterminated \" quote".into()),
                    }
                }
            }
            '\\' => {
                if let Some(c) = chars.next() {
                    word.get_or_insert_with(String::new).push(c);
                }
            }
            c => word.get_or_insert_with(String::new).push(c),
        }
    }
    if let Some(w) = word {
        words.push(w.into());
    }
    Ok(words)
}

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

const HELP_WIDTH: usize = 100;
const HELP_INDENT: usize = 30;

/// Words of `text` in lines of at most `width` characters.
fn wrap(text: &str, width: usize) -> Vec<String> {
    let mut lines: Vec<String> = Vec::new();
    for word in text.split_whitespace() {
        match lines.last_mut() {
            Some(line) if line.len() + 1 + word.len() <= width => {
                line.push(' ');
                line.push_str(word);
            }
            _ => lines.push(word.to_string()),
        }
    }
    lines
}

/// `--help` (common options, rlaunch's spelling) or `--help-all` (everything).
pub fn help(all: bool) -> String {
    let mut out = String::from(
        "rlaunch: launch an MPI-style parallel job, one proxy per node, ranks under the proxies.\n\n\
         Usage: rlaunch [OPTIONS] [-n N] PROGRAM [ARGS]... [: [OPTIONS] PROGRAM [ARGS]...]...\n",
    );
    let mut topics: Vec<Topic> = OPTIONS.iter().map(|o| o.topic).collect();
    topics.sort();
    topics.dedup();
    for topic in topics {
        let shown: Vec<&Opt> =
            OPTIONS.iter().filter(|o| o.topic == topic && (all || o.common)).collect();
        if shown.is_empty() {
            continue;
        }
        out.push_str(&format!("\n{}:\n", topic.title()));
        for o in shown {
            let names = if all {
                o.names.join(", ")
            } else {
                // The one-letter spelling too, if there is one: it is what people type.
                let short = o.names.iter().find(|n| n.len() == 2 && !n.starts_with("--"));
                match short {
                    Some(s) if *s != o.names[0] => format!("{s}, {}", o.names[0]),
                    _ => o.names[0].to_string(),
                }
            };
            let arg = match o.arg {
                Flag => String::new(),
                Value(v) => format!(" {v}"),
                Pair => " NAME VALUE".into(),
            };
            let head = format!("  {names}{arg}");
            let mut lines = wrap(o.help, HELP_WIDTH - HELP_INDENT).into_iter();
            if head.len() < HELP_INDENT {
                let first = lines.next().unwrap_or_default();
                out.push_str(&format!("{head:<HELP_INDENT$}{first}\n"));
            } else {
                out.push_str(&format!("{head}\n"));
            }
            for line in lines {
                out.push_str(&format!("{:<HELP_INDENT$}{line}\n", ""));
            }
        }
    }
    if all {
        out.push_str(
            "\nOptions before the first program apply to every segment; -n, -env*, -hosts and \
             -wdir after\na ':' apply to their segment. A rank's environment, later wins: \
             rlaunch's environment (all of it,\nor as filtered by -genvnone/-genvlist, or by \
             the segment's own -envall/-envnone/-envlist), then\n-genv and -x in order, then \
             the segment's -env in order, then the PMI variables rlaunch sets.\nSettings from \
             the environment: the command line wins over RLAUNCH_HOSTFILE, RLAUNCH_LAUNCHER,\n\
             RLAUNCH_LAUNCHER_EXEC, RLAUNCH_TIMEOUT, which win over HYDRA_HOST_FILE, \
             HYDRA_LAUNCHER,\nHYDRA_LAUNCHER_EXEC, MPIEXEC_TIMEOUT.\n",
        );
    } else {
        out.push_str(
            "\n`rlaunch --help-all` lists every option with its Hydra and Open MPI spellings.\n",
        );
    }
    out.push('\n');
    out.push_str(EXIT_CODES);
    out.push('\n');
    out
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
        let e = split(&args("-hostz a ./x")).unwrap_err();
        assert!(e.contains("'-hostz'; did you mean '-hosts'"), "{e}");
        assert!(split(&args("-n")).unwrap_err().contains("-n needs N"));
        assert!(split(&args("./a :")).unwrap_err().contains("followed by a program"));
        assert!(split(&args("-n 1 : ./b")).unwrap_err().contains("must follow a program"));
        assert!(split(&args("--np=2 ./a")).is_ok());
        assert!(split(&args("--genvnone=1 ./a")).unwrap_err().contains("takes no value"));
    }

    #[test]
    fn configfiles_have_comments_continuations_and_quotes() {
        let text = "# master\n-n 1 ./m\n\n-n 2 -env A 'x y' \\\n  ./w \"q\\\"z\" # two\n";
        let lines = split_configfile(text).unwrap();
        assert_eq!(lines[0], (2, args("-n 1 ./m")));
        assert_eq!(lines[1].0, 4);
        assert_eq!(lines[1].1[4], os("x y"));
        assert_eq!(lines[1].1[6], os("q\"z"));
        assert_eq!(split_configfile("a\n'b\n").unwrap_err().0, 2);
    }

    #[test]
    fn suggestions_are_close_or_absent() {
        assert!(unknown_option("--tree-wdith").contains("'--tree-width'"));
        assert!(!unknown_option("--zzzzzzzzzzzz").contains("did you mean"));
    }
}
