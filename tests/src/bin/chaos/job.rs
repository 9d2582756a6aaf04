//! One rlaunch job of a trial: started with its output checked as it streams, its stdin fed,
//! and the processes it is made of found on every node.

use std::io::{Read, Write};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use rlaunch_tests::{
    flood_line, procfs, scan_flood_stream_with, FloodReport, FloodScanner, Tag, TAG_VAR,
};

/// The rank number of the lines fed to stdin (`chaosrank` passes them through rank 0).
pub const STDIN_RANK: u32 = 999_999;

/// What rlaunch printed on stderr: enough for every line that matters, bounded.
const STDERR_KEEP: usize = 64 * 1024;

pub struct Job {
    child: Child,
    status: Option<ExitStatus>,
    pub tag: Tag,
    pub started: Instant,
    stdout: Option<JoinHandle<Result<FloodReport, String>>>,
    stderr: Option<JoinHandle<Vec<u8>>>,
    stdin_stop: Arc<AtomicBool>,
    stdin: Option<JoinHandle<()>>,
}

impl Job {
    /// Starts rlaunch with `args` and `env` added to this environment; its stdout is checked
    /// as flood lines, `lenient` ranks' with gaps allowed (see [`FloodScanner::lenient`]).
    pub fn start(
        rlaunch: &Path,
        args: &[String],
        env: &[(String, String)],
        feed_stdin: bool,
        lenient: Vec<u32>,
    ) -> Job {
        let tag = Tag::new();
        let mut command = Command::new(rlaunch);
        command
            .args(args)
            .envs(env.iter().map(|(k, v)| (k, v)))
            .env(TAG_VAR, tag.as_str())
            .stdin(if feed_stdin { Stdio::piped() } else { Stdio::null() })
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .process_group(0);
        let mut child = command
            .spawn()
            .unwrap_or_else(|e| panic!("chaos: cannot start {}: {e}", rlaunch.display()));
        let out = child.stdout.take().expect("piped");
        let scanner = FloodScanner::lenient(lenient);
        let stdout = std::thread::spawn(move || scan_flood_stream_with(out, None, scanner).1);
        let mut err = child.stderr.take().expect("piped");
        let stderr = std::thread::spawn(move || {
            let mut kept = Vec::new();
            let mut buf = [0; 8192];
            while let Ok(n @ 1..) = err.read(&mut buf) {
                let room = STDERR_KEEP.saturating_sub(kept.len());
                kept.extend_from_slice(&buf[..n.min(room)]);
            }
            kept
        });
        let stdin_stop = Arc::new(AtomicBool::new(false));
        let stdin = child.stdin.take().map(|mut pipe| {
            let stop = Arc::clone(&stdin_stop);
            std::thread::spawn(move || {
                let mut seq = 0;
                while !stop.load(Ordering::Relaxed) {
                    let mut block = Vec::with_capacity(64 * 64);
                    for _ in 0..64 {
                        block.extend_from_slice(&flood_line(STDIN_RANK, seq));
                        seq += 1;
                    }
                    if pipe.write_all(&block).is_err() {
                        break;
                    }
                }
            })
        });
        Job {
            child,
            status: None,
            tag,
            started: Instant::now(),
            stdout: Some(stdout),
            stderr: Some(stderr),
            stdin_stop,
            stdin,
        }
    }

    pub fn pid(&self) -> Pid {
        Pid::from_raw(self.child.id() as i32)
    }

    pub fn status(&mut self) -> Option<ExitStatus> {
        if self.status.is_none() {
            self.status = self.child.try_wait().ok().flatten();
        }
        self.status
    }

