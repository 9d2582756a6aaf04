//! Each node's PMIx server as Open MPI programs meet it: process sets rlaunch defines, MPICH
//! still served PMI-1 beside it, a server only where a program can use it and started late
//! (when a rank connects) for a shell's job, a program that loads Open MPI its own way, a
//! build without PMIx, and a server that cannot serve or never starts (the job fails naming
//! the node, or its ranks are reported never run), a server lost mid-job (its node still
//! takes part in the fences), and the files a killed proxy's server left.

use std::time::Duration;

use rlaunch_tests::hosts::hostname;
use rlaunch_tests::mpi::{
    check_hello, fake_nodes, mpi_run, via_library, CProgram, LibraryPath, MPI_LIMIT,
};
use rlaunch_tests::output::{report_field, rlaunch_lines, sorted};
use rlaunch_tests::Run;

#[test]
fn process_sets_are_defined_by_rlaunch_and_seen_by_pmix_clients() {
    let options = [fake_nodes(2, 2), vec!["--pset".into(), "io=0-2".into()]].concat();
    let out = Run::new(&[])
        .args(options)
        .args(["-n", "2", &CProgram::Psets.path_str(), ":", "-n", "2"])
        .arg(CProgram::Psets.path_str())
        .timeout(MPI_LIMIT)
        .run();
    out.assert_code(0);
    let want = [
        "psets 5",
        "pset rlaunch://app/0: 0 1",
        "pset rlaunch://app/1: 2 3",
        "pset rlaunch://node/n1: 0 1",
        "pset rlaunch://node/n2: 2 3",
        "pset io: 0 1 2",
    ];
    assert_eq!(out.lines(), want, "{out}");
}

#[test]
fn bad_process_sets_are_refused_naming_the_option() {
    let out = Run::new(&["--pset", "io=0-9", "-n", "2", "true"]).run();
    out.assert_code(2);
    assert_eq!(
        out.stderr_str(),
        "rlaunch: --pset io: rank 9 is beyond the job's 2 ranks\n",
        "{out}"
    );
}

#[test]
fn mpich_is_served_pmi_on_proxies_that_serve_pmix() {
    let out = mpi_run(&["--pmi".into(), "all".into()], 4, CProgram::Hello, &["4"]).run();
    check_hello(&out, 4);
    let out = mpi_run(
        &[fake_nodes(2, 2), vec!["--pmi".into(), "all".into()]].concat(),
        4,
        CProgram::Hello,
        &["4"],
    )
    .run();
    check_hello(&out, 4);
}

#[test]
fn pmix_is_served_only_where_a_program_can_use_it() {
    // sh can start anything: served. `--pmi simple`: never.
    let env = |options: &[&str]| {
        let out = Run::new(options).args(["-n", "1", "sh", "-c", "env"]).timeout(MPI_LIMIT).run();
        out.assert_code(0);
        out.lines().iter().any(|l| l.starts_with("PMIX_NAMESPACE="))
    };
    assert!(env(&[]), "sh gets a PMIx server by default");
    assert!(!env(&["--pmi", "simple"]), "--pmi simple starts no PMIx server");
}

#[test]
fn an_open_mpi_program_reached_through_a_library_of_its_own_sees_its_whole_world() {
    // The program links only libmpihello.so, which links Open MPI: found through the
    // program's RUNPATH ($ORIGIN/lib), or through LD_LIBRARY_PATH in the job's environment.
    for path in [LibraryPath::OriginRunpath, LibraryPath::Environment] {
        let program = via_library(path);
        let lib = program.parent().unwrap().join("lib");
        let env = match path {
            LibraryPath::OriginRunpath | LibraryPath::Dlopen => vec![],
            LibraryPath::Environment => {
                vec!["-genv".to_string(), "LD_LIBRARY_PATH".into(), lib.display().to_string()]
            }
        };
        for nodes in [vec![], fake_nodes(2, 2)] {
            let out = Run::new(&[]).args(&env).args(&nodes).args(["-n", "4"]);
            let out = out.arg(program).arg("4").timeout(MPI_LIMIT).run();
            check_hello(&out, 4);
        }
    }
}

