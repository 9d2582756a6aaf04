//! Reading what a run printed: the ranks' lines by rank (under `rlaunch -l`, each starts with
//! `[<rank>] `), the `rankprog env` dumps among them, and rlaunch's own `rlaunch: ...` lines.
//! Ranks print side by side, so their lines arrive in any order: compare them [`sorted`].

use std::collections::BTreeMap;

/// What the proxy of a lone rank logged (`RLAUNCH_LOG=debug`) of the rank's output it wrote
/// into rlaunch's stdout itself: the bytes, and how many of them it copied rather than
/// spliced.
pub fn written_by_the_proxy(stderr: &str) -> (u64, u64) {
    let line =
        stderr.lines().find(|l| l.contains(" bytes of output written into rlaunch's stdout"));
    let words: Vec<&str> = line.expect("the proxy's count").split_whitespace().collect();
    let before = |word: &str, by: usize| -> u64 {
        let at = words.iter().position(|&w| w == word).expect("the count's words");
        words[at - by].parse().expect("a count")
    };
    (before("bytes", 1), before("them", 2))
}

/// rank -> the lines it printed, in order, from the `-l` output `lines`; panics on a line
/// without the prefix.
pub fn by_rank(lines: &[String]) -> BTreeMap<u32, Vec<String>> {
    let mut out: BTreeMap<u32, Vec<String>> = BTreeMap::new();
    for line in lines {
        let (rank, rest) = split_rank(line).unwrap_or_else(|| panic!("no -l prefix in {line:?}"));
        out.entry(rank).or_default().push(rest.to_owned());
    }
    out
}

/// rank -> NAME -> VALUE, from the `-l` output of `rankprog env` (lines without `=` are
/// passed over).
pub fn envs_by_rank(lines: &[String]) -> BTreeMap<u32, BTreeMap<String, String>> {
    by_rank(lines)
        .into_iter()
        .map(|(rank, lines)| {
            let vars = lines
                .iter()
                .filter_map(|l| l.split_once('='))
                .map(|(k, v)| (k.to_owned(), v.to_owned()))
                .collect();
            (rank, vars)
        })
        .collect()
}

/// The lines of `text` that rlaunch itself printed (`rlaunch: ...`).
pub fn rlaunch_lines(text: &str) -> Vec<&str> {
    text.lines().filter(|l| l.starts_with("rlaunch:")).collect()
}

/// The frames of branch `head` (`+ rank 3:`, `ranks 0-3:`) of a hang report's stacks, up to
/// the next branch, trimmed; from the report's lines with or without rlaunch's prefix.
/// Panics, showing the lines, when there is no such branch.
pub fn stack_branch<S: AsRef<str>>(lines: &[S], head: &str) -> Vec<String> {
    let bare = |l: &S| l.as_ref().trim_start_matches("rlaunch:").trim().to_string();
    let at = lines.iter().position(|l| bare(l) == head);
    let shown = || lines.iter().map(|l| l.as_ref()).collect::<Vec<_>>().join("\n");
    let at = at.unwrap_or_else(|| panic!("no branch {head} in:\n{}", shown()));
    // A head ends with a colon and has no place in parentheses, as a frame has.
    let frame = |l: &String| !l.ends_with(':') || l.contains(" (");
    lines[at + 1..].iter().map(bare).take_while(frame).collect()
}

/// The line of `source` (a file under tests/) that holds `text`, counted from 1: where a
/// program's debug info places it.
pub fn source_line(source: &str, text: &str) -> usize {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(source);
    let code = std::fs::read_to_string(&path).unwrap();
    let at = code.lines().position(|l| l.contains(text));
    1 + at.unwrap_or_else(|| panic!("no {text} in {source}"))
}

/// The items in order, for comparing lines that ranks printed side by side.
pub fn sorted<T: Ord>(items: impl IntoIterator<Item = T>) -> Vec<T> {
    let mut items: Vec<T> = items.into_iter().collect();
    items.sort();
    items
}

/// `[<rank>] rest` -> `(rank, rest)`.
fn split_rank(line: &str) -> Option<(u32, &str)> {
    let (prefix, rest) = line.split_once("] ")?;
    Some((prefix.strip_prefix('[')?.parse().ok()?, rest))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lines(text: &str) -> Vec<String> {
        text.lines().map(str::to_owned).collect()
    }

    #[test]
    fn lines_and_environments_by_rank() {
        let out = lines("[1] A=1\n[0] hello\n[1] B=x=y\n[0] A=0");
        assert_eq!(by_rank(&out)[&1], ["A=1", "B=x=y"]);
        let envs = envs_by_rank(&out);
        assert_eq!(envs[&0]["A"], "0");
        assert_eq!(envs[&1]["B"], "x=y");
        assert_eq!(envs[&0].len(), 1);
    }

    #[test]
    fn rlaunch_lines_and_order() {
        assert_eq!(
            rlaunch_lines("x\nrlaunch: a\n rlaunch: b\nrlaunch: c"),
            ["rlaunch: a", "rlaunch: c"]
        );
        assert_eq!(sorted(["b", "a"]), ["a", "b"]);
    }
}

/// The hosts job `job`'s ranks ran on, in rank order, as a `--report` file lists them (0: the
/// launched job; 1, 2, ...: spawned jobs).
pub fn report_hosts(report: &std::path::Path, job: u64) -> Vec<String> {
    report_ranks(report, job).iter().map(|r| r["host"].as_str().unwrap().to_string()).collect()
}

/// The variables rlaunch set for each of job `job`'s ranks, in rank order, as a `--report`
/// file lists them.
pub fn report_vars(report: &std::path::Path, job: u64) -> Vec<BTreeMap<String, String>> {
    let vars = |r: &serde_json::Value| {
        let vars = r["vars"].as_object().expect("the rank's variables");
        vars.iter().map(|(k, v)| (k.clone(), v.as_str().unwrap().to_string())).collect()
    };
    report_ranks(report, job).iter().map(vars).collect()
}

/// Field `field` of each of job `job`'s ranks, in rank order, as a `--report` file has it.
pub fn report_field(report: &std::path::Path, job: u64, field: &str) -> Vec<serde_json::Value> {
    report_ranks(report, job).iter().map(|r| r[field].clone()).collect()
}

/// Job `job`'s ranks in a `--report` file, in rank order.
fn report_ranks(report: &std::path::Path, job: u64) -> Vec<serde_json::Value> {
    let text = std::fs::read_to_string(report).expect("the report was written");
    let json: serde_json::Value = serde_json::from_str(&text).expect("the report is JSON");
    let ranks = json["ranks"].as_array().expect("the report lists its ranks");
    let mut ranks: Vec<serde_json::Value> =
        ranks.iter().filter(|r| r["job"].as_u64() == Some(job)).cloned().collect();
    ranks.sort_by_key(|r| r["rank"].as_u64());
    ranks
}
