//! Process bookkeeping shared by the launcher and the proxies: reaping, process groups,
//! descendant sweeps, subreaping.

use std::collections::{HashMap, HashSet};

use nix::errno::Errno;
use nix::sys::signal::{kill, killpg, Signal};
use nix::unistd::Pid;
use rlaunch_protocol::ids::ExitOutcome;

/// A child that ended, and what it used (its descendants it waited for included).
#[derive(Debug, Clone, Copy)]
pub struct Ended {
    pub pid: i32,
    pub outcome: ExitOutcome,
    pub user_us: u64,
    pub system_us: u64,
    pub maxrss_kib: u64,
}

/// Reaps every child that has ended, known or adopted. One owner per process calls this (on
/// SIGCHLD), so no exit is ever stolen from another waiter.
pub fn reap_ended() -> Vec<Ended> {
    let out = reap_waiting();
    // The guard's pid is free for reuse once it is reaped.
    for ended in &out {
        crate::guard::reaped(ended.pid);
    }
    out
}

/// Where a dispatcher hears of its children's ends.
pub enum Reaper {
    /// This process's children, reaped by the dispatcher itself when SIGCHLD says some
    /// ended ([`reap_ended`]): until then each is a zombie holding its pid, so a signal the
    /// dispatcher sends by a pid of its tables cannot reach another process that took the pid.
    ThisProcess {
        sigchld: tokio::signal::unix::Signal,
        /// Reap once before the first SIGCHLD: a child may have ended before there was a
        /// handler to hear it.
        first: bool,
    },
    /// Ends a test sends (its processes are none of this process's children).
    Sent(tokio::sync::mpsc::UnboundedReceiver<Ended>),
}

impl Reaper {
    /// This process's: installs the SIGCHLD handler.
    pub fn this_process() -> Reaper {
        use tokio::signal::unix::{signal, SignalKind};
        let sigchld = signal(SignalKind::child()).expect("SIGCHLD handler");
        Reaper::ThisProcess { sigchld, first: true }
    }

    /// The ends are this process's children's: what they leave behind is its to kill.
    pub fn of_this_process(&self) -> bool {
        matches!(self, Reaper::ThisProcess { .. })
    }

    /// The next children's ends, as many as there are. Cancel-safe: the reaping happens in
    /// the same poll as the wake-up that causes it.
    pub async fn next(&mut self) -> Vec<Ended> {
        match self {
            Reaper::ThisProcess { sigchld, first } => {
                if !std::mem::take(first) && sigchld.recv().await.is_none() {
                    return std::future::pending().await;
                }
                reap_ended()
            }
            Reaper::Sent(ends) => match ends.recv().await {
                Some(end) => vec![end],
                None => std::future::pending().await,
            },
        }
    }

    /// The ends there are now, without waiting: for a caller about to act on a deadline
    /// that an end due at the same moment would change (the select that woke it picked
    /// one of the two at random).
    pub fn now(&mut self) -> Vec<Ended> {
        match self {
            Reaper::ThisProcess { .. } => reap_ended(),
            Reaper::Sent(ends) => std::iter::from_fn(|| ends.try_recv().ok()).collect(),
        }
    }
}

fn reap_waiting() -> Vec<Ended> {
    use nix::libc;
    let mut out = Vec::new();
    loop {
        let mut status = 0;
        // SAFETY: an all-zero rusage is a valid value for wait4 to overwrite.
        let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
        // SAFETY: wait4 writes one int and one rusage, both ours.
        let pid = unsafe { libc::wait4(-1, &mut status, libc::WNOHANG, &mut usage) };
        if pid == 0 {
            return out;
        }
        if pid < 0 {
            match Errno::last() {
                Errno::EINTR => continue,
                Errno::ECHILD => return out,
                e => {
                    tracing::warn!("wait4 failed: {e}");
                    return out;
                }
            }
        }
        let outcome = if libc::WIFEXITED(status) {
            ExitOutcome::Exited(libc::WEXITSTATUS(status))
        } else if libc::WIFSIGNALED(status) {
            ExitOutcome::Signaled(libc::WTERMSIG(status))
        } else {
            // Stopped or continued: not an end.
            continue;
        };
        let micros = |t: libc::timeval| t.tv_sec as u64 * 1_000_000 + t.tv_usec as u64;
        out.push(Ended {
            pid,
            outcome,
            user_us: micros(usage.ru_utime),
            system_us: micros(usage.ru_stime),
            maxrss_kib: usage.ru_maxrss as u64,
        });
    }
}