/// rlaunch's line about a rank served no PMIx that started Open MPI alone.
fn singleton_line(rank: u32, pid: u32, host: &str) -> String {
    format!(
        "rlaunch: rank {rank} (pid {pid} on {host}) started Open MPI as a singleton, which \
         would compute alone: it needs PMIx, which it was not served (run with --pmi pmix)"
    )
}

/// Checks a job whose ranks were served no PMIx and started Open MPI: exit 255, one line
/// naming one of its ranks on its node (`hosts`: each rank's), no rank computed, nothing
/// left.
fn check_singleton(out: &rlaunch_tests::Outcome, hosts: &[&str]) {
    out.assert_code(255);
    let err = out.stderr_str();
    let ours = rlaunch_lines(&err);
    assert_eq!(ours.len(), 1, "{out}");
    let named = (0..hosts.len() as u32).any(|rank| {
        let prefix = format!("rlaunch: rank {rank} (pid ");
        let pid = ours[0].strip_prefix(&prefix).and_then(|r| r.split(' ').next());
        let pid = pid.and_then(|p| p.parse().ok()).unwrap_or(0);
        pid > 0 && ours[0] == singleton_line(rank, pid, hosts[rank as usize])
    });
    assert!(named, "{out}");
    assert!(out.lines().is_empty(), "no rank computed alone: {out}");
    out.tag.wait_until_none(Duration::from_secs(5)).unwrap_or_else(|left| {
        panic!("left running: {left:?}");
    });
}

#[test]
fn an_open_mpi_rank_served_no_pmix_fails_the_job_naming_it_instead_of_computing_alone() {
    // `--pmi simple`: the user said no PMIx; each rank would be a world of one.
    let simple = ["--pmi".to_string(), "simple".to_string()];
    let out = mpi_run(&simple, 2, CProgram::OmpiHello, &["2"]).run();
    let here = hostname();
    check_singleton(&out, &[&here, &here]);
    let fake = [simple.to_vec(), fake_nodes(2, 1)].concat();
    let out = mpi_run(&fake, 2, CProgram::OmpiHello, &["2"]).run();
    check_singleton(&out, &["n1", "n2"]);
}

#[test]
fn a_program_that_loads_open_mpi_by_a_name_no_file_shows_is_caught_not_run_alone() {
    // Only the library the program links knows, at run time, that it loads Open MPI: by
    // default no PMIx is served, and the trap names the rank; `--pmi pmix` serves it.
    let program = via_library(LibraryPath::Dlopen);
    let hello = program.parent().unwrap().join("lib").join("libmpihello.so");
    let env = ["-genv".to_string(), "MPI_HELLO_LIBRARY".into(), hello.display().to_string()];
    for (nodes, hosts) in
        [(vec![], vec![hostname(); 2]), (fake_nodes(2, 1), vec!["n1".into(), "n2".into()])]
    {
        let run = Run::new(&[]).args(&env).args(&nodes).args(["-n", "2"]).arg(program);
        let out = run.arg("2").timeout(MPI_LIMIT).run();
        let hosts: Vec<&str> = hosts.iter().map(String::as_str).collect();
        check_singleton(&out, &hosts);
        let run = Run::new(&["--pmi", "pmix"]).args(&env).args(&nodes).args(["-n", "2"]);
        let out = run.arg(program).arg("2").timeout(MPI_LIMIT).run();
        check_hello(&out, 2);
    }
}

