//! Every local rank's stdout and stderr, carried upstream by one task.
//!
//! ```text
//!  rank pipes ──► epoll set of our own ──► one tokio registration ──► hub ──► data channel
//!  (level-triggered)   (names the ready pipes)                              (bounded) ──► upstream
//! ```
//!
//! A task and two reactor registrations per rank cost about 1.3 KiB for the rank's whole
//! life, a third of a 256-rank proxy's heap. Here a rank's pipes cost two entries in a map:
//! they sit in an epoll set of the hub's own, which tokio watches as a single fd, and
//! `epoll_wait` on that set names exactly the pipes that are ready, a fair share each
//! (level-triggered entries go to the back of the ready list once reported).
//!
//! A pipe whose chunk went up in a carrier is not read again until the chunk has gone and
//! the channel up has room, for at most 2 ms (see [`paced`]): a pipe that was polled wakes
//! its poller on every write, so a rank writing fast had the hub wake and carry 64 KiB per
//! write; paced, it carries half a pipe at a time (docs/measurements.md, *Paced carriers*).
//!
//! The node's output budget is the backpressure ([`credit::Local`]): when the launcher's
//! reader is slow, the window upstream closes, the budget runs out, the hub waits for room,
//! the pipes fill, and the ranks block in write.
//!
//! When rlaunch gives the job's output up (`Down::DropOutput`: it was interrupted, or its
//! reader fell behind at the end of a failed job) the node calls [`Outputs::drop_all`]: the
//! hub closes every pipe, whatever it still holds (up to a pipe's 1 MiB a rank), and relays
//! nothing more, so that the node ends now rather than after pushing it all up to be thrown
//! away.

use rlaunch_protocol::ids::Gid;
use std::collections::HashMap;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::Arc;

use nix::libc;
use rlaunch_protocol::control::Up;
use rlaunch_protocol::ids::Stream;
use rlaunch_protocol::record::{self, Micros};
use tokio::io::unix::AsyncFd;
use tokio::sync::{mpsc, watch};
use tokio::time::{Duration, Instant};

use rlaunch_tree::credit::{self, Queued};
use rlaunch_tree::fdio;
use rlaunch_tree::mailbox;
use rlaunch_tree::splice::{self, Carried, Carriers, Gone};

mod direct;

use direct::{Direct, OnAdd, State};

/// Largest chunk of output read and sent in one frame.
const OUTPUT_CHUNK: usize = 128 << 10;
/// Largest chunk of output carried in one frame: half a rank's 1 MiB pipe, so that the rank
/// fills the other half while the chunk goes (docs/measurements.md, *Carried chunk*).
const CARRIED_CHUNK: usize = 512 << 10;
/// Ready pipes taken from the epoll set at a time.
const READY_BATCH: usize = 64;

/// Output moved in carriers, spliced, when the channel up takes splices.
pub struct Carrying {
    pub carriers: Arc<Carriers>,
    /// The channel up (a registration of its own), watched for room: a pipe whose chunk
    /// went up is read again once the channel has room, not as soon as the chunk is in it.
    pub upstream: AsyncFd<OwnedFd>,
}

/// The node's handle on the hub.
pub struct Outputs {
    adds: mailbox::Sender<Add>,
    /// Set once: drop every pipe, relay nothing more.
    dropped: watch::Sender<bool>,
    /// Bytes read from the ranks' pipes so far, every stream's.
    read: Arc<std::sync::atomic::AtomicU64>,
}

struct Add {
    rank: Gid,
    local: usize,
    first: Up,
    stdout: OwnedFd,
    stderr: OwnedFd,
}

struct Pipe {
    fd: OwnedFd,
    rank: Gid,
    local: usize,
    stream: Stream,
    /// Read so far.
    bytes: u64,
    /// When the first bytes were read.
    first: Option<Micros>,
}

/// A rank's stream ended: what was read of it.
#[derive(Debug, Clone, Copy)]
pub struct StreamEnd {
    pub local: usize,
    pub stream: Stream,
    pub bytes: u64,
    pub first: Option<Micros>,
}

