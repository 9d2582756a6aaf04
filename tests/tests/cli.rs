//! The drop-in command line: Hydra's and Open MPI's spellings, MPMD segments, configfiles,
//! the ranks' environment and working directory, settings from the environment, help and
//! the one-line errors. Every test checks what the ranks really saw (their environment,
//! directory, arguments and host), printed by `rankprog`.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use rlaunch_tests::output::{by_rank, envs_by_rank};
use rlaunch_tests::{fakessh, rankprog_str, Run};

/// The host each rank was placed on (fake hosts under `--launcher fork`).
fn hosts_of(lines: &[String]) -> Vec<String> {
    envs_by_rank(lines)
        .values()
        .map(|env| env["MPIR_CVAR_CH3_INTERFACE_HOSTNAME"].clone())
        .collect()
}

fn one_line_error(out: &rlaunch_tests::Outcome, culprit: &str) {
    out.assert_code(2);
    let err = out.stderr_str();
    assert_eq!(err.lines().count(), 1, "not one line:\n{err}");
    assert!(err.starts_with("rlaunch: ") && err.contains(culprit), "{err}");
}

#[test]
fn hydra_and_open_mpi_host_spellings_place_the_same_ranks() {
    let dir = rlaunch_tests::tempdir();
    let file = dir.path().join("hosts");
    std::fs::write(&file, "n1:2\nn2 slots=2\n").unwrap();
    let file = file.to_str().unwrap();
    let spellings: &[&[&str]] = &[
        &["--launcher", "fork", "--hosts", "n1:2,n2:2", "--np", "4"],
        &["-launcher", "fork", "-hosts", "n1:2,n2:2", "-np", "4"],
        &["-bootstrap", "fork", "-f", file, "-n", "4"],
        &["--launcher=fork", "-machinefile", file, "-n", "4"],
        &["--launcher", "fork", "--hostfile", file, "-np", "4"],
        &["--launcher", "fork", "-H", "n1,n1,n2,n2", "-np", "4"],
        &["--launcher", "fork", "--host", "n1:2,n2:2"],
        &["--launcher", "fork", "-hosts", "n1,n2", "-ppn", "2", "-n", "4"],
        &["--launcher", "fork", "-H", "n1,n2", "--map-by", "ppr:2:node", "-np", "4"],
        &["--launcher", "fork", "-H", "n1,n2", "-N", "2", "-c", "4", "--oversubscribe"],
    ];
    for args in spellings {
        let out = Run::new(args).args(["-l", &rankprog_str(), "env"]).run();
        out.assert_code(0);
        assert_eq!(hosts_of(&out.lines()), ["n1", "n1", "n2", "n2"], "{args:?}");
    }
    for by_node in [&["--map-by", "node"][..], &["-map-by", "node"], &["--bynode"]] {
        let out = Run::new(&["--launcher", "fork", "-hosts", "n1:2,n2:2", "-n", "4"])
            .args(by_node)
            .args(["-l", &rankprog_str(), "env"])
            .run();
        assert_eq!(hosts_of(&out.lines()), ["n1", "n2", "n1", "n2"], "{by_node:?}");
    }
}

#[test]
fn mpmd_segments_number_ranks_across_and_keep_their_own_options() {
    let dir = rlaunch_tests::tempdir();
    let d = dir.path().to_str().unwrap();
    let out = Run::new(&["-l", "--launcher", "fork", "-hosts", "n1:2,n2:2"])
        .args(["-n", "1", "-env", "ROLE", "master", &rankprog_str(), "env", "cwd", "echo", "a1"])
        .args([":", "-n", "2", "-env", "ROLE=worker", "-wdir", d, &rankprog_str(), "env", "cwd"])
        .args([":", "-n", "1", "-hosts", "n3", &rankprog_str(), "env", "cwd"])
        .run();
    out.assert_code(0);
    let envs = envs_by_rank(&out.lines());
    let lines = by_rank(&out.lines());
    let here = std::env::current_dir().unwrap();
    assert_eq!(envs.len(), 4, "{out}");
    assert_eq!(envs[&0]["ROLE"], "master");
    assert!(lines[&0].contains(&"a1".to_string()), "{out}");
    assert!(lines[&0].contains(&here.display().to_string()), "{out}");
    for r in [1, 2] {
        assert_eq!(envs[&r]["ROLE"], "worker");
        assert!(lines[&r].contains(&d.to_string()), "{out}");
    }
    assert!(!envs[&3].contains_key("ROLE"), "-env leaked into another segment");
    // Segments on the same hosts continue their slots; the third has its own host.
    assert_eq!(hosts_of(&out.lines()), ["n1", "n1", "n2", "n3"]);
    for env in envs.values() {
        assert_eq!(env["PMI_SIZE"], "4");
    }
}