#[test]
fn a_build_without_pmix_is_quiet_where_no_pmix_is_needed_and_says_what_to_install_where_it_is() {
    let rlaunch = rlaunch_tests::rlaunch_without_pmix();
    let run = |args: &[&str]| Run::program(&rlaunch, args).timeout(MPI_LIMIT);
    let get = "rebuild rlaunch with OpenPMIx's development files installed (Debian and Ubuntu: \
               libpmix-dev; RHEL and its rebuilds: pmix-devel)";
    let fake = ["--launcher", "fork", "--hosts", "n1,n2"];
    // A shell's ranks, which may use PMIx and do not: not a word of it.
    let out = run(&fake).args(["-n", "2", "sh", "-c", "echo ran"]).run();
    out.assert_code(0);
    assert_eq!(out.lines(), ["ran", "ran"], "{out}");
    assert_eq!(out.stderr_str(), "", "{out}");
    // Open MPI's hello needs it: one line for the job before anything starts (rlaunch forks
    // its machine's proxies from itself: they have no PMIx either); `--pmi pmix` likewise.
    let out = run(&fake).args(["-n", "2", &CProgram::OmpiHello.path_str(), "2"]).run();
    let want = format!(
        "rlaunch: the program needs PMIx (it links Open MPI or libpmix), which this rlaunch \
         was built without; {get}"
    );
    assert_eq!(out.stderr_str(), format!("{want}\n"), "{out}");
    out.assert_code(255);
    assert!(out.lines().is_empty(), "no rank ran: {out}");
    let out = run(&["--pmi", "pmix", "-n", "1", "true"]).run();
    let want =
        format!("rlaunch: --pmi pmix asks for PMIx, which this rlaunch was built without; {get}");
    assert_eq!(out.stderr_str(), format!("{want}\n"), "{out}");
    out.assert_code(255);
    // A shell that starts Open MPI's hello: caught as it would start alone.
    let script = format!("exec {} 2", CProgram::OmpiHello.path_str());
    let out = run(&fake).args(["-n", "2", "sh", "-c", &script]).run();
    out.assert_code(255);
    let err = out.stderr_str();
    let ours = rlaunch_lines(&err);
    let tail = format!(
        "started Open MPI as a singleton, which would compute alone: it needs PMIx, which this \
         rlaunch was built without; {get}"
    );
    assert!(ours.len() == 1 && ours[0].ends_with(&tail), "{out}");
    // `--pmi all` asks for it: one note for the job, not one a node; MPICH runs on PMI.
    let hello = CProgram::Hello.path_str();
    let all = [&fake[..], &["--pmi", "all", "-n", "2", &hello, "2"]].concat();
    let out = run(&all).run();
    let note = format!("rlaunch: PMIx is not served: this rlaunch was built without it; {get}");
    assert_eq!(rlaunch_lines(&out.stderr_str()), [note], "{out}");
    let lines: Vec<String> = out.lines();
    assert_eq!(lines.len(), 2, "{out}");
    assert!(lines.iter().all(|l| l.contains(" size 2 sum 1 ")), "{out}");
    // `--info` says what is missing and how to get it.
    let out = run(&["--info"]).run();
    out.assert_code(0);
    let info = out.stdout_str();
    assert!(
        info.contains(
            "  PMIx:       not built in: Open MPI programs cannot run (MPICH's can); to have it,\n"
        ),
        "{info}"
    );
    assert!(info.contains(&format!("\n              {get}\n")), "{info}");
}

#[test]
fn a_shell_jobs_server_starts_only_when_a_rank_connects() {
    // sh may start an Open MPI program: its ranks are told of a server at once, and the
    // server starts when the first of them connects, on every fake node; until then none
    // runs.
    let hello = CProgram::OmpiHello.path_str();
    let script = format!("echo waiting; read x; exec {hello} 4");
    let mut job = Run::new(&[])
        .args(fake_nodes(2, 2))
        .args(["--stdin", "all", "-n", "4", "sh", "-c", &script])
        .stdin_piped()
        .timeout(MPI_LIMIT)
        .spawn();
    for _ in 0..4 {
        job.wait_for_line(|l| l == "waiting", MPI_LIMIT);
    }
    let servers = |job: &rlaunch_tests::Job| {
        let procs = rlaunch_tests::tagged_processes(job.tag());
        procs.into_iter().filter(|p| p.comm == "rlaunch-pmix").count()
    };
    assert_eq!(servers(&job), 0, "no rank has connected yet");
    job.write_stdin(b"go\n");
    let out = job.wait(MPI_LIMIT);
    let lines: Vec<String> = out.lines().into_iter().filter(|l| l != "waiting").collect();
    let sizes =
        lines.iter().filter(|l| l.starts_with("rank ") && l.contains(" size 4 sum 6 ")).count();
    assert_eq!(sizes, 4, "one world of 4: {out}");
    out.assert_code(0);
    assert!(rlaunch_lines(&out.stderr_str()).is_empty(), "{out}");
}

