//! The node's side of the singleton trap (`crate::singleton`): ranks served no PMIx are
//! given the trap's `OPAL_BINDIR`, and the proxy listens for reports from the first such
//! rank on; a report names the rank it came from, and the job ends.

use rlaunch_protocol::control::Up;

use super::{Event, Node};
use crate::singleton::{self, Reports, BINDIR_VAR};

/// The node's trap: set for the first rank served no PMIx (tried once), and the reports it
/// took, held (their processes wait) until the node ends.
#[derive(Default)]
pub(super) struct Trap {
    /// `None`: not tried yet; `Some(None)`: it could not be set.
    armed: Option<Option<Armed>>,
    held: Vec<tokio::net::UnixStream>,
}

/// The trap's directory, and the task that reads the reports.
struct Armed {
    dir: std::path::PathBuf,
    _reports: super::pmix::Watch,
}

impl Node {
    /// The variables of a rank served no PMIx: the trap's bindir, unless the job names its
    /// own. Without a trap (it could not be set), none.
    pub(super) fn singleton_env(&mut self) -> Vec<Vec<u8>> {
        if self.job.env.iter().any(|(k, _)| k == BINDIR_VAR.as_bytes()) {
            return Vec::new();
        }
        if self.trap.armed.is_none() {
            // Tried once: a trap that cannot be set is not tried again for every rank.
            let armed = self.arm_singleton_trap();
            let armed = armed.inspect_err(|e| tracing::debug!("no singleton trap here: {e}"));
            self.trap.armed = Some(armed.ok());
        }
        let Some(Some(armed)) = self.trap.armed.as_ref() else { return Vec::new() };
        use std::os::unix::ffi::OsStrExt;
        vec![[BINDIR_VAR.as_bytes(), b"=", armed.dir.as_os_str().as_bytes()].concat()]
    }

    fn arm_singleton_trap(&self) -> std::io::Result<Armed> {
        let dir = singleton::trap_dir(std::path::Path::new(&self.proxy_exe))?;
        let reports = Reports::listen()?;
        let events = self.events.clone();
        let task = tokio::spawn(async move {
            while let Ok((pid, stream)) = reports.report().await {
                if events.send(Event::Singleton { pid, stream }).is_err() {
                    return;
                }
            }
        });
        Ok(Armed { dir, _reports: super::pmix::Watch(task.abort_handle()) })
    }

    /// Process `pid` was started as the trap's `orted`: the rank it descends from started
    /// Open MPI alone. The connection is held, and with it the trap, until the node ends.
    pub(super) fn singleton_reported(&mut self, pid: i32, stream: tokio::net::UnixStream) {
        let rank = singleton::ancestry(pid).into_iter().find_map(|p| self.ranks.by_pid(p));
        let Some(local) = rank else {
            return tracing::warn!(pid, "Open MPI's singleton start outside this node's ranks");
        };
        let rank = self.ranks.get(local);
        let _ = self.up.control.send(Up::Singleton { rank: rank.gid, pid: rank.pid as u32 });
        self.trap.held.push(stream);
    }
}