#[test]
fn a_configfile_holds_the_segments() {
    let dir = rlaunch_tests::tempdir();
    let conf = dir.path().join("job.conf");
    let text = format!(
        "# a master and two workers\n-n 1 -env ROLE master {rp} echo 'two words'\n\n\
         -n 2 -env ROLE worker \\\n   {rp} echo \"x\\\"y\"   # workers\n",
        rp = rankprog_str()
    );
    std::fs::write(&conf, text).unwrap();
    let out = Run::new(&["-l", "-configfile", conf.to_str().unwrap()]).run();
    out.assert_code(0);
    let lines = by_rank(&out.lines());
    assert_eq!(lines[&0], ["two words"], "{out}");
    assert_eq!(lines[&1], ["x\"y"], "{out}");
    assert_eq!(lines[&2], ["x\"y"], "{out}");

    std::fs::write(&conf, format!("-n 1 {rp} cwd\n-n 2 -nn 3 {rp} cwd\n", rp = rankprog_str()))
        .unwrap();
    let out = Run::new(&["-configfile", conf.to_str().unwrap()]).run();
    one_line_error(&out, &format!("{}:2: unknown option '-nn'", conf.display()));
    let out = Run::new(&["-configfile", conf.to_str().unwrap(), &rankprog_str()]).run();
    one_line_error(&out, "either in the file or on the command line");
    let out = Run::new(&["-configfile", "/nonexistent/job.conf"]).run();
    one_line_error(&out, "cannot read /nonexistent/job.conf");
}

#[test]
fn environment_options_decide_what_ranks_see() {
    let run = |args: &[&str]| {
        let out = Run::new(&["-l", "-n", "1"])
            .args(args)
            .args([&rankprog_str(), "env"])
            .env("FWD_A", "a")
            .env("FWD_B", "b")
            .run();
        out.assert_code(0);
        envs_by_rank(&out.lines()).remove(&0).expect("rank 0")
    };
    // Hydra's default: everything.
    let env = run(&[]);
    assert_eq!((env["FWD_A"].as_str(), env["FWD_B"].as_str()), ("a", "b"));
    let env = run(&["-genv", "G", "1", "--genv", "H=2", "-x", "X=3", "-x", "FWD_A=over"]);
    assert_eq!(
        (&env["G"], &env["H"], &env["X"], &env["FWD_A"]),
        (&"1".into(), &"2".into(), &"3".into(), &"over".into())
    );
    // Later wins.
    assert_eq!(run(&["-x", "V=1", "-genv", "V", "2"])["V"], "2");
    assert_eq!(run(&["-genv", "V", "2", "-x", "V=1"])["V"], "1");
    // Only what is named.
    let env = run(&["-genvnone", "-genv", "G", "1", "-x", "FWD_B"]);
    assert!(!env.contains_key("FWD_A") && !env.contains_key("PATH"), "{env:?}");
    assert_eq!((&env["G"], &env["FWD_B"]), (&"1".into(), &"b".into()));
    assert_eq!(env["PMI_RANK"], "0", "rlaunch's own variables are always set");
    let env = run(&["-genvlist", "FWD_A,PATH"]);
    assert!(env.contains_key("FWD_A") && env.contains_key("PATH") && !env.contains_key("FWD_B"));
    assert!(run(&["-genvnone", "-genvall"]).contains_key("FWD_B"));
    // A segment's own filter and pairs sit above the global ones.
    let env = run(&["-genv", "G", "1", "-envnone", "-env", "E", "2"]);
    assert!(!env.contains_key("FWD_A"), "{env:?}");
    assert_eq!((&env["G"], &env["E"]), (&"1".into(), &"2".into()));
    let env = run(&["-genvnone", "-envall"]);
    assert!(env.contains_key("FWD_A"));
    let env = run(&["-envlist", "FWD_B", "-genv", "G", "1", "-env", "G", "seg"]);
    assert!(!env.contains_key("FWD_A") && env.contains_key("FWD_B"));
    assert_eq!(env["G"], "seg");

    let out = Run::new(&["-genv", "=x", &rankprog_str(), "env"]).run();
    one_line_error(&out, "-genv =x: empty variable name");
    let out = Run::new(&["-genv", "ONLY_A_NAME"]).run();
    one_line_error(&out, "-genv needs a value after ONLY_A_NAME");
}

