//! PMIx for Open MPI programs: each node's PMIx server is OpenPMIx's own library, held by a
//! small host process (`pmix/host.c`, built by build.rs and embedded in this executable) that
//! the proxy starts for a job that serves PMIx. The host turns libpmix's server callbacks
//! into [`Event`]s and the dispatcher's [`Command`]s into callback completions; the node
//! (see `node/pmix/`) decides everything, on its own thread, with the PMI machinery.
//!
//! ```text
//!   libpmix thread ─callback─► host ─Event─► reader task ─► Node dispatcher (tokio)
//!                     cbfunc ◄─ host ◄─Command── writer task ◄─┘
//! ```
//!
//! libpmix's threads never touch tokio: the two meet on a socket, one reader and one writer
//! task on this side, and the host completes callbacks from its main thread.

pub mod wire;

use rlaunch_protocol::ids::NodeId;
use std::io;
use std::path::{Path, PathBuf};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::mpsc;

pub use wire::{Command, Event};

/// The OpenPMIx version this proxy's PMIx host was built against, if it has one.
pub fn version() -> Option<&'static str> {
    #[cfg(rlaunch_pmix)]
    return Some(env!("RLAUNCH_PMIX_VERSION"));
    #[cfg(not(rlaunch_pmix))]
    None
}

/// The host executable, embedded: a proxy runs wherever it was copied, alone.
#[cfg(rlaunch_pmix)]
const HOST_EXE: &[u8] = include_bytes!(env!("RLAUNCH_PMIX_HOST"));

/// A node's PMIx files for one job: the server's rendezvous and session directory, and the
/// directory of Open MPI's shared-memory segments if /dev/shm is there. Named first (a late
/// server's ranks are told of them before it starts), made by [`Files::make`], and removed
/// when dropped.
pub struct Files {
    dir: PathBuf,
    shm: Option<PathBuf>,
    made: bool,
}

impl Files {
    /// Where job `jobid` keeps its files on node `node`; nothing is made yet.
    pub fn at(jobid: &str, node: NodeId) -> Files {
        let name = format!("rlaunch-pmix.{}.{}.{}", sanitize(jobid), node, std::process::id());
        let dir = std::env::temp_dir().join(&name);
        // Open MPI names its shared-memory segments after the host name, the job and the
        // local rank: the ranks of two fake nodes of one machine would share them. A
        // directory per node and job keeps them apart, and goes with the job however its
        // ranks end.
        let shm = Path::new("/dev/shm");
        let shm = shm.is_dir().then(|| shm.join(&name));
        Files { dir, shm, made: false }
    }

    /// Makes the directories, private to this user (and first removes what dead proxies
    /// left).
    pub fn make(mut self) -> io::Result<Files> {
        sweep_leftovers();
        private_dir(&self.dir)?;
        self.made = true;
        if self.shm.as_ref().is_some_and(|shm| private_dir(shm).is_err()) {
            self.shm = None;
        }
        Ok(self)
    }

    /// Where this node's ranks keep their shared-memory segments.
    pub fn shm_dir(&self) -> Option<&Path> {
        self.shm.as_deref()
    }
}

impl Drop for Files {
    fn drop(&mut self) {
        if !self.made {
            return;
        }
        let _ = std::fs::remove_dir_all(&self.dir);
        if let Some(shm) = &self.shm {
            let _ = std::fs::remove_dir_all(shm);
        }
    }
}

/// What a node gives its ranks before its server exists, for a job whose ranks may never
/// use PMIx: a listening socket on the loopback, and the environment that names it. The
/// server starts when the first client connects (the socket becomes readable), takes the
/// socket over with the clients waiting in its backlog, and serves them as if it had been
/// there first ([`Host::start`] with it). A job whose ranks never connect pays for a socket
/// and a few variables, not for a server (docs/measurements.md, *Late PMIx server*).
pub struct Late {
    listener: std::net::TcpListener,
    /// The server's namespace in the ranks' `PMIX_SERVER_URI*` (its rank is 0).
    #[cfg_attr(
        not(rlaunch_pmix),
        expect(dead_code, reason = "a proxy without PMIx never starts a host")
    )]
    server: String,
    uri: String,
}

