//! Stopping, inspecting and resuming the threads of a live process with ptrace.
//!
//! Protocol per thread: `PTRACE_SEIZE` (does not stop), `PTRACE_INTERRUPT`, then wait until the
//! thread is in a ptrace-stop.  The stop is detected by polling `/proc/PID/task/TID/stat` for
//! state `t` (tracing stop), NOT by relying on a wait notification, because a process-wide
//! `wait4(-1, WNOHANG)` SIGCHLD reaper elsewhere in the tracer may consume the notification of
//! the thread-group leader.  `waitid(P_PID, tid, WSTOPPED|WNOHANG|__WALL)` is only used to
//! consume a still-pending notification so that it does not linger.  A hard deadline bounds the
//! whole stop phase; threads that do not stop in time (D state, ...) are reported unreadable.
//!
//! IMPORTANT: ptrace's tracer is the *thread* that attached.  All calls on a `Stopped`
//! must happen on the thread that created it (it is `!Send`).  If that thread exits, the kernel
//! detaches all its remaining tracees (`exit_ptrace`), which is how stragglers that could not
//! be detached (still running, e.g. in D state, when we gave up) get released: run a dump on a
//! short-lived thread.

use std::collections::BTreeMap;
use std::marker::PhantomData;
use std::time::{Duration, Instant};

use nix::errno::Errno;
use nix::sys::ptrace;
use nix::sys::wait::{waitid, Id, WaitPidFlag};
use nix::unistd::Pid;

/// The registers needed for unwinding (x86_64).
#[derive(Clone, Copy, Debug)]
pub struct Regs {
    pub ip: u64,
    pub sp: u64,
    pub bp: u64,
}

#[derive(Clone, Debug)]
pub enum ThreadStatus {
    /// In a ptrace-stop; registers read.
    Stopped(Regs),
    /// Could not be stopped or read; the string says why.
    Unreadable(String),
}

#[derive(Debug)]
pub struct ThreadState {
    pub tid: i32,
    /// Scheduler state letter from /proc before we attached (R, S, D, T, ...).
    pub state_before: char,
    pub comm: String,
    pub status: ThreadStatus,
    attached: bool,
    /// Signal that put the thread into a signal-delivery-stop while we held it; re-injected on detach.
    pending_signal: Option<i32>,
}

/// A process whose threads are held in ptrace-stop.  Detaches (resumes) all threads on drop.
pub struct Stopped {
    pub pid: i32,
    pub threads: Vec<ThreadState>,
    /// Threads that were still running when we gave up and so could not be detached; they are
    /// released when the tracer thread exits.
    pub stragglers: Vec<i32>,
    _not_send: PhantomData<*const ()>,
}

const PTRACE_EVENT_STOP: i32 = 128;

/// Reads the state letter and comm of a thread from /proc/PID/task/TID/stat.
pub fn thread_stat(pid: i32, tid: i32) -> Option<(char, String)> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/stat")).ok()?;
    let open = s.find('(')?;
    let close = s.rfind(')')?;
    let comm = s[open + 1..close].to_string();
    let state = s[close + 1..].trim_start().chars().next()?;
    Some((state, comm))
}

pub fn list_tids(pid: i32) -> std::io::Result<Vec<i32>> {
    let mut tids: Vec<i32> = std::fs::read_dir(format!("/proc/{pid}/task"))?
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
        .collect();
    tids.sort();
    Ok(tids)
}

/// A process whose threads were told to stop (seized and interrupted), not yet seen stopped.
pub struct Stopping {
    pid: i32,
    threads: BTreeMap<i32, ThreadState>,
    interrupted_at: BTreeMap<i32, Instant>,
    _not_send: PhantomData<*const ()>,
}

impl Stopping {
    /// Tells every thread of `pid` to stop, without waiting: many processes can be told
    /// first and waited for after, so that those stopped already no longer compete for the
    /// CPU with those still to stop. Errors only if the process does not exist.
    pub fn begin(pid: i32, until: Instant) -> std::io::Result<Stopping> {
        let mut threads: BTreeMap<i32, ThreadState> = BTreeMap::new();
        let mut interrupted_at: BTreeMap<i32, Instant> = BTreeMap::new();
        // Seize + interrupt; re-list the tasks until no new thread appears (bounded), so threads
        // created while we attach are caught too.
        for _round in 0..5 {
            let mut new = 0;
            for tid in list_tids(pid)? {
                if threads.contains_key(&tid) {
                    continue;
                }
                new += 1;
                let (state_before, comm) = thread_stat(pid, tid).unwrap_or(('?', String::new()));
                let mut ts = ThreadState {
                    tid,
                    state_before,
                    comm,
                    status: ThreadStatus::Unreadable("it did not stop in time".into()),
                    attached: false,
                    pending_signal: None,
                };
                let p = Pid::from_raw(tid);
                match ptrace::seize(p, ptrace::Options::empty()) {
                    Ok(()) => {
                        ts.attached = true;
                        match ptrace::interrupt(p) {
                            Ok(()) => {
                                interrupted_at.insert(tid, Instant::now());
                            }
                            Err(e) => {
                                ts.status = ThreadStatus::Unreadable(format!(
                                    "ptrace refused it: {}",
                                    e.desc()
                                ))
                            }
                        }
                    }
                    Err(Errno::ESRCH) => {
                        continue; // thread exited meanwhile
                    }
                    Err(e) => {
                        ts.status =
                            ThreadStatus::Unreadable(format!("ptrace refused it: {}", e.desc()))
                    }
                }
                threads.insert(tid, ts);
            }
            if new == 0 || Instant::now() >= until {
                break;
            }
        }

        Ok(Stopping { pid, threads, interrupted_at, _not_send: PhantomData })
    }

