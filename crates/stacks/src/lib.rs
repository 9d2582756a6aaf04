//! The stacks of a live process, every thread's, native frames and Python frames merged, read
//! by its parent (the proxy, which started it: so ptrace is allowed under Yama's default
//! `ptrace_scope=1`). Nothing is needed on the node: no gdb, gstack, eu-stack or py-spy.
//!
//! ```text
//!  Reader::read_all(pids)
//!    stop every thread of every process (ptrace: seize, interrupt, /proc polling, a deadline)
//!    each: modules (/proc/PID/maps, the ELF files), its Python interpreter (py-spy),
//!          unwind each thread (framehop on .eh_frame, memory from /proc/PID/mem), Python frames
//!    symbols (addr2line: names, file:line, inlined calls), Python frames merged in
//!    resume all (signals that came meanwhile passed back)
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

/// How long the threads read together may take to stop, and more for each thread: beyond
/// it, a thread is reported as not stopped (it is in the kernel, in D state, or the machine
/// is starved) and left alone. A runnable thread stops only once it gets a CPU: in CI (2
/// CPUs, four tests' spinning MPI ranks) a spinning rank was still not stopped after 200 ms.
/// The wait ends as soon as every thread has stopped, so only a straggler makes it longer.
pub const STOP_DEADLINE: Duration = Duration::from_millis(1000);
pub const STOP_PER_THREAD: Duration = Duration::from_millis(2);

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
    /// How long its threads were held stopped (with the others read with it).
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
}

impl Default for Reader {
    fn default() -> Self {
        Reader::new()
    }
}

/// One process while its threads are held: what was read of it, for its names after.
struct Held {
    process: Process,
    stopped: Option<ptrace::Stopped>,
    unwinder: unwind::Native,
    walks: Vec<Option<unwind::Walk>>,
    python: Option<python::Interpreter>,
    py_threads: Option<std::collections::HashMap<i32, python::PyThread>>,
}

impl Reader {
    pub fn new() -> Reader {
        Reader { files: unwind::Files::default(), symbols: symbols::Symbols::default() }
    }

    /// The stacks of `pid`; see [`Reader::read_all`].
    pub fn read(&mut self, pid: i32) -> Process {
        self.read_all(&[pid], None).pop().unwrap_or_default()
    }

    /// The stacks of `pids`, children of this process (or processes this user may trace),
    /// as one snapshot: every thread of every process is told to stop first, and all are
    /// held while their stacks are walked and named, then let go together. Holding them
    /// also keeps the reading from competing with them for the CPU: a node of spinning
    /// ranks, several to a core, still gets read.
    /// Processes not walked by `until` are said so. Never fails: what could not be read is
    /// said in the answer. The calling thread is the tracer for the while, and must not be
    /// an async runtime's.
    pub fn read_all(&mut self, pids: &[i32], until: Option<Instant>) -> Vec<Process> {
        let began = Instant::now();
        let stopping: Vec<std::io::Result<ptrace::Stopping>> =
            pids.iter().map(|&pid| ptrace::Stopping::begin(pid, began + STOP_DEADLINE)).collect();
        // Each thread to stop needs a turn on a CPU, which can be slow in coming where the
        // ranks outnumber the cores.
        let threads: u32 = stopping.iter().flatten().map(|s| s.threads() as u32).sum();
        let stop_until = Instant::now() + STOP_DEADLINE + STOP_PER_THREAD * threads;
        let mut held: Vec<Held> = pids
            .iter()
            .zip(stopping)
            .map(|(&pid, stopping)| {
                let mut process = Process { pid, ..Process::default() };
                let stopped = match stopping {
                    Ok(stopping) => Some(stopping.wait(stop_until)),
                    Err(e) => {
                        process.unreadable = Some(unreadable_why(&e));
                        None
                    }
                };
                Held {
                    process,
                    stopped,
                    unwinder: unwind::Native::default(),
                    walks: Vec::new(),
                    python: None,
                    py_threads: None,
                }
            })
            .collect();
        for one in &mut held {
            if until.is_some_and(|until| Instant::now() >= until) {
                one.process.unreadable = Some("its stack was not read in time".into());
                continue;
            }
            self.walk(one);
        }
        // Named before they run again: where ranks outnumber the cores and spin, this
        // thread would get a sliver of a CPU once they run (256 spinning ranks on 2 cores:
        // 7 s to name them running, against a fraction of a second held).
        let mut processes: Vec<(Process, Option<ptrace::Stopped>)> =
            held.into_iter().map(|one| self.named(one)).collect();
        for (process, stopped) in &mut processes {
            if let Some(stopped) = stopped.as_mut() {
                stopped.resume();
                if !stopped.stragglers.is_empty() {
                    let (pid, left) = (process.pid, &stopped.stragglers);
                    tracing::debug!(
                        pid,
                        ?left,
                        "threads left traced until the reading thread ends"
                    );
                }
            }
            process.stopped_for = began.elapsed();
        }
        processes.into_iter().map(|(process, _)| process).collect()
    }

    /// Walks the threads of a process held stopped, and reads its Python frames.
    fn walk(&mut self, one: &mut Held) {
        let Some(stopped) = one.stopped.as_ref() else { return };
        let pid = one.process.pid;
        let opened = procmem::ProcMem::open(pid).and_then(|m| Ok((m, unwind::read_maps(pid)?)));
        let (mut mem, maps) = match opened {
            Ok(opened) => opened,
            Err(e) => {
                one.process.unreadable = Some(unreadable_why(&e));
                return;
            }
        };
        one.unwinder.add_modules(pid, &maps, &mem, &mut self.files);
        if python::looks_like_python(&maps) {
            match python::Interpreter::find(pid) {
                Ok(found) => one.python = Some(found),
                Err(why) => one.process.python_missing = Some(why),
            }
        }
        one.walks = stopped
            .threads
            .iter()
            .map(|t| match t.status {
                ptrace::ThreadStatus::Stopped(regs) => Some(one.unwinder.walk(&regs, &mut mem)),
                ptrace::ThreadStatus::Unreadable(_) => None,
            })
            .collect();
        match one.python.as_mut().map(|p| p.threads()) {
            Some(Ok(threads)) => one.py_threads = Some(threads),
            Some(Err(why)) => one.process.python_missing = Some(why),
            None => {}
        }
    }

    /// The process's threads with their frames named, Python frames merged in; and its
    /// threads, still held.
    fn named(&mut self, one: Held) -> (Process, Option<ptrace::Stopped>) {
        let Held { mut process, stopped, unwinder, walks, python, py_threads } = one;
        let Some(stopped) = stopped else { return (process, None) };
        if process.unreadable.is_some() {
            return (process, Some(stopped));
        }
        process.python = python.as_ref().filter(|_| py_threads.is_some()).map(|p| p.version());
        let mut walks = walks.into_iter();
        for t in &stopped.threads {
            let mut thread = Thread {
                tid: t.tid,
                name: t.comm.clone(),
                state: t.state_before,
                frames: Vec::new(),
                note: None,
            };
            match (&t.status, walks.next().flatten()) {
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
        (process, Some(stopped))
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
