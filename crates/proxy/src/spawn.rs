//! Creating a rank's process: `clone(CLONE_VM | CLONE_VFORK)` then `execve`, the way glibc's
//! posix_spawn does it, plus the steps posix_spawn cannot take (PR_SET_PDEATHSIG, CPU
//! binding).
//!
//! Why not `std::process::Command`: with a `pre_exec` hook it forks, and fork copies the
//! proxy's page tables and then copy-on-write faults on both sides. Profiling a 256-rank
//! launch put about a third of the proxy's CPU there. A vfork-style child shares the proxy's
//! memory and runs only until its execve; the proxy waits for that.
//!
//! ```text
//!   Program::new (once per job segment)   Spawn::start (once per rank)
//!   resolved path, argv, base environment ──► envp + rank variables ──► clone ──► execve
//! ```
//!
//! Everything the child touches is built before the clone: it allocates nothing, takes no
//! lock, and calls only async-signal-safe functions.

use std::collections::HashMap;
use std::ffi::{CStr, CString, OsStr};
use std::os::fd::RawFd;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::sync::atomic::{AtomicI32, AtomicUsize, Ordering};
use std::sync::{mpsc, Arc, OnceLock};

use nix::libc::{self, c_char};
use nix::sched::{CloneFlags, CpuSet};
use rlaunch_protocol::control::{Job, Segment};
use rlaunch_protocol::ids::ExitOutcome;

/// The default search path of execvp when the environment has no PATH.
const DEFAULT_PATH: &[u8] = b"/bin:/usr/bin";
thread_local! {
    /// Stack of the short-lived child; it only makes a few system calls. One per thread,
    /// reused: the parent waits (CLONE_VFORK) until the child no longer needs it. Allocating
    /// it zeroed for every rank was a 64 KiB memset per rank.
    static CHILD_STACK: std::cell::RefCell<Vec<u8>> = std::cell::RefCell::new(vec![0; 64 << 10]);
}

/// One MPMD segment's executable, ready to start any number of times.
pub struct Program {
    path: CString,
    argv: Vec<CString>,
    /// The inherited and segment variables, without the ones set per rank.
    env: Vec<CString>,
    wdir: Option<CString>,
}

impl Program {
    /// Resolves the executable on the ranks' PATH and builds what every rank shares.
    /// `per_rank` names the variables each rank gets its own value of.
    pub fn new(job: &Job, segment: &Segment, per_rank: &[&str]) -> Result<Program, ExitOutcome> {
        let inherited = if segment.inherit_env { &job.env[..] } else { &[] };
        // Later wins, as with repeated `env` calls; the first position is kept.
        let mut order: Vec<&[u8]> = Vec::new();
        let mut values: HashMap<&[u8], &[u8]> = HashMap::new();
        for (k, v) in inherited.iter().chain(&segment.env) {
            if per_rank.iter().any(|p| p.as_bytes() == k.as_slice()) {
                continue;
            }
            if values.insert(k, v).is_none() {
                order.push(k);
            }
        }
        let env = order.iter().filter_map(|k| pair(k, values[k])).collect();
        let search = values.get(&b"PATH"[..]).copied().unwrap_or(DEFAULT_PATH);
        let wdir = (!segment.wdir.is_empty()).then(|| cstring(&segment.wdir));
        // Checked here because a failed chdir in the child would look like a missing program.
        if let Some(dir) = &wdir {
            // A file is "not a directory", not "permission denied" as access() has it.
            let is_dir = std::fs::metadata(OsStr::from_bytes(&segment.wdir)).map(|m| m.is_dir());
            if is_dir.is_ok_and(|d| !d) {
                return Err(ExitOutcome::NoWorkdir { errno: libc::ENOTDIR });
            }
            // SAFETY: a valid C string.
            if unsafe { libc::access(dir.as_ptr(), libc::X_OK) } != 0 {
                return Err(ExitOutcome::NoWorkdir { errno: last_errno() });
            }
        }
        let path = resolve(&segment.exe, search, wdir.as_deref())?;
        let mut argv = vec![cstring(&segment.exe)];
        argv.extend(segment.args.iter().map(|a| cstring(a)));
        Ok(Program { path, argv, env, wdir })
    }
}