#[test]
fn the_working_directory_is_rlaunchs_unless_told() {
    let dir = rlaunch_tests::tempdir();
    std::fs::create_dir(dir.path().join("sub")).unwrap();
    let sub = dir.path().join("sub").canonicalize().unwrap();
    let cwd_of = |args: &[&str]| {
        let out = Run::new(args).args([&rankprog_str(), "cwd"]).current_dir(dir.path()).run();
        out.assert_code(0);
        PathBuf::from(out.lines()[0].clone())
    };
    assert_eq!(cwd_of(&[]), dir.path().canonicalize().unwrap());
    assert_eq!(cwd_of(&["-wdir", "sub"]), sub, "relative to rlaunch's directory");
    assert_eq!(cwd_of(&["--wdir", sub.to_str().unwrap()]), sub);
    assert_eq!(cwd_of(&["-wd", "sub"]), sub);

    let out = Run::new(&["-n", "2", "-wdir", "/nonexistent/dir", &rankprog_str(), "cwd"]).run();
    out.assert_code(126);
    let err = out.stderr_str();
    assert!(err.contains("working directory /nonexistent/dir: No such file or directory"), "{err}");
}

#[test]
fn settings_come_from_the_environment_when_the_command_line_is_silent() {
    let dir = rlaunch_tests::tempdir();
    let (a, b) = (dir.path().join("a"), dir.path().join("b"));
    std::fs::write(&a, "na1\nna2\n").unwrap();
    std::fs::write(&b, "nb1\n").unwrap();
    let hosts = |run: Run| {
        let out = run.args(["-l", "-n", "2", &rankprog_str(), "env"]).run();
        out.assert_code(0);
        hosts_of(&out.lines())
    };
    let base = || Run::new(&[]).env("HYDRA_LAUNCHER", "fork").env("HYDRA_HOST_FILE", &a);
    assert_eq!(hosts(base()), ["na1", "na2"]);
    assert_eq!(hosts(base().env("RLAUNCH_HOSTFILE", &b)), ["nb1", "nb1"]);
    assert_eq!(hosts(base().env("RLAUNCH_HOSTFILE", &b).args(["-hosts", "nc"])), ["nc", "nc"]);

    let out = base().env("RLAUNCH_LAUNCHER", "pbs").args([&rankprog_str(), "env"]).run();
    one_line_error(&out, "RLAUNCH_LAUNCHER pbs: expected fork, ssh, rsh, slurm, sge or lsf");

    // HYDRA_LAUNCHER_EXEC is the remote shell; RLAUNCH_LAUNCHER_EXEC wins over it.
    let out = Run::new(&["-hosts", "r1,r2", "-l", "-n", "2", &rankprog_str(), "env"])
        .env("HYDRA_LAUNCHER", "ssh")
        .env("HYDRA_LAUNCHER_EXEC", "/nonexistent/ssh")
        .env("RLAUNCH_LAUNCHER_EXEC", fakessh())
        .run();
    out.assert_code(0);
    assert_eq!(hosts_of(&out.lines()), ["r1", "r2"]);
    let out = Run::new(&["-hosts", "r1", "-n", "1", &rankprog_str(), "env"])
        .env("HYDRA_LAUNCHER_EXEC", "/nonexistent/ssh")
        .run();
    out.assert_code(255);
    assert!(out.stderr_str().contains("r1"), "{out}");

    let start = Instant::now();
    let out = Run::new(&["-n", "1", &rankprog_str(), "sleep", "60"])
        .env("MPIEXEC_TIMEOUT", "100")
        .env("RLAUNCH_TIMEOUT", "1")
        .run();
    out.assert_code(124);
    assert!(start.elapsed() < Duration::from_secs(20));
}

