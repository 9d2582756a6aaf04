//! Symbolization of absolute addresses of a (running or stopped) process with blazesym:
//! ELF symbols, plus function/file:line and inlined frames from DWARF where present
//! (including separate debug files found by build-id / debuglink, e.g. libc6-dbg).

use blazesym::symbolize::source::{Process, Source};
use blazesym::symbolize::{CodeInfo, Input, Symbolized, Symbolizer};
use blazesym::Pid;

/// One symbolized (possibly inlined) frame.
#[derive(Clone, Debug, Default)]
pub struct SymFrame {
    pub function: Option<String>,
    pub file: Option<String>,
    pub line: Option<u32>,
    pub module: Option<String>,
    pub inlined: bool,
}

pub struct NativeSymbolizer {
    inner: Symbolizer,
}

impl Default for NativeSymbolizer {
    fn default() -> Self {
        Self::new()
    }
}

fn code_loc(ci: Option<&CodeInfo>) -> (Option<String>, Option<u32>) {
    match ci {
        Some(ci) => (Some(ci.to_path().display().to_string()), ci.line),
        None => (None, None),
    }
}

impl NativeSymbolizer {
    pub fn new() -> Self {
        NativeSymbolizer {
            inner: Symbolizer::builder().enable_inlined_fns(true).enable_code_info(true).build(),
        }
    }

    /// Symbolizes lookup addresses (for return addresses pass `ret - 1`, see
    /// `FrameAddress::address_for_lookup`).  For each input address returns the frames it stands
    /// for, innermost (most deeply inlined) first.
    pub fn symbolize(&self, pid: i32, addrs: &[u64]) -> Vec<Vec<SymFrame>> {
        let mut src = Process::new(Pid::from(pid as u32));
        src.perf_map = false;
        // /proc/PID/map_files needs CAP_SYS_ADMIN (or CAP_CHECKPOINT_RESTORE); an unprivileged
        // tracer must use the paths from /proc/PID/maps instead.
        src.map_files = unsafe { libc::geteuid() } == 0;
        let src = Source::Process(src);
        let results = match self.inner.symbolize(&src, Input::AbsAddr(addrs)) {
            Ok(r) => r,
            Err(_) => return addrs.iter().map(|_| vec![SymFrame::default()]).collect(),
        };
        results
            .into_iter()
            .map(|s| match s {
                Symbolized::Sym(sym) => {
                    let module = sym.module.as_ref().map(|m| m.to_string_lossy().into_owned());
                    let mut out = Vec::with_capacity(1 + sym.inlined.len());
                    // blazesym lists inlined calls outermost first: f (sym), g, h.  The location of
                    // each level is the call site of the next deeper one; the deepest level has the
                    // location of the address itself.
                    for inl in sym.inlined.iter().rev() {
                        let (file, line) = code_loc(inl.code_info.as_ref());
                        out.push(SymFrame {
                            function: Some(inl.name.to_string()),
                            file,
                            line,
                            module: module.clone(),
                            inlined: true,
                        });
                    }
                    let (file, line) = code_loc(sym.code_info.as_deref());
                    out.push(SymFrame { function: Some(sym.name.to_string()), file, line, module, inlined: false });
                    out
                }
                Symbolized::Unknown(_) => vec![SymFrame::default()],
            })
            .collect()
    }
}
