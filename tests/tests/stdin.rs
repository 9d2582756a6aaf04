//! rlaunch's stdin: to rank 0 by default, to every rank, to one, or to none (`--stdin`);
//! ranks without it read /dev/null and hold no descriptor but their own.

use rlaunch_tests::output::{envs_by_rank, sorted};
use rlaunch_tests::{rankprog_str, stdin_sum_line, Run};

#[test]
fn stdin_goes_to_rank_zero_and_arrives_intact() {
    let input: Vec<u8> = (0..10 << 20).map(|i: u32| (i * 7 + i / 4096) as u8).collect();
    let out =
        Run::new(&["-l", "-n", "3", &rankprog_str(), "stdin-sum"]).stdin_bytes(input.clone()).run();
    out.assert_code(0);
    let lines = sorted(out.lines());
    let empty = stdin_sum_line(b"");
    assert_eq!(
        lines,
        [
            format!("[0] {}", stdin_sum_line(&input).trim_end()),
            format!("[1] {}", empty.trim_end()),
            format!("[2] {}", empty.trim_end()),
        ]
    );
}

#[test]
fn stdin_all_reaches_every_rank_and_none_reaches_none() {
    let input = b"hello ranks\n".repeat(10_000);
    let out = Run::new(&["--stdin", "all", "-n", "3", &rankprog_str(), "stdin-sum"])
        .stdin_bytes(input.clone())
        .run();
    out.assert_code(0);
    assert_eq!(
        out.stdout_str().matches(&stdin_sum_line(&input)).count(),
        3,
        "{}",
        out.stdout_str()
    );

    let out = Run::new(&["--stdin", "1", "-l", "-n", "2", &rankprog_str(), "stdin-sum"])
        .stdin_bytes(input.clone())
        .run();
    out.assert_code(0);
    assert!(
        out.stdout_str().contains(&format!("[1] {}", stdin_sum_line(&input))),
        "{}",
        out.stdout_str()
    );

    let out = Run::new(&["--stdin", "none", "-n", "2", &rankprog_str(), "stdin-is-devnull"])
        .stdin_bytes(input)
        .run();
    out.assert_code(0);
    assert_eq!(out.stdout_str().matches("stdin-devnull yes").count(), 2);
}

#[test]
fn ranks_without_stdin_read_dev_null_and_see_only_their_own_fds() {
    let out = Run::new(&["-l", "-n", "2", &rankprog_str(), "stdin-is-devnull", "fds", "env"])
        .stdin_piped()
        .run();
    out.assert_code(0);
    let text = out.stdout_str();
    assert!(text.contains("[0] stdin-devnull no"), "{text}");
    assert!(text.contains("[1] stdin-devnull yes"), "{text}");
    let envs = envs_by_rank(&out.lines());
    for rank in 0..2 {
        let fd = &envs[&rank]["PMI_FD"];
        let expected = format!("[{rank}] fds 0,1,2,{fd}");
        assert!(text.lines().any(|l| l == expected), "rank {rank}: want {expected:?} in\n{text}");
    }
}

#[test]
fn stdin_waits_with_ranks_that_wait_for_their_pmix_server() {
    // With PMIx served, a node starts its ranks only once its PMIx server has their
    // environments; stdin that comes first (and its end) waits for them instead of being
    // acknowledged into the void.
    for pmi in ["pmix", "simple"] {
        let input = b"to every rank\n".repeat(1000);
        let out = Run::new(&["--pmi", pmi, "--stdin", "all", "--launcher", "fork", "--hosts"])
            .args(["a,b", "-n", "4", &rankprog_str(), "stdin-sum"])
            .stdin_bytes(input.clone())
            .run();
        out.assert_code(0);
        let want = stdin_sum_line(&input);
        assert_eq!(out.stdout_str().matches(&want).count(), 4, "--pmi {pmi}: {out}");
    }
}

/// `--stdin all` over two fake nodes, n2's rank ending at once without reading: its node is
/// done, and rlaunch's window of chunks in flight (8) no longer waits for it. Rank 0 reads
/// 4 MiB (64 chunks), all of it. (Before, the window stayed full and the job hung.)
#[test]
fn stdin_all_flows_on_once_a_nodes_ranks_have_ended() {
    let input: Vec<u8> = (0..4u32 << 20).map(|i| (i % 253) as u8).collect();
    let rankprog = rankprog_str();
    // Rank 0 starts reading once rank 1 (and so its node) is done.
    let script = format!("if [ \"$PMI_RANK\" = 0 ]; then sleep 1; exec {rankprog} stdin-sum; fi");
    let args = ["--stdin", "all", "--launcher", "fork", "--hosts", "n1:1,n2:1", "-n", "2"];
    let out =
        Run::new(&[&args[..], &["sh", "-c", &script]].concat()).stdin_bytes(input.clone()).run();
    out.assert_code(0);
    assert_eq!(out.stdout_str(), stdin_sum_line(&input), "{out}");
}