#[test]
fn unknown_options_get_one_line_with_a_suggestion() {
    let rp = rankprog_str();
    one_line_error(
        &Run::new(&["-hostz", "a", &rp]).run(),
        "unknown option '-hostz'; did you mean '-hosts'?",
    );
    one_line_error(&Run::new(&["--tree-wdith", "2", &rp]).run(), "did you mean '--tree-width'?");
    one_line_error(&Run::new(&["-genvlits", "A", &rp]).run(), "did you mean '-genvlist'?");
    one_line_error(&Run::new(&["--outptu-filename", "d", &rp]).run(), "'--output-filename'");
    one_line_error(&Run::new(&["-n", "x", &rp]).run(), "-n x: expected a number of ranks");
    one_line_error(&Run::new(&["-n", "1", &rp, "args", ":"]).run(), "followed by a program");
    one_line_error(&Run::new(&["--map-by", "ppr:2:bogus", &rp]).run(), "ppr:N:UNIT");
    one_line_error(&Run::new(&["--bind-to", "corez", &rp]).run(), "--bind-to corez");
    one_line_error(&Run::new(&["-n", "2"]).run(), "no program given");
}

#[test]
fn options_of_other_launchers_are_accepted_as_mpirun_and_mpiexec_take_them() {
    // `--mca` goes to the ranks as mpirun passes it; flags typed out of habit that ask for
    // nothing new are quiet; an option whose meaning is lost here gets one note.
    let out = Run::new(&["-demux", "poll", "--mca", "btl", "tcp", "-mca", "pml=ob1"])
        .args(["--allow-run-as-root", "--oversubscribe", "-q"])
        .args(["-n", "2", &rankprog_str(), "env"])
        .run();
    out.assert_code(0);
    let lines = out.lines();
    for var in ["OMPI_MCA_btl=tcp", "OMPI_MCA_pml=ob1"] {
        assert_eq!(lines.iter().filter(|l| *l == var).count(), 2, "{var} in each rank: {out}");
    }
    let notes: Vec<String> = out.stderr_lines();
    assert_eq!(notes.len(), 1, "{out}");
    assert!(notes[0].starts_with("rlaunch: note: -demux has no effect: "), "{out}");
}

#[test]
fn help_is_short_help_all_lists_every_spelling() {
    let out = Run::new(&["--help"]).run();
    out.assert_code(0);
    let short = out.stdout_str();
    for needed in ["-n, --np N", "--hosts", "--genv", "--wdir", "--outfile-pattern", "Exit status:"]
    {
        assert!(short.contains(needed), "--help lacks {needed}:\n{short}");
    }
    // One screen: the options, then the exit status table (which wraps to two more lines
    // since its 128+S row says what Ctrl-C ends with).
    assert!(!short.contains("-genvlist") && short.lines().count() <= 64, "{short}");
    let out = Run::new(&["--help-all"]).run();
    out.assert_code(0);
    let all = out.stdout_str();
    let issue = "-n -np -ppn -f -hosts -hostfile -machinefile -genv -genvall -genvnone -genvlist \
        -env -envall -envnone -envlist -wdir -configfile -l -prepend-rank -launcher \
        -launcher-exec -bootstrap -print-all-exitcodes -outfile-pattern -errfile-pattern \
        -prepend-pattern -bind-to -map-by -iface -v -verbose -info -version -H --host \
        --hostfile --oversubscribe -x --tag-output --output-filename --timestamp-output \
        --map-by --bind-to --report-bindings --wdir --stdin";
    for name in issue.split_whitespace() {
        let listed = all
            .lines()
            .any(|l| l.trim_start().starts_with('-') && l.split([',', ' ']).any(|w| w == name));
        assert!(listed, "--help-all does not list {name}");
    }
    assert_eq!(Run::new(&["-h"]).run().stdout_str(), short);
}