impl Pipe {
    fn end(&self) -> StreamEnd {
        StreamEnd { local: self.local, stream: self.stream, bytes: self.bytes, first: self.first }
    }
}

impl Outputs {
    /// Starts the hub; `closed` is called as each of a rank's streams ends (twice per rank),
    /// after its end went upstream. `stdout`: rlaunch's stdout, a pipe, for the lone rank's
    /// output to be moved into directly (see [`direct`]).
    pub fn start(
        data: mpsc::UnboundedSender<Queued>,
        carrying: Option<Carrying>,
        stdout: Option<OwnedFd>,
        closed: impl FnMut(StreamEnd) + Send + 'static,
    ) -> io::Result<Outputs> {
        // SAFETY: epoll_create1 with a valid flag; the fd is owned from here on.
        let raw = unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) };
        if raw < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `raw` was just created and is owned by nobody else.
        let set = unsafe { OwnedFd::from_raw_fd(raw) };
        // SAFETY: the OwnedFd stays open, and is the same fd, for as long as the AsyncFd owns it.
        let set = unsafe { AsyncFd::register(set) }.map_err(|e| e.into_parts().1)?;
        let (adds, added) = mailbox::channel();
        let (dropped, drop_rx) = watch::channel(false);
        let direct = stdout.map(Direct::new).transpose()?;
        let (carriers, upstream) = match carrying {
            Some(Carrying { carriers, upstream }) => (Some(carriers), Some(upstream)),
            None => (None, None),
        };
        let (gone, rearm) = mailbox::channel();
        let read = Arc::new(std::sync::atomic::AtomicU64::new(0));
        let hub = Hub {
            read: read.clone(),
            gone,
            set_fd: set.as_raw_fd(),
            pipes: HashMap::new(),
            next_key: 0,
            data,
            carriers,
            carried: 0,
            room: credit::Local::new(),
            dropped: drop_rx,
            upstream: true,
            direct,
            closed,
        };
        tokio::spawn(run(set, added, rearm, hub, upstream));
        Ok(Outputs { adds, dropped, read })
    }

    /// Bytes the node's ranks have written so far (read from their pipes), every stream's:
    /// whether they write at all, for `--stall-report`.
    pub fn bytes_read(&self) -> u64 {
        self.read.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Sends `first` upstream, then the rank's output, until both pipes end.
    pub fn add(&self, rank: Gid, local: usize, first: Up, stdout: OwnedFd, stderr: OwnedFd) {
        let _ = self.adds.send(Add { rank, local, first, stdout, stderr });
    }

    /// Closes every pipe now, with what it holds, and relays nothing more: each stream is
    /// reported closed, and so is every stream added from here on.
    pub fn drop_all(&self) {
        self.dropped.send_replace(true);
    }
}

async fn run<F: FnMut(StreamEnd)>(
    set: AsyncFd<OwnedFd>,
    mut added: mailbox::Receiver<Add>,
    mut rearm: mailbox::Receiver<(u64, bool)>,
    mut hub: Hub<F>,
    upstream: Option<AsyncFd<OwnedFd>>,
) {
    // Pipes whose carried chunk went up, to be read again when the channel up has room, or
    // after PACE_MAX from the first of them.
    let mut unread = Vec::new();
    let mut unread_since = Instant::now();
    let mut adding = true;
    while adding || !hub.pipes.is_empty() || hub.holds() {
        let blocked = hub.direct.as_ref().filter(|d| d.blocked);
        tokio::select! {
            biased;
            _ = rlaunch_tree::raised(&mut hub.dropped), if hub.upstream => hub.abandon(),
            _ = async { blocked.expect("checked").room().await }, if blocked.is_some() => {
                hub.unblock().await;
            }
            went = rearm.recv() => match went.expect("the hub holds a sender") {
                (key, true) => {
                    if unread.is_empty() {
                        unread_since = Instant::now();
                    }
                    unread.push(key);
                }
                // Dropped, not sent: there is no channel to wait for.
                (key, false) => hub.rearm(key),
            },
            _ = paced(upstream.as_ref(), unread_since), if !unread.is_empty() => {
                for key in unread.drain(..) {
                    hub.rearm(key);
                }
            }
            add = added.recv(), if adding => match add {
                Some(add) => hub.add(add).await,
                None => adding = false,
            },
            guard = set.readable(), if !hub.pipes.is_empty() => match guard {
                Ok(mut guard) => {
                    if !hub.relay_ready().await {
                        // Nothing ready: wait for the set to become readable again.
                        guard.clear_ready();
                    }
                }
                Err(e) => {
                    tracing::debug!("the output set failed: {e}");
                    hub.abandon();
                }
            },
        }
    }
    tracing::debug!("{} bytes of output carried", hub.carried);
    if let Some(direct) = &hub.direct {
        let (written, copied) = (direct.written, direct.copied);
        tracing::debug!(
            "{written} bytes of output written into rlaunch's stdout, {copied} of them copied"
        );
    }
}

