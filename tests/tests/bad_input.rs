//! The catalogue of bad input: hostfiles, host lists, command lines, programs, output paths,
//! PMI traffic and control frames that are wrong, each answered the same way. Every case
//! checks, through [`refused`]:
//!
//! * exactly one line of rlaunch's on stderr, compared whole, naming the culprit (FILE:LINE,
//!   host, rank, option) and quoting no more than a short piece of the input;
//! * the documented exit status (README's table: 2 for usage, 126/127 for programs, 255 for
//!   the rest; 1 for a proxy refusing its control channel);
//! * nothing of the run left running (its tag);
//! * nothing written: the run's working directory, a fresh one, is unchanged.
//!
//! The command-line cases are generated from rlaunch's option table, so that an option added
//! later is tried too (and [`wrong_value`] matches every option key without a wildcard).

use std::fs;
use std::net::ToSocketAddrs;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use rlaunch::args::{Arg, Key, OPTIONS};
use rlaunch_tests::hosts::hostname;
use rlaunch_tests::output::rlaunch_lines;
use rlaunch_tests::{fakessh, pmiprog_str, proxy, rankprog_str, tempdir, Outcome, Run, TempDir};

/// How long a refused run's processes may take to be gone.
const GONE: Duration = Duration::from_secs(5);

/// Every file under `dir` with its size and modification time, directories too.
fn snapshot(dir: &Path) -> Vec<(PathBuf, u64, Option<std::time::SystemTime>)> {
    let mut found = Vec::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        for entry in fs::read_dir(&d).unwrap().map(Result::unwrap) {
            let meta = entry.metadata().unwrap();
            if meta.is_dir() {
                todo.push(entry.path());
            }
            found.push((entry.path(), meta.len(), meta.modified().ok()));
        }
    }
    found.sort();
    found
}

/// `(pid 1234 ` as `(pid P `: the one part of a line the test cannot know in advance.
fn without_pids(line: &str) -> String {
    let mut out = String::new();
    let mut rest = line;
    while let Some(at) = rest.find("(pid ") {
        out.push_str(&rest[..at + 5]);
        rest = rest[at + 5..].trim_start_matches(|c: char| c.is_ascii_digit());
        out.push('P');
    }
    out.push_str(rest);
    out
}

/// Runs `run` in `dir` and checks the four promises of the module doc. `line` is the whole
/// line after `rlaunch: ` (a pid written `(pid P `). Ranks' own stderr lines, if the job
/// started ranks, are not rlaunch's and are left out.
fn refused(dir: &TempDir, run: Run, line: &str, code: i32) -> Outcome {
    let before = snapshot(dir.path());
    let out = run.current_dir(dir.path()).timeout(Duration::from_secs(30)).run();
    let err = out.stderr_str();
    let lines: Vec<String> = rlaunch_lines(&err).into_iter().map(without_pids).collect();
    assert_eq!(lines, [format!("rlaunch: {line}")], "{out}");
    out.assert_code(code);
    if let Err(left) = out.tag.wait_until_none(GONE) {
        panic!("left running: {left:?}\n{out}");
    }
    assert_eq!(snapshot(dir.path()), before, "the run wrote in its directory\n{out}");
    out
}

/// [`refused`] with nothing but that one line on stderr: a run that started no rank.
fn refused_alone(dir: &TempDir, run: Run, line: &str, code: i32) -> Outcome {
    let out = refused(dir, run, line, code);
    assert_eq!(out.stderr_str(), format!("rlaunch: {line}\n"), "{out}");
    out
}

fn fresh_with(files: &[(&str, &[u8])]) -> TempDir {
    let dir = tempdir();
    for (name, bytes) in files {
        fs::write(dir.join(name), bytes).unwrap();
    }
    dir
}

fn path_str(p: PathBuf) -> String {
    p.into_os_string().into_string().unwrap()
}

/// 64 characters of `text`, then `...`: how rlaunch quotes a long culprit.
fn cut(text: &str) -> String {
    format!("{}...", &text[..64])
}

