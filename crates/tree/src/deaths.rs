//! The order in which a process's children died, as the kernel saw it.
//!
//! `wait4(-1)` hands out the zombies of one pass in the order the children were forked, not in
//! the order they died. When one rank's death makes others fail at once (libpmix answers their
//! fence PARTIAL SUCCESS the moment the dead rank's connection drops, and they exit 1), all of
//! them can be zombies by the time the node reaps, and the first failure it judges must be the
//! cause, not rank 0's exit 1 (chaos, PMIx ranks on one node: rank 2 exited 3 and rank 3's
//! exit 1 was judged first). So each watched child has a pidfd (Linux 5.3) in an epoll set:
//! the kernel wakes a pidfd when its process becomes a zombie, and epoll hands out the ready
//! ones first come, first served. Where pidfds are missing, the order is the reap order.

use std::collections::HashMap;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

use nix::libc;

use crate::procs::Ended;

/// Children's pidfds in an epoll set, and the order in which those that died were seen.
pub struct DeathOrder {
    epoll: Option<OwnedFd>,
    watched: HashMap<i32, OwnedFd>,
    /// Each dead child's place in the order (until its pid is watched again).
    seen: HashMap<i32, u64>,
    next: u64,
}

impl DeathOrder {
    /// An empty set; without epoll (never seen on Linux), every order is the reap order.
    pub fn new() -> DeathOrder {
        // SAFETY: epoll_create1 takes a flag and returns a new descriptor or -1.
        let fd = unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) };
        // SAFETY: a fresh descriptor, owned by nothing else.
        let epoll = (fd >= 0).then(|| unsafe { OwnedFd::from_raw_fd(fd) });
        DeathOrder { epoll, watched: HashMap::new(), seen: HashMap::new(), next: 0 }
    }

    /// Watches child `pid`: called before anything reaps it (its pid cannot be another's).
    /// A kernel without pidfds leaves it unwatched.
    pub fn watch(&mut self, pid: i32) {
        let Some(epoll) = self.epoll.as_ref() else { return };
        // SAFETY: pidfd_open takes a pid and flags and returns a new descriptor or -1.
        let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) } as RawFd;
        if fd < 0 {
            return;
        }
        // SAFETY: a fresh descriptor, owned by nothing else.
        let pidfd = unsafe { OwnedFd::from_raw_fd(fd) };
        self.seen.remove(&pid);
        let mut event = libc::epoll_event { events: libc::EPOLLIN as u32, u64: pid as u64 };
        // SAFETY: both descriptors are open; the event is read during the call only.
        let rc = unsafe {
            libc::epoll_ctl(epoll.as_raw_fd(), libc::EPOLL_CTL_ADD, pidfd.as_raw_fd(), &mut event)
        };
        if rc == 0 {
            self.watched.insert(pid, pidfd);
        }
    }

    /// Sorts `ended` (one reaping pass) into the order its watched processes died; the
    /// others keep their places relative to each other, after those.
    pub fn sort(&mut self, ended: &mut [Ended]) {
        self.take_ready();
        ended.sort_by_key(|e| self.seen.get(&e.pid).copied().unwrap_or(u64::MAX));
        for e in ended.iter() {
            // Reaped: its pidfd has nothing more to say.
            self.watched.remove(&e.pid);
        }
    }

    /// Whether watched process `later` is known to have died after `earlier` did.
    pub fn died_after(&mut self, later: i32, earlier: i32) -> bool {
        self.take_ready();
        matches!((self.seen.get(&later), self.seen.get(&earlier)), (Some(l), Some(e)) if l > e)
    }

    /// Notes, in the kernel's order, every watched process that died since the last call; a
    /// noted one leaves the set (it would be ready again at every call).
    fn take_ready(&mut self) {
        let Some(epoll) = self.epoll.as_ref() else { return };
        const BATCH: usize = 256;
        loop {
            let mut events = [libc::epoll_event { events: 0, u64: 0 }; BATCH];
            // SAFETY: epoll_wait writes at most BATCH events into the array; timeout 0.
            let n = unsafe { libc::epoll_wait(epoll.as_raw_fd(), events.as_mut_ptr(), 256, 0) };
            if n <= 0 {
                return;
            }
            for event in &events[..n as usize] {
                let pid = event.u64 as i32;
                if let Some(pidfd) = self.watched.get(&pid) {
                    // SAFETY: both descriptors are open; DEL ignores the event argument.
                    unsafe {
                        libc::epoll_ctl(
                            epoll.as_raw_fd(),
                            libc::EPOLL_CTL_DEL,
                            pidfd.as_raw_fd(),
                            std::ptr::null_mut(),
                        )
                    };
                }
                self.seen.insert(pid, self.next);
                self.next += 1;
            }
            if (n as usize) < BATCH {
                return;
            }
        }
    }
}

impl Default for DeathOrder {
    fn default() -> Self {
        DeathOrder::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Children that die in the reverse of the order they were forked in (so `wait4(-1)`
    /// hands them out in the wrong order) are sorted into the order they died.
    #[test]
    fn children_are_sorted_into_the_order_they_died() {
        use std::process::Command;
        let mut order = DeathOrder::new();
        // Each waits for its file to appear, then exits: the test says who dies when.
        let dir = std::env::temp_dir().join(format!("deaths-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let script = "while [ ! -e \"$0\" ]; do sleep 0.01; done";
        let mut children = Vec::new();
        for i in 0..3 {
            let go = dir.join(i.to_string());
            let child = Command::new("sh").args(["-c", script]).arg(&go).spawn().unwrap();
            order.watch(child.id() as i32);
            children.push((child, go));
        }
        let pids: Vec<i32> = children.iter().map(|(c, _)| c.id() as i32).collect();
        for (child, go) in children.iter_mut().rev() {
            std::fs::write(go, "").unwrap();
            // A zombie now, not reaped.
            while procs_state(child.id() as i32) != Some('Z') {
                std::thread::sleep(std::time::Duration::from_millis(5));
            }
        }
        // Reaped in the order they were forked, as wait4(-1) would.
        let mut ended: Vec<Ended> = pids
            .iter()
            .map(|&pid| {
                nix::sys::wait::waitpid(nix::unistd::Pid::from_raw(pid), None).unwrap();
                Ended {
                    pid,
                    outcome: rlaunch_protocol::ids::ExitOutcome::Exited(0),
                    user_us: 0,
                    system_us: 0,
                    maxrss_kib: 0,
                }
            })
            .collect();
        order.sort(&mut ended);
        let sorted: Vec<i32> = ended.iter().map(|e| e.pid).collect();
        assert_eq!(sorted, [pids[2], pids[1], pids[0]]);
        assert!(order.died_after(pids[0], pids[1]) && !order.died_after(pids[2], pids[1]));
        assert!(order.watched.is_empty());
        std::fs::remove_dir_all(&dir).unwrap();
    }

    fn procs_state(pid: i32) -> Option<char> {
        crate::procs::snapshot(pid).map(|(state, _, _)| state)
    }
}