#[test]
fn a_late_servers_environment_is_what_the_library_gives_its_clients() {
    // The variables a late server's ranks get before it starts are written by rlaunch; the
    // ones a server that starts with the node gives come from PMIx_server_setup_fork. Any
    // difference but the server's address, files and data stores is a libpmix rlaunch does
    // not know.
    let env = |options: &[&str]| -> std::collections::BTreeMap<String, String> {
        let out = Run::new(options).args(["-n", "1", "sh", "-c", "env"]).timeout(MPI_LIMIT).run();
        out.assert_code(0);
        let vars = out.lines().into_iter().filter(|l| l.starts_with("PMIX_"));
        vars.filter_map(|l| l.split_once('=').map(|(k, v)| (k.to_string(), v.to_string())))
            .collect()
    };
    let forked = env(&["--pmi", "all"]);
    let late = env(&[]);
    let names = |vars: &std::collections::BTreeMap<String, String>| {
        vars.keys().filter(|k| !k.starts_with("PMIX_DSTORE_")).cloned().collect::<Vec<_>>()
    };
    assert_eq!(names(&late), names(&forked), "late: {late:?}\nforked: {forked:?}");
    for same in ["PMIX_SECURITY_MODE", "PMIX_BFROP_BUFFER_TYPE", "PMIX_VERSION", "PMIX_HOSTNAME"] {
        assert_eq!(late[same], forked[same], "{same}");
    }
    assert_eq!(late["PMIX_RANK"], "0");
    let stores: Vec<&str> = forked["PMIX_GDS_MODULE"].split(',').collect();
    assert!(stores.contains(&late["PMIX_GDS_MODULE"].as_str()), "{late:?} {forked:?}");
    let uri = &late["PMIX_SERVER_URI41"];
    assert!(uri.contains(";tcp4://127.0.0.1:"), "{uri}");
    for name in ["PMIX_SERVER_URI4", "PMIX_SERVER_URI3", "PMIX_SERVER_URI2", "PMIX_SERVER_URI21"] {
        assert_eq!(&late[name], uri, "{name}");
    }
}

#[test]
fn info_names_the_pmix_library_built_in() {
    let version = std::process::Command::new("pkg-config").args(["--modversion", "pmix"]).output();
    let version = version.expect("pkg-config runs (./test.sh installs pkgconf)");
    let version = String::from_utf8_lossy(&version.stdout).trim().to_string();
    let out = Run::new(&["--info"]).run();
    out.assert_code(0);
    let want = format!(
        "  PMIx:       OpenPMIx {version} server on every node, for programs that can use it (--pmi)"
    );
    assert!(out.lines().contains(&want), "{out}");
}

#[test]
fn a_node_that_cannot_serve_pmix_fails_a_job_that_needs_it_and_not_one_that_does_not() {
    // A PMIx server needs a private directory; under an unusable TMPDIR it cannot start.
    // Open MPI's ranks would each run alone: the job ends naming the node instead.
    let out = mpi_run(&[], 2, CProgram::OmpiHello, &["2"]).env("TMPDIR", "/nonexistent").run();
    out.assert_code(255);
    let err = out.stderr_str();
    let ours = rlaunch_lines(&err);
    assert_eq!(ours.len(), 1, "{out}");
    let want = format!("rlaunch: lost proxy on {} (it cannot serve PMIx, which the program needs: /nonexistent/rlaunch-pmix.", hostname());
    assert!(ours[0].starts_with(&want), "{out}");
    assert!(ours[0].ends_with(": No such file or directory (os error 2))"), "{out}");
    assert!(out.lines().is_empty(), "no rank ran: {out}");
    // MPICH needs only PMI: a note, and the job runs.
    let all = ["--pmi".to_string(), "all".to_string()];
    let out = mpi_run(&all, 2, CProgram::Hello, &["2"]).env("TMPDIR", "/nonexistent").run();
    check_hello(&out, 2);
    assert!(out.stderr_str().contains("rlaunch: note: on "), "{out}");
}

/// Options that make every link of the tree, and each node's PMIx server, count as lost after
/// a second of silence.
const QUICK_LIVENESS: [&str; 4] = ["--heartbeat", "0.2", "--silence-timeout", "1"];