#[test]
fn version_and_info_say_what_rlaunch_is() {
    // The version, the commit it was built from (the tests run on the tree it was built
    // from), and the PMIx built in: what `mpirun --version` callers read.
    let git = |args: &[&str]| {
        let out = std::process::Command::new("git")
            .current_dir(env!("CARGO_MANIFEST_DIR"))
            .args(args)
            .output()
            .expect("git runs");
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    };
    let commit = git(&["rev-parse", "--short=12", "HEAD"]);
    let pmix = std::process::Command::new("pkg-config").args(["--modversion", "pmix"]).output();
    let pmix = String::from_utf8_lossy(&pmix.expect("pkg-config runs").stdout).trim().to_string();
    let out = Run::new(&["--version"]).run();
    out.assert_code(0);
    let want =
        format!("rlaunch {} (commit {commit}, PMIx: OpenPMIx {pmix})\n", env!("CARGO_PKG_VERSION"));
    assert_eq!(out.stdout_str(), want);
    assert_eq!(Run::new(&["-version"]).run().stdout_str(), out.stdout_str());
    let out = Run::new(&["-info"]).run();
    out.assert_code(0);
    let info = out.stdout_str();
    let needed = ["launchers:", "ssh", "fork", "PMI-1", "PMI-2", "rlaunch-proxy", "binding:"];
    // Every unit of --bind-to and --map-by, and the GPU makers (tests/tests/gpus.rs checks
    // the `this node:` line on fake machines).
    let units = ["l3cache", "ppr:N:UNIT", ":PE=N", "NVIDIA, AMD and Intel", "this node:"];
    for needed in needed.into_iter().chain(units) {
        assert!(info.contains(needed), "-info lacks {needed}:\n{info}");
    }
}

#[test]
fn an_unknown_option_is_refused_not_run_as_the_program() {
    let out = Run::new(&["-n", "1", "--prepend-rnk", "true"]).run();
    out.assert_code(2);
    assert!(out.stderr_str().contains("'--prepend-rnk'"), "{out}");
    assert!(out.stderr_str().contains("'--prepend-rank'"), "{out}");
    // After the program, everything is the program's.
    let out =
        Run::new(&["-n", "1", "sh", "-c", "printf '%s|' \"$@\"", "sh", "-n", "--bogus"]).run();
    out.assert_code(0);
    assert_eq!(out.stdout_str(), "-n|--bogus|", "{out}");
}

#[test]
fn a_silence_timeout_within_the_heartbeat_is_refused() {
    let out = Run::new(&["--heartbeat", "3", "--silence-timeout", "2", "true"]).run();
    one_line_error(&out, "--silence-timeout 2: must be longer than the heartbeat (3 s)");
    let out = Run::new(&["--heartbeat", "0", "true"]).run();
    one_line_error(&out, "--heartbeat 0: must be at least 0.001 seconds");
    // Within reason, a job runs with them.
    let out =
        Run::new(&["--heartbeat", "0.05", "--silence-timeout", "0.5", "-n", "2", "true"]).run();
    out.assert_code(0);
}

#[test]
fn iface_names_the_interface_rlaunch_listens_on() {
    // Hydra's -iface: the address proxies that dial back reach rlaunch at.
    Run::new(&["-iface", "lo", "-n", "1", "true"]).run().assert_code(0);
    let out = Run::new(&["--iface", "rl-nosuch0", "true"]).run();
    one_line_error(&out, "--iface rl-nosuch0: no interface of that name has an IPv4 address");
    assert!(out.stderr_str().contains("(these do: ") && out.stderr_str().contains("lo"), "{out}");
}

/// Runs `command` to completion; panics with what it said unless it succeeds. Its stdout.
fn succeeds(command: &mut std::process::Command) -> String {
    let out = command.output().unwrap_or_else(|e| panic!("cannot run {command:?}: {e}"));
    let said = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
    assert!(
        out.status.success(),
        "{command:?}: {}\n{}{}",
        out.status,
        said(&out.stdout),
        said(&out.stderr)
    );
    said(&out.stdout)
}

