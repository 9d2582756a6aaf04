//! Python frames of a CPython process, read with py-spy as a library.  The process must already
//! be stopped by us (LockingStrategy::AlreadyLocked): py-spy then only reads memory.

use std::collections::HashMap;

#[cfg(feature = "python")]
use py_spy::{
    config::{Config, LockingStrategy},
    PythonSpy,
};

#[derive(Clone, Debug)]
pub struct PyFrame {
    pub function: String,
    pub file: String,
    pub line: i32,
    /// Python >= 3.11: this frame was entered by a fresh call of the C eval loop
    /// (_PyEval_EvalFrameDefault); frames without it were executed "inline" by the same C frame.
    pub is_entry: bool,
}

#[derive(Clone, Debug)]
pub struct PyThread {
    pub os_tid: Option<i32>,
    pub python_thread_id: u64,
    pub owns_gil: bool,
    pub name: Option<String>,
    /// Innermost first.
    pub frames: Vec<PyFrame>,
}

pub struct PythonReader {
    #[cfg(feature = "python")]
    spy: PythonSpy,
}

/// Cheap check used to decide whether to try Python at all.
pub fn looks_like_python(maps: &[crate::unwind::MapEntry]) -> bool {
    maps.iter().any(|m| {
        let name = m.path.rsplit('/').next().unwrap_or("");
        name.starts_with("python") || name.starts_with("libpython")
    })
}

pub fn is_python_module(path: &str) -> bool {
    let name = path.rsplit('/').next().unwrap_or("");
    name.starts_with("python") || name.starts_with("libpython")
}

#[cfg(not(feature = "python"))]
impl PythonReader {
    pub fn new(_pid: i32) -> anyhow::Result<PythonReader> {
        anyhow::bail!("built without the `python` feature")
    }
    pub fn version(&self) -> String {
        String::new()
    }
    pub fn threads(&mut self) -> anyhow::Result<HashMap<i32, PyThread>> {
        Ok(HashMap::new())
    }
}

#[cfg(feature = "python")]
impl PythonReader {
    /// Locates the interpreter (reads binaries and process memory); call before stopping the
    /// process to keep the stopped window short.
    pub fn new(pid: i32) -> anyhow::Result<PythonReader> {
        let config = Config {
            blocking: LockingStrategy::AlreadyLocked,
            native: false,
            collect_thread_names: true,
            ..Config::default()
        };
        Ok(PythonReader { spy: PythonSpy::new(pid as py_spy::Pid, &config)? })
    }

    pub fn version(&self) -> String {
        self.spy.version.to_string()
    }

    /// Reads all Python threads; call while the process is stopped.
    pub fn threads(&mut self) -> anyhow::Result<HashMap<i32, PyThread>> {
        let traces = self.spy.get_stack_traces()?;
        let mut out = HashMap::new();
        for (i, t) in traces.into_iter().enumerate() {
            let frames = t
                .frames
                .into_iter()
                .map(|f| PyFrame { function: f.name, file: f.filename, line: f.line, is_entry: f.is_entry })
                .collect();
            let os_tid = t.os_thread_id.map(|x| x as i32);
            // Threads without a known OS tid get a negative key so they are still reported.
            let key = os_tid.unwrap_or(-(i as i32) - 1);
            out.insert(
                key,
                PyThread { os_tid, python_thread_id: t.thread_id, owns_gil: t.owns_gil, name: t.thread_name, frames },
            );
        }
        Ok(out)
    }
}