#[test]
fn hostfile_garbage_is_named_by_file_and_line() {
    let mega_name = "a".repeat(1 << 20);
    let mega_count = format!("n1:{}", "9".repeat(1 << 20));
    let mut binary = b"n1\nn2:2\n".to_vec();
    binary.extend((0..=255u8).cycle().take(4096));
    // (contents, line after the file name; `{f}` is the file)
    let cases: Vec<(Vec<u8>, String)> = vec![
        (binary, "{f}:3: not text (is it a hostfile?)".into()),
        (b"\x7fELF\x02\x01\x01\0\0\0".to_vec(), "{f}:1: not text (is it a hostfile?)".into()),
        (b"n1:99999999999\n".to_vec(), "{f}:1: bad slot count '99999999999'".into()),
        (b"n1\nn2 slots=-2\n".to_vec(), "{f}:2: bad slot count '-2'".into()),
        (b"n1:0\n".to_vec(), "{f}:1: bad slot count '0'".into()),
        (b"n1 slots=2 slots=3\n".to_vec(), "{f}:1: slots given twice for host n1".into()),
        (b"n1:2 slots=3\n".to_vec(), "{f}:1: slots given twice for host n1".into()),
        (
            b"n1 max_slots=2 max_slots=4\n".to_vec(),
            "{f}:1: max_slots given twice for host n1".into(),
        ),
        (b"n1 colour=red\n".to_vec(), "{f}:1: unexpected 'colour=red' after host n1".into()),
        (
            format!("n1\n{mega_name}\n").into_bytes(),
            format!("{{f}}:2: host name '{}' is longer than 253 characters", cut(&mega_name)),
        ),
        (
            mega_count.clone().into_bytes(),
            format!("{{f}}:1: bad slot count '{}'", cut(&mega_count[3..])),
        ),
        (b"# nothing\n\n".to_vec(), "hostfile {f} names no host".into()),
        (b":4\n".to_vec(), "{f}:1: empty host name".into()),
    ];
    for (contents, line) in cases {
        let dir = fresh_with(&[("hosts", &contents)]);
        let file = path_str(dir.join("hosts"));
        let line = line.replace("{f}", &file);
        let run = Run::new(&["--launcher", "fork", "-f", &file, "-n", "1", "true"]);
        let out = refused_alone(&dir, run, &line, 2);
        assert!(out.elapsed < Duration::from_secs(5), "{out}");
    }
}

#[test]
fn hostfiles_that_cannot_be_read_are_named() {
    let dir = tempdir();
    fs::create_dir(dir.join("sub")).unwrap();
    let sub = path_str(dir.join("sub"));
    let cases = [
        (
            "/nonexistent/hosts".to_string(),
            "cannot read hostfile /nonexistent/hosts: No such file or directory".to_string(),
        ),
        (sub.clone(), format!("cannot read hostfile {sub}: Is a directory")),
        // Read up to the bound, not until memory runs out.
        ("/dev/zero".into(), "hostfile /dev/zero is larger than 64 MiB".into()),
    ];
    for (file, line) in cases {
        refused_alone(&dir, Run::new(&["-f", &file, "true"]), &line, 2);
    }
    // The same through the environment.
    let dir = fresh_with(&[("hosts", b"\0\0\0\0")]);
    let file = path_str(dir.join("hosts"));
    let run = Run::new(&["-n", "1", "true"]).env("RLAUNCH_HOSTFILE", &file);
    refused_alone(&dir, run, &format!("{file}:1: not text (is it a hostfile?)"), 2);
}

#[test]
fn a_binary_configfile_is_named_by_file_and_line() {
    let dir = fresh_with(&[("job.conf", b"-n 1 true\n\xff\xfe\0\x01\n")]);
    let file = path_str(dir.join("job.conf"));
    let line = format!("{file}:2: not text (is it a configfile?)");
    refused_alone(&dir, Run::new(&["-configfile", &file]), &line, 2);
}

