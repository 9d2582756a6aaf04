//! What `/proc` says of a process: its command name, state and parent (`/proc/<pid>/stat`),
//! and its resident size (`/proc/<pid>/status`). Tests watch processes that are not their
//! children (proxies, ranks, daemons), and `/proc` is the one place to read them.
//!
//! `/proc/<pid>/stat` reads `pid (comm) S ppid ...`; comm may hold spaces and parentheses, so
//! the last `)` ends it.

/// The fields of `/proc/<pid>/stat` the tests use.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Stat {
    /// The command name (at most 15 bytes), as `/proc/<pid>/comm` gives it too.
    pub comm: String,
    /// `R`, `S`, `D`, `T` (stopped), `Z` (zombie), ...
    pub state: char,
    /// The parent: a rank's is its node's proxy.
    pub ppid: i32,
}

/// The stat of `pid`; `None` once the process is gone (or when it is not ours to read).
pub fn stat(pid: i32) -> Option<Stat> {
    parse_stat(&std::fs::read(format!("/proc/{pid}/stat")).ok()?)
}

/// The parent of a running process; panics if it is gone.
pub fn parent_pid(pid: i32) -> i32 {
    running(pid).ppid
}

/// The state letter of a running process; panics if it is gone.
pub fn state(pid: i32) -> char {
    running(pid).state
}

/// The resident set of a process in KiB (`VmRSS`); 0 once it is gone.
pub fn rss_kib(pid: i32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0)
}

/// Every process in `/proc` at the time of the call, in no particular order.
pub fn pids() -> Vec<i32> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries.filter_map(|entry| entry.ok()?.file_name().to_str()?.parse().ok()).collect()
}

fn running(pid: i32) -> Stat {
    stat(pid).unwrap_or_else(|| panic!("cannot read /proc/{pid}/stat: the process is gone"))
}

fn parse_stat(stat: &[u8]) -> Option<Stat> {
    let open = stat.iter().position(|&b| b == b'(')?;
    let close = stat.iter().rposition(|&b| b == b')')?;
    let comm = String::from_utf8_lossy(stat.get(open + 1..close)?).into_owned();
    let rest = std::str::from_utf8(stat.get(close + 1..)?).ok()?;
    let mut fields = rest.split_whitespace();
    let state = fields.next()?.chars().next()?;
    let ppid = fields.next()?.parse().ok()?;
    Some(Stat { comm, state, ppid })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_lines_parse_whatever_the_command_name() {
        let line = b"4242 (a) (b) S 17 4242 4242 0 -1 4194560 101 0 0 0\n";
        let want = Stat { comm: "a) (b".into(), state: 'S', ppid: 17 };
        assert_eq!(parse_stat(line), Some(want));
        assert_eq!(parse_stat(b"4242 (sleep"), None);
        assert_eq!(parse_stat(b"4242 (sleep) S"), None);
    }

    #[test]
    fn this_process_is_running_under_its_parent() {
        let me = std::process::id() as i32;
        assert_eq!(parent_pid(me), std::os::unix::process::parent_id() as i32);
        // The main thread's state: it waits for the test threads.
        assert!(matches!(state(me), 'R' | 'S'), "{}", state(me));
        assert!(rss_kib(me) > 0);
        assert!(pids().contains(&me));
    }
}