/// One process to start.
pub struct Spawn {
    pub program: Arc<Program>,
    /// Set on top of the program's environment.
    pub env: Vec<(&'static str, String)>,
    pub stdin: RawFd,
    pub stdout: RawFd,
    pub stderr: RawFd,
    /// A close-on-exec descriptor the process inherits (its PMI socket).
    pub keep: Option<RawFd>,
    pub cpus: Option<CpuSet>,
    /// A session of its own, as Hydra's ranks have: under the kernel's autogroup (on in
    /// Debian's and Ubuntu's kernels) a CPU share of its own rather than one shared with the
    /// launcher's login session, and out of the terminal's job control. Only where each rank
    /// has a CPU: the kernel's `sched_yield` yields within a group, so oversubscribed ranks
    /// that yield while they wait (Open MPI told so) must share one, or they wait 3 times as
    /// long (docs/measurements.md, *Ranks beside other work*). Else its own process group.
    pub own_session: bool,
    /// `NAME=value` entries ahead of all others (its PMIx server's): the first of a name in
    /// an environment is the one read, so these win over any inherited value.
    pub front_env: Vec<CString>,
}

/// What the child writes for the parent before it gives up; the parent reads it after the
/// child's exit released it (CLONE_VFORK). 0 means the execve happened.
struct Failure {
    errno: AtomicI32,
}

impl Spawn {
    /// Starts the process in its own process group (and session: `own_session`); returns its
    /// pid.
    pub fn start(&self) -> Result<i32, ExitOutcome> {
        let p = &*self.program;
        let extra: Vec<CString> =
            self.env.iter().filter_map(|(k, v)| pair(k.as_bytes(), v.as_bytes())).collect();
        let mut envp: Vec<*const c_char> = self.front_env.iter().map(|c| c.as_ptr()).collect();
        envp.extend(p.env.iter().map(|c| c.as_ptr()));
        envp.extend(extra.iter().map(|c| c.as_ptr()));
        envp.push(std::ptr::null());
        let mut argv: Vec<*const c_char> = p.argv.iter().map(|c| c.as_ptr()).collect();
        argv.push(std::ptr::null());
        let failure = Failure { errno: AtomicI32::new(0) };
        let child = ChildSteps {
            path: p.path.as_ptr(),
            argv: argv.as_ptr(),
            envp: envp.as_ptr(),
            wdir: p.wdir.as_ref().map(|d| d.as_ptr()),
            stdio: [self.stdin, self.stdout, self.stderr],
            keep: self.keep,
            cpus: self.cpus,
            own_session: self.own_session,
            parent: std::process::id() as i32,
            failure: &failure,
        };
        // Signals stay blocked across the clone, so that no handler of the proxy's runs in the
        // child (which shares its memory) before the child has reset them.
        let mut all: libc::sigset_t = unsafe { std::mem::zeroed() };
        let mut old: libc::sigset_t = unsafe { std::mem::zeroed() };
        // SAFETY: plain libc calls on local sigsets; the clone child runs `child.run`, which
        // follows the rules above, on its own stack, while this thread waits (CLONE_VFORK).
        let pid = unsafe {
            libc::sigfillset(&mut all);
            libc::pthread_sigmask(libc::SIG_SETMASK, &all, &mut old);
            let pid = CHILD_STACK.with_borrow_mut(|stack| {
                nix::sched::clone(
                    Box::new(|| child.run()),
                    stack,
                    CloneFlags::CLONE_VM | CloneFlags::CLONE_VFORK,
                    Some(libc::SIGCHLD),
                )
            });
            libc::pthread_sigmask(libc::SIG_SETMASK, &old, std::ptr::null_mut());
            pid
        };
        let pid = pid.map_err(|e| ExitOutcome::SpawnFailed { errno: e as i32 })?.as_raw();
        match failure.errno.load(Ordering::Acquire) {
            0 => Ok(pid),
            errno => {
                // Reap it here: it never became a rank.
                let _ = nix::sys::wait::waitpid(nix::unistd::Pid::from_raw(pid), None);
                Err(ExitOutcome::SpawnFailed { errno })
            }
        }
    }
}

/// Batches smaller than this start on the calling thread alone.
const PARALLEL_FROM: usize = 8;
/// At most this many helper threads, whatever the machine.
const MAX_HELPERS: usize = 3;

/// Starts every process of `batch`; the results come in the same order.
///
/// [`Spawn::start`] returns once its child has exec'd (CLONE_VFORK), and the exec, which is
/// most of a start's cost, runs on another CPU: one thread starting ranks keeps only one
/// exec going at a time, where fork would let the parent go on. So a batch is shared
/// between the calling thread and a helper per further CPU, each waiting on its own child.
pub fn start_all(batch: Vec<Spawn>) -> Vec<Result<i32, ExitOutcome>> {
    let helpers = if batch.len() >= PARALLEL_FROM { helpers() } else { &[] };
    if helpers.is_empty() {
        return batch.iter().map(Spawn::start).collect();
    }
    let (done, finished) = mpsc::channel();
    let shared = Arc::new(Batch {
        results: (0..batch.len()).map(|_| OnceLock::new()).collect(),
        spawns: batch,
        next: AtomicUsize::new(0),
        done,
    });
    // A helper never ends (see `helpers`), so a send cannot fail; if one did, the work would
    // still be done here.
    let working = helpers.iter().filter(|h| h.send(shared.clone()).is_ok()).count();
    shared.work();
    for _ in 0..working {
        // The batch holds a sender, so this waits for a helper rather than failing.
        let _ = finished.recv();
    }
    shared.results.iter().map(|r| *r.get().expect("every spawn of the batch was started")).collect()
}

/// Creates ranks' processes.
pub(crate) trait Spawner: Send {
    /// Starts a batch of ranks: each one's pid, or how it failed to run, in the batch's
    /// order. The descriptors each `Spawn` names are the rank's ends, closed once this
    /// returns.
    fn start_all(&mut self, batch: Vec<Spawn>) -> Vec<Result<i32, ExitOutcome>>;
}

/// This process's: `clone` and `execve` (this module's [`start_all`]).
pub(crate) struct Processes;

impl Spawner for Processes {
    fn start_all(&mut self, batch: Vec<Spawn>) -> Vec<Result<i32, ExitOutcome>> {
        start_all(batch)
    }
}

/// A batch shared by the threads starting it.
struct Batch {
    spawns: Vec<Spawn>,
    next: AtomicUsize,
    results: Vec<OnceLock<Result<i32, ExitOutcome>>>,
    /// Each helper says here that it has taken its last spawn.
    done: mpsc::Sender<()>,
}

impl Batch {
    /// Takes spawns off the batch until none is left.
    fn work(&self) {
        loop {
            let i = self.next.fetch_add(1, Ordering::Relaxed);
            let Some(spawn) = self.spawns.get(i) else { return };
            let _ = self.results[i].set(spawn.start());
        }
    }
}

/// The CPUs this proxy may run its ranks on (its affinity, a cgroup's quota).
pub(crate) fn cpus_here() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// The helper threads, started on first use and never ended: the kernel sends a rank its
/// PR_SET_PDEATHSIG when the *thread* that created it exits, so a helper that returned would
/// kill every rank it started. They end with the process, as they should.
fn helpers() -> &'static [mpsc::Sender<Arc<Batch>>] {
    static HELPERS: OnceLock<Vec<mpsc::Sender<Arc<Batch>>>> = OnceLock::new();
    HELPERS.get_or_init(|| {
        let cpus = cpus_here();
        // Helpers allocate a few small vectors per spawn: the main arena will do, rather
        // than an arena of their own each.
        // SAFETY: mallopt with integer arguments.
        unsafe { libc::mallopt(libc::M_ARENA_MAX, 1) };
        (1..cpus.min(MAX_HELPERS + 1))
            .filter_map(|i| {
                let (tx, rx) = mpsc::channel::<Arc<Batch>>();
                let spawned = std::thread::Builder::new()
                    .name(format!("spawn-{i}"))
                    .stack_size(128 << 10)
                    .spawn(move || loop {
                        let Ok(batch) = rx.recv() else {
                            // The sender is in a static and is never dropped; park for good
                            // rather than return (see above).
                            loop {
                                std::thread::park();
                            }
                        };
                        batch.work();
                        let _ = batch.done.send(());
                    });
                match spawned {
                    Ok(_) => Some(tx),
                    Err(e) => {
                        tracing::debug!("cannot start a spawn helper thread: {e}");
                        None
                    }
                }
            })
            .collect()
    })
}

