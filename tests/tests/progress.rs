//! The live progress line: on a terminal (a real pseudo-terminal here), a launch over more
//! than a few nodes shows one line that updates in place and is gone, leaving nothing, when
//! the output starts; it never shows when stderr is not a terminal, for a few nodes, or with
//! `RLAUNCH_PROGRESS=0`.

use std::io::Read;
use std::os::fd::OwnedFd;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use rlaunch_tests::{fakessh, rankprog_str, rlaunch, Run};

/// A fake ssh that takes 0.4 s to connect: the tree of width 2 over 8 hosts comes up in
/// three waves, slow enough for the line to change. The ranks print after 2 s, once the tree
/// is up.
fn slow_ssh(dir: &rlaunch_tests::TempDir) -> String {
    let path = dir.join("slowssh");
    std::fs::write(&path, format!("#!/bin/sh\nsleep 0.4\nexec {} \"$@\"\n", fakessh())).unwrap();
    std::fs::set_permissions(&path, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    path.to_str().unwrap().to_string()
}

fn job_args(ssh: &str, hosts: &str, n: &str) -> Vec<String> {
    let rankprog = rankprog_str();
    ["--launcher", "ssh", "--launcher-exec", ssh, "--hosts", hosts, "--tree-width", "2", "-n", n]
        .into_iter()
        .chain([rankprog.as_str(), "sleep", "2", "echo", "done"])
        .map(String::from)
        .collect()
}

/// Runs rlaunch with `args` on a pseudo-terminal of 24x100 (stdout and stderr both): the bytes
/// the terminal got, and the exit code.
fn on_terminal(args: &[String], env: &[(&str, &str)]) -> (Vec<u8>, i32) {
    let size = nix::pty::Winsize { ws_row: 24, ws_col: 100, ws_xpixel: 0, ws_ypixel: 0 };
    let pty = nix::pty::openpty(Some(&size), None).expect("a pseudo-terminal");
    let slave = |pty: &OwnedFd| Stdio::from(pty.try_clone().unwrap());
    let mut child = Command::new(rlaunch())
        .args(args)
        .envs(env.iter().copied())
        .stdin(Stdio::null())
        .stdout(slave(&pty.slave))
        .stderr(slave(&pty.slave))
        .spawn()
        .expect("rlaunch starts");
    drop(pty.slave);
    let master = pty.master;
    let reader = std::thread::spawn(move || {
        let mut file = std::fs::File::from(master);
        let mut bytes = Vec::new();
        let mut buf = [0u8; 4096];
        // EIO once the last writer of the terminal is gone.
        while let Ok(n) = file.read(&mut buf) {
            if n == 0 {
                break;
            }
            bytes.extend_from_slice(&buf[..n]);
        }
        bytes
    });
    let start = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if start.elapsed() > Duration::from_secs(60) {
            child.kill().unwrap();
            panic!("rlaunch on a terminal did not end within 60 s");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    (reader.join().unwrap(), status.code().unwrap_or(-1))
}

/// What a 24x100 terminal shows after `bytes`.
fn screen(bytes: &[u8]) -> Vec<String> {
    let mut parser = vt100::Parser::new(24, 100, 0);
    parser.process(bytes);
    parser
        .screen()
        .contents()
        .lines()
        .map(|l| l.trim_end().to_string())
        .filter(|l| !l.is_empty())
        .collect()
}

/// The progress lines drawn, in order, without repeats.
fn drawn(bytes: &[u8]) -> Vec<String> {
    let text = String::from_utf8_lossy(bytes);
    let mut lines: Vec<String> = Vec::new();
    for piece in text.split(['\r', '\n']) {
        let Some(at) = piece.find("rlaunch: ") else { continue };
        let line = piece[at..].trim_end().to_string();
        if line.contains(" nodes up, ") && lines.last() != Some(&line) {
            lines.push(line);
        }
    }
    lines
}

#[test]
fn a_launch_on_a_terminal_shows_one_line_that_updates_then_goes() {
    let dir = rlaunch_tests::tempdir();
    let ssh = slow_ssh(&dir);
    let (bytes, code) = on_terminal(&job_args(&ssh, "a,b,c,d,e,f,g,h", "8"), &[]);
    assert_eq!(code, 0, "{}", String::from_utf8_lossy(&bytes));
    let lines = drawn(&bytes);
    // The line changed as the tree came up: counts only ever grow, to every node up.
    assert!(lines.len() >= 3, "{lines:#?}");
    let counts = |l: &str| -> Vec<u32> {
        l.split(|c: char| !c.is_ascii_digit()).filter_map(|w| w.parse().ok()).collect()
    };
    for pair in lines.windows(2) {
        let (a, b) = (counts(&pair[0]), counts(&pair[1]));
        assert!(a[0] <= b[0] && a[2] <= b[2], "counts went down: {pair:?}");
    }
    assert!(
        lines[0].starts_with("rlaunch: 0/8 nodes up, 0/8 ranks started, 0 in PMI, "),
        "{lines:#?}"
    );
    assert!(lines.iter().any(|l| l.starts_with("rlaunch: 8/8 nodes up, ")), "{lines:#?}");
    // In place: never a newline after the line; and once the output came, nothing of it on
    // the screen.
    let text = String::from_utf8_lossy(&bytes);
    assert!(!text.lines().any(|l| l.contains(" nodes up, ") && l.ends_with("s")), "{text}");
    assert_eq!(screen(&bytes), vec!["done"; 8], "{text}");
}

#[test]
fn no_line_off_a_terminal_for_a_few_nodes_or_when_asked_not_to() {
    let dir = rlaunch_tests::tempdir();
    let ssh = slow_ssh(&dir);
    // stderr a pipe: batch logs stay clean.
    let args = job_args(&ssh, "a,b,c,d,e,f,g,h", "8");
    let out = Run::new(&args.iter().map(String::as_str).collect::<Vec<_>>()).run();
    out.assert_code(0);
    assert_eq!(out.stderr_str(), "");
    assert_eq!(out.stdout_str(), "done\n".repeat(8));
    // Three nodes on a terminal; eight with RLAUNCH_PROGRESS=0.
    for (hosts, n, env) in
        [("a,b,c", "3", vec![]), ("a,b,c,d,e,f,g,h", "8", vec![("RLAUNCH_PROGRESS", "0")])]
    {
        let (bytes, code) = on_terminal(&job_args(&ssh, hosts, n), &env);
        assert_eq!(code, 0);
        let text = String::from_utf8_lossy(&bytes);
        assert!(!text.contains("nodes up"), "{hosts} {env:?}: {text}");
        assert_eq!(screen(&bytes), vec!["done"; n.parse().unwrap()], "{text}");
    }
}
