//! Python frames of a CPython process, read with py-spy as a library. The process is stopped
//! here already (`LockingStrategy::AlreadyLocked`): py-spy only reads its memory.

use std::collections::HashMap;

use py_spy::config::{Config, LockingStrategy};
use py_spy::PythonSpy;

use crate::unwind::MapEntry;

pub(crate) struct PyFrame {
    pub function: String,
    pub file: String,
    pub line: i32,
    /// Python 3.11 and later: this frame was entered by a call of the C eval loop
    /// (`_PyEval_EvalFrameDefault`); the frames without it ran in the same C frame.
    pub is_entry: bool,
}

pub(crate) struct PyThread {
    /// Its Python name (`threading.current_thread().name`).
    pub name: Option<String>,
    /// Innermost first.
    pub frames: Vec<PyFrame>,
}

/// Whether a process maps a Python interpreter: only then are its Python frames looked for.
pub(crate) fn looks_like_python(maps: &[MapEntry]) -> bool {
    maps.iter().any(|m| is_python_module(&m.path))
}

pub(crate) fn is_python_module(path: &str) -> bool {
    let name = path.rsplit('/').next().unwrap_or("");
    name.starts_with("python") || name.starts_with("libpython")
}

/// The interpreter of one process, found while it runs.
pub(crate) struct Interpreter(PythonSpy);

impl Interpreter {
    /// Finds the interpreter's state in `pid` (reads its binaries and memory): before the
    /// process is stopped, to keep the stop short.
    pub fn find(pid: i32) -> Result<Interpreter, String> {
        let config = Config {
            blocking: LockingStrategy::AlreadyLocked,
            native: false,
            collect_thread_names: true,
            ..Config::default()
        };
        let spy = PythonSpy::new(pid as py_spy::Pid, &config).map_err(|e| format!("{e:#}"))?;
        Ok(Interpreter(spy))
    }

    pub fn version(&self) -> String {
        self.0.version.to_string()
    }

    /// Every Python thread, by OS thread id; while the process is stopped.
    pub fn threads(&mut self) -> Result<HashMap<i32, PyThread>, String> {
        let traces = self.0.get_stack_traces().map_err(|e| format!("{e:#}"))?;
        let threads = traces.into_iter().filter_map(|t| {
            let frames = t
                .frames
                .into_iter()
                .map(|f| PyFrame {
                    function: f.name,
                    file: f.filename,
                    line: f.line,
                    is_entry: f.is_entry,
                })
                .collect();
            Some((t.os_thread_id? as i32, PyThread { name: t.thread_name, frames }))
        });
        Ok(threads.collect())
    }
}