/// What the child does between clone and execve, all prepared by the parent.
struct ChildSteps<'a> {
    path: *const c_char,
    argv: *const *const c_char,
    envp: *const *const c_char,
    wdir: Option<*const c_char>,
    stdio: [RawFd; 3],
    keep: Option<RawFd>,
    cpus: Option<CpuSet>,
    own_session: bool,
    parent: i32,
    failure: &'a Failure,
}

impl ChildSteps<'_> {
    /// Runs in the child. Never returns on success (execve); on failure records errno and
    /// exits 127.
    fn run(&self) -> isize {
        // SAFETY: async-signal-safe calls only, on memory the parent keeps alive and does not
        // touch until this process has exec'd or exited.
        unsafe {
            let fail = |errno: i32| -> isize {
                self.failure.errno.store(errno.max(1), Ordering::Release);
                libc::_exit(127)
            };
            // Handlers are the proxy's, and this process shares its memory: back to default.
            // SIGPIPE too, which Rust programs ignore (std's spawn resets it as well).
            for sig in 1..libc::SIGRTMAX() {
                if sig == libc::SIGKILL || sig == libc::SIGSTOP {
                    continue;
                }
                let mut old: libc::sigaction = std::mem::zeroed();
                if libc::sigaction(sig, std::ptr::null(), &mut old) != 0 {
                    continue;
                }
                if old.sa_sigaction != libc::SIG_IGN || sig == libc::SIGPIPE {
                    let mut dfl: libc::sigaction = std::mem::zeroed();
                    dfl.sa_sigaction = libc::SIG_DFL;
                    libc::sigaction(sig, &dfl, std::ptr::null_mut());
                }
            }
            // Its own process group, which the proxy signals, in a session of its own where
            // it has a CPU (see `own_session`).
            let grouped = if self.own_session { libc::setsid() } else { libc::setpgid(0, 0) };
            if grouped < 0 {
                return fail(last_errno());
            }
            // Backstop: if the proxy dies without cleaning up, the kernel kills the rank.
            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL, 0, 0, 0);
            if libc::getppid() != self.parent {
                libc::_exit(137);
            }
            for (target, fd) in self.stdio.iter().enumerate() {
                if libc::dup2(*fd, target as i32) < 0 {
                    return fail(last_errno());
                }
            }
            if let Some(fd) = self.keep {
                if libc::fcntl(fd, libc::F_SETFD, 0) != 0 {
                    return fail(last_errno());
                }
            }
            if let Some(dir) = self.wdir {
                if libc::chdir(dir) != 0 {
                    return fail(last_errno());
                }
            }
            if let Some(set) = &self.cpus {
                // Binding is a hint for performance, not a condition to run: a cpuset that
                // shrank since the proxy looked is no reason to fail the job. The rank says
                // so on its own stderr, where its lines go.
                if nix::sched::sched_setaffinity(nix::unistd::Pid::from_raw(0), set).is_err() {
                    const MSG: &[u8] =
                        b"rlaunch-proxy: cannot bind this rank to its CPUs; it runs unbound\n";
                    libc::write(2, MSG.as_ptr().cast(), MSG.len());
                }
            }
            let mut none: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&mut none);
            libc::sigprocmask(libc::SIG_SETMASK, &none, std::ptr::null_mut());
            libc::execve(self.path, self.argv, self.envp);
            fail(last_errno())
        }
    }
}

