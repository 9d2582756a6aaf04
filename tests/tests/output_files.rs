//! Where rank output goes: `--outfile-pattern` and `--errfile-pattern` files, prefixes
//! (`--prepend-pattern`, `--tag-output`, `--timestamp-output`) and Open MPI's
//! `--output-filename` tree. Every test runs the real binaries in a scratch directory and
//! reads what was really written there.

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use rlaunch_tests::output::sorted;
use rlaunch_tests::{check_flood, rankprog_str, spawn_client, tempdir, Run};

const WAIT: Duration = Duration::from_secs(30);

fn read(path: impl AsRef<Path>) -> String {
    let path = path.as_ref();
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()))
}

/// The names of the files in `dir`, sorted.
fn names(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    names.sort();
    names
}

#[test]
fn outfile_and_errfile_patterns_expand_rank_pid_host_and_job_id() {
    let dir = tempdir();
    // Hydra's single-dash spellings; sh is the rank program, so `$$` is the rank's pid.
    let out = Run::new(&[
        "--launcher",
        "fork",
        "--hosts",
        "n1,n2",
        "-n",
        "4",
        "-outfile-pattern",
        "out.%r.%g.%h.%t",
        "-errfile-pattern",
        "err-%r%%",
        "sh",
        "-c",
        "echo \"pid $$ rank $PMI_RANK\"; echo \"oops $PMI_RANK\" >&2",
    ])
    .current_dir(dir.path())
    .run();
    out.assert_code(0);
    assert_eq!(out.stdout_str(), "", "stdout went to the files: {out}");
    assert_eq!(out.stderr_str(), "", "stderr went to the files: {out}");

    let mut jobids = Vec::new();
    let mut outs = BTreeMap::new();
    for name in names(dir.path()).into_iter().filter(|n| n.starts_with("out.")) {
        let fields: Vec<&str> = name.splitn(5, '.').collect();
        let [_, rank, pid, host, jobid] = fields[..] else { panic!("file name {name}") };
        assert_eq!(read(dir.join(&name)), format!("pid {pid} rank {rank}\n"), "{name}");
        // Blocks of one slot per host, around again: n1 gets ranks 0 and 2.
        let rank: u32 = rank.parse().unwrap();
        assert_eq!(host, format!("n{}", rank % 2 + 1), "{name}");
        jobids.push(jobid.to_string());
        outs.insert(rank, name.clone());
    }
    assert_eq!(outs.keys().copied().collect::<Vec<_>>(), [0, 1, 2, 3], "{outs:?}");
    jobids.dedup();
    assert_eq!(jobids.len(), 1, "one job id for every rank: {outs:?}");
    assert!(jobids[0].starts_with("rlaunch_") && !jobids[0].contains('%'), "{jobids:?}");
    for rank in 0..4 {
        assert_eq!(read(dir.join(format!("err-{rank}%"))), format!("oops {rank}\n"));
    }
}

#[test]
fn ranks_sharing_a_file_write_whole_lines_into_it() {
    let dir = tempdir();
    let bytes_per_rank: u64 = 2 << 20;
    let out = Run::new(&[
        "-n",
        "4",
        "--outfile-pattern",
        "shared.out",
        &rankprog_str(),
        "flood",
        &bytes_per_rank.to_string(),
    ])
    .current_dir(dir.path())
    .run();
    out.assert_code(0);
    assert_eq!(out.stdout_str(), "", "{out}");
    let shared = std::fs::read(dir.join("shared.out")).unwrap();
    check_flood(&shared, 4, bytes_per_rank).unwrap();

    // Both streams of every rank into one file, which is created afresh.
    std::fs::write(dir.join("both.log"), "old contents, to be truncated\n").unwrap();
    let out = Run::new(&[
        "-n",
        "3",
        "--outfile-pattern",
        "both.log",
        "--errfile-pattern",
        "both.log",
        &rankprog_str(),
        "print",
        "100",
        "eprint",
        "100",
    ])
    .current_dir(dir.path())
    .run();
    out.assert_code(0);
    let text = read(dir.join("both.log"));
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 600, "{text}");
    for rank in 0..3 {
        for i in 0..100 {
            let line = format!("rank {rank} line {i}");
            assert_eq!(lines.iter().filter(|l| **l == line).count(), 2, "{line:?} in\n{text}");
        }
    }
}

