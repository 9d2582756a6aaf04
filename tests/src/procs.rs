//! Finding and killing a run's processes by the tag in their environment.
//!
//! `rlaunch` forwards its environment to every rank, and ranks pass it on to what they start,
//! so `RLAUNCH_TEST_TAG=<tag>` in `/proc/<pid>/environ` marks every process of a run,
//! daemonized ones included, whatever their parent or session.
//!
//! A process in the middle of `execve` shows no environment for a moment (between the switch
//! to its new memory and the setup of its stack), and one started with `vfork` shows its
//! parent's until then. So "none left" is only believed after several empty scans in a row,
//! and counts are waited for, not taken from one scan.

use std::fmt;
use std::time::{Duration, Instant};

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

use crate::procfs;

/// The environment variable carrying a run's tag.
pub const TAG_VAR: &str = "RLAUNCH_TEST_TAG";

/// How long [`Tag`]'s drop keeps killing processes that fork while it kills them.
const KILL_PATIENCE: Duration = Duration::from_secs(5);

/// Empty scans in a row that make "no process left" believable (see the module doc).
const QUIET_SCANS: u32 = 3;

/// The pause between two scans of the process table.
const SCAN_PAUSE: Duration = Duration::from_millis(5);

/// A unique tag; when it drops, every process still carrying it is SIGKILLed.
#[derive(Debug)]
pub struct Tag(String);

impl Tag {
    pub fn new() -> Tag {
        Tag(crate::unique_id())
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The running processes carrying this tag.
    pub fn processes(&self) -> Vec<TaggedProcess> {
        running_tagged(&self.0)
    }

    /// See [`wait_until_no_tagged`].
    pub fn wait_until_none(&self, timeout: Duration) -> Result<(), Vec<TaggedProcess>> {
        wait_until_no_tagged(&self.0, timeout)
    }

    /// See [`wait_until_tagged`].
    pub fn wait_until_running(
        &self,
        count: usize,
        timeout: Duration,
    ) -> Result<Vec<TaggedProcess>, Vec<TaggedProcess>> {
        wait_until_tagged(&self.0, count, timeout)
    }

    /// SIGKILLs every process carrying the tag, again and again until none is left (or
    /// five seconds are spent: a process may fork while it is being killed). Returns
    /// the survivors.
    pub fn kill_all(&self) -> Vec<TaggedProcess> {
        let deadline = Instant::now() + KILL_PATIENCE;
        let mut quiet = 0;
        loop {
            let alive = self.processes();
            quiet = if alive.is_empty() { quiet + 1 } else { 0 };
            if quiet == QUIET_SCANS || (!alive.is_empty() && Instant::now() >= deadline) {
                return alive;
            }
            for process in &alive {
                // It may have exited since the scan; nothing to do then.
                let _ = kill(process.pid, Signal::SIGKILL);
            }
            std::thread::sleep(SCAN_PAUSE);
        }
    }
}

impl Default for Tag {
    fn default() -> Self {
        Tag::new()
    }
}

impl fmt::Display for Tag {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl Drop for Tag {
    fn drop(&mut self) {
        let survivors = self.kill_all();
        if !survivors.is_empty() {
            eprintln!("warning: processes of tag {} survive SIGKILL: {}", self.0, list(&survivors));
        }
    }
}

/// One process found by [`tagged_processes`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TaggedProcess {
    pub pid: Pid,
    /// The command name from `/proc/<pid>/stat` (at most 15 bytes).
    pub comm: String,
    /// The state letter from `/proc/<pid>/stat`: `R`, `S`, `D`, `T`, `Z`, ...
    pub state: char,
}

impl TaggedProcess {
    /// Zombies (and dying tasks) have finished running; only their parent's wait is missing.
    pub fn is_running(&self) -> bool {
        !matches!(self.state, 'Z' | 'X' | 'x')
    }
}

impl fmt::Display for TaggedProcess {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "pid {} ({}) state {}", self.pid, self.comm, self.state)
    }
}

/// A list of processes for messages.
pub(crate) fn list(processes: &[TaggedProcess]) -> String {
    let items: Vec<String> = processes.iter().map(ToString::to_string).collect();
    items.join(", ")
}

/// Every process whose environment holds `RLAUNCH_TEST_TAG=<tag>`, in pid order.
///
/// Processes that vanish during the scan, and those whose environment cannot be read (other
/// users'), are skipped. A zombie's environment is gone with its memory, so zombies seldom
/// show up; when one does, [`TaggedProcess::is_running`] says so.
pub fn tagged_processes(tag: &str) -> Vec<TaggedProcess> {
    let wanted = format!("{TAG_VAR}={tag}");
    let mut found: Vec<TaggedProcess> = procfs::pids()
        .into_iter()
        .filter_map(|pid| {
            let environ = std::fs::read(format!("/proc/{pid}/environ")).ok()?;
            environ.split(|&b| b == 0).any(|var| var == wanted.as_bytes()).then_some(())?;
            let procfs::Stat { comm, state, .. } = procfs::stat(pid)?;
            Some(TaggedProcess { pid: Pid::from_raw(pid), comm, state })
        })
        .collect();
    found.sort_by_key(|p| p.pid.as_raw());
    found
}

