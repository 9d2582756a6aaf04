//! Stack dumps of live processes: native frames (framehop + blazesym) for every thread, with
//! Python frames merged in for CPython processes (py-spy).
//!
//! Phases: preload modules/interpreter (process running) -> stop all threads (ptrace) -> unwind
//! + read Python frames -> resume -> symbolize + merge (process running again).

pub mod merge;
pub mod procmem;
pub mod ptrace;
pub mod python;
pub mod symbolize;
pub mod unwind;

use std::collections::HashMap;
use std::time::{Duration, Instant};

pub use merge::{Frame, FrameKind};

#[derive(Clone, Debug)]
pub struct Options {
    /// Hard limit for getting all threads into ptrace-stop.
    pub stop_deadline: Duration,
    /// None: auto-detect from the mappings.
    pub python: Option<bool>,
}

impl Default for Options {
    fn default() -> Self {
        Options { stop_deadline: Duration::from_millis(200), python: None }
    }
}

#[derive(Clone, Debug)]
pub struct ThreadDump {
    pub tid: i32,
    pub comm: String,
    pub state_before: char,
    pub frames: Vec<Frame>,
    /// Set when the thread could not be read, or its stack is incomplete.
    pub error: Option<String>,
    pub python_gil: Option<bool>,
    pub python_thread_name: Option<String>,
}

#[derive(Clone, Debug, Default)]
pub struct Timings {
    pub preload: Duration,
    pub stop: Duration,
    pub read: Duration,
    pub resume: Duration,
    pub stopped_total: Duration,
    pub symbolize: Duration,
    pub total: Duration,
}

#[derive(Clone, Debug)]
pub struct ProcessDump {
    pub pid: i32,
    pub python_version: Option<String>,
    pub python_error: Option<String>,
    pub threads: Vec<ThreadDump>,
    pub stragglers: Vec<i32>,
    pub timings: Timings,
}

/// Dumps `pid`.  Runs the ptrace part on a short-lived thread: the kernel detaches any tracee that
/// could not be detached in time (a straggler) when that thread exits.
pub fn dump(pid: i32, opts: &Options) -> std::io::Result<ProcessDump> {
    let opts = opts.clone();
    std::thread::Builder::new()
        .name("stackdump".into())
        .spawn(move || dump_on_this_thread(pid, &opts))?
        .join()
        .map_err(|_| std::io::Error::other("dump thread panicked"))?
}

/// Same as `dump` but on the calling thread (which becomes the tracer).
pub fn dump_on_this_thread(pid: i32, opts: &Options) -> std::io::Result<ProcessDump> {
    let t_start = Instant::now();
    let opened = procmem::ProcMem::open(pid).and_then(|m| Ok((m, unwind::read_maps(pid)?)));
    let (mut mem, maps) = match opened {
        Ok(x) => x,
        // Not permitted (other user, non-dumpable without CAP_SYS_PTRACE): report, don't fail.
        Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied => return unreadable_dump(pid, &e, t_start),
        Err(e) => return Err(e),
    };
    let mut unwinder = unwind::NativeUnwinder::new();
    unwinder.load_modules(pid, &maps, &mem);
    let want_python = opts.python.unwrap_or_else(|| python::looks_like_python(&maps));
    let (mut py, mut python_error) = (None, None);
    if want_python {
        match python::PythonReader::new(pid) {
            Ok(r) => py = Some(r),
            Err(e) => python_error = Some(format!("{e:#}")),
        }
    }
    let t_preload = t_start.elapsed();

    // --- process stopped from here ---
    let t_stop0 = Instant::now();
    let mut stopped = ptrace::StoppedProcess::stop(pid, opts.stop_deadline)?;
    let t_stop = t_stop0.elapsed();
    let t_read0 = Instant::now();
    // Catch modules mapped since the preload.
    if let Ok(maps2) = unwind::read_maps(pid) {
        unwinder.load_modules(pid, &maps2, &mem);
    }
    let mut raw: Vec<(usize, Vec<framehop::FrameAddress>, Option<String>)> = Vec::new();
    for (i, t) in stopped.threads.iter().enumerate() {
        if let ptrace::ThreadStatus::Stopped(regs) = &t.status {
            let (frames, err) = unwinder.unwind(regs, &mut mem);
            raw.push((i, frames, err));
        }
    }
    let py_threads = match py.as_mut().map(|p| p.threads()) {
        Some(Ok(t)) => Some(t),
        Some(Err(e)) => {
            python_error = Some(format!("{e:#}"));
            None
        }
        None => None,
    };
    let t_read = t_read0.elapsed();
    let t_res0 = Instant::now();
    stopped.resume();
    let t_resume = t_res0.elapsed();
    let t_stopped_total = t_stop0.elapsed();
    // --- process running again ---

    let t_sym0 = Instant::now();
    let mut addrs: Vec<u64> = raw.iter().flat_map(|r| r.1.iter().map(|f| f.address_for_lookup())).collect();
    addrs.sort_unstable();
    addrs.dedup();
    let syms = symbolize::NativeSymbolizer::new().symbolize(pid, &addrs);
    let symmap: HashMap<u64, Vec<symbolize::SymFrame>> = addrs.iter().copied().zip(syms).collect();
    let t_sym = t_sym0.elapsed();

    let mut threads = Vec::new();
    for (i, t) in stopped.threads.iter().enumerate() {
        let mut td = ThreadDump {
            tid: t.tid,
            comm: t.comm.clone(),
            state_before: t.state_before,
            frames: Vec::new(),
            error: None,
            python_gil: None,
            python_thread_name: None,
        };
        match &t.status {
            ptrace::ThreadStatus::Unreadable(why) => td.error = Some(why.clone()),
            ptrace::ThreadStatus::Stopped(_) => {
                let (_, fr, err) = raw.iter().find(|r| r.0 == i).unwrap();
                let native: Vec<(u64, Vec<symbolize::SymFrame>)> = fr
                    .iter()
                    .map(|f| {
                        let a = f.address_for_lookup();
                        let mut syms = symmap[&a].clone();
                        // Unknown symbols still get their module (needed by the Python merge).
                        for s in syms.iter_mut().filter(|s| s.module.is_none() || s.function.is_none()) {
                            if let Some(m) = unwinder.module_for(a) {
                                s.module = Some(m.path.clone());
                                if s.function.is_none() {
                                    // Offset usable with addr2line / a debug file later.
                                    let base = m.path.rsplit('/').next().unwrap_or("");
                                    s.function = Some(format!("{base}+0x{:x}", a.wrapping_sub(m.bias)));
                                }
                            }
                        }
                        (a, syms)
                    })
                    .collect();
                let pyt = py_threads.as_ref().and_then(|m| m.get(&t.tid));
                td.python_gil = pyt.map(|p| p.owns_gil);
                td.python_thread_name = pyt.and_then(|p| p.name.clone());
                let (frames, note) = merge::merge(&native, pyt.map(|p| p.frames.as_slice()));
                td.frames = frames;
                td.error = match (err, note) {
                    (Some(a), Some(b)) => Some(format!("{a}; {b}")),
                    (a, b) => a.clone().or(b),
                };
            }
        }
        threads.push(td);
    }
    let stragglers = std::mem::take(&mut stopped.stragglers);
    Ok(ProcessDump {
        pid,
        python_version: py.as_ref().map(|p| p.version()),
        python_error,
        threads,
        stragglers,
        timings: Timings {
            preload: t_preload,
            stop: t_stop,
            read: t_read,
            resume: t_resume,
            stopped_total: t_stopped_total,
            symbolize: t_sym,
            total: t_start.elapsed(),
        },
    })
}