/// A run whose PMIx servers never become ready: hwloc, which libpmix starts with, reads the
/// node's topology from a FIFO that nobody writes (`fifo`, made here).
fn with_a_server_that_never_starts(run: Run, fifo: &std::path::Path) -> Run {
    nix::unistd::mkfifo(fifo, nix::sys::stat::Mode::S_IRWXU).unwrap();
    run.env("HWLOC_COMPONENTS", "xml").env("HWLOC_XMLFILE", fifo)
}

/// A job that ends while its ranks wait for their PMIx environments (a server slow to start:
/// here one that never does, and a timeout first): they never start, and each is reported
/// ended by the teardown's SIGTERM, as ranks that waited for a rendezvous are.
#[test]
fn ranks_that_wait_for_their_pmix_environments_when_the_job_ends_are_reported_never_run() {
    let tmp = rlaunch_tests::tempdir();
    let (fifo, report) = (tmp.path().join("topology"), tmp.path().join("report.json"));
    let options = ["--timeout", "2", "--report", report.to_str().unwrap(), "-n", "2"];
    let run = Run::new(&options).arg(CProgram::OmpiHello.path_str()).arg("2");
    let out = with_a_server_that_never_starts(run, &fifo).timeout(MPI_LIMIT).run();
    out.assert_code(124);
    let want = ["rlaunch: the job timed out after 2 s and was killed"];
    assert_eq!(rlaunch_lines(&out.stderr_str()), want, "{out}");
    assert!(out.lines().is_empty(), "no rank ran: {out}");
    assert_eq!(report_field(&report, 0, "signal"), [15, 15], "{out}");
    let never = serde_json::Value::Null;
    assert_eq!(report_field(&report, 0, "pid"), [never.clone(), never], "no pid: never run");
    out.tag.wait_until_none(Duration::from_secs(5)).unwrap_or_else(|left| {
        panic!("left running: {left:?}");
    });
}

#[test]
fn a_server_that_never_becomes_ready_fails_a_job_that_needs_pmix_and_not_one_that_does_not() {
    // Open MPI's ranks would each run alone: the job ends naming the node, and no rank ran.
    let tmp = rlaunch_tests::tempdir();
    let fifo = tmp.path().join("topology");
    let run = Run::new(&QUICK_LIVENESS).args(["-n", "2"]).arg(CProgram::OmpiHello.path_str());
    let out = with_a_server_that_never_starts(run.arg("2"), &fifo).timeout(MPI_LIMIT).run();
    out.assert_code(255);
    let want = format!(
        "rlaunch: lost proxy on {} (it cannot serve PMIx, which the program needs: the PMIx \
         server of this node did not answer for 1 s)",
        hostname()
    );
    assert_eq!(rlaunch_lines(&out.stderr_str()), [want], "{out}");
    assert!(out.lines().is_empty(), "no rank ran: {out}");
    out.tag.wait_until_none(Duration::from_secs(5)).unwrap_or_else(|left| {
        panic!("left running: {left:?}");
    });
    // sh needs no PMIx: with `--pmi all` its server starts with the node, and when it
    // cannot, a note, and the ranks start without it.
    std::fs::remove_file(&fifo).unwrap();
    let run = Run::new(&QUICK_LIVENESS).args([
        "--pmi",
        "all",
        "-n",
        "2",
        "sh",
        "-c",
        "echo ran ${PMIX_RANK-alone}",
    ]);
    let out = with_a_server_that_never_starts(run, &fifo).timeout(MPI_LIMIT).run();
    out.assert_code(0);
    let want = format!(
        "rlaunch: note: on {}: PMIx is not served on this node: the PMIx server of this node \
         did not answer for 1 s",
        hostname()
    );
    assert_eq!(rlaunch_lines(&out.stderr_str()), [want], "{out}");
    assert_eq!(out.lines(), ["ran alone", "ran alone"], "{out}");
    out.tag.wait_until_none(Duration::from_secs(5)).unwrap_or_else(|left| {
        panic!("left running: {left:?}");
    });
    // By default sh's ranks start at once, and the server only when one of them connects:
    // that rank needs it, so a server that never becomes ready then ends the job.
    std::fs::remove_file(&fifo).unwrap();
    let hello = format!("exec {} 2", CProgram::OmpiHello.path_str());
    let run = Run::new(&QUICK_LIVENESS).args(["-n", "2", "sh", "-c", &hello]);
    let out = with_a_server_that_never_starts(run, &fifo).timeout(MPI_LIMIT).run();
    out.assert_code(255);
    let want = format!(
        "rlaunch: lost proxy on {} (it cannot serve PMIx, which the program needs: the PMIx \
         server of this node did not answer for 1 s)",
        hostname()
    );
    let err = out.stderr_str();
    let ours = rlaunch_lines(&err);
    assert_eq!(ours[0], want, "{out}");
    // Cut off from the server they waited on, the ranks may fail before the teardown ends
    // them: then the table of failed ranks follows.
    let table = ours.len() == 1 || (ours[1] == "rlaunch: 2 ranks failed:" && ours.len() == 5);
    assert!(table, "{out}");
    out.tag.wait_until_none(Duration::from_secs(5)).unwrap_or_else(|left| {
        panic!("left running: {left:?}");
    });
}