#[test]
fn host_lists_as_long_as_an_argument_run_or_fail_in_one_short_line() {
    // A hundred thousand hosts in a file, and as many as one argument holds (128 KiB): a
    // one-rank job uses the first and starts no proxy for the others.
    let many: String = (0..100_000).map(|i| format!("host{i:06}\n")).collect();
    let dir = fresh_with(&[("hosts", many.as_bytes())]);
    let file = path_str(dir.join("hosts"));
    let start = Instant::now();
    let out =
        Run::new(&["--launcher", "fork", "-f", &file, "-n", "1", &rankprog_str(), "echo", "ok"])
            .current_dir(dir.path())
            .run();
    out.assert_code(0);
    assert_eq!(out.lines(), ["ok"], "{out}");
    let list: Vec<String> = (0..12_000).map(|i| format!("h{i:05}:2")).collect();
    let list = list.join(",");
    assert!(list.len() > 90_000 && list.len() < 128 << 10);
    let out = Run::new(&[
        "--launcher",
        "fork",
        "--hosts",
        &list,
        "-n",
        "1",
        &rankprog_str(),
        "echo",
        "ok",
    ])
    .run();
    out.assert_code(0);
    let out = Run::new(&["--launcher", "fork", "-n", "1", &rankprog_str(), "echo", "ok"])
        .env("RLAUNCH_HOSTFILE", &file)
        .run();
    out.assert_code(0);
    assert!(start.elapsed() < Duration::from_secs(10), "took {:?}", start.elapsed());

    // A bad host at the end: the line quotes the start of the list, not all of it.
    let bad = format!("{list},h2:x");
    let line = format!("--hosts {}: bad slot count 'x'", cut(&bad));
    refused_alone(&dir, Run::new(&["--hosts", &bad, "true"]), &line, 2);
    let long = "b".repeat(300);
    let line =
        format!("--hosts {}: host name '{}' is longer than 253 characters", cut(&long), cut(&long));
    refused_alone(&dir, Run::new(&["--hosts", &long, "true"]), &line, 2);
    refused_alone(&dir, Run::new(&["-H", "a,,b", "true"]), "--hosts a,,b: empty host name", 2);
}

#[test]
fn more_ranks_than_hosts_can_run_are_refused_before_anything_is_laid_out() {
    let dir = fresh_with(&[("hosts", b"n1:4294967295\n")]);
    let file = path_str(dir.join("hosts"));
    let line = "4294967295 ranks on 1 host: more than Linux can run (4194304 processes a host)";
    refused_alone(&dir, Run::new(&["--launcher", "fork", "-f", &file, "true"]), line, 2);
    let line = "4000000000 ranks on 1 host: more than Linux can run (4194304 processes a host)";
    refused_alone(&dir, Run::new(&["-n", "4000000000", "true"]), line, 2);
    let run = Run::new(&["-n", "4294967295", "true", ":", "-n", "2", "true"]);
    refused_alone(&dir, run, "too many ranks", 2);
}