impl Late {
    /// A listening socket for node `node`'s ranks. Fails where this proxy has no PMIx.
    pub fn listen(node: NodeId) -> io::Result<Late> {
        if version().is_none() {
            return Err(no_pmix());
        }
        let listener = std::net::TcpListener::bind((std::net::Ipv4Addr::LOCALHOST, 0))?;
        let port = listener.local_addr()?.port();
        let server = format!("rlaunch-server.{node}.{}", std::process::id());
        let uri = format!("{server}.0;tcp4://127.0.0.1:{port}");
        Ok(Late { listener, server, uri })
    }

    /// A descriptor that becomes readable when the first client connects.
    pub fn watch(&self) -> io::Result<std::os::fd::OwnedFd> {
        Ok(self.listener.try_clone()?.into())
    }

    /// The variables `PMIx_server_setup_fork` gives rank `rank` of `nspace`, for the server
    /// this proxy will start with [`Host::start`]: its address, its namespace, the session
    /// directory of `files`, `host`'s name, and the one data store every libpmix has (the
    /// late server is started with no other, so no shared segment need exist first).
    pub fn env(&self, files: &Files, nspace: &str, rank: u32, host: &str) -> Vec<Vec<u8>> {
        let dir = files.dir.display();
        let uris = ["URI41", "URI4", "URI3", "URI2", "URI21"];
        let mut vars: Vec<String> =
            uris.iter().map(|v| format!("PMIX_SERVER_{v}={}", self.uri)).collect();
        vars.extend([
            format!("PMIX_NAMESPACE={nspace}"),
            format!("PMIX_RANK={rank}"),
            "PMIX_SECURITY_MODE=native".into(),
            "PMIX_BFROP_BUFFER_TYPE=PMIX_BFROP_BUFFER_NON_DESC".into(),
            format!("PMIX_GDS_MODULE={GDS}"),
            format!("PMIX_SERVER_TMPDIR={dir}"),
            format!("PMIX_SYSTEM_TMPDIR={dir}"),
            format!("PMIX_HOSTNAME={host}"),
            format!("PMIX_VERSION={}", version().unwrap_or_default()),
        ]);
        vars.into_iter().map(String::into_bytes).collect()
    }
}

/// The data store of every server and its clients: libpmix's own `hash`, which needs no
/// shared segment made before the ranks start (a late server's clients are told of it before
/// their server exists), and which keeps every key (see `spawn_host`).
const GDS: &str = "hash";

/// What to install to have PMIx, for messages about a build without it.
pub const GET_PMIX: &str = "rebuild rlaunch with OpenPMIx's development files installed \
                            (Debian and Ubuntu: libpmix-dev; RHEL and its rebuilds: pmix-devel)";

/// This proxy has no PMIx host: `ErrorKind::Unsupported`, and nothing else is.
fn no_pmix() -> io::Error {
    io::Error::new(
        io::ErrorKind::Unsupported,
        format!("this rlaunch-proxy was built without PMIx; {GET_PMIX}"),
    )
}

/// A running PMIx host: where commands go, and this node's files of the job (removed when
/// the host is dropped).
pub struct Host {
    commands: mpsc::UnboundedSender<Command>,
    pid: i32,
    files: Files,
}

/// What the host's reader task reports.
pub enum HostNews {
    Event(Event),
    /// The link closed or broke: the host is gone; why.
    Gone(String),
}