/// Waits until no running process carries `tag`; on timeout, returns those still running.
///
/// Polling the process table is the one way to watch processes that are not our children.
pub fn wait_until_no_tagged(tag: &str, timeout: Duration) -> Result<(), Vec<TaggedProcess>> {
    wait_until_empty(timeout, || running_tagged(tag))
}

/// Scans with `scan` until it finds nothing several times in a row (see the module doc);
/// on timeout, returns what the last scan found. For any set of processes: tagged ones, or
/// those of a job on other hosts.
pub fn wait_until_empty<T>(
    timeout: Duration,
    mut scan: impl FnMut() -> Vec<T>,
) -> Result<(), Vec<T>> {
    let deadline = Instant::now() + timeout;
    let mut quiet = 0;
    loop {
        let found = scan();
        quiet = if found.is_empty() { quiet + 1 } else { 0 };
        if quiet == QUIET_SCANS {
            return Ok(());
        }
        if !found.is_empty() && Instant::now() >= deadline {
            return Err(found);
        }
        std::thread::sleep(SCAN_PAUSE);
    }
}

/// Waits until at least `count` running processes carry `tag` and returns them; on timeout,
/// returns those found by the last scan.
pub fn wait_until_tagged(
    tag: &str,
    count: usize,
    timeout: Duration,
) -> Result<Vec<TaggedProcess>, Vec<TaggedProcess>> {
    let deadline = Instant::now() + timeout;
    loop {
        let running = running_tagged(tag);
        if running.len() >= count {
            return Ok(running);
        }
        if Instant::now() >= deadline {
            return Err(running);
        }
        std::thread::sleep(SCAN_PAUSE);
    }
}

fn running_tagged(tag: &str) -> Vec<TaggedProcess> {
    tagged_processes(tag).into_iter().filter(TaggedProcess::is_running).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::process::ExitStatusExt;
    use std::process::{Command, Stdio};

    fn sleeper(tag: &Tag) -> std::process::Child {
        Command::new("sleep")
            .arg("30")
            .env(TAG_VAR, tag.as_str())
            .stdin(Stdio::null())
            .spawn()
            .expect("cannot start sleep")
    }

    #[test]
    fn scan_finds_a_tagged_process_until_it_dies() {
        let tag = Tag::new();
        let mut child = sleeper(&tag);
        let found =
            tag.wait_until_running(1, Duration::from_secs(10)).expect("the sleep never showed up");
        let pid = Pid::from_raw(child.id() as i32);
        assert_eq!(found.len(), 1, "found {found:?}");
        assert_eq!(found[0].pid, pid);
        assert_eq!(found[0].comm, "sleep");
        assert!(found[0].is_running(), "{}", found[0]);
        assert!(tagged_processes(Tag::new().as_str()).is_empty());

        // Killed but not reaped: a zombie no longer counts.
        kill(pid, Signal::SIGKILL).unwrap();
        let gone = wait_until_no_tagged(tag.as_str(), Duration::from_secs(10));
        let status = child.wait().unwrap();
        assert_eq!(gone, Ok(()));
        assert_eq!(status.signal(), Some(Signal::SIGKILL as i32));
    }

    #[test]
    fn dropping_the_tag_kills_its_processes() {
        let tag = Tag::new();
        let mut first = sleeper(&tag);
        let mut second = sleeper(&tag);
        let found = tag.wait_until_running(2, Duration::from_secs(10));
        drop(tag);
        for child in [&mut first, &mut second] {
            let status = child.wait().unwrap();
            assert_eq!(status.signal(), Some(Signal::SIGKILL as i32));
        }
        assert_eq!(found.map(|f| f.len()), Ok(2));
    }

    #[test]
    fn comm_may_hold_parentheses_and_spaces() {
        let dir = crate::tempdir();
        let odd = dir.path().join("a) (b");
        std::os::unix::fs::symlink("/bin/sleep", &odd).unwrap();
        let tag = Tag::new();
        let mut child = Command::new(&odd).arg("30").env(TAG_VAR, tag.as_str()).spawn().unwrap();
        let found = tag.wait_until_running(1, Duration::from_secs(10));
        drop(tag);
        child.wait().unwrap();
        let found = found.expect("the process never showed up");
        assert_eq!(found[0].comm, "a) (b");
        assert!(found[0].is_running(), "{}", found[0]);
    }
}