/// Makes orphaned descendants (a rank's daemonized grandchild) ours to reap and kill.
pub fn become_subreaper() {
    // SAFETY: prctl with integer arguments only.
    let rc = unsafe { nix::libc::prctl(nix::libc::PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) };
    if rc != 0 {
        tracing::warn!("cannot become a child subreaper: {}", std::io::Error::last_os_error());
    }
}

/// Sends `sig` to a process group, ignoring groups that are already gone. A group id of 1 or
/// less is nobody's: killpg(2) takes 0 for the caller's own group and 1 for every process.
pub fn signal_group(pgid: i32, sig: Signal) {
    if pgid <= 1 {
        return tracing::debug!(pgid, %sig, "no process group to signal");
    }
    match killpg(Pid::from_raw(pgid), sig) {
        Ok(()) | Err(Errno::ESRCH) => {}
        Err(e) => tracing::debug!("killpg({pgid}, {sig}) failed: {e}"),
    }
}

/// Sends `sig` to process `pid`, ignoring one that is already gone. A pid of 0 or less
/// (a child with no process of its own) is nobody's: kill(2) would take it for a group or
/// for every process.
pub fn signal_pid(pid: i32, sig: Signal) {
    if pid <= 0 {
        return tracing::debug!(pid, %sig, "no process to signal");
    }
    match kill(Pid::from_raw(pid), sig) {
        Ok(()) | Err(Errno::ESRCH) => {}
        Err(e) => tracing::debug!("kill({pid}, {sig}) failed: {e}"),
    }
}

/// Every live descendant of this process, except the subtrees rooted at `spare` (child
/// proxies, which clean up their own). Read from /proc, so it also finds processes that left
/// their group and session.
pub fn descendants(spare: &HashSet<i32>) -> Vec<i32> {
    descendants_but(spare, |_| false)
}

/// [`descendants`], sparing also the subtree of each descendant `spared` picks, and asking
/// `spared` only of the descendants met. Walks down from this process by the kernel's lists
/// of each task's children (`/proc/PID/task/TID/children`), which reach this process's own
/// subtree and nothing else; where the kernel keeps no such lists, one read of all of /proc
/// (which, for each of a thousand interior proxies on one machine, cost a tenth of the
/// launch's CPU time at 1024 fake nodes).
fn descendants_but(spare: &HashSet<i32>, spared: impl Fn(i32) -> bool) -> Vec<i32> {
    let me = std::process::id() as i32;
    if children_of(me).is_none() {
        return descendants_scanning(spare, spared);
    }
    let mut out = Vec::new();
    let mut stack = vec![me];
    while let Some(pid) = stack.pop() {
        for child in children_of(pid).unwrap_or_default() {
            let live = Stat::read(child).and_then(|s| Some(!matches!(s.field(3)?, "Z" | "X")));
            if live == Some(true) && !spare.contains(&child) && !spared(child) {
                out.push(child);
                stack.push(child);
            }
        }
    }
    out
}

/// Process `pid`'s children, every thread's (a child belongs to the thread that forked it,
/// and an orphan to the thread of its subreaper the kernel chose); `None` where the kernel
/// keeps no lists of children (CONFIG_PROC_CHILDREN), or `pid` is gone.
fn children_of(pid: i32) -> Option<Vec<i32>> {
    let mut children = Vec::new();
    for task in std::fs::read_dir(format!("/proc/{pid}/task")).ok()?.flatten() {
        let Ok(list) = std::fs::read_to_string(task.path().join("children")) else {
            if task.path().exists() {
                return None;
            }
            continue;
        };
        children.extend(list.split_whitespace().filter_map(|c| c.parse::<i32>().ok()));
    }
    Some(children)
}

