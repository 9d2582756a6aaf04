//! One rank: how it is started, and the tasks that carry its output and stdin.

use std::ffi::OsStr;
use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::Arc;

use nix::sched::CpuSet;
use nix::sys::socket::{socketpair, AddressFamily, SockFlag, SockType};
use pmi_wire::control::{Job, Segment, Up};
use pmi_wire::ids::{ExitOutcome, Stream};
use tokio::io::AsyncWriteExt;
use tokio::sync::mpsc;

use crate::fdio::FdStream;

/// Largest chunk of output sent in one frame.
pub const OUTPUT_CHUNK: usize = 128 << 10;

/// Where a rank sits, for its environment.
pub struct Placement<'a> {
    pub rank: u32,
    pub local_id: usize,
    pub local_count: usize,
    pub host: &'a str,
}

/// How a rank reaches its PMI server.
pub enum PmiSetup {
    /// A socketpair; the rank inherits its end as `PMI_FD`.
    Fd,
    /// The proxy's loopback listener: `PMI_PORT` and `PMI_ID`.
    Port(String),
}

/// A rank that is running.
pub struct Started {
    pub pid: i32,
    /// The proxy's end of the rank's PMI socketpair.
    pub pmi: Option<FdStream>,
    pub stdout: FdStream,
    pub stderr: FdStream,
    pub stdin: Option<FdStream>,
}

/// Starts one rank in its own process group, with piped stdout/stderr and, if it reads the
/// launcher's stdin, a piped stdin (else /dev/null), bound to `cpus` if given. Returns why
/// if it cannot run.
pub fn spawn(
    job: &Job,
    segment: &Segment,
    at: &Placement,
    gets_stdin: bool,
    pmi: &PmiSetup,
    cpus: Option<&CpuSet>,
) -> Result<Started, ExitOutcome> {
    let errno = |e: io::Error| e.raw_os_error().unwrap_or(nix::libc::EIO);
    // Checked here because a failed chdir in the child looks just like a missing program.
    if !segment.wdir.is_empty() {
        let wdir = Path::new(OsStr::from_bytes(&segment.wdir));
        if let Err(e) = nix::unistd::access(wdir, nix::unistd::AccessFlags::X_OK) {
            return Err(ExitOutcome::NoWorkdir { errno: e as i32 });
        }
    }
    let failed = |e: io::Error| ExitOutcome::SpawnFailed { errno: errno(e) };
    let mut cmd = Command::new(OsStr::from_bytes(&segment.exe));
    cmd.args(segment.args.iter().map(|a| OsStr::from_bytes(a)));
    cmd.env_clear();
    let inherited = if segment.inherit_env { &job.env[..] } else { &[] };
    for (k, v) in inherited.iter().chain(&segment.env) {
        cmd.env(OsStr::from_bytes(k), OsStr::from_bytes(v));
    }
    cmd.env("PMI_RANK", at.rank.to_string())
        .env("PMI_SIZE", job.size.to_string())
        .env("MPI_LOCALRANKID", at.local_id.to_string())
        .env("MPI_LOCALNRANKS", at.local_count.to_string())
        .env("MPIR_CVAR_CH3_INTERFACE_HOSTNAME", at.host)
        .env("GFORTRAN_UNBUFFERED_PRECONNECTED", "y");
    if !segment.wdir.is_empty() {
        cmd.current_dir(OsStr::from_bytes(&segment.wdir));
    }
    cmd.stdin(if gets_stdin { Stdio::piped() } else { Stdio::null() })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    // Both ends close on exec; the child clears the flag on its own end only, so each rank
    // inherits exactly one PMI socket: its own.
    let pair = match pmi {
        PmiSetup::Fd => {
            let (ours, theirs) =
                socketpair(AddressFamily::Unix, SockType::Stream, None, SockFlag::SOCK_CLOEXEC)
                    .map_err(|e| failed(e.into()))?;
            cmd.env("PMI_FD", theirs.as_raw_fd().to_string());
            Some((ours, theirs))
        }
        PmiSetup::Port(addr) => {
            cmd.env("PMI_PORT", addr).env("PMI_ID", at.rank.to_string());
            None
        }
    };
    let rank_end = pair.as_ref().map(|(_, theirs)| theirs.as_raw_fd());
    let parent = std::process::id() as i32;
    // Copied into the closure: the child only makes the syscall.
    let cpus = cpus.copied();
    // SAFETY: only async-signal-safe calls (setpgid, prctl, getppid, fcntl, sigprocmask,
    // sched_setaffinity, write) between fork and exec, and no allocation.
    unsafe {
        cmd.pre_exec(move || {
            use nix::libc;
            if libc::setpgid(0, 0) != 0 {
                return Err(io::Error::last_os_error());
            }
            // Backstop: if this proxy dies without cleaning up, the kernel kills the rank.
            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL, 0, 0, 0);
            if libc::getppid() != parent {
                libc::_exit(137);
            }
            if let Some(fd) = rank_end {
                if libc::fcntl(fd, libc::F_SETFD, 0) != 0 {
                    return Err(io::Error::last_os_error());
                }
            }
            let mut none: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&mut none);
            libc::sigprocmask(libc::SIG_SETMASK, &none, std::ptr::null_mut());
            if let Some(set) = &cpus {
                // Binding is a hint for performance, not a condition to run: a cpuset that
                // shrank since the proxy looked is no reason to fail the job. The rank says
                // so on its own stderr, where its lines go.
                if nix::sched::sched_setaffinity(nix::unistd::Pid::from_raw(0), set).is_err() {
                    const MSG: &[u8] =
                        b"rlaunch-proxy: cannot bind this rank to its CPUs; it runs unbound\n";
                    libc::write(2, MSG.as_ptr().cast(), MSG.len());
                }
            }
            Ok(())
        });
    }
    let mut child = cmd.spawn().map_err(failed)?;
    let wrap = |fd: OwnedFd| FdStream::new(fd).map_err(failed);
    Ok(Started {
        pid: child.id() as i32,
        pmi: pair.map(|(ours, _theirs)| wrap(ours)).transpose()?,
        stdout: wrap(enlarged(child.stdout.take().expect("piped").into()))?,
        stderr: wrap(child.stderr.take().expect("piped").into())?,
        stdin: child.stdin.take().map(|s| wrap(s.into())).transpose()?,
    })
}