struct Hub<F> {
    /// The epoll set, owned by `run`'s registration.
    set_fd: RawFd,
    /// Hears which pipe's carried chunk is gone (its key, and whether it was sent), to watch
    /// that pipe again.
    gone: mailbox::Sender<(u64, bool)>,
    pipes: HashMap<u64, Pipe>,
    next_key: u64,
    data: mpsc::UnboundedSender<Queued>,
    /// Large chunks are moved out of the pipes into carriers, not read (when the upstream
    /// takes splices).
    carriers: Option<Arc<Carriers>>,
    /// Bytes that went up in carriers.
    carried: u64,
    /// The node's output budget: what is read waits for room in it before it goes.
    room: Arc<credit::Local>,
    /// Becomes true when the node drops the output ([`Outputs::drop_all`]).
    dropped: watch::Receiver<bool>,
    /// False once the data channel is closed or the output dropped: nothing more is relayed.
    upstream: bool,
    /// rlaunch's stdout, when this node moves a lone rank's output into it itself.
    direct: Option<Direct>,
    closed: F,
    /// Bytes read from the ranks' pipes so far ([`Outputs::bytes_read`]).
    read: Arc<std::sync::atomic::AtomicU64>,
}

impl<F: FnMut(StreamEnd)> Hub<F> {
    async fn add(&mut self, add: Add) {
        let on_add = match &mut self.direct {
            Some(direct) if self.upstream => {
                let lone_open = direct.key().is_some_and(|key| self.pipes.contains_key(&key));
                direct.on_add(lone_open)
            }
            _ => OnAdd::Relay { first: Vec::new() },
        };
        let take = match on_add {
            OnAdd::Hold => return self.direct.as_mut().expect("holding").hold(add),
            OnAdd::Relay { first } => {
                self.handed_back(first).await;
                false
            }
            OnAdd::Take => true,
        };
        self.send(add.first, None).await;
        for (stream, fd) in [(Stream::Stdout, add.stdout), (Stream::Stderr, add.stderr)] {
            let pipe = Pipe { fd, rank: add.rank, local: add.local, stream, bytes: 0, first: None };
            if !self.upstream {
                (self.closed)(pipe.end());
                continue;
            }
            let key = self.next_key;
            self.next_key += 1;
            match watch(self.set_fd, &pipe.fd, key) {
                Ok(()) => {
                    self.pipes.insert(key, pipe);
                    if take && stream == Stream::Stdout {
                        self.direct.as_mut().expect("taking").take(key);
                    }
                }
                Err(e) => {
                    tracing::debug!(rank = %add.rank, ?stream, "cannot watch output: {e}");
                    self.end(pipe).await;
                }
            }
        }
    }