/// [`descendants_but`] by one read of all of /proc.
fn descendants_scanning(spare: &HashSet<i32>, spared: impl Fn(i32) -> bool) -> Vec<i32> {
    let mut children: HashMap<i32, Vec<i32>> = HashMap::new();
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    for entry in dir.flatten() {
        let Some(pid) = entry.file_name().to_str().and_then(|s| s.parse::<i32>().ok()) else {
            continue;
        };
        let Some(stat) = Stat::read(pid) else {
            continue;
        };
        let ppid = stat.field(4).and_then(|p| p.parse::<i32>().ok());
        if let (Some(state), Some(ppid)) = (stat.field(3), ppid) {
            if state != "Z" && state != "X" {
                children.entry(ppid).or_default().push(pid);
            }
        }
    }
    let mut out = Vec::new();
    let mut stack = vec![std::process::id() as i32];
    while let Some(pid) = stack.pop() {
        for &child in children.get(&pid).into_iter().flatten() {
            if !spare.contains(&child) && !spared(child) {
                out.push(child);
                stack.push(child);
            }
        }
    }
    out
}

/// /proc/PID/stat, read once; its fields numbered as proc(5) numbers them.
pub struct Stat {
    text: String,
    /// Where the fields after `(comm)` begin: comm may hold spaces and parentheses.
    after_comm: usize,
}

impl Stat {
    /// Process `pid`'s; `None` if it is gone.
    pub fn read(pid: i32) -> Option<Stat> {
        let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
        let after_comm = text.rfind(')')? + 1;
        Some(Stat { text, after_comm })
    }

    /// Field `n` of proc(5), from 3 (the state) on.
    pub fn field(&self, n: usize) -> Option<&str> {
        self.text[self.after_comm..].split_whitespace().nth(n.checked_sub(3)?)
    }

    /// Field `n` as a number.
    pub fn number(&self, n: usize) -> Option<u64> {
        self.field(n)?.parse().ok()
    }
}

/// Process `pid` now: its state letter, CPU time (user and system, in ms) and resident
/// memory (KiB); `None` if it is gone.
pub fn snapshot(pid: i32) -> Option<(char, u64, u64)> {
    let stat = Stat::read(pid)?;
    let state = stat.field(3)?.chars().next()?;
    let number = |n: usize| stat.number(n).unwrap_or(0);
    // SAFETY: sysconf reads a constant.
    let (hz, page) = unsafe {
        (nix::libc::sysconf(nix::libc::_SC_CLK_TCK), nix::libc::sysconf(nix::libc::_SC_PAGESIZE))
    };
    let (hz, page) = (hz.max(1) as u64, page.max(1) as u64);
    let cpu_ms = (number(14) + number(15)) * 1000 / hz;
    Some((state, cpu_ms, number(24) * page / 1024))
}

/// Whether process `pid` has begun to exit (the kernel's PF_EXITING, set before it closes
/// its files), has exited, or is gone. A rank's socket reaching end of file while the rank
/// is not exiting means the rank closed it and lives on.
pub fn is_exiting(pid: i32) -> bool {
    const PF_EXITING: u64 = 0x4;
    let Some(stat) = Stat::read(pid) else {
        return true;
    };
    let state = stat.field(3).unwrap_or("X");
    let flags = stat.number(9).unwrap_or(0);
    matches!(state, "Z" | "X" | "x") || flags & PF_EXITING != 0
}

/// Whether this process has any child at all, live or ended (without reaping one).
fn has_children() -> bool {
    use nix::libc;
    // SAFETY: waitid with WNOWAIT only fills `info`; it reaps nothing.
    let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
    let rc = unsafe {
        libc::waitid(libc::P_ALL, 0, &mut info, libc::WEXITED | libc::WNOHANG | libc::WNOWAIT)
    };
    !(rc == -1 && std::io::Error::last_os_error().raw_os_error() == Some(libc::ECHILD))
}

/// SIGKILLs every descendant outside `spare`.
pub fn kill_descendants(spare: &HashSet<i32>) {
    kill_descendants_but(spare, None)
}

/// A proxy's sweep: SIGKILLs every descendant outside `spare` and outside the subtrees of
/// other proxies (processes of `proxy_exe`, the executable child proxies run, or of this
/// process's own). A proxy cleans up its own subtree, and one below this proxy's that is no
/// child of its may be a proxy whose parent was lost and that rlaunch adopted
/// (`Job::adoption`): on this machine (fork-started nodes) it was re-parented to this
/// proxy, the nearest subreaper, and lives on for the job.
pub fn kill_descendants_but_proxies(spare: &HashSet<i32>, proxy_exe: &std::ffi::OsStr) {
    kill_descendants_but(spare, Some(proxy_exe))
}