#[test]
fn the_prepend_pattern_prefixes_lines_on_the_terminal_and_in_files() {
    let out = Run::new(&[
        "--launcher",
        "fork",
        "--hosts",
        "n1,n2",
        "-n",
        "2",
        "-prepend-pattern",
        "<%r@%h> ",
        &rankprog_str(),
        "print",
        "2",
        "eprint",
        "1",
    ])
    .run();
    out.assert_code(0);
    assert_eq!(
        sorted(out.lines()),
        [
            "<0@n1> rank 0 line 0",
            "<0@n1> rank 0 line 1",
            "<1@n2> rank 1 line 0",
            "<1@n2> rank 1 line 1"
        ]
    );
    assert_eq!(sorted(out.stderr_lines()), ["<0@n1> rank 0 line 0", "<1@n2> rank 1 line 0"]);

    let dir = tempdir();
    let out = Run::new(&[
        "-n",
        "2",
        "--prepend-pattern",
        "%r| ",
        "--outfile-pattern",
        "o.%r",
        &rankprog_str(),
        "print",
        "2",
        "noeol",
        "tail",
    ])
    .current_dir(dir.path())
    .run();
    out.assert_code(0);
    assert_eq!(out.stdout_str(), "");
    for rank in 0..2 {
        assert_eq!(
            read(dir.join(format!("o.{rank}"))),
            format!("{rank}| rank {rank} line 0\n{rank}| rank {rank} line 1\n{rank}| tail")
        );
    }
}

#[test]
fn prepend_rank_and_prepend_pattern_together_are_refused() {
    let out = Run::new(&["-l", "--prepend-pattern", "%r: ", "-n", "1", "true"]).run();
    out.assert_code(2);
    assert_eq!(
        out.stderr_str(),
        "rlaunch: -l and --prepend-pattern both set the line prefix; give one\n"
    );
}

#[test]
fn prepend_rank_tags_every_line_on_both_streams() {
    let out = Run::new(&["-l", "-n", "2", &rankprog_str(), "print", "2", "eprint", "1"]).run();
    out.assert_code(0);
    let lines = sorted(out.lines());
    assert_eq!(
        lines,
        ["[0] rank 0 line 0", "[0] rank 0 line 1", "[1] rank 1 line 0", "[1] rank 1 line 1"]
    );
    let err = sorted(out.stderr_lines());
    assert_eq!(err, ["[0] rank 0 line 0", "[1] rank 1 line 0"]);
}

#[test]
fn tag_output_is_open_mpis_and_goes_before_the_rank_prefix() {
    let out =
        Run::new(&["--tag-output", "-n", "2", &rankprog_str(), "print", "1", "eprint", "1"]).run();
    out.assert_code(0);
    assert_eq!(sorted(out.lines()), ["[1,0]<stdout>:rank 0 line 0", "[1,1]<stdout>:rank 1 line 0"]);
    assert_eq!(
        sorted(out.stderr_lines()),
        ["[1,0]<stderr>:rank 0 line 0", "[1,1]<stderr>:rank 1 line 0"]
    );

    let out = Run::new(&["-tag-output", "-l", "-n", "1", &rankprog_str(), "echo", "x"]).run();
    out.assert_code(0);
    assert_eq!(out.stdout_str(), "[1,0]<stdout>:[0] x\n");
}

/// The UTC time now, as `date` formats it: the independent oracle for rlaunch's stamps.
fn date_now() -> String {
    let out = Command::new("date").args(["-u", "+%Y-%m-%dT%H:%M:%S.%3NZ"]).output().unwrap();
    assert!(out.status.success(), "date failed");
    String::from_utf8(out.stdout).unwrap().trim().to_string()
}

/// `[YYYY-MM-DDTHH:MM:SS.mmmZ] ` at the start of `line`: the stamp and the rest.
fn split_stamp(line: &str) -> (&str, &str) {
    let bytes = line.as_bytes();
    assert!(bytes.len() >= 27, "no stamp: {line:?}");
    for (i, &b) in bytes[..27].iter().enumerate() {
        let want = match i {
            0 => Some(b'['),
            5 | 8 => Some(b'-'),
            11 => Some(b'T'),
            14 | 17 => Some(b':'),
            20 => Some(b'.'),
            24 => Some(b'Z'),
            25 => Some(b']'),
            26 => Some(b' '),
            _ => None,
        };
        match want {
            Some(w) => assert_eq!(b, w, "byte {i} of {line:?}"),
            None => assert!(b.is_ascii_digit(), "byte {i} of {line:?}"),
        }
    }
    let field = |from: usize, to: usize| line[from..to].parse::<u32>().unwrap();
    assert!((1..=12).contains(&field(6, 8)), "month of {line:?}");
    assert!((1..=31).contains(&field(9, 11)), "day of {line:?}");
    assert!(field(12, 14) < 24 && field(15, 17) < 60 && field(18, 20) < 60, "time of {line:?}");
    (&line[1..25], &line[27..])
}

