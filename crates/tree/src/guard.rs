//! A guard for a proxy reached through a remote shell (ssh, rsh, `qrsh -inherit`, `blaunch`).
//!
//! When such a proxy is lost, its parent can only kill the remote shell's client. A healthy
//! proxy then sees its channel close and takes its node down; a stopped (SIGSTOP) or wedged
//! one cannot, and its ranks would live on, since their `PR_SET_PDEATHSIG` fires only when the
//! proxy dies. The guard is a small forked process that waits for the channel to go:
//!
//! ```text
//!  proxy ──fork──► guard: poll(channel) ── hang-up ──► proxy stopped? ── yes ──► SIGKILL proxy
//!    ▲                                                      │ no                  (ranks follow
//!    └──── dies with the proxy (PR_SET_PDEATHSIG) ◄─────────┴─ patience ──► SIGKILL by their
//!                                                                            PDEATHSIG)
//! ```
//!
//! The patience is longer than a healthy proxy's own teardown (the kill grace, then the child
//! proxies' grace, then an orphan's last wait and the last flush), so the guard never cuts
//! that short. It ignores the signals a batch system or a hangup sends the proxy's group.
//! While it lives, the proxy always has a child, so its sweeps read `/proc` each time.
//!
//! The guard is forked from a process with threads: it calls only async-signal-safe
//! functions and allocates nothing.

use std::os::fd::RawFd;
use std::sync::atomic::{AtomicI32, Ordering};
use std::time::Duration;

use nix::libc;

/// The guard's pid, spared by the proxy's sweeps of its descendants (0: none).
static GUARD: AtomicI32 = AtomicI32::new(0);

/// The guard was reaped (it died with a signal of its own): its pid may be reused.
pub fn reaped(pid: i32) {
    let _ = GUARD.compare_exchange(pid, 0, Ordering::Relaxed, Ordering::Relaxed);
}

/// The guard's pid, if one runs.
pub fn pid() -> Option<i32> {
    match GUARD.load(Ordering::Relaxed) {
        0 => None,
        pid => Some(pid),
    }
}

/// Ends the guard: the proxy's channel is gone and it goes on over another link (rlaunch
/// adopted it, see `Job::adoption`); the guard would kill it once its patience is over.
pub fn dismiss() {
    let pid = GUARD.swap(0, Ordering::Relaxed);
    if pid > 0 {
        // SAFETY: a plain kill(2) of the guard, this process's own child.
        unsafe { libc::kill(pid, libc::SIGKILL) };
    }
}

/// Starts the guard of this proxy, watching the control channel `input`/`output`.
pub fn start(input: RawFd, output: RawFd, patience: Duration) {
    let proxy = nix::unistd::getpid().as_raw();
    let patience = libc::timespec {
        tv_sec: patience.as_secs() as libc::time_t,
        tv_nsec: patience.subsec_nanos() as libc::c_long,
    };
    // SAFETY: the child runs `watch`, which calls only async-signal-safe functions.
    match unsafe { libc::fork() } {
        0 => unsafe { watch(proxy, input, output, patience) },
        -1 => tracing::warn!(
            "cannot start the guard of this proxy: {}",
            std::io::Error::last_os_error()
        ),
        pid => GUARD.store(pid, Ordering::Relaxed),
    }
}

/// The guard's life. Safety: called in the child of a fork, before anything else.
unsafe fn watch(proxy: i32, input: RawFd, output: RawFd, patience: libc::timespec) -> ! {
    libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL, 0, 0, 0);
    if libc::getppid() != proxy {
        libc::_exit(0);
    }
    // Signals to the proxy's process group (a hangup, a batch system's TERM) are the
    // proxy's to act on: the guard stays to see that it does.
    for sig in [libc::SIGTERM, libc::SIGHUP, libc::SIGINT] {
        libc::signal(sig, libc::SIG_IGN);
    }
    for sig in [libc::SIGCHLD, libc::SIGPIPE] {
        libc::signal(sig, libc::SIG_DFL);
    }
    let all: libc::sigset_t = std::mem::zeroed();
    libc::pthread_sigmask(libc::SIG_SETMASK, &all, std::ptr::null_mut());
    // Only the channel stays open here: a copy of a rank's stdin pipe would keep it from
    // ever seeing end of file.
    libc::dup2(input, 0);
    libc::dup2(output, 1);
    if libc::syscall(libc::SYS_close_range, 2u32, u32::MAX, 0u32) != 0 {
        // Kernels before 5.9: every descriptor the limit allows.
        let mut limit = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
        let top = if libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) == 0 {
            limit.rlim_cur.min(1 << 20) as i32
        } else {
            1 << 16
        };
        for fd in 2..top {
            libc::close(fd);
        }
    }
    let mut fds = [
        libc::pollfd { fd: 0, events: libc::POLLRDHUP, revents: 0 },
        libc::pollfd { fd: 1, events: 0, revents: 0 },
    ];
    loop {
        let n = libc::poll(fds.as_mut_ptr(), 2, -1);
        let gone = libc::POLLHUP | libc::POLLERR | libc::POLLRDHUP | libc::POLLNVAL;
        if n > 0 && fds.iter().any(|f| f.revents & gone != 0) {
            break;
        }
    }
    // The channel is gone. A stopped proxy will never act on it: at once. Any other gets the
    // patience to finish by itself, which a healthy one does.
    let step = libc::timespec { tv_sec: 0, tv_nsec: 100_000_000 };
    let steps = patience.tv_sec * 10 + patience.tv_nsec / 100_000_000;
    for _ in 0..steps.max(1) {
        if stopped(proxy) {
            break;
        }
        libc::nanosleep(&step, std::ptr::null_mut());
    }
    libc::kill(proxy, libc::SIGKILL);
    libc::_exit(0)
}

/// Whether `pid` is stopped: state `T` in `/proc/<pid>/stat`, read into a stack buffer.
unsafe fn stopped(pid: i32) -> bool {
    let mut path = *b"/proc/0000000000/stat\0";
    let mut digits = [0u8; 10];
    let (mut n, mut len) = (pid as u32, 0);
    loop {
        digits[len] = b'0' + (n % 10) as u8;
        len += 1;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    for i in 0..len {
        path[6 + i] = digits[len - 1 - i];
    }
    let tail = b"/stat\0";
    path[6 + len..6 + len + tail.len()].copy_from_slice(tail);
    let fd = libc::open(path.as_ptr().cast(), libc::O_RDONLY | libc::O_CLOEXEC);
    if fd < 0 {
        return false;
    }
    let mut buf = [0u8; 512];
    let got = libc::read(fd, buf.as_mut_ptr().cast(), buf.len());
    libc::close(fd);
    if got <= 0 {
        return false;
    }
    let stat = &buf[..got as usize];
    // "pid (comm) S ...": the state follows the last ')'.
    match stat.iter().rposition(|&b| b == b')') {
        Some(close) => stat.get(close + 2) == Some(&b'T'),
        None => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_its_own_state() {
        // SAFETY: reads /proc into a stack buffer.
        assert!(!unsafe { stopped(std::process::id() as i32) });
        assert!(!unsafe { stopped(i32::MAX) });
    }
}