fn unreadable_dump(pid: i32, e: &std::io::Error, t_start: Instant) -> std::io::Result<ProcessDump> {
    let threads = ptrace::list_tids(pid)?
        .into_iter()
        .map(|tid| {
            let (state_before, comm) = ptrace::thread_stat(pid, tid).unwrap_or(('?', String::new()));
            ThreadDump { tid, comm, state_before, frames: vec![], error: Some(format!("unreadable: {e}")), python_gil: None, python_thread_name: None }
        })
        .collect();
    Ok(ProcessDump {
        pid,
        python_version: None,
        python_error: None,
        threads,
        stragglers: vec![],
        timings: Timings { total: t_start.elapsed(), ..Default::default() },
    })
}

/// Plain-text rendering, one block per thread.
pub fn format_dump(d: &ProcessDump) -> String {
    use std::fmt::Write;
    let mut s = String::new();
    let cmd = std::fs::read(format!("/proc/{}/cmdline", d.pid))
        .map(|b| String::from_utf8_lossy(&b).replace('\0', " ").trim().to_string())
        .unwrap_or_default();
    let _ = writeln!(s, "Process {}: {}", d.pid, cmd);
    if let Some(v) = &d.python_version {
        let _ = writeln!(s, "Python v{v}");
    }
    if let Some(e) = &d.python_error {
        let _ = writeln!(s, "Python frames unavailable: {e}");
    }
    for t in &d.threads {
        let gil = if t.python_gil == Some(true) { ", gil" } else { "" };
        let pyname = t.python_thread_name.as_ref().map(|n| format!(" py:\"{n}\"")).unwrap_or_default();
        let _ = writeln!(s, "Thread {} \"{}\"{} (state {}{}):", t.tid, t.comm, pyname, t.state_before, gil);
        for f in &t.frames {
            let loc = match (&f.file, f.line) {
                (Some(file), Some(l)) => format!("{file}:{l}"),
                (Some(file), None) => file.clone(),
                (None, _) => f.module.clone().unwrap_or_default(),
            };
            let tag = match f.kind {
                FrameKind::Python => " [py]",
                FrameKind::Inlined => " [inlined]",
                FrameKind::Native => "",
            };
            let _ = writeln!(s, "    {} ({}){}", f.function, loc, tag);
        }
        if let Some(e) = &t.error {
            let _ = writeln!(s, "    !! {e}");
        }
    }
    if !d.stragglers.is_empty() {
        let _ = writeln!(s, "Stragglers (released when the tracer thread exits): {:?}", d.stragglers);
    }
    s
}