impl Host {
    /// Starts the host with `files` (made here), on the node named `host` in the job (for a
    /// late start, on `late`'s socket); `news` hears its events and its end. Fails if this
    /// proxy was built without PMIx or the host cannot start.
    pub fn start(
        files: Files,
        host_name: &str,
        late: Option<Late>,
        news: impl Fn(HostNews) -> bool + Send + 'static,
    ) -> io::Result<Host> {
        let files = files.make()?;
        let (commands, rx) = mpsc::unbounded_channel();
        let (child, link) =
            spawn_host(&files.dir, host_name, late, std::process::Stdio::inherit())?;
        let host = Host { commands, pid: child.id() as i32, files };
        link.set_nonblocking(true)?;
        let link = tokio::net::UnixStream::from_std(link)?;
        let (read, write) = link.into_split();
        tokio::spawn(write_commands(write, rx));
        tokio::spawn(read_events(read, news));
        Ok(host)
    }

    pub fn send(&self, command: Command) {
        let _ = self.commands.send(command);
    }

    /// The host's process id (it is this proxy's child: the reaper sees it end).
    pub fn pid(&self) -> i32 {
        self.pid
    }

    /// A host with no process behind it, for a test: the commands sent it come out of the
    /// receiver.
    #[cfg(test)]
    pub(crate) fn detached(jobid: &str) -> (Host, mpsc::UnboundedReceiver<Command>) {
        let (commands, rx) = mpsc::unbounded_channel();
        let files = Files::at(jobid, rlaunch_protocol::ids::NodeId(0));
        (Host { commands, pid: 0, files }, rx)
    }

    /// Kills the host: one that stopped answering will not exit when its link closes.
    pub fn kill(&self) {
        // Never a group nor every process: a host with no process of its own has none.
        if self.pid <= 0 {
            return;
        }
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(self.pid),
            nix::sys::signal::Signal::SIGKILL,
        );
    }

    /// Where this node's ranks keep their shared-memory segments.
    pub fn shm_dir(&self) -> Option<&Path> {
        self.files.shm_dir()
    }
}

/// Removes what proxies that died without unwinding (SIGKILL, the OOM killer) left: the
/// `rlaunch-pmix.*.PID` directories of this user in the temporary directory and /dev/shm
/// whose proxy PID is gone. Each proxy removes its own on its way out; this catches the rest.
fn sweep_leftovers() {
    let me = nix::unistd::getuid().as_raw();
    for parent in [std::env::temp_dir(), PathBuf::from("/dev/shm")] {
        let Ok(entries) = std::fs::read_dir(&parent) else { continue };
        for entry in entries.flatten() {
            let name = entry.file_name();
            let Some(name) = name.to_str().filter(|n| n.starts_with("rlaunch-pmix.")) else {
                continue;
            };
            let Some(pid) = name.rsplit('.').next().and_then(|p| p.parse::<i32>().ok()) else {
                continue;
            };
            use std::os::unix::fs::MetadataExt;
            let ours = entry.metadata().is_ok_and(|m| m.is_dir() && m.uid() == me);
            let gone = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), None)
                == Err(nix::errno::Errno::ESRCH);
            if ours && gone && pid > 0 {
                tracing::debug!(dir = %entry.path().display(), "removing a dead proxy's PMIx files");
                let _ = std::fs::remove_dir_all(entry.path());
            }
        }
    }
}

/// Makes a directory only this user may enter.
fn private_dir(dir: &Path) -> io::Result<()> {
    use std::os::unix::fs::DirBuilderExt;
    std::fs::DirBuilder::new()
        .mode(0o700)
        .create(dir)
        .map_err(|e| io::Error::new(e.kind(), format!("{}: {e}", dir.display())))
}

/// A job id fit for a file name.
fn sanitize(jobid: &str) -> String {
    jobid.chars().map(|c| if c.is_ascii_alphanumeric() || c == '-' { c } else { '_' }).collect()
}