/// A value of `key`'s option that rlaunch refuses, and the line it says about it (`{o}` is
/// the spelling used) with its status; `None` for options without a value, or whose every
/// value is taken (checked where it is used). No wildcard: a new key must be placed here.
fn wrong_value(key: Key) -> Option<(&'static str, &'static str, i32)> {
    let usage = |value, line| Some((value, line, 2));
    match key {
        Key::Np => usage("x", "{o} x: expected a number of ranks"),
        Key::Configfile => {
            usage("/nonexistent/job.conf", "cannot read /nonexistent/job.conf: No such file or directory")
        }
        Key::Timeout
        | Key::StallReport
        | Key::KillGrace
        | Key::RestartBackoff
        | Key::Heartbeat
        | Key::SilenceTimeout => {
            usage("-1", "{o} -1: expected a number of seconds, at most 1000000000")
        }
        Key::MaxRestarts => usage("-1", "{o} -1: expected a number of restarts"),
        Key::SpareHosts => usage("a:x", "{o} a:x: expected a host list, e.g. a,b"),
        Key::OnFailure => usage("retry", "{o} retry: expected end or continue"),
        Key::HangReport => usage("all", "{o} all: expected stacks, fences or none"),
        Key::Pmi => usage("pmi3", "{o} pmi3: expected auto, all, simple or pmix"),
        Key::Pset => usage("io", "{o} io: expected NAME=RANKS, e.g. io=0-3,8"),
        Key::Tracker => usage("ps-lite", "{o} ps-lite: expected rabit"),
        Key::Bcast => usage(
            "a:../x",
            "{o} a:../x: expected FILE or FILE:DEST, DEST a relative name without '..'",
        ),
        Key::BcastDir => usage("tmp", "{o} tmp: expected an absolute directory"),
        Key::Stdin => usage("x", "--stdin x: expected a rank number, 'all' or 'none'"),
        Key::Hosts => usage("a:x", "--hosts a:x: bad slot count 'x'"),
        Key::Hostfile => {
            usage("/nonexistent/h", "cannot read hostfile /nonexistent/h: No such file or directory")
        }
        Key::Ppn => usage("0", "{o} 0: expected a number of ranks per host"),
        Key::MapBy => usage(
            "diagonal",
            "{o} diagonal: expected slot, node, hwthread, core, l3cache, numa, socket, or \
             ppr:N:UNIT, optionally :PE=n",
        ),
        Key::Launcher => usage("pbs", "{o} pbs: expected fork, ssh, rsh, slurm, sge or lsf"),
        Key::LauncherExec => usage(" ", "{o}: empty command"),
        Key::BindAddress => usage("x", "{o} x: expected an IP address"),
        Key::Iface => usage(
            "rl-nosuch0",
            "{o} rl-nosuch0: no interface of that name has an IPv4 address (these do: {ifaces})",
        ),
        Key::TreeWidth => usage("-1", "{o} -1: expected a number of children"),
        Key::Rmk => usage("pbx", "{o} pbx: expected slurm, sge, pbs, lsf or none"),
        Key::Genv | Key::Env | Key::Export => usage("=x", "{o} =x: empty variable name"),
        Key::Wdir => Some((
            "/nonexistent",
            "cannot start rank 0 on {host}: working directory /nonexistent: No such file or directory",
            126,
        )),
        Key::PrependPattern => {
            usage("%q", "--prepend-pattern %q: unknown escape %q (known: %r %g %h %t %%)")
        }
        Key::OutfilePattern => {
            usage("%q", "--outfile-pattern %q: unknown escape %q (known: %r %g %h %t %%)")
        }
        Key::ErrfilePattern => {
            usage("%q", "--errfile-pattern %q: unknown escape %q (known: %r %g %h %t %%)")
        }
        Key::OutputFilename => {
            usage("d:bogus", "--output-filename d:bogus: unknown option bogus (known: nocopy, nojobid)")
        }
        Key::Report => Some((
            "/nonexistent/r.json",
            "cannot write the report /nonexistent/r.json: No such file or directory",
            255,
        )),
        Key::Timeline => Some((
            "/nonexistent/t.json",
            "cannot write the timeline /nonexistent/t.json: No such file or directory",
            255,
        )),
        Key::BindTo => usage(
            "corez",
            "{o} corez: expected none, hwthread, core, l3cache, numa or socket, optionally :N",
        ),
        Key::GpusPerRank => usage("x", "{o} x: expected a number of GPUs"),
        Key::GpuBind => usage(
            "nearest",
            "{o} nearest: expected closest, none or map:LIST (GPU indexes: 3,2,1,0)",
        ),
        // Any path: it is the remote hosts' to find.
        Key::ProxyPath => None,
        // Names of variables, set or not.
        Key::Genvlist | Key::Envlist => None,
        Key::NoEffect(_) | Key::Habit(_) => None,
        // Any NAME VALUE: Open MPI judges its parameters.
        Key::Mca => None,
        Key::PmiPort
        | Key::Oversubscribe
        | Key::Genvall
        | Key::Genvnone
        | Key::Envall
        | Key::Envnone
        | Key::PrependRank
        | Key::TagOutput
        | Key::TimestampOutput
        | Key::PrintAllExitCodes
        | Key::ReportBindings
        | Key::GpuShare
        | Key::Verbose
        | Key::Help
        | Key::HelpAll
        | Key::Version
        | Key::Info => None,
    }
}

/// The interfaces with an IPv4 address, as `--iface` lists them.
fn ipv4_interfaces() -> String {
    let mut known: Vec<String> = Vec::new();
    for ifa in nix::ifaddrs::getifaddrs().unwrap() {
        let ipv4 = ifa.address.as_ref().and_then(|a| a.as_sockaddr_in()).is_some();
        if ipv4 && !known.contains(&ifa.interface_name) {
            known.push(ifa.interface_name);
        }
    }
    known.join(", ")
}