#[test]
fn a_server_that_stops_answering_mid_job_fails_a_job_that_needs_it_naming_the_node() {
    // Both ranks are PMIx clients waiting on stdin when n2's server is stopped (SIGSTOP): it
    // is killed, and the job ends as if it had died.
    let options =
        [&QUICK_LIVENESS[..], &["--launcher", "fork", "--hosts", "n1,n2", "--stdin", "all"]];
    let mut job = Run::new(&options.concat())
        .args(["-n", "2", &CProgram::Fence.path_str(), "10", "-", "wait"])
        .stdin_piped()
        .timeout(MPI_LIMIT)
        .spawn();
    for _ in 0..2 {
        job.wait_for_line(|l| l.starts_with("ready "), MPI_LIMIT);
    }
    let n2 = rlaunch_tests::tagged_processes(job.tag())
        .into_iter()
        .find(|p| p.comm == "rlaunch-pmix" && pmix_host_node(p.pid.as_raw()) == "n2")
        .expect("n2's PMIx server runs");
    nix::sys::signal::kill(n2.pid, nix::sys::signal::Signal::SIGSTOP).unwrap();
    // Stdin stays open: the ranks wait on it until the job ends them.
    job.wait_exit(MPI_LIMIT);
    let out = job.wait(MPI_LIMIT);
    out.assert_code(255);
    let want = "rlaunch: lost proxy on n2 (it cannot serve PMIx, which the program needs: the \
                PMIx server of this node did not answer for 1 s)";
    assert_eq!(rlaunch_lines(&out.stderr_str()), [want], "{out}");
    out.tag.wait_until_none(Duration::from_secs(5)).unwrap_or_else(|left| {
        panic!("left running: {left:?}");
    });
}

#[test]
fn nodes_that_lost_their_pmix_server_still_take_part_in_the_fence_with_nothing() {
    // Five nodes, two children a proxy: n1 has n3 and n4 below it, n2 has n5. Ranks 0 (n1)
    // and 4 (n5) are no PMIx clients, and their nodes' servers are killed: n1 must fold its
    // children's entries into one, and n5, a leaf, must enter with nothing, or the other
    // ranks' fence miscounts or never completes. `--pmi all`: every node's server starts
    // with it (by default, sh's ranks get one only when a rank connects).
    let all = ["--pmi", "all", "--tree-width", "2"].map(String::from);
    let options = [fake_nodes(5, 1), all.to_vec()].concat();
    let fence = CProgram::Fence.path_str();
    let script =
        format!("case $PMIX_RANK in 0|4) read x; exit 0;; esac; exec {fence} 1000 0,4 wait");
    let mut job = Run::new(&[])
        .args(options)
        .args(["--stdin", "all", "-n", "5", "sh", "-c", &script])
        .stdin_piped()
        .timeout(MPI_LIMIT)
        .spawn();
    for _ in 1..4 {
        job.wait_for_line(|l| l.starts_with("ready "), MPI_LIMIT);
    }
    for node in ["n1", "n5"] {
        let server = rlaunch_tests::tagged_processes(job.tag())
            .into_iter()
            .find(|p| p.comm == "rlaunch-pmix" && pmix_host_node(p.pid.as_raw()) == node)
            .unwrap_or_else(|| panic!("{node}'s PMIx server runs"));
        nix::sys::signal::kill(server.pid, nix::sys::signal::Signal::SIGKILL).unwrap();
        let note = format!(
            "rlaunch: note: on {node}: PMIx is not served on this node: the PMIx server of this \
             node ended: it exited"
        );
        job.wait_for_stderr_line(|l| l == note, MPI_LIMIT);
    }
    job.write_stdin(b"go\n");
    let out = job.wait(MPI_LIMIT);
    out.assert_code(0);
    let want = (1..4).flat_map(|r| [format!("ready {r}"), format!("rank {r} has 2 blobs")]);
    assert_eq!(sorted(out.lines()), sorted(want), "{out}");
}