#[test]
fn timestamps_are_utc_of_arrival_and_never_go_back() {
    let before = date_now();
    let out = Run::new(&[
        "--timestamp-output",
        "--tag-output",
        "-n",
        "2",
        &rankprog_str(),
        "print",
        "50",
        "sleep",
        "0.05",
        "print",
        "50",
        "eprint",
        "1",
    ])
    .run();
    let after = date_now();
    out.assert_code(0);
    let lines = out.lines();
    assert_eq!(lines.len(), 200, "{out}");
    let mut last = before.clone();
    let mut per_rank = [0; 2];
    for line in &lines {
        let (stamp, rest) = split_stamp(line);
        // ISO 8601 stamps of one width compare as the times they name.
        assert!(*stamp >= *last, "{stamp} after {last}: {line:?}");
        assert!(*stamp <= *after, "{stamp} later than {after}, when the run had ended");
        last = stamp.to_string();
        let rank: usize = rest[3..4].parse().unwrap();
        assert_eq!(rest, format!("[1,{rank}]<stdout>:rank {rank} line {}", per_rank[rank] % 50));
        per_rank[rank] += 1;
    }
    assert_eq!(per_rank, [100, 100]);
    assert_eq!(out.stderr_lines().len(), 2, "{out}");
    for line in out.stderr_lines() {
        assert!(split_stamp(&line).1.starts_with("[1,"), "{line:?}");
    }
}

#[test]
fn output_filename_writes_open_mpis_tree_and_still_copies_to_the_terminal() {
    let dir = tempdir();
    let out = Run::new(&[
        "-n",
        "2",
        "--output-filename",
        "tree",
        &rankprog_str(),
        "print",
        "2",
        "eprint",
        "1",
    ])
    .current_dir(dir.path())
    .run();
    out.assert_code(0);
    for rank in 0..2 {
        let rank_dir = dir.join(format!("tree/1/rank.{rank}"));
        assert_eq!(names(&rank_dir), ["stderr", "stdout"]);
        assert_eq!(
            read(rank_dir.join("stdout")),
            format!("rank {rank} line 0\nrank {rank} line 1\n")
        );
        assert_eq!(read(rank_dir.join("stderr")), format!("rank {rank} line 0\n"));
    }
    assert_eq!(out.lines().len(), 4, "{out}");
    assert_eq!(out.stderr_lines().len(), 2, "{out}");

    // Ranks padded to the width of the job size; nocopy keeps the terminal quiet.
    let out =
        Run::new(&["-n", "12", "-output-filename", "quiet:nocopy", &rankprog_str(), "print", "1"])
            .current_dir(dir.path())
            .run();
    out.assert_code(0);
    assert_eq!(out.stdout_str(), "", "{out}");
    let ranks = names(&dir.join("quiet/1"));
    assert_eq!(ranks, (0..12).map(|r| format!("rank.{r:02}")).collect::<Vec<_>>());
    assert_eq!(read(dir.join("quiet/1/rank.07/stdout")), "rank 7 line 0\n");
    assert_eq!(read(dir.join("quiet/1/rank.07/stderr")), "");
}

#[test]
fn an_outfile_pattern_takes_stdout_from_output_filename() {
    let dir = tempdir();
    let out = Run::new(&[
        "-n",
        "2",
        "--output-filename",
        "tree",
        "--outfile-pattern",
        "out.%r",
        &rankprog_str(),
        "print",
        "1",
        "eprint",
        "1",
    ])
    .current_dir(dir.path())
    .run();
    out.assert_code(0);
    assert_eq!(out.stdout_str(), "", "stdout goes to the pattern's files only: {out}");
    assert_eq!(out.stderr_lines().len(), 2, "stderr is still copied: {out}");
    for rank in 0..2 {
        assert_eq!(read(dir.join(format!("out.{rank}"))), format!("rank {rank} line 0\n"));
        let rank_dir = dir.join(format!("tree/1/rank.{rank}"));
        assert_eq!(names(&rank_dir), ["stderr"]);
        assert_eq!(read(rank_dir.join("stderr")), format!("rank {rank} line 0\n"));
    }
}