#[test]
fn every_option_with_a_missing_or_wrong_value_gets_one_line() {
    let dir = tempdir();
    let (host, ifaces) = (hostname(), ipv4_interfaces());
    let mut tried = 0;
    for opt in OPTIONS {
        for &spelling in opt.names {
            let needs = match opt.arg {
                Arg::None => None,
                Arg::Value(what) => Some(what),
                Arg::Pair => Some("NAME VALUE"),
            };
            match needs {
                // Missing: the option is the last word.
                Some(what) => {
                    let line = format!("{spelling} needs {what}");
                    refused_alone(&dir, Run::new(&["-n", "1", spelling]), &line, 2);
                }
                // A value given to a flag.
                None if spelling.starts_with("--") => {
                    let run = Run::new(&[&format!("{spelling}=1"), "true"]);
                    refused_alone(&dir, run, &format!("{spelling} takes no value"), 2);
                }
                None => {}
            }
            let wrong = wrong_value(opt.key).filter(|_| opt.arg != Arg::None);
            if let Some((value, line, code)) = wrong {
                let line = line
                    .replace("{o}", spelling)
                    .replace("{host}", &host)
                    .replace("{ifaces}", &ifaces);
                // A configfile holds the programs: none on the command line then.
                let program: &[&str] = if opt.key == Key::Configfile { &[] } else { &["true"] };
                let run = Run::new(&["-n", "1", spelling, value]).args(program);
                refused(&dir, run, &line, code);
            }
            tried += 1;
        }
    }
    assert!(tried > 80, "only {tried} spellings");
}

#[test]
fn command_lines_that_say_nothing_runnable_get_one_line() {
    let dir = tempdir();
    let huge = format!("--{}", "z".repeat(100_000));
    let cases: Vec<(Vec<String>, String)> = vec![
        (vec![], "no program given: rlaunch -n N PROGRAM [ARGS]".into()),
        (vec!["-n".into(), "2".into()], "no program given: rlaunch -n N PROGRAM [ARGS]".into()),
        (vec!["-n".into(), "1".into(), "".into()], "empty program name".into()),
        (
            vec!["-n".into(), "0".into(), "true".into()],
            "-n 0: a segment needs at least 1 rank".into(),
        ),
        (vec!["-n".into(), "-1".into(), "true".into()], "-n -1: expected a number of ranks".into()),
        (
            vec!["-n".into(), "1".into(), ":".into(), "true".into()],
            "':' must follow a program: rlaunch -n 1 ./a : -n 2 ./b".into(),
        ),
        (vec!["true".into(), ":".into()], "a ':' must be followed by a program".into()),
        (vec!["--".into()], "'--' must be followed by a program".into()),
        (
            vec![huge.clone(), "true".into()],
            format!("unknown option '{}' (rlaunch --help-all lists all)", cut(&huge)),
        ),
        (
            vec!["-n".into(), "9".repeat(100_000), "true".into()],
            format!("-n {}: expected a number of ranks", cut(&"9".repeat(100_000))),
        ),
    ];
    for (args, line) in cases {
        refused_alone(&dir, Run::new(&[]).args(&args), &line, 2);
    }
    let run = Run::new(&["true"]).env("RLAUNCH_TIMEOUT", "soon");
    refused_alone(
        &dir,
        run,
        "RLAUNCH_TIMEOUT soon: expected a number of seconds, at most 1000000000",
        2,
    );
}

#[test]
fn programs_that_cannot_start_name_program_and_host() {
    let host = hostname();
    let dir = fresh_with(&[("not-executable", b"#!/bin/sh\n"), ("file", b"x")]);
    fs::create_dir(dir.join("adir")).unwrap();
    let cases = [
        (
            vec!["-n", "2", "./no-such-program"],
            "cannot start ./no-such-program on {h}: No such file or directory",
            127,
        ),
        (
            vec!["-n", "2", "no-such-program-on-path"],
            "cannot start no-such-program-on-path on {h}: No such file or directory",
            127,
        ),
        (
            vec!["-n", "2", "./not-executable"],
            "cannot start ./not-executable on {h}: Permission denied",
            126,
        ),
        (vec!["-n", "2", "./adir"], "cannot start ./adir on {h}: Is a directory", 126),
        (
            vec!["-n", "1", "-wdir", "/nonexistent", "true"],
            "cannot start rank 0 on {h}: working directory /nonexistent: No such file or directory",
            126,
        ),
        (
            vec!["-n", "1", "-wdir", "file", "true"],
            "cannot start rank 0 on {h}: working directory {d}/file: Not a directory",
            126,
        ),
    ];
    let d = path_str(dir.path().to_path_buf());
    for (args, line, code) in cases {
        let line = line.replace("{h}", &host).replace("{d}", &d);
        let out = refused_alone(&dir, Run::new(&args), &line, code);
        assert!(out.elapsed < Duration::from_secs(10), "{out}");
    }
}