fn enlarged(fd: OwnedFd) -> OwnedFd {
    crate::fdio::enlarge_pipe(&fd, crate::fdio::PIPE_CAPACITY);
    fd
}

/// Carries one output stream of a rank upstream until end of file. The bounded `data`
/// channel is the backpressure: when the launcher's reader is slow, this task waits, the
/// pipe fills, and the rank blocks in write.
pub async fn relay_output(rank: u32, stream: Stream, mut fd: FdStream, data: mpsc::Sender<Up>) {
    loop {
        match fd.read_available(OUTPUT_CHUNK).await {
            Ok(chunk) if chunk.is_empty() => break,
            Ok(chunk) => {
                if data.send(Up::Output { rank, stream, data: chunk }).await.is_err() {
                    break;
                }
            }
            Err(e) => {
                tracing::debug!(rank, ?stream, "output read failed: {e}");
                break;
            }
        }
    }
    let _ = data.send(Up::OutputEnd { rank, stream }).await;
}

/// What the dispatcher sends a rank's stdin feeder.
pub enum StdinChunk {
    Data { seq: u64, data: Arc<[u8]> },
    Eof,
}

/// Writes the launcher's stdin into one rank, acknowledging each chunk once written (or
/// dropped, when the rank has closed its stdin) so the launcher can send more.
pub async fn feed_stdin(
    mut fd: Option<FdStream>,
    mut chunks: mpsc::UnboundedReceiver<StdinChunk>,
    acks: mpsc::UnboundedSender<Up>,
) {
    while let Some(chunk) = chunks.recv().await {
        match chunk {
            StdinChunk::Data { seq, data } => {
                if let Some(f) = fd.as_mut() {
                    if let Err(e) = f.write_all(&data).await {
                        tracing::debug!("rank stopped reading stdin: {e}");
                        fd = None;
                    }
                }
                let _ = acks.send(Up::StdinAck { seq });
            }
            StdinChunk::Eof => fd = None,
        }
    }
}