/// Starts the embedded host with its link on fd 3 (and a late start's listening socket on
/// fd 4); returns it and our end of the link.
#[cfg(rlaunch_pmix)]
fn spawn_host(
    dir: &Path,
    name: &str,
    late: Option<Late>,
    stderr: std::process::Stdio,
) -> io::Result<(std::process::Child, std::os::unix::net::UnixStream)> {
    use std::io::Write;
    use std::os::fd::{AsRawFd, FromRawFd};
    use std::os::unix::process::CommandExt;

    use nix::sys::memfd::{memfd_create, MemFdCreateFlag};
    use nix::sys::socket::{socketpair, AddressFamily, SockFlag, SockType};
    let exe = memfd_create(c"rlaunch-pmix-host", MemFdCreateFlag::MFD_CLOEXEC)?;
    std::fs::File::from(exe.try_clone()?).write_all(HOST_EXE)?;
    // The link goes on fd 3 before the exec: the executable must be elsewhere, or the exec
    // would find the socket in its place (a process with fds 0-2 only gets fd 3 here).
    let exe = match exe.as_raw_fd() {
        fd if fd <= 3 => {
            // SAFETY: F_DUPFD_CLOEXEC returns a new descriptor that nothing else owns.
            let above = unsafe { nix::libc::fcntl(fd, nix::libc::F_DUPFD_CLOEXEC, 4) };
            if above < 0 {
                return Err(io::Error::last_os_error());
            }
            // SAFETY: just made, owned here alone.
            unsafe { std::os::fd::OwnedFd::from_raw_fd(above) }
        }
        _ => exe,
    };
    let (ours, theirs) =
        socketpair(AddressFamily::Unix, SockType::Stream, None, SockFlag::SOCK_CLOEXEC)?;
    let theirs_fd = theirs.as_raw_fd();
    let parent = std::process::id() as i32;
    let mut command = std::process::Command::new(format!("/proc/self/fd/{}", exe.as_raw_fd()));
    command.arg0("rlaunch-pmix-host").arg(dir).arg(name);
    command.stdin(std::process::Stdio::null()).stderr(stderr);
    let listener = late.as_ref().map(|late| late.listener.as_raw_fd()).unwrap_or(-1);
    if let Some(late) = &late {
        command.arg(LATE_LISTENER.to_string()).arg(&late.server);
    }
    // Every server keeps its data in `hash` alone, and so its clients (setup_fork names them
    // only the stores their server has; a late server's were told of this one): libpmix
    // 4.2.2's shared-memory stores (ds21, ds12) lose a local rank's later keys once a key of
    // exactly an extension slot's size (25 bytes in ds21, "k13"="0") is appended right after
    // that rank's trimmed slot, and then spin in pmix_sm_store (dstore_base.c: no slot is
    // reserved behind it, the next rank's data follows, the rank's chain runs on into it).
    // A user's own choice wins.
    if std::env::var_os("PMIX_MCA_gds").is_none() {
        command.env("PMIX_MCA_gds", GDS);
    }
    // libpmix reads the node's topology with hwloc at start: with hwloc's I/O, PCI, OpenCL
    // and GL discovery that is three quarters of its 19 ms here, and the ranks need none of
    // it from the server (measured: 4.5-6 ms without). A user's own setting wins.
    if std::env::var_os("HWLOC_COMPONENTS").is_none() {
        command.env("HWLOC_COMPONENTS", "-pci,-opencl,-gl,-linuxio");
    }
    // SAFETY: only async-signal-safe calls between fork and exec.
    unsafe {
        command.pre_exec(move || {
            // Dies with the proxy, whatever ends it.
            if nix::libc::prctl(nix::libc::PR_SET_PDEATHSIG, nix::libc::SIGKILL) != 0
                || nix::libc::getppid() != parent
            {
                return Err(io::Error::last_os_error());
            }
            // The listener first: the link may be on fd 4 now, and moves off it next.
            let mut link = theirs_fd;
            if listener >= 0 {
                if link == LATE_LISTENER {
                    link = nix::libc::fcntl(link, nix::libc::F_DUPFD_CLOEXEC, 5);
                    if link < 0 {
                        return Err(io::Error::last_os_error());
                    }
                }
                inherit(listener, LATE_LISTENER)?;
            }
            inherit(link, 3)
        });
    }
    let child = command.spawn()?;
    drop(theirs);
    // The host holds the listener now.
    drop(late);
    Ok((child, std::os::unix::net::UnixStream::from(ours)))
}

