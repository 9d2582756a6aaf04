//! The stacks of a live process, every thread's, native frames and Python frames merged, read
//! by its parent (the proxy, which started it: so ptrace is allowed under Yama's default
//! `ptrace_scope=1`). Nothing is needed on the node: no gdb, gstack, eu-stack or py-spy.
//!
//! ```text
//!  Reader::read(pid)
//!    modules (/proc/PID/maps, the ELF files) ─┐  while the process runs
//!    Python interpreter found (py-spy)        ┘
//!    stop every thread (ptrace: seize, interrupt, /proc polling, a deadline)
//!    unwind each (framehop on .eh_frame, memory from /proc/PID/mem), Python frames read
//!    resume (signals that came meanwhile passed back)
//!    symbols (addr2line: names, file:line, inlined calls), Python frames merged in
//! ```
//!
//! A [`Reader`] keeps what it learnt of each file (unwind sections, DWARF, symbols) for the
//! next process: the ranks of a node mostly run one program. It must live on a thread of
//! its own that ends after the reads (see [`ptrace`]): a thread that could not be stopped
//! in time (in D state) is let go when its tracer thread exits.
//!
//! Start at [`Reader::read`]; `README.md` has what was measured.

mod merge;
mod procmem;
pub mod ptrace;
mod python;
mod symbols;
mod unwind;

use std::time::{Duration, Instant};

pub use merge::{Frame, FrameKind};

/// How long the threads of a process may take to stop: beyond it, a thread is reported as
/// not stopped (it is in the kernel, in D state, or the machine is starved) and left alone.
pub const STOP_DEADLINE: Duration = Duration::from_millis(200);

/// The stacks of one process.
#[derive(Clone, Debug, Default)]
pub struct Process {
    pub pid: i32,
    pub threads: Vec<Thread>,
    /// Why its stacks could not be read at all (another user's process, a non-dumpable one,
    /// ptrace forbidden, it ended).
    pub unreadable: Option<String>,
    /// Its Python's version, when it is a Python process whose frames were read.
    pub python: Option<String>,
    /// Why its Python frames could not be read, when it looked like a Python process.
    pub python_missing: Option<String>,
    /// How long its threads were held stopped.
    pub stopped_for: Duration,
}

/// One thread's stack.
#[derive(Clone, Debug)]
pub struct Thread {
    pub tid: i32,
    /// Its name (`comm`), or its Python thread's name.
    pub name: String,
    /// Its state letter in /proc before it was stopped (`R`, `S`, `D`, ...).
    pub state: char,
    /// Innermost first.
    pub frames: Vec<Frame>,
    /// Why the stack is missing or ends early.
    pub note: Option<String>,
}

/// Reads stacks, keeping what it learnt of each file for the next process.
pub struct Reader {
    files: unwind::Files,
    symbols: symbols::Symbols,
    /// The longest a process's threads may take to stop.
    pub stop_deadline: Duration,
}

impl Default for Reader {
    fn default() -> Self {
        Reader::new()
    }
}

impl Reader {
    pub fn new() -> Reader {
        Reader {
            files: unwind::Files::default(),
            symbols: symbols::Symbols::default(),
            stop_deadline: STOP_DEADLINE,
        }
    }

    /// The stacks of `pid`, a child of this process (or of any process this user may
    /// trace). Never fails: what could not be read is said in the answer. The calling
    /// thread becomes the tracer for the while, and must not be an async runtime's.
    pub fn read(&mut self, pid: i32) -> Process {
        let mut process = Process { pid, ..Process::default() };
        let opened = procmem::ProcMem::open(pid).and_then(|m| Ok((m, unwind::read_maps(pid)?)));
        let (mut mem, maps) = match opened {
            Ok(opened) => opened,
            Err(e) => {
                process.unreadable = Some(unreadable_why(&e));
                return process;
            }
        };
        let mut unwinder = unwind::Native::default();
        unwinder.add_modules(pid, &maps, &mem, &mut self.files);
        let mut python = None;
        if python::looks_like_python(&maps) {
            match python::Interpreter::find(pid) {
                Ok(found) => python = Some(found),
                Err(why) => process.python_missing = Some(why),
            }
        }

        let stop_began = Instant::now();
        let mut stopped = match ptrace::Stopped::stop(pid, self.stop_deadline) {
            Ok(stopped) => stopped,
            Err(e) => {
                process.unreadable = Some(unreadable_why(&e));
                return process;
            }
        };
        // Libraries loaded since the first look.
        if let Ok(maps) = unwind::read_maps(pid) {
            unwinder.add_modules(pid, &maps, &mem, &mut self.files);
        }
        let walks: Vec<Option<unwind::Walk>> = stopped
            .threads
            .iter()
            .map(|t| match t.status {
                ptrace::ThreadStatus::Stopped(regs) => Some(unwinder.walk(&regs, &mut mem)),
                ptrace::ThreadStatus::Unreadable(_) => None,
            })
            .collect();
        let py_threads = python.as_mut().map(|p| p.threads());
        stopped.resume();
        process.stopped_for = stop_began.elapsed();

        let py_threads = match py_threads {
            Some(Ok(threads)) => Some(threads),
            Some(Err(why)) => {
                process.python_missing = Some(why);
                None
            }
            None => None,
        };
        process.python = python.as_ref().filter(|_| py_threads.is_some()).map(|p| p.version());
        for (t, walk) in stopped.threads.iter().zip(walks) {
            let mut thread = Thread {
                tid: t.tid,
                name: t.comm.clone(),
                state: t.state_before,
                frames: Vec::new(),
                note: None,
            };
            match (&t.status, walk) {
                (ptrace::ThreadStatus::Stopped(_), Some(walk)) => {
                    let native: Vec<_> = walk
                        .addresses
                        .iter()
                        .map(|&at| (at, self.symbols.frames(at, unwinder.module_for(at))))
                        .collect();
                    let py = py_threads.as_ref().and_then(|threads| threads.get(&t.tid));
                    if let Some(name) = py.and_then(|p| p.name.clone()) {
                        thread.name = name;
                    }
                    let (frames, note) = merge::merge(&native, py.map(|p| p.frames.as_slice()));
                    thread.frames = frames;
                    thread.note = match (walk.ended, note) {
                        (Some(a), Some(b)) => Some(format!("{a}; {b}")),
                        (a, b) => a.or(b),
                    };
                }
                (ptrace::ThreadStatus::Unreadable(why), _) => thread.note = Some(why.clone()),
                (ptrace::ThreadStatus::Stopped(_), None) => {}
            }
            process.threads.push(thread);
        }
        if !stopped.stragglers.is_empty() {
            tracing::debug!(pid, stragglers = ?stopped.stragglers, "threads left traced until the reading thread ends");
        }
        process
    }
}

/// Why a process could not be read, in a user's words.
fn unreadable_why(e: &std::io::Error) -> String {
    match e.kind() {
        std::io::ErrorKind::PermissionDenied => {
            "not permitted to read it (another user's, not dumpable, or ptrace forbidden)".into()
        }
        std::io::ErrorKind::NotFound => "it ended".into(),
        _ => e.to_string(),
    }
}