#[test]
fn spawned_jobs_get_their_own_tags_hosts_and_job_ids() {
    let out = Run::new(&[
        "--launcher",
        "fork",
        "--hosts",
        "n1,n2",
        "-n",
        "2",
        "--tag-output",
        "--prepend-pattern",
        "%h %t: ",
        "python3",
        &spawn_client(),
        "1",
    ])
    .run();
    out.assert_code(0);
    let lines = out.lines();
    let parent = lines.iter().find(|l| l.starts_with("[1,0]<stdout>:n1 ")).expect("rank 0");
    let jobid = parent.split_whitespace().nth(1).unwrap().trim_end_matches(':');
    let children: Vec<&String> = lines.iter().filter(|l| l.contains(": child ")).collect();
    assert_eq!(children.len(), 4, "{out}");
    let mut hosts = BTreeMap::new();
    for child in children {
        // `[J,R]<stdout>:HOST KVS: child R of 2 kvs KVS ...`, J = 2 or 3 for the two spawns.
        let (tag, rest) = child.split_once("<stdout>:").unwrap();
        let words: Vec<&str> = rest.split_whitespace().collect();
        let kvs = words[1].trim_end_matches(':');
        assert_eq!(words[7], kvs, "%t is the spawned job's kvsname: {child}");
        let job: u32 = kvs.strip_prefix(&format!("{jobid}_")).unwrap().parse().unwrap();
        assert_eq!(tag, format!("[{},{}]", job + 1, words[3]), "{child}");
        let rank: u32 = words[3].parse().unwrap();
        hosts.entry(job).or_insert_with(BTreeMap::new).insert(rank, words[0].to_string());
    }
    // Each spawn's two children go after the last slot taken, round the hosts: child 0 on
    // n1, child 1 on n2, and %h names each one's own.
    let per_job: Vec<Vec<String>> =
        hosts.into_values().map(|h| h.into_values().collect()).collect();
    assert_eq!(per_job, [["n1", "n2"], ["n1", "n2"]], "{out}");
}

#[test]
fn a_bad_pattern_is_a_usage_error_that_names_it() {
    let out = Run::new(&["--outfile-pattern", "out.%x", "-n", "1", "true"]).run();
    out.assert_code(2);
    assert_eq!(
        out.stderr_str(),
        "rlaunch: --outfile-pattern out.%x: unknown escape %x (known: %r %g %h %t %%)\n"
    );
    let out = Run::new(&["-errfile-pattern", "err%", "-n", "1", "true"]).run();
    out.assert_code(2);
    assert!(out.stderr_str().starts_with("rlaunch: --errfile-pattern err%: "), "{out}");
    let out = Run::new(&["--output-filename", "d:copy", "-n", "1", "true"]).run();
    out.assert_code(2);
    assert!(out.stderr_str().contains("unknown option copy"), "{out}");
}

#[test]
fn an_output_file_that_cannot_be_created_ends_the_job_and_names_the_file() {
    let dir = tempdir();
    let start = Instant::now();
    let out = Run::new(&[
        "-n",
        "2",
        "--outfile-pattern",
        "missing/out.%r",
        &rankprog_str(),
        "ready",
        "sleep",
        "60",
    ])
    .current_dir(dir.path())
    .run();
    assert_eq!(out.code, Some(255), "{out}");
    assert!(start.elapsed() < WAIT, "took {:?}", start.elapsed());
    let err = out.stderr_lines();
    assert_eq!(err.len(), 1, "one line: {out}");
    let rank = ["0", "1"]
        .into_iter()
        .find(|r| {
            err[0]
                == format!(
                    "rlaunch: cannot create missing/out.{r} (stdout of rank {r}): \
                     No such file or directory"
                )
        })
        .unwrap_or_else(|| panic!("{out}"));
    assert!(!dir.join(format!("missing/out.{rank}")).exists());
    out.tag.wait_until_none(Duration::from_secs(2)).unwrap();
}