    /// Waits for rlaunch to exit until `deadline`.
    pub fn wait_until(&mut self, deadline: Instant) -> Option<ExitStatus> {
        loop {
            if let Some(status) = self.status() {
                return Some(status);
            }
            if Instant::now() >= deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// SIGCONT and SIGKILL rlaunch, and reap it.
    pub fn kill(&mut self) -> ExitStatus {
        let _ = kill(self.pid(), Signal::SIGCONT);
        let _ = self.child.kill();
        let status = self.child.wait().expect("rlaunch is our child");
        self.status = Some(status);
        status
    }

    /// Stops feeding stdin, and collects what stdout and stderr delivered. Streams still
    /// open after `patience` (a process left behind holds them) give what came so far.
    pub fn output(&mut self, patience: Duration) -> (Result<FloodReport, String>, Vec<u8>) {
        self.stdin_stop.store(true, Ordering::Relaxed);
        let deadline = Instant::now() + patience;
        let out = join_by(self.stdout.take(), deadline)
            .unwrap_or_else(|| Err("stdout still open: a process of the job holds it".into()));
        let err = join_by(self.stderr.take(), deadline).unwrap_or_default();
        if let Some(stdin) = self.stdin.take() {
            if stdin.is_finished() {
                let _ = stdin.join();
            }
        }
        (out, err)
    }
}

impl Drop for Job {
    fn drop(&mut self) {
        if self.status.is_none() {
            self.kill();
        }
        for p in self.tag.processes() {
            let _ = kill(p.pid, Signal::SIGCONT);
        }
        self.tag.kill_all();
    }
}

fn join_by<T>(handle: Option<JoinHandle<T>>, deadline: Instant) -> Option<T> {
    let handle = handle?;
    while !handle.is_finished() {
        if Instant::now() >= deadline {
            return None;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    handle.join().ok()
}

/// The files `chaosrank` leaves in its directory.
pub struct RankFiles {
    dir: PathBuf,
}

impl RankFiles {
    pub fn new(dir: PathBuf) -> RankFiles {
        RankFiles { dir }
    }

    pub fn pid(&self, rank: u32) -> Option<i32> {
        std::fs::read_to_string(self.dir.join(format!("pid.{rank}"))).ok()?.trim().parse().ok()
    }

    pub fn ready(&self, rank: u32) -> bool {
        self.dir.join(format!("ready.{rank}")).exists()
    }

    /// The failed ranks the rank was told of (continue policy), if it was.
    pub fn told(&self, rank: u32) -> Option<String> {
        std::fs::read_to_string(self.dir.join(format!("told.{rank}"))).ok()
    }

    /// Lines the rank wrote to its stdout, by its own count.
    pub fn lines(&self, rank: u32) -> u64 {
        std::fs::read_to_string(self.dir.join(format!("lines.{rank}")))
            .ok()
            .and_then(|t| t.trim().parse().ok())
            .unwrap_or(0)
    }
}

/// Polls `probe` every 2 ms until it gives something or `deadline` passes.
pub fn poll<T>(deadline: Instant, mut probe: impl FnMut() -> Option<T>) -> Option<T> {
    loop {
        if let Some(found) = probe() {
            return Some(found);
        }
        if Instant::now() >= deadline {
            return None;
        }
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// A process for the report: pid, command name, state.
pub fn describe(pid: i32) -> String {
    let Some(stat) = procfs::stat(pid) else {
        return format!("{pid} (gone)");
    };
    let args = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
    let args: String = String::from_utf8_lossy(&args).replace('\0', " ").chars().take(80).collect();
    format!("{pid} ({}, {}, parent {}: {})", stat.comm, stat.state, stat.ppid, args.trim_end())
}

/// Network namespaces' inode numbers: a process is on node I when its `ns/net` is node I's.
pub fn netns_inode(name: &str) -> Option<u64> {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(format!("/run/netns/{name}")).ok().map(|m| m.ino())
}

/// Live processes in any of these network namespaces, sshd's own aside: what is left of jobs
/// on the hosts of the ssh topology.
pub fn processes_in_netns(inodes: &[u64]) -> Vec<i32> {
    procfs::pids()
        .into_iter()
        .filter(|&pid| {
            let Ok(link) = std::fs::read_link(format!("/proc/{pid}/ns/net")) else {
                return false;
            };
            let link = link.to_string_lossy().into_owned();
            let inode = link.trim_start_matches("net:[").trim_end_matches(']').parse::<u64>();
            if !inode.is_ok_and(|i| inodes.contains(&i)) {
                return false;
            }
            procfs::stat(pid)
                .is_some_and(|s| !s.comm.starts_with("sshd") && !matches!(s.state, 'Z' | 'X'))
        })
        .collect()
}

/// The ssh client carrying node `host`'s proxy, if one runs: `ssh ... host ...`, of this
/// job (tagged: started by rlaunch) or of a remote proxy (in one of `inodes`).
pub fn ssh_client_of(host: &str, tag: &str, inodes: &[u64]) -> Option<i32> {
    let tagged: Vec<i32> =
        rlaunch_tests::tagged_processes(tag).iter().map(|p| p.pid.as_raw()).collect();
    let remote = processes_in_netns(inodes);
    tagged.into_iter().chain(remote).find(|&pid| {
        procfs::stat(pid).is_some_and(|s| s.comm == "ssh")
            && std::fs::read(format!("/proc/{pid}/cmdline"))
                .is_ok_and(|c| c.split(|&b| b == 0).any(|w| w == host.as_bytes()))
    })
}