#[test]
fn an_unknown_host_is_named() {
    let dir = tempdir();
    let run =
        Run::new(&["--launcher-exec", &fakessh(), "-hosts", "unreachable1", "-n", "1", "true"]);
    let line = "lost proxy on unreachable1 (fakessh exited with code 255: ssh: Could not resolve \
                hostname unreachable1: Name or service not known)";
    refused_alone(&dir, run, line, 255);
}

#[test]
fn output_files_that_cannot_be_created_leave_nothing_behind() {
    let dir = fresh_with(&[("file", b"x")]);
    let cases = [
        (
            vec!["--outfile-pattern", "file/out.%r"],
            "cannot create file/out.0 (stdout of rank 0): Not a directory",
        ),
        (
            vec!["--errfile-pattern", "/nonexistent/err.%r"],
            "cannot create /nonexistent/err.0 (stderr of rank 0): No such file or directory",
        ),
        (
            vec!["--output-filename", "file/logs"],
            "cannot create file/logs/1/rank.0 (stdout of rank 0): Not a directory",
        ),
    ];
    for (args, line) in cases {
        let run = Run::new(&args).args(["-n", "2", &rankprog_str(), "echo", "x"]);
        refused_alone(&dir, run, line, 255);
    }
}

#[test]
fn too_few_file_descriptors_for_the_ranks_is_a_clear_error() {
    let dir = tempdir();
    let run = Run::program("prlimit", &["--nofile=64:64", "--"])
        .arg(rlaunch_tests::rlaunch())
        .args(["-n", "100", &rankprog_str(), "sleep", "30"]);
    let line = format!(
        "cannot start {} on {}: Too many open files (raise the open-file limit, ulimit -n)",
        rankprog_str(),
        hostname()
    );
    let out = refused_alone(&dir, run, &line, 255);
    assert!(out.elapsed < Duration::from_secs(10), "{out}");
}

#[test]
fn pmi_garbage_and_floods_from_a_rank_end_the_job_naming_it() {
    let dir = tempdir();
    let host = hostname();
    let pmiprog = pmiprog_str();
    let cases = [
        (
            vec!["-n", "2", &pmiprog, "@1", "raw", "garbage\\n"],
            "rank 1 (pid P on {h}) sent a bad PMI-2 message (bad pmi-2 length header \"garbag\"): \"garbage\"",
        ),
        (
            vec!["-n", "1", &pmiprog, "raw", "--init", "cmd=put kvsname=x key=\\n"],
            "rank 0 (pid P on {h}) sent a bad PMI-1 message (pmi-1 put: missing value): \"cmd=put kvsname=x key=\"",
        ),
        (
            vec!["-n", "1", &pmiprog, "v2", "flood-puts", "100000000"],
            "rank 0 (pid P on {h}) put more than 8 MiB of keys and values",
        ),
    ];
    for (args, line) in cases {
        let out = refused(&dir, Run::new(&args), &line.replace("{h}", &host), 255);
        assert!(out.elapsed < Duration::from_secs(10), "{out}");
    }
    // A line of a megabyte: quoted cut short.
    let long = format!("cmd={}", "a".repeat(1 << 20));
    let dir = fresh_with(&[("line", long.as_bytes())]);
    let script = "cat line >&$PMI_FD; sleep 30";
    let line = format!(
        "rank 0 (pid P on {host}) sent a bad PMI-1 message (pmi-1 line longer than 1024 bytes): \"{}\"…",
        &long[..120]
    );
    let out = refused(&dir, Run::new(&["-n", "1", "bash", "-c", script]), &line, 255);
    assert!(out.elapsed < Duration::from_secs(10), "{out}");
}

/// A Down frame: length, tag 0 (a bincode message), body.
fn frame(tag: u8, body: &[u8]) -> Vec<u8> {
    let mut out = ((body.len() + 1) as u32).to_be_bytes().to_vec();
    out.push(tag);
    out.extend_from_slice(body);
    out
}