/// The file execvp would run for `exe`: as given if it holds a slash, else the first
/// executable match on `search` (relative entries count from `wdir`, as they would after
/// the child's chdir).
fn resolve(exe: &[u8], search: &[u8], wdir: Option<&CStr>) -> Result<CString, ExitOutcome> {
    if exe.is_empty() {
        return Err(ExitOutcome::SpawnFailed { errno: libc::ENOENT });
    }
    if exe.contains(&b'/') {
        // execve says what is wrong with it (not found, not executable), but only
        // "permission denied" for a directory.
        let path = match wdir {
            Some(wdir) if !exe.starts_with(b"/") => {
                Path::new(OsStr::from_bytes(wdir.to_bytes())).join(OsStr::from_bytes(exe))
            }
            _ => Path::new(OsStr::from_bytes(exe)).to_path_buf(),
        };
        if path.is_dir() {
            return Err(ExitOutcome::SpawnFailed { errno: libc::EISDIR });
        }
        return Ok(cstring(exe));
    }
    let mut denied = false;
    for dir in search.split(|&b| b == b':') {
        let mut candidate = if dir.is_empty() { b".".to_vec() } else { dir.to_vec() };
        candidate.push(b'/');
        candidate.extend_from_slice(exe);
        let checked = match wdir {
            Some(wdir) if !candidate.starts_with(b"/") => {
                let mut full = wdir.to_bytes().to_vec();
                full.push(b'/');
                full.extend_from_slice(&candidate);
                full
            }
            _ => candidate.clone(),
        };
        let checked_c = cstring(&checked);
        // SAFETY: a valid C string.
        if unsafe { libc::access(checked_c.as_ptr(), libc::X_OK) } == 0 {
            if std::fs::metadata(OsStr::from_bytes(&checked)).is_ok_and(|m| m.is_file()) {
                return Ok(cstring(&candidate));
            }
        } else if last_errno() == libc::EACCES {
            denied = true;
        }
    }
    let errno = if denied { libc::EACCES } else { libc::ENOENT };
    Err(ExitOutcome::SpawnFailed { errno })
}

/// `KEY=VALUE`, or nothing for a pair a C environment cannot hold (a NUL byte).
fn pair(key: &[u8], value: &[u8]) -> Option<CString> {
    let mut bytes = Vec::with_capacity(key.len() + value.len() + 1);
    bytes.extend_from_slice(key);
    bytes.push(b'=');
    bytes.extend_from_slice(value);
    CString::new(bytes).ok()
}

/// A C string of `bytes` up to any NUL (which the wire allows and C cannot hold).
fn cstring(bytes: &[u8]) -> CString {
    let end = bytes.iter().position(|&b| b == 0).unwrap_or(bytes.len());
    CString::new(&bytes[..end]).expect("no NUL before end")
}

fn last_errno() -> i32 {
    std::io::Error::last_os_error().raw_os_error().unwrap_or(libc::EIO)
}