fn kill_descendants_but(spare: &HashSet<i32>, proxy_exe: Option<&std::ffi::OsStr>) {
    // Every descendant hangs below a child. Without children there is nothing to find, and
    // no reason to read all of /proc (which, with a thousand proxies on one machine, each
    // doing it, costs seconds).
    if !has_children() {
        return;
    }
    // The guard lives as long as the proxy, to kill it should it stop (see crate::guard).
    let guard = crate::guard::pid();
    let proxies: Vec<std::path::PathBuf> = proxy_exe.map_or_else(Vec::new, |proxy_exe| {
        [std::fs::read_link("/proc/self/exe").ok(), std::fs::canonicalize(proxy_exe).ok()]
            .into_iter()
            .flatten()
            .collect()
    });
    let proxy = |pid: i32| {
        !proxies.is_empty()
            && std::fs::read_link(format!("/proc/{pid}/exe")).is_ok_and(|e| proxies.contains(&e))
    };
    for pid in descendants_but(spare, proxy).into_iter().filter(|&pid| Some(pid) != guard) {
        signal_pid(pid, Signal::SIGKILL);
    }
}

/// What this process has used so far (all its threads; not its children), with
/// `fds_running` left for the caller, which knows when its ranks had started.
pub fn own_usage() -> rlaunch_protocol::record::OwnUsage {
    use nix::sys::resource::{getrusage, UsageWho};
    let Ok(usage) = getrusage(UsageWho::RUSAGE_SELF) else { return Default::default() };
    let micros = |t: nix::sys::time::TimeVal| t.tv_sec() as u64 * 1_000_000 + t.tv_usec() as u64;
    rlaunch_protocol::record::OwnUsage {
        user_us: micros(usage.user_time()),
        system_us: micros(usage.system_time()),
        maxrss_kib: usage.max_rss() as u64,
        fds_running: 0,
    }
}

/// How many descriptors this process has open (0 if /proc cannot say).
pub fn open_fds() -> u32 {
    // The directory's own descriptor is among those listed.
    std::fs::read_dir("/proc/self/fd").map_or(0, |dir| dir.count().saturating_sub(1) as u32)
}

/// Marks every descriptor from 3 up close-on-exec, so that whatever this process inherited
/// (a shell's, a batch system's, a test harness's) is not passed on to proxies and ranks.
pub fn cloexec_inherited_fds() {
    use nix::libc;
    // SAFETY: close_range only changes descriptor flags.
    let rc =
        unsafe { libc::syscall(libc::SYS_close_range, 3u32, u32::MAX, libc::CLOSE_RANGE_CLOEXEC) };
    if rc == 0 {
        return;
    }
    // Kernels before 5.11: walk what is open.
    let Ok(dir) = std::fs::read_dir("/proc/self/fd") else { return };
    let fds: Vec<i32> =
        dir.flatten().filter_map(|e| e.file_name().to_str()?.parse().ok()).collect();
    for fd in fds.into_iter().filter(|&fd| fd > 2) {
        // SAFETY: setting FD_CLOEXEC on a descriptor we may not own changes no memory.
        unsafe { libc::fcntl(fd, libc::F_SETFD, libc::FD_CLOEXEC) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A child from a thread of its own, and its own child: both walks find both, and
    /// sparing the child spares its subtree.
    #[test]
    fn the_walk_by_children_lists_finds_what_a_scan_of_proc_finds() {
        let spawned = std::thread::spawn(|| {
            std::process::Command::new("sh")
                .args(["-c", "sleep 60 & echo $!; exec sleep 60"])
                .stdout(std::process::Stdio::piped())
                .spawn()
                .unwrap()
        });
        let mut child = spawned.join().unwrap();
        let mut line = String::new();
        use std::io::BufRead;
        std::io::BufReader::new(child.stdout.take().unwrap()).read_line(&mut line).unwrap();
        let grandchild: i32 = line.trim().parse().unwrap();
        let pid = child.id() as i32;
        let walked = descendants(&HashSet::new());
        let scanned = descendants_scanning(&HashSet::new(), |_| false);
        for p in [pid, grandchild] {
            assert!(walked.contains(&p), "{p} not in {walked:?}");
            assert!(scanned.contains(&p), "{p} not in {scanned:?}");
        }
        let spared = descendants(&HashSet::from([pid]));
        assert!(!spared.contains(&pid) && !spared.contains(&grandchild), "{spared:?}");
        signal_pid(grandchild, Signal::SIGKILL);
        let _ = child.kill();
        let _ = child.wait();
    }
}