/// The node a PMIx server serves: the last argument of `rlaunch-pmix-host DIR NODE`.
fn pmix_host_node(pid: i32) -> String {
    let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
    let args: Vec<&[u8]> = cmdline.split(|&b| b == 0).filter(|a| !a.is_empty()).collect();
    args.last().map(|a| String::from_utf8_lossy(a).into_owned()).unwrap_or_default()
}

#[test]
fn pmix_files_a_killed_proxy_left_are_swept_by_the_next_server() {
    // A proxy killed with SIGKILL cannot remove its PMIx directories; the next one to start a
    // PMIx server removes those of proxies that are gone, and no others.
    let tmp = rlaunch_tests::tempdir();
    let mut child = std::process::Command::new("true").spawn().unwrap();
    let dead = child.id();
    child.wait().unwrap();
    let left = tmp.path().join(format!("rlaunch-pmix.old_1.0.{dead}"));
    let alive = tmp.path().join(format!("rlaunch-pmix.live_1.0.{}", std::process::id()));
    for dir in [&left, &alive] {
        std::fs::create_dir(dir).unwrap();
        std::fs::write(dir.join("pmix.sock"), b"").unwrap();
    }
    let run = Run::new(&["--pmi", "all", "-n", "1", "sh", "-c", "true"]);
    let out = run.env("TMPDIR", tmp.path()).run();
    out.assert_code(0);
    assert!(!left.exists(), "a dead proxy's directory is swept");
    assert!(alive.exists(), "a live proxy's directory is kept");
    // The user's directory of error files (TORCHELASTIC_ERROR_FILE) is kept on purpose.
    let kept = |name: &std::ffi::OsStr| name.to_string_lossy().starts_with("rlaunch-errors.");
    let mine: Vec<_> = std::fs::read_dir(tmp.path())
        .unwrap()
        .flatten()
        .map(|e| e.file_name())
        .filter(|name| !kept(name))
        .collect();
    assert_eq!(mine.len(), 1, "the job's own directory went with it: {mine:?}");
}

/// A rank that dies inside a PMIx fence (rank 1 of `diefence`, by SIGALRM, before the others
/// come in, which ignore the teardown's SIGTERM): libpmix completes its node's part without
/// it, and the proxy holds that part, so the others stay in the fence until the kill grace
/// is over: none comes out of it without rank 1's data, to fail on it and race the true
/// culprit. Rank 0 shares rank 1's node; one node and two.
#[test]
fn a_rank_that_dies_inside_a_pmix_fence_leaves_the_others_in_it_until_the_end() {
    let program = CProgram::DieFence.path_str();
    for hosts in ["a:4", "a:2,b:2"] {
        let args = ["--launcher", "fork", "--hosts", hosts, "--kill-grace", "3", "-n", "4"];
        let out = Run::new(&args).arg(&program).timeout(Duration::from_secs(30)).run();
        out.assert_code(128 + 14);
        assert_eq!(out.lines(), Vec::<String>::new(), "{hosts}: {out}");
        let err = out.stderr_str();
        let said = rlaunch_lines(&err);
        let first = said.first().copied().unwrap_or_default();
        assert!(first.starts_with("rlaunch: rank 1 (pid "), "{hosts}: {out}");
        assert!(first.ends_with(" was killed by signal 14 (SIGALRM)"), "{hosts}: {out}");
    }
}