#[test]
fn make_install_puts_binaries_manual_completions_and_mpi_names_under_a_prefix() {
    let prefix = rlaunch_tests::tempdir();
    let repo = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
    // The binaries this test run built (no cargo inside cargo test: it holds the build lock).
    let built = rlaunch_tests::rlaunch().parent().unwrap().to_path_buf();
    succeeds(std::process::Command::new("make").current_dir(repo).args([
        "-s".to_string(),
        "install-mpi-links".into(),
        format!("PREFIX={}", prefix.path().display()),
        format!("BUILT={}", built.display()),
    ]));
    let bin = prefix.join("bin");

    // A job from the prefix: rlaunch finds the rlaunch-proxy installed beside it.
    let out = Run::program(bin.join("rlaunch"), &["-n", "2", &rankprog_str(), "echo", "ran"]).run();
    out.assert_code(0);
    assert_eq!(out.lines(), ["ran", "ran"], "{out}");
    // `mpirun --version`, which Ray's MPI runtime and Lightning's Jittor strategy run first.
    let out = Run::program(bin.join("mpirun"), &["--version"]).run();
    out.assert_code(0);
    assert!(out.stdout_str().starts_with("rlaunch "), "{out}");
    // mpi4py's own hello as its documentation runs it, under mpiexec started detached, with
    // no terminal and stdin closed (as MPIClusterManagers.jl's mpirun_cmd does): Debian's
    // mpi4py is an Open MPI program under python, served PMIx when it connects.
    let mpiexec = bin.join("mpiexec").display().to_string();
    let args = ["-w", &mpiexec, "-n", "2", "/usr/bin/python3", "-m", "mpi4py.bench", "helloworld"];
    let out = Run::program("setsid", &args).run();
    out.assert_code(0);
    let host = rlaunch_tests::hosts::hostname();
    let want: Vec<String> =
        (0..2).map(|r| format!("Hello, World! I am process {r} of 2 on {host}.")).collect();
    assert_eq!(rlaunch_tests::output::sorted(out.lines()), want, "{out}");
    // dask-mpi's batch example as its documentation runs it: `mpirun -np 4 python script.py`
    // (rank 0 the scheduler, rank 1 the client, two workers), with PyPI's dask-mpi in the
    // venv test.sh makes.
    let venv = rlaunch_tests::venv_python("dask-mpi");
    let script = repo.join("tests/scripts/dask_job.py").display().to_string();
    let out = Run::program(bin.join("mpirun"), &["-np", "4", &venv, &script]).run();
    out.assert_code(0);
    assert_eq!(out.lines(), ["sum 499500 workers 2"], "{out}");
    assert_eq!(rlaunch_tests::output::rlaunch_lines(&out.stderr_str()), Vec::<&str>::new());

    // The manual, rendered as man shows it, names every spelling of every option.
    let man = prefix.join("share/man/man1/rlaunch.1");
    let page = succeeds(
        std::process::Command::new("man")
            .arg("-l")
            .arg(&man)
            .env("LC_ALL", "C")
            .env("MANWIDTH", "200"),
    );
    assert!(page.starts_with("RLAUNCH(1)"), "{page}");
    for o in rlaunch::args::OPTIONS {
        for name in o.names {
            assert!(page.contains(name), "the manual lacks {name}");
        }
    }
    assert!(std::fs::read_link(prefix.join("share/man/man1/mpirun.1")).is_ok());

    // bash completes option names, and a hostfile's path after -f.
    let hosts = prefix.join("myhosts");
    std::fs::write(&hosts, "localhost\n").unwrap();
    let completion = prefix.join("share/bash-completion/completions/rlaunch");
    let script = format!(
        "source {}; COMP_WORDS=(mpirun --hos); COMP_CWORD=1; _rlaunch; echo ${{COMPREPLY[@]}}; \
         COMP_WORDS=(rlaunch -f {}/myh); COMP_CWORD=2; _rlaunch; echo ${{COMPREPLY[@]}}",
        completion.display(),
        prefix.path().display()
    );
    let said = succeeds(std::process::Command::new("bash").args(["-c", &script]));
    assert_eq!(said, format!("--hosts --host --hostfile\n{}\n", hosts.display()));
    // zsh reads its script; fish completes from its own.
    let zsh = prefix.join("share/zsh/site-functions/_rlaunch");
    succeeds(std::process::Command::new("zsh").arg("-n").arg(&zsh));
    let fish = prefix.join("share/fish/vendor_completions.d/rlaunch.fish");
    let script = format!("source {}; complete -C 'rlaunch --hostf'", fish.display());
    let said = succeeds(std::process::Command::new("fish").args(["--no-config", "-c", &script]));
    assert!(said.starts_with("--hostfile\t"), "{said}");
}