#[test]
fn a_proxy_fed_bad_control_frames_exits_with_one_line_and_starts_nothing() {
    let hello = |version: u32| {
        let mut out = rlaunch_protocol::control::MAGIC.to_vec();
        out.extend_from_slice(&version.to_be_bytes());
        out
    };
    let ok = hello(rlaunch_protocol::control::PROTOCOL_VERSION);
    let with = |rest: &[u8]| [&ok[..], rest].concat();
    let cases: Vec<(Vec<u8>, String)> = vec![
        (vec![b'X'; 70 << 10], "no rlaunch hello in the first 65536 bytes".into()),
        (b"RLAUNCH\x7f\0\0\0\x05".to_vec(), "connection closed before the hello".into()),
        (
            hello(99),
            format!(
                "the launcher speaks protocol version 99, this proxy speaks version {}",
                rlaunch_protocol::control::PROTOCOL_VERSION
            ),
        ),
        (
            with(&[0xff, 0xff, 0xff, 0xff, 0]),
            "frame of 4294967295 bytes exceeds the limit of 67108864 bytes".into(),
        ),
        (with(&[0, 0, 0, 0]), "empty frame".into()),
        (with(&[0, 0, 0, 9, 0, 1]), "connection closed in the middle of a frame".into()),
        (with(&frame(0, &[0x01])), "malformed frame: it ends a byte short".into()),
        (with(&frame(0, &[200])), "malformed frame: an unknown kind of message".into()),
        (with(&frame(7, &[0])), "unknown frame tag 7".into()),
    ];
    let host = hostname();
    for (input, line) in cases {
        let dir = tempdir();
        let before = snapshot(dir.path());
        let out = Run::program(proxy(), &[]).stdin_bytes(input).current_dir(dir.path()).run();
        assert_eq!(out.stderr_str(), format!("rlaunch-proxy on {host}: {line}\n"), "{out}");
        out.assert_code(1);
        if let Err(left) = out.tag.wait_until_none(GONE) {
            panic!("left running: {left:?}\n{out}");
        }
        assert_eq!(snapshot(dir.path()), before, "{out}");
    }
}

#[test]
fn a_remote_shell_that_answers_garbage_loses_its_host() {
    let dir = fresh_with(&[(
        "liar",
        b"#!/bin/sh\nprintf 'welcome!\\n\\177RLAUNCH\\0\\0\\0\\143'\nsleep 30\n",
    )]);
    let liar = path_str(dir.join("liar"));
    fs::set_permissions(&liar, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let run = Run::new(&["--launcher-exec", &liar, "-hosts", "r1", "-n", "1", "true"]);
    let line = format!(
        "lost proxy on r1 (its proxy speaks protocol version 99, this rlaunch speaks version {}: \
         install the same rlaunch version on every host)",
        rlaunch_protocol::control::PROTOCOL_VERSION
    );
    refused_alone(&dir, run, &line, 255);
}

#[test]
fn a_node_no_address_of_which_is_known_is_named_with_what_was_tried() {
    // Neither its name nor Slurm (no controller outside the tests' cluster) gives nosuch1 an
    // address: one line saying both, exit 255, nothing started.
    let dir = tempdir();
    let by_name = ("nosuch1", 9).to_socket_addrs().expect_err("nosuch1 does not resolve");
    let by_name = by_name.to_string();
    let by_name = by_name.split(" (os error").next().unwrap();
    let scontrol = std::process::Command::new("scontrol")
        .args(["-o", "show", "node", "nosuch1,nosuch2"])
        .output()
        .expect("scontrol runs (./test.sh installs slurm-client)");
    let said = String::from_utf8_lossy(&scontrol.stderr);
    let last = said.lines().rev().find(|l| !l.trim().is_empty()).unwrap().trim().to_string();
    let last = if last.len() > 64 { cut(&last) } else { last };
    let line = format!(
        "cannot find the address that reaches nosuch1 to listen on for its proxy (its name: \
         {by_name}; Slurm's NodeAddr: scontrol failed ({}): {last}); give --bind-address",
        scontrol.status
    );
    let run = Run::new(&["--launcher", "slurm", "--hosts", "nosuch1,nosuch2", "-n", "1", "true"]);
    refused_alone(&dir, run, &line, 255);
}