/// Where a late host finds the proxy's listening socket.
#[cfg(rlaunch_pmix)]
const LATE_LISTENER: i32 = 4;

/// Puts `fd` on `to`, open across the exec. Between fork and exec: async-signal-safe calls
/// only.
#[cfg(rlaunch_pmix)]
fn inherit(fd: i32, to: i32) -> io::Result<()> {
    // SAFETY: fcntl and dup2 on descriptors this process holds.
    unsafe {
        if fd == to {
            let flags = nix::libc::fcntl(to, nix::libc::F_GETFD);
            nix::libc::fcntl(to, nix::libc::F_SETFD, flags & !nix::libc::FD_CLOEXEC);
        } else if nix::libc::dup2(fd, to) < 0 {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(())
}

#[cfg(not(rlaunch_pmix))]
fn spawn_host(
    _dir: &Path,
    _name: &str,
    _late: Option<Late>,
    _stderr: std::process::Stdio,
) -> io::Result<(std::process::Child, std::os::unix::net::UnixStream)> {
    Err(no_pmix())
}

async fn write_commands(
    mut link: tokio::net::unix::OwnedWriteHalf,
    mut commands: mpsc::UnboundedReceiver<Command>,
) {
    while let Some(command) = commands.recv().await {
        if link.write_all(&command.encode()).await.is_err() {
            return;
        }
    }
}

async fn read_events(mut link: tokio::net::unix::OwnedReadHalf, news: impl Fn(HostNews) -> bool) {
    let why = loop {
        let mut len = [0u8; 4];
        if let Err(e) = link.read_exact(&mut len).await {
            break match e.kind() {
                io::ErrorKind::UnexpectedEof => "it exited".to_string(),
                _ => e.to_string(),
            };
        }
        let len = u32::from_le_bytes(len) as usize;
        if len == 0 || len > wire::MAX_MESSAGE {
            break format!("it sent a message of {len} bytes");
        }
        let mut body = vec![0; len];
        if let Err(e) = link.read_exact(&mut body).await {
            break e.to_string();
        }
        match Event::decode(&body) {
            Ok(event) => {
                if !news(HostNews::Event(event)) {
                    return;
                }
            }
            Err(e) => break e.to_string(),
        }
    };
    news(HostNews::Gone(why));
}

#[cfg(all(test, rlaunch_pmix))]
mod tests {
    use std::io::{Read, Write};
    use std::os::unix::process::ExitStatusExt;
    use std::sync::atomic::{AtomicU32, Ordering};

    use super::*;

    /// A message to the host, built field by field as `wire` encodes them.
    struct Message(Vec<u8>);

    impl Message {
        fn new(tag: u8) -> Message {
            Message(vec![tag])
        }
        fn u32(mut self, v: u32) -> Message {
            self.0.extend_from_slice(&v.to_le_bytes());
            self
        }
        fn str(self, s: &str) -> Message {
            let mut m = self.u32(s.len() as u32);
            m.0.extend_from_slice(s.as_bytes());
            m
        }
        /// SETUP of a job of one rank on node "n1" (this node), up to its process sets.
        fn setup() -> Message {
            let m = Message::new(1).u32(0).str("rlaunch-test").str("rlaunch-test");
            m.u32(1).u32(0).u32(1).str("n1").u32(0).u32(0)
        }
        fn framed(self) -> Vec<u8> {
            [(self.0.len() as u32).to_le_bytes().to_vec(), self.0].concat()
        }
    }

    /// A host started for a test, once it is ready.
    struct TestHost {
        child: std::process::Child,
        link: std::os::unix::net::UnixStream,
        dir: PathBuf,
    }

    impl TestHost {
        fn start() -> TestHost {
            static NEXT: AtomicU32 = AtomicU32::new(0);
            let n = NEXT.fetch_add(1, Ordering::Relaxed);
            let name = format!("rlaunch-pmix-test.{}.{n}", std::process::id());
            let dir = std::env::temp_dir().join(name);
            private_dir(&dir).unwrap();
            let (child, link) = spawn_host(&dir, "n1", None, std::process::Stdio::piped())
                .expect("the host starts");
            let mut host = TestHost { child, link, dir };
            let ready = host.event();
            assert!(matches!(ready, Event::Ready { .. }), "{ready:?}");
            host
        }

        fn send(&mut self, message: Message) {
            self.link.write_all(&message.framed()).unwrap();
        }

        fn event(&mut self) -> Event {
            let mut len = [0; 4];
            self.link.read_exact(&mut len).unwrap();
            let mut body = vec![0; u32::from_le_bytes(len) as usize];
            self.link.read_exact(&mut body).unwrap();
            Event::decode(&body).unwrap()
        }
    }

    impl Drop for TestHost {
        fn drop(&mut self) {
            let _ = self.child.kill();
            let _ = self.child.wait();
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }

    /// Starts a host, waits for it to be ready, sends it `message`, and returns its exit
    /// code (`None` if a signal ended it) and what it wrote on stderr.
    fn host_reads(message: Message) -> (Option<i32>, String) {
        let mut host = TestHost::start();
        host.send(message);
        let mut stderr = String::new();
        host.child.stderr.take().unwrap().read_to_string(&mut stderr).unwrap();
        let status = host.child.wait().unwrap();
        (status.signal().map_or(status.code(), |_| None), stderr)
    }

    #[test]
    fn a_spawned_job_the_server_cannot_register_is_refused_with_its_status() {
        // A namespace longer than libpmix keeps: refused whole, not registered cut short.
        let mut host = TestHost::start();
        let long = "j".repeat(300);
        let setup = Message::new(1).u32(1).str(&long).str(&long);
        host.send(setup.u32(1).u32(0).u32(1).str("n1").u32(0).u32(0).u32(0));
        let refused = Event::SetupDone { nspace: long.clone(), status: wire::ERR_BAD_PARAM };
        assert_eq!(host.event(), refused);
        // Its ranks get no environment, with the status that says why.
        host.send(Message::new(2).str(&long).u32(0).u32(0).u32(1).u32(0));
        let env = host.event();
        let refused = |status: i32, vars: &[Vec<u8>]| status < 0 && vars.is_empty();
        assert!(
            matches!(&env, Event::Env { rank: 0, status, vars, .. } if refused(*status, vars)),
            "{env:?}"
        );
    }

    fn broken(what: &str) -> (Option<i32>, String) {
        (Some(4), format!("rlaunch-pmix-host: malformed message from the proxy ({what})\n"))
    }

    #[test]
    fn counts_from_the_proxy_are_checked_against_the_message_before_anything_is_allocated() {
        const HUGE: u32 = 1 << 30;
        // SETUP: 4 G node names, none there.
        let nodes = Message::new(1).u32(0).str("j").str("j").u32(1).u32(0).u32(u32::MAX);
        assert_eq!(host_reads(nodes), broken("node count"));
        // SETUP: 1 G ranks of one node, not one of them there.
        let ranks = Message::new(1).u32(0).str("j").str("j").u32(HUGE).u32(0).u32(1).str("n1");
        assert_eq!(host_reads(ranks), broken("rank count"));
        // A job registered with libpmix, then 1 G process sets, or one of 1 G members.
        assert_eq!(host_reads(Message::setup().u32(HUGE)), broken("process set count"));
        let members = Message::setup().u32(1).str("io").u32(HUGE).u32(0);
        assert_eq!(host_reads(members), broken("process set size"));
        // CLIENTS and LOOKUP_DONE likewise.
        let clients = Message::new(2).str("j").u32(0).u32(0).u32(HUGE);
        assert_eq!(host_reads(clients), broken("client count"));
        let found = Message::new(5).u32(0).u32(0).u32(HUGE).str("key");
        assert_eq!(host_reads(found), broken("lookup count"));
    }
}
