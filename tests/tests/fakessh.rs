//! The ssh bootstrap and tree spawn, with a fake `ssh` (tests/scripts/fakessh) that runs
//! the remote command here: fast, and no root or sshd needed. The real thing, over sshd in
//! network namespaces, is tests/multihost.rs.

use std::time::{Duration, Instant};

use rlaunch_tests::hosts::node_list;
use rlaunch_tests::{fakessh, rankprog_str, Run};

#[test]
fn ssh_tree_spawn_reaches_every_host() {
    let exec = format!("{} -oBatchMode=yes", fakessh());
    let out = Run::new(&[
        "--launcher",
        "ssh",
        "--launcher-exec",
        &exec,
        "--hosts",
        &node_list(7),
        "--tree-width",
        "2",
        "-l",
        "-n",
        "7",
        &rankprog_str(),
        "env",
    ])
    .run();
    out.assert_code(0);
    for r in 0..7 {
        let want = format!("[{r}] MPIR_CVAR_CH3_INTERFACE_HOSTNAME=n{}", r + 1);
        assert!(out.lines().contains(&want), "missing {want:?}\n{out}");
    }
}

#[test]
fn an_unreachable_host_fails_the_launch_at_once_naming_it_and_what_ssh_said() {
    let start = Instant::now();
    let out = Run::new(&[
        "--launcher-exec",
        &fakessh(),
        "--hosts",
        "n1,unreachable2,n3",
        "-n",
        "3",
        &rankprog_str(),
        "ready",
        "sleep",
        "60",
    ])
    .run();
    out.assert_code(255);
    let err = out.stderr_str();
    assert!(err.contains("rlaunch: lost proxy on unreachable2 ("), "{err}");
    assert!(err.contains("Could not resolve hostname unreachable2"), "{err}");
    assert!(start.elapsed() < Duration::from_secs(10), "took {:?}", start.elapsed());
    out.tag.wait_until_none(Duration::from_secs(2)).unwrap();
}

#[test]
fn an_unreachable_host_deep_in_the_tree_is_reported_by_its_parent() {
    let list = "n1,n2,n3,n4,unreachable5";
    let out = Run::new(&[
        "--launcher-exec",
        &fakessh(),
        "--hosts",
        list,
        "--tree-width",
        "2",
        "-n",
        "5",
        &rankprog_str(),
        "ready",
        "sleep",
        "60",
    ])
    .run();
    out.assert_code(255);
    assert!(out.stderr_str().contains("lost proxy on unreachable5 ("), "{out}");
    out.tag.wait_until_none(Duration::from_secs(2)).unwrap();
}

#[test]
fn a_missing_proxy_binary_on_the_host_is_named() {
    let out = Run::new(&[
        "--launcher-exec",
        &fakessh(),
        "--proxy-path",
        "/nonexistent/rlaunch-proxy",
        "--hosts",
        "n1",
        "-n",
        "1",
        "true",
    ])
    .run();
    out.assert_code(255);
    assert!(out.stderr_str().contains("lost proxy on n1 ("), "{out}");
    assert!(out.stderr_str().contains("/nonexistent/rlaunch-proxy"), "{out}");
}

#[test]
fn hostfiles_place_ranks_and_bad_lines_are_named() {
    let dir = rlaunch_tests::tempdir();
    let file = dir.path().join("hosts");
    std::fs::write(&file, "# two nodes\nn1:2\n\nn2 slots=1 max_slots=4\n").unwrap();
    let out = Run::new(&[
        "--launcher",
        "fork",
        "-f",
        file.to_str().unwrap(),
        "-l",
        "-n",
        "4",
        &rankprog_str(),
        "env",
    ])
    .run();
    out.assert_code(0);
    let lines = out.lines();
    for (r, host) in [(0, "n1"), (1, "n1"), (2, "n2"), (3, "n1")] {
        let want = format!("[{r}] MPIR_CVAR_CH3_INTERFACE_HOSTNAME={host}");
        assert!(lines.contains(&want), "missing {want:?}\n{out}");
    }
    std::fs::write(&file, "n1\nn2:x\n").unwrap();
    let out = Run::new(&["-f", file.to_str().unwrap(), "-n", "1", "true"]).run();
    out.assert_code(2);
    assert_eq!(out.stderr_str(), format!("rlaunch: {}:2: bad slot count 'x'\n", file.display()));
    let out = Run::new(&["--launcher", "fork", "-n", "2", "-l", &rankprog_str(), "env"])
        .env("HYDRA_HOST_FILE", file.to_str().unwrap())
        .run();
    out.assert_code(2);
}