    /// Relays what the ready pipes hold; false if none was ready.
    async fn relay_ready(&mut self) -> bool {
        let mut ready = [libc::epoll_event { events: 0, u64: 0 }; READY_BATCH];
        // SAFETY: epoll_wait writes at most READY_BATCH events into `ready`.
        let n = unsafe { libc::epoll_wait(self.set_fd, ready.as_mut_ptr(), READY_BATCH as i32, 0) };
        if n <= 0 {
            // Nothing ready, or EINTR.
            return false;
        }
        for event in &ready[..n as usize] {
            let key = event.u64;
            let Some(pipe) = self.pipes.get_mut(&key) else {
                continue;
            };
            let fd = pipe.fd.as_raw_fd();
            let held = fdio::pending(fd).unwrap_or(0);
            // Nothing held: the end of the stream, read below like any other.
            if held > 0 && self.direct.as_ref().is_some_and(|d| d.moves(key)) {
                self.relay_direct(key, held).await;
                continue;
            }
            let carried = match &self.carriers {
                Some(c) => {
                    c.take(fd, held, splice::SPLICE_MIN, CARRIED_CHUNK).unwrap_or_else(|e| {
                        tracing::debug!(rank = %pipe.rank, "cannot carry output: {e}");
                        None
                    })
                }
                None => None,
            };
            if let Some(mut carried) = carried {
                // The pipe is not read again until this chunk is gone: meanwhile the rank
                // fills it, and the next chunk is larger, instead of a wakeup per write.
                if set_events(self.set_fd, &pipe.fd, key, 0).is_ok() {
                    carried.tell_when_gone(Gone { to: self.gone.clone(), key });
                }
                pipe.bytes += carried.len() as u64;
                self.read.fetch_add(carried.len() as u64, std::sync::atomic::Ordering::Relaxed);
                self.carried += carried.len() as u64;
                pipe.first.get_or_insert_with(record::now_us);
                let (rank, stream) = (pipe.rank, pipe.stream);
                self.send(Up::Output { rank, stream, data: Vec::new() }, Some(carried)).await;
                continue;
            }
            match fdio::read_pending(fd, held, OUTPUT_CHUNK) {
                Ok(chunk) if !chunk.is_empty() => {
                    pipe.bytes += chunk.len() as u64;
                    self.read.fetch_add(chunk.len() as u64, std::sync::atomic::Ordering::Relaxed);
                    pipe.first.get_or_insert_with(record::now_us);
                    let (rank, stream) = (pipe.rank, pipe.stream);
                    self.send(Up::Output { rank, stream, data: chunk }, None).await;
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                read => {
                    if let Err(e) = read {
                        tracing::debug!(rank = %pipe.rank, "output read failed: {e}");
                    }
                    let pipe = self.pipes.remove(&key).expect("looked up above");
                    let writing = |d: &&mut Direct| d.moves(key) && !d.discarding();
                    if let Some(direct) = self.direct.as_mut().filter(writing) {
                        // The last line, without its newline, unless the output is dropped
                        // meanwhile (the loop then gives every pipe up).
                        let finished = tokio::select! {
                            biased;
                            _ = rlaunch_tree::raised(&mut self.dropped) => Ok(()),
                            finished = direct.finish() => finished,
                        };
                        if let Err(e) = finished {
                            self.stdout_broken(e).await;
                        }
                    }
                    self.end(pipe).await;
                    self.after_direct(key, State::Done).await;
                }
            }
        }
        true
    }

    /// Moves the whole lines the lone rank's stdout pipe `key` holds (`held` bytes) into
    /// rlaunch's stdout (see [`direct`]).
    async fn relay_direct(&mut self, key: u64, held: usize) {
        let direct = self.direct.as_mut().expect("moving");
        let pipe = self.pipes.get_mut(&key).expect("a ready pipe");
        if direct.discarding() {
            if let Ok(thrown) = fdio::read_pending(pipe.fd.as_raw_fd(), held, OUTPUT_CHUNK) {
                pipe.bytes += thrown.len() as u64;
                self.read.fetch_add(thrown.len() as u64, std::sync::atomic::Ordering::Relaxed);
            }
            return;
        }
        pipe.first.get_or_insert_with(record::now_us);
        let step = direct.step(pipe.fd.as_raw_fd(), held);
        pipe.bytes += step.taken as u64;
        self.read.fetch_add(step.taken as u64, std::sync::atomic::Ordering::Relaxed);
        self.after_direct(key, step.state).await;
    }

    /// After a move into rlaunch's stdout, of the lone rank's pipe `key`: wait for room, or
    /// hand stdout back if that was asked, or say it is closed.
    async fn after_direct(&mut self, key: u64, state: State) {
        let Some(direct) = self.direct.as_mut() else { return };
        match state {
            State::Done => {
                if let Some((first, held)) = direct.hand_back() {
                    self.handed_back(first).await;
                    for add in held {
                        self.add(add).await;
                    }
                }
            }
            // Out of the set, not just asking for no events: a pipe whose writer closed is
            // reported (EPOLLHUP) whatever it asks for, and would be taken again mid-move.
            // (Already out when a resumed move finds stdout full again.)
            State::Full => {
                if let Some(pipe) = self.pipes.get(&key) {
                    if !direct.blocked {
                        let _ = epoll_ctl(self.set_fd, libc::EPOLL_CTL_DEL, &pipe.fd, key, 0);
                    }
                    direct.blocked = true;
                }
            }
            State::Broken(e) => self.stdout_broken(e).await,
            State::Failed(e) => {
                let (first, held) = direct.fail(&e);
                self.handed_back(first).await;
                for add in held {
                    self.add(add).await;
                }
            }
        }
    }

    /// rlaunch's stdout is closed: said upstream (where it ends the job); the lone rank's
    /// output is thrown away from now on, and the ranks held are relayed.
    async fn stdout_broken(&mut self, e: io::Error) {
        tracing::debug!("rlaunch's stdout is closed: {e}");
        let Some(direct) = self.direct.as_mut() else { return };
        let held = direct.broken();
        self.send(Up::StdoutClosed, None).await;
        for add in held {
            self.add(add).await;
        }
    }

    /// Stdout was handed back: the lone rank's line start goes up first.
    async fn handed_back(&mut self, first: Vec<u8>) {
        let lone = self.direct.as_ref().and_then(Direct::key).and_then(|k| self.pipes.get(&k));
        if let (Some(pipe), false) = (lone, first.is_empty()) {
            let (rank, stream) = (pipe.rank, pipe.stream);
            self.send(Up::Output { rank, stream, data: first }, None).await;
        }
    }

    /// rlaunch's stdout has room again: the move under way goes on, and once it is done the
    /// lone rank's pipe is watched again.
    async fn unblock(&mut self) {
        let Some(direct) = self.direct.as_mut() else { return };
        let Some((key, pipe)) = direct.key().and_then(|key| Some((key, self.pipes.get(&key)?)))
        else {
            direct.blocked = false;
            return;
        };
        let state = direct.resume(pipe.fd.as_raw_fd());
        // Done, or not going on (its output is thrown away, or relayed): watched again.
        if !matches!(state, State::Full) {
            direct.blocked = false;
            let added =
                epoll_ctl(self.set_fd, libc::EPOLL_CTL_ADD, &pipe.fd, key, libc::EPOLLIN as u32);
            if let Err(e) = added {
                tracing::debug!(rank = %pipe.rank, "cannot watch output again: {e}");
            }
        }
        self.after_direct(key, state).await;
    }

    /// Ranks are held for the lone rank's line to end.
    fn holds(&self) -> bool {
        self.direct.as_ref().is_some_and(Direct::holds)
    }

    /// Sends `up` upstream (output with its data in `carried`, if carried), output once
    /// there is room for it; once upstream is gone or the output dropped (while it waits,
    /// too), gives up every pipe.
    async fn send(&mut self, up: Up, carried: Option<Carried>) {
        if !self.upstream {
            return;
        }
        let queued = Queued { up, debt: None, carried };
        let debt = match queued.output_len() {
            Some(len) => tokio::select! {
                biased;
                _ = rlaunch_tree::raised(&mut self.dropped) => None,
                debt = self.room.borrow(len) => Some(debt),
            },
            None => None,
        };
        let dropped = debt.is_none() && matches!(queued.up, Up::Output { .. });
        if dropped || self.data.send(Queued { debt, ..queued }).is_err() {
            self.abandon();
        }
    }

    /// Watches the pipe `key` again, if it is still open.
    fn rearm(&mut self, key: u64) {
        if let Some(pipe) = self.pipes.get(&key) {
            if let Err(e) = set_events(self.set_fd, &pipe.fd, key, libc::EPOLLIN as u32) {
                tracing::debug!(rank = %pipe.rank, "cannot watch output again: {e}");
            }
        }
    }

    /// Ends a stream: out of the set, closed, its end sent upstream (if it wrote anything:
    /// the end of a stream is for rlaunch's writer to finish its last line, and one frame
    /// less a rank is one wake less of rlaunch's writer thread, see docs/scale.md) and
    /// reported.
    async fn end(&mut self, pipe: Pipe) {
        let _ = epoll_ctl(self.set_fd, libc::EPOLL_CTL_DEL, &pipe.fd, 0, 0);
        let end = pipe.end();
        let Pipe { fd, rank, stream, .. } = pipe;
        drop(fd);
        if end.bytes > 0 {
            self.send(Up::OutputEnd { rank, stream }, None).await;
        }
        (self.closed)(end);
    }

    /// Upstream is gone, or the output dropped: every pipe is closed and reported now (the
    /// node waits for each stream's end), and so is every stream added from here on.
    fn abandon(&mut self) {
        self.upstream = false;
        for (_, pipe) in self.pipes.drain() {
            (self.closed)(pipe.end());
        }
        let (_, held) = self.direct.as_mut().map(Direct::off).unwrap_or_default();
        for add in held {
            for stream in [Stream::Stdout, Stream::Stderr] {
                let end = StreamEnd { local: add.local, stream, bytes: 0, first: None };
                (self.closed)(end);
            }
        }
    }
}

/// The longest a pipe whose chunk went up waits for room in the channel up: the channel is
/// shared (with the output of child proxies, and of pipes read rather than carried), and a
/// pipe must not wait for it to drain for as long as the others keep it full.
const PACE_MAX: Duration = Duration::from_millis(2);

/// Returns once `upstream` has room, or at `since` + [`PACE_MAX`].
///
/// A chunk has gone up when the pump has spliced it into the channel, which a 1 MiB socket
/// buffer takes at once. Reading the pipe again then has the hub wake for every write the
/// rank makes (a pipe that was polled wakes its poller on every write) and carry 64 KiB at
/// a time. A unix socket has room again (is writable) when at most a quarter of its buffer
/// is still queued, so its reader has taken most of the chunk; the rank has filled its pipe
/// meanwhile, and the next chunk is a large one. A pipe up (a proxy under ssh) has room
/// whenever it is not full, so this paces little there.
async fn paced(upstream: Option<&AsyncFd<OwnedFd>>, since: Instant) {
    tokio::select! {
        _ = has_room(upstream) => {}
        _ = tokio::time::sleep_until(since + PACE_MAX) => {}
    }
}

/// Returns once `upstream` is writable (at once when there is none, or on an error or a
/// hangup, which the pump meets too).
async fn has_room(upstream: Option<&AsyncFd<OwnedFd>>) {
    let Some(upstream) = upstream else { return };
    loop {
        let Ok(mut guard) = upstream.writable().await else { return };
        if guard.ready().is_write_closed() {
            return;
        }
        let mut poll = libc::pollfd { fd: upstream.as_raw_fd(), events: libc::POLLOUT, revents: 0 };
        // SAFETY: one pollfd, no wait.
        let n = unsafe { libc::poll(&mut poll, 1, 0) };
        if n != 0 {
            return;
        }
        guard.clear_ready();
    }
}

/// Adds `fd` to the set, level-triggered, tagged `key`.
fn watch(set: RawFd, fd: &OwnedFd, key: u64) -> io::Result<()> {
    fdio::set_nonblocking(fd)?;
    epoll_ctl(set, libc::EPOLL_CTL_ADD, fd, key, libc::EPOLLIN as u32)
}

/// Changes what `fd`, tagged `key`, is watched for (nothing: `events` 0).
fn set_events(set: RawFd, fd: &OwnedFd, key: u64, events: u32) -> io::Result<()> {
    epoll_ctl(set, libc::EPOLL_CTL_MOD, fd, key, events)
}

fn epoll_ctl(set: RawFd, op: i32, fd: &OwnedFd, key: u64, events: u32) -> io::Result<()> {
    let mut event = libc::epoll_event { events, u64: key };
    // SAFETY: both fds are open; `event` is a valid epoll_event.
    let rc = unsafe { libc::epoll_ctl(set, op, fd.as_raw_fd(), &mut event) };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

#[cfg(test)]
mod tests;