    /// How many threads were told to stop.
    pub fn threads(&self) -> usize {
        self.interrupted_at.len()
    }

    /// Waits until every thread told to stop has, or `until`; reads their registers.
    pub fn wait(self, until: Instant) -> Stopped {
        let Stopping { pid, mut threads, interrupted_at, .. } = self;
        // Poll for the stops.
        let mut waiting: Vec<i32> = interrupted_at.keys().copied().collect();
        let mut sleep = Duration::from_micros(20);
        while !waiting.is_empty() {
            waiting.retain(|&tid| {
                let ts = threads.get_mut(&tid).unwrap();
                match thread_stat(pid, tid) {
                    None => {
                        ts.status = ThreadStatus::Unreadable("it ended".into());
                        ts.attached = false;
                        false
                    }
                    Some(('t', _)) => {
                        Stopped::on_stopped(ts);
                        false
                    }
                    Some(('Z' | 'X', _)) => {
                        ts.status = ThreadStatus::Unreadable("zombie".into());
                        false
                    }
                    Some(_) => true,
                }
            });
            if waiting.is_empty() || Instant::now() >= until {
                break;
            }
            std::thread::sleep(sleep);
            sleep = (sleep * 2).min(Duration::from_millis(2));
        }
        for tid in &waiting {
            let ts = threads.get_mut(tid).unwrap();
            let state = thread_stat(pid, *tid).map(|s| s.0).unwrap_or('?');
            ts.status = ThreadStatus::Unreadable(match state {
                'D' => "in uninterruptible sleep (D state): it could not be stopped".to_string(),
                _ => format!("not stopped in time (state {state})"),
            });
        }
        Stopped {
            pid,
            threads: threads.into_values().collect(),
            stragglers: Vec::new(),
            _not_send: PhantomData,
        }
    }
}

impl Stopped {
    fn on_stopped(ts: &mut ThreadState) {
        let p = Pid::from_raw(ts.tid);
        // Consume the stop notification if nobody else (a wait4(-1) reaper) did.
        let _ =
            waitid(Id::Pid(p), WaitPidFlag::WSTOPPED | WaitPidFlag::WNOHANG | WaitPidFlag::__WALL);
        // Distinguish our PTRACE_EVENT_STOP from a signal-delivery-stop, whose signal must be
        // re-injected on detach (else it would be lost).
        if let Ok(si) = ptrace::getsiginfo(p) {
            if si.si_code >> 8 != PTRACE_EVENT_STOP {
                ts.pending_signal = Some(si.si_signo);
            }
        }
        ts.status = match ptrace::getregs(p) {
            Ok(r) => ThreadStatus::Stopped(Regs { ip: r.rip, sp: r.rsp, bp: r.rbp }),
            Err(e) => {
                ThreadStatus::Unreadable(format!("its registers could not be read: {}", e.desc()))
            }
        };
    }

    /// Resumes all threads.  Threads that never reached the stop cannot be detached (the kernel
    /// requires a ptrace-stop); they are kept in `stragglers`.
    pub fn resume(&mut self) {
        for ts in &mut self.threads {
            if !ts.attached {
                continue;
            }
            ts.attached = false;
            // ESRCH means gone, or not (yet) in a ptrace-stop: the latter is a straggler.
            if detach(ts.tid, ts.pending_signal.unwrap_or(0)).is_err()
                && thread_stat(self.pid, ts.tid).is_some_and(|s| !matches!(s.0, 'Z' | 'X'))
            {
                self.stragglers.push(ts.tid);
            }
        }
    }
}

/// PTRACE_DETACH passing `signo` on (0: none). Not nix's `detach`, whose `Signal` has no
/// real-time signals: a queued SIGRTMIN caught in the stop would be lost.
fn detach(tid: i32, signo: i32) -> nix::Result<()> {
    // SAFETY: PTRACE_DETACH reads no memory of ours; the kernel checks the tid.
    let done = unsafe { libc::ptrace(libc::PTRACE_DETACH, tid, 0, signo as libc::c_long) };
    Errno::result(done).map(drop)
}

impl Drop for Stopped {
    fn drop(&mut self) {
        self.resume();
    }
}
