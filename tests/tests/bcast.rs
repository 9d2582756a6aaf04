//! `--bcast`: files copied to every node through the proxy tree before the ranks start
//! (docs/options.md, docs/architecture.md "The path of a broadcast file"). Fake nodes in a
//! width-2 tree, so that the bytes cross interior proxies, each feeding its children from
//! its own copy; the ssh hosts' case is in `multihost`.

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::time::Duration;

use rlaunch_tests::hosts::node_list;
use rlaunch_tests::output::rlaunch_lines;
use rlaunch_tests::{tempdir, Run};

const WAIT: Duration = Duration::from_secs(60);

/// Bytes that differ from chunk to chunk of the stream (512 KiB), so that one out of place
/// shows.
fn pattern(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

/// Every entry under `dir`, as paths relative to it.
fn entries(dir: &Path) -> Vec<String> {
    let mut found = Vec::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        for entry in std::fs::read_dir(&d).unwrap().map(Result::unwrap) {
            if entry.file_type().unwrap().is_dir() {
                todo.push(entry.path());
            }
            found.push(entry.path().strip_prefix(dir).unwrap().display().to_string());
        }
    }
    found.sort();
    found
}

#[test]
fn files_reach_every_node_of_a_deep_tree_whole_and_go_with_the_job() {
    let dir = tempdir();
    // 3 MiB and a bit: six chunks and a piece, more than one window's worth in flight
    // through two levels of interior proxies; an empty file; a name in a subdirectory.
    let data = pattern((3 << 20) + 4321, 7);
    std::fs::write(dir.join("data.bin"), &data).unwrap();
    std::fs::write(dir.join("empty"), b"").unwrap();
    let nodes = dir.join("nodes");
    std::fs::create_dir(&nodes).unwrap();
    let check = format!(
        "cmp -s {0} \"$RLAUNCH_BCAST_DIR/in/data.bin\" && test -f \"$RLAUNCH_BCAST_DIR/empty\" \
         && ! test -s \"$RLAUNCH_BCAST_DIR/empty\" && echo ok $PMI_RANK $RLAUNCH_BCAST_DIR",
        dir.join("data.bin").display()
    );
    let out = Run::new(&["--launcher", "fork", "--hosts", &node_list(7), "--tree-width", "2"])
        .args(["--bcast", &format!("{}:in/data.bin", dir.join("data.bin").display())])
        .args(["--bcast", &dir.join("empty").display().to_string()])
        .args(["--bcast-dir", nodes.to_str().unwrap(), "-n", "7", "sh", "-c", &check])
        .timeout(WAIT)
        .run();
    out.assert_code(0);
    let mut lines = out.lines();
    lines.sort();
    assert_eq!(lines.len(), 7, "{out}");
    for (rank, line) in lines.iter().enumerate() {
        let words: Vec<&str> = line.split(' ').collect();
        assert_eq!(words[..2], ["ok", &rank.to_string()], "{out}");
        // Each node its own directory: the job's id, the attempt, the node.
        let name = Path::new(words[2]).file_name().unwrap().to_str().unwrap();
        assert!(
            name.starts_with("rlaunch-bcast.") && name.ends_with(&format!(".0.{rank}")),
            "{out}"
        );
        assert_eq!(Path::new(words[2]).parent().unwrap(), nodes, "{out}");
    }
    assert_eq!(entries(&nodes), Vec::<String>::new(), "every copy goes with the job");
}

#[test]
fn a_program_sent_runs_from_its_copy_on_every_node() {
    let dir = tempdir();
    let script = dir.join("whereami");
    std::fs::write(&script, "#!/bin/sh\necho \"$0\" \"$RLAUNCH_BCAST_DIR\"\n").unwrap();
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o750)).unwrap();
    let script = script.to_str().unwrap();
    let out = Run::new(&["--launcher", "fork", "--hosts", &node_list(3), "--bcast", script])
        .args(["-n", "3", script])
        .timeout(WAIT)
        .run();
    out.assert_code(0);
    let lines = out.lines();
    assert_eq!(lines.len(), 3, "{out}");
    for line in &lines {
        let (run, bcast_dir) = line.split_once(' ').unwrap();
        assert_eq!(run, format!("{bcast_dir}/whereami"), "{out}");
    }
}

#[test]
fn a_node_that_cannot_write_the_files_fails_the_job_naming_it_and_leaves_nothing() {
    let dir = tempdir();
    std::fs::write(dir.join("data.bin"), pattern(100_000, 3)).unwrap();
    let nodes = dir.join("nodes");
    for node in ["n1", "n3", "n4"] {
        std::fs::create_dir_all(nodes.join(node)).unwrap();
    }
    // n2's "directory" is a file.
    std::fs::write(nodes.join("n2"), b"").unwrap();
    let base = format!("{}/%h", nodes.display());
    let out = Run::new(&["--launcher", "fork", "--hosts", &node_list(4), "--tree-width", "2"])
        .args(["--bcast", dir.join("data.bin").to_str().unwrap(), "--bcast-dir", &base])
        .args(["-n", "4", "echo", "never"])
        .timeout(WAIT)
        .run();
    out.assert_code(255);
    assert_eq!(out.stdout_str(), "", "no rank ran\n{out}");
    let err = out.stderr_str();
    let lines = rlaunch_lines(&err);
    assert_eq!(lines.len(), 1, "{out}");
    let jobdir = format!("{}/n2/rlaunch-bcast.", nodes.display());
    let line = lines[0];
    let prefix = format!("rlaunch: --bcast: n2 cannot have the files: cannot make {jobdir}");
    assert!(line.starts_with(&prefix), "{out}");
    assert!(line.ends_with(".0.1: Not a directory"), "{out}");
    assert_eq!(entries(&nodes), ["n1", "n2", "n3", "n4"], "nothing left on the other nodes");
}

#[test]
fn files_that_cannot_be_sent_are_refused_before_anything_starts() {
    let dir = tempdir();
    std::fs::write(dir.join("a"), b"x").unwrap();
    let a = dir.join("a").display().to_string();
    let cases = [
        (
            vec!["--bcast".to_string(), format!("{a}:x"), "--bcast".into(), format!("{a}:x")],
            format!("--bcast {a}: a file is sent as x already"),
        ),
        (
            vec![
                "--bcast".to_string(),
                format!("{a}:b/app"),
                "--bcast".into(),
                format!("{a}:b//app"),
            ],
            format!("--bcast {a}: a file is sent as b//app already"),
        ),
        (
            vec!["--bcast".to_string(), format!("{a}:x"), "--bcast".into(), format!("{a}:x/y")],
            format!("--bcast {a}: x/y and x cannot both be on a node"),
        ),
        (
            vec!["--bcast".into(), dir.join("none").display().to_string()],
            format!("--bcast {}: No such file or directory", dir.join("none").display()),
        ),
        (
            vec!["--bcast".into(), dir.path().display().to_string()],
            format!("--bcast {}: not a regular file", dir.path().display()),
        ),
    ];
    for (args, line) in cases {
        let out = Run::new(&[]).args(&args).args(["-n", "1", "echo", "never"]).run();
        out.assert_code(2);
        assert_eq!(out.stderr_str(), format!("rlaunch: {line}\n"), "{out}");
        assert_eq!(out.stdout_str(), "");
    }
}
