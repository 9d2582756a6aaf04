//! A lone rank's stdout, moved into rlaunch's stdout by its node itself.
//!
//! ```text
//!  relayed: rank pipe ─splice─► carrier ─splice─► link ─splice─► rlaunch's stdout
//!  direct:  rank pipe ─splice────────────────────────────────────► rlaunch's stdout
//! ```
//!
//! A job of one rank, run by the proxy rlaunch forked on its own machine, whose output
//! rlaunch would splice unchanged into its stdout (a pipe; no prefix, tag, timestamp or
//! output file; stderr not the same pipe): the proxy is handed a copy of that stdout and
//! moves the rank's output there itself, one splice a chunk where there were three, and
//! rlaunch does not wake for it at all. Everything else goes up as before: the rank's stderr,
//! its start and end, its byte counts. A stdout found closed is said upstream
//! ([`Up::StdoutClosed`](rlaunch_protocol::control::Up)), and rlaunch ends the job as it does when
//! its own write fails. Only into a pipe: a splice into it can be told not to block
//! (`SPLICE_F_NONBLOCK`) while the descriptor stays as it is (its flags are shared with the
//! user's shell), and the node's one thread never waits on a disk.
//!
//! **Whole lines.** The node writes stdout the way rlaunch's writer does: whole lines only,
//! so that stdout can be handed back at a line's end. Before a chunk is moved, the pipe is
//! `tee`d into a scratch pipe (no copy), the scratch's last [`TAIL`] bytes are read to find
//! the chunk's last newline, and only the lines up to it are moved; the rest, the start of a
//! line, is read into memory and written ahead of the next chunk's lines (or at the end of
//! the stream, or once it is past [`MAX_PARTIAL`], as rlaunch does). A move that finds stdout
//! full finishes once it has room, before anything else is written.
//!
//! **Handing back.** Ranks added later (the lone rank spawned some: MPI_Comm_spawn) are
//! relayed, and rlaunch writes their lines, so the node hands stdout back first: the new
//! ranks are held, their pipes not yet watched, until the move under way (if any) is done;
//! then the line start in memory goes up as the lone rank's first relayed output, and its
//! output is relayed from then on like theirs. Nothing waits on the rank, only on stdout's
//! reader, and no line is cut.

use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};

use nix::libc;
use tokio::io::unix::AsyncFd;
use tokio::io::Interest;

use super::Add;
use rlaunch_tree::splice;

/// How far back from a chunk's end its last newline is looked for without copying the chunk.
const TAIL: usize = 4 << 10;
/// A line start longer than this is written without waiting for its newline (rlaunch's own
/// limit for a partial line).
const MAX_PARTIAL: usize = 64 << 10;

/// rlaunch's stdout, and the lone rank's stdout pipe moved into it.
pub struct Direct {
    /// rlaunch's stdout (a pipe), registered for writability.
    sink: AsyncFd<OwnedFd>,
    /// Where a chunk is `tee`d to find its last newline: read end, write end.
    scratch: (OwnedFd, OwnedFd),
    null: File,
    /// The lone rank's stdout pipe, by its key in the hub, once added.
    key: Option<u64>,
    phase: Phase,
    /// The start of a line, taken out of the pipe and not yet written.
    partial: Vec<u8>,
    /// A move under way: what is still to be written, before anything else.
    owed: Owed,
    /// Stdout was full: the pipe is not watched until it has room.
    pub blocked: bool,
    /// Ranks added while handing back, to add once that is done.
    held: Vec<Add>,
    /// Bytes written into stdout, and how many of them went through memory.
    pub written: u64,
    pub copied: u64,
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Phase {
    /// No rank yet: the first one added is the lone rank.
    Waiting,
    Moving,
    /// A rank was added: stdout goes back to rlaunch once the move under way is done.
    HandingBack,
    /// Stdout broke: the lone rank's output is thrown away (rlaunch is ending the job), so
    /// that the rank is not held up and the end of its stream is seen.
    Discarding,
    /// Relaying, like any node.
    Off,
}

/// Whole lines on their way into stdout: `mem` (from `done` on), through the scratch pipe
/// (`staged` bytes there now), then `pipe` bytes spliced straight from the rank's pipe; then
/// `skip` bytes of the pipe thrown away (a line start already copied into memory).
#[derive(Default)]
struct Owed {
    mem: Vec<u8>,
    done: usize,
    staged: usize,
    pipe: usize,
    skip: usize,
}

impl Owed {
    fn is_empty(&self) -> bool {
        self.done == self.mem.len() && self.staged == 0 && self.pipe == 0 && self.skip == 0
    }
}

/// What to do with a rank being added.
#[derive(Debug, PartialEq)]
pub enum OnAdd {
    /// The lone rank: its stdout goes into rlaunch's stdout ([`Direct::take`] its key).
    Take,
    /// Held until the move under way is done ([`Direct::hold`]).
    Hold,
    /// Relayed. `first`: the lone rank's line start, to send up ahead of anything else of
    /// its output (stdout has just been handed back).
    Relay { first: Vec<u8> },
}

/// How a step went: `taken` bytes came out of the rank's pipe.
pub struct Step {
    pub taken: usize,
    pub state: State,
}

#[derive(Debug)]
pub enum State {
    /// All written that could be; stdout is at a line's end.
    Done,
    /// Stdout is full with lines still owed: wait for room ([`Direct::room`]), then
    /// [`Direct::resume`].
    Full,
    /// Stdout is closed, or failed.
    Broken(io::Error),
    /// The scratch pipe or the rank's pipe failed (never seen: their state is ours): stdout
    /// goes back to rlaunch ([`Direct::fail`]).
    Failed(io::Error),
}

impl Direct {
    /// `sink`: a copy of rlaunch's stdout, a pipe.
    pub fn new(sink: OwnedFd) -> io::Result<Direct> {
        // SAFETY: the OwnedFd stays open, and is the same fd, for as long as the AsyncFd owns
        // it.
        let sink = unsafe { AsyncFd::register_with_interest(sink, Interest::WRITABLE) }
            .map_err(|e| e.into_parts().1)?;
        let scratch = splice::pipe(libc::O_NONBLOCK)?;
        // As large as a rank's pipe, so that one tee sees all it holds.
        rlaunch_tree::fdio::enlarge_pipe(&scratch.1, rlaunch_tree::fdio::PIPE_CAPACITY);
        let null = File::options().write(true).open("/dev/null")?;
        Ok(Direct {
            sink,
            scratch,
            null,
            key: None,
            phase: Phase::Waiting,
            partial: Vec::new(),
            owed: Owed::default(),
            blocked: false,
            held: Vec::new(),
            written: 0,
            copied: 0,
        })
    }

    /// A rank is being added; `lone_open`: the lone rank's stdout is still open.
    pub fn on_add(&mut self, lone_open: bool) -> OnAdd {
        match self.phase {
            Phase::Waiting => OnAdd::Take,
            Phase::Moving if lone_open && !self.owed.is_empty() => {
                tracing::debug!("a rank was added: stdout goes back to rlaunch after this move");
                self.phase = Phase::HandingBack;
                OnAdd::Hold
            }
            Phase::HandingBack => OnAdd::Hold,
            Phase::Moving => {
                tracing::debug!("a rank was added: stdout goes back to rlaunch");
                self.phase = Phase::Off;
                OnAdd::Relay { first: std::mem::take(&mut self.partial) }
            }
            Phase::Discarding | Phase::Off => OnAdd::Relay { first: Vec::new() },
        }
    }

    /// The lone rank's stdout is the pipe `key`.
    pub fn take(&mut self, key: u64) {
        self.key = Some(key);
        self.phase = Phase::Moving;
    }

    pub fn hold(&mut self, add: Add) {
        self.held.push(add);
    }

    pub fn holds(&self) -> bool {
        !self.held.is_empty()
    }

    pub fn key(&self) -> Option<u64> {
        self.key
    }

    /// Whether the pipe `key` is the one moved into stdout (or thrown away).
    pub fn moves(&self, key: u64) -> bool {
        let moving = matches!(self.phase, Phase::Moving | Phase::HandingBack | Phase::Discarding);
        self.key == Some(key) && moving
    }

    pub fn discarding(&self) -> bool {
        self.phase == Phase::Discarding
    }

    /// Stdout broke: the lone rank's output is thrown away from now on. Returns the held
    /// ranks, to add now.
    pub fn broken(&mut self) -> Vec<Add> {
        self.phase = Phase::Discarding;
        std::mem::take(&mut self.held)
    }

    /// If stdout is being handed back and the move under way is done: hands it back.
    /// Returns the lone rank's line start, to send up first, and the held ranks, to add.
    pub fn hand_back(&mut self) -> Option<(Vec<u8>, Vec<Add>)> {
        if self.phase != Phase::HandingBack || !self.owed.is_empty() {
            return None;
        }
        Some(self.off())
    }

    /// Relaying from now on (the output was dropped, or handed back): the line start and
    /// the ranks held.
    pub fn off(&mut self) -> (Vec<u8>, Vec<Add>) {
        tracing::debug!("relaying the lone rank's output");
        self.phase = Phase::Off;
        (std::mem::take(&mut self.partial), std::mem::take(&mut self.held))
    }

    /// The pipe holds `held` bytes: moves the whole lines among them into stdout (after the
    /// line start in memory), and keeps the start of the last line.
    pub fn step(&mut self, pipe: RawFd, held: usize) -> Step {
        if !self.owed.is_empty() {
            return Step { taken: 0, state: self.pay(pipe) };
        }
        match self.take_lines(pipe, held) {
            Ok(taken) => Step { taken, state: self.pay(pipe) },
            Err(e) => Step { taken: 0, state: State::Failed(e) },
        }
    }

    /// Stdout has room again: goes on with the move under way.
    pub fn resume(&mut self, pipe: RawFd) -> State {
        self.pay(pipe)
    }

    /// The lone rank's stdout ended: its last line start, written as it is. No move is under
    /// way: the pipe is out of the epoll set while one is, so its end is not seen.
    pub async fn finish(&mut self) -> io::Result<()> {
        debug_assert!(self.owed.is_empty(), "the pipe ended mid-move");
        let last = std::mem::take(&mut self.partial);
        self.write_all(&last).await
    }

    /// Something of ours failed (see [`State::Failed`]): relaying from now on, with the line
    /// start and what was still to be written going up first (what the scratch held is lost).
    /// Returns those bytes and the ranks held.
    pub fn fail(&mut self, e: &io::Error) -> (Vec<u8>, Vec<Add>) {
        tracing::warn!("writing the rank's output into rlaunch's stdout failed: {e}; relaying it");
        self.empty_scratch();
        let owed = std::mem::take(&mut self.owed);
        let mut first = owed.mem[owed.done..].to_vec();
        first.append(&mut self.partial);
        let (_, held) = self.off();
        (first, held)
    }

    /// Returns once stdout has room (or is closed: the next write finds that out).
    pub async fn room(&self) {
        super::has_room(Some(&self.sink)).await
    }

    /// Sets up the next move: the line start in memory and the chunk's whole lines, found
    /// through the scratch pipe. Returns the bytes taken out of the pipe (into the move, or
    /// into memory).
    fn take_lines(&mut self, pipe: RawFd, held: usize) -> io::Result<usize> {
        let flags = libc::SPLICE_F_NONBLOCK;
        // SAFETY: tee between two pipes, nothing borrowed.
        let teed = unsafe { libc::tee(pipe, self.scratch.1.as_raw_fd(), held, flags) };
        if teed <= 0 {
            // Emptied meanwhile, or the scratch is out of step: nothing to take.
            self.empty_scratch();
            return Ok(0);
        }
        let chunk = teed as usize;
        let tail_len = chunk.min(TAIL);
        self.throw_away(self.scratch.0.as_raw_fd(), chunk - tail_len)?;
        let tail = splice::read_exact_now(self.scratch.0.as_raw_fd(), tail_len)?;
        if let Some(end) = last_line_end(&tail) {
            // Splice the lines; read what follows the last one, already in `tail`.
            let lines = chunk - tail_len + end;
            let rest = tail[end..].to_vec();
            let mem = std::mem::replace(&mut self.partial, rest);
            // The line start comes out of the pipe once the lines have.
            let skip = self.partial.len();
            self.owed = Owed { mem, pipe: lines, skip, ..Owed::default() };
            return Ok(chunk);
        }
        // No newline near the end: the chunk is a line start, or a long line. Copy it.
        let data = if chunk == tail_len {
            self.throw_away(pipe, chunk)?;
            tail
        } else {
            splice::read_exact_now(pipe, chunk)?
        };
        self.partial.extend_from_slice(&data);
        let cut = match last_line_end(&self.partial) {
            Some(end) => end,
            None if self.partial.len() > MAX_PARTIAL => self.partial.len(),
            None => return Ok(chunk),
        };
        let rest = self.partial.split_off(cut);
        let mem = std::mem::replace(&mut self.partial, rest);
        self.owed = Owed { mem, ..Owed::default() };
        Ok(chunk)
    }

    /// Writes what is owed, without blocking; once the lines spliced from the pipe are all
    /// in stdout, throws away the line start after them (kept in `partial`). Bytes in memory
    /// go through the scratch pipe: a write into stdout itself could block, and its flags are
    /// not ours to change. A full stdout gets one short pause to drain (see
    /// `splice::DRAIN`) before the move waits for room.
    fn pay(&mut self, pipe: RawFd) -> State {
        let mut paused = false;
        let flags = libc::SPLICE_F_MOVE | libc::SPLICE_F_NONBLOCK;
        loop {
            let moved = if self.owed.staged > 0 {
                let (scratch, sink) = (self.scratch.0.as_raw_fd(), self.sink.as_raw_fd());
                splice::splice(scratch, sink, self.owed.staged, flags).inspect(|&n| {
                    self.owed.staged -= n;
                    self.copied += n as u64;
                })
            } else if self.owed.done < self.owed.mem.len() {
                match stage(self.scratch.1.as_raw_fd(), &self.owed.mem[self.owed.done..]) {
                    Ok(n) => {
                        self.owed.done += n;
                        self.owed.staged += n;
                        continue;
                    }
                    Err(e) => return State::Failed(e),
                }
            } else if self.owed.pipe > 0 {
                splice::splice(pipe, self.sink.as_raw_fd(), self.owed.pipe, flags)
                    .inspect(|&n| self.owed.pipe -= n)
            } else if self.owed.skip > 0 {
                match self.throw_away(pipe, self.owed.skip) {
                    Ok(()) => self.owed.skip = 0,
                    Err(e) => return State::Failed(e),
                }
                continue;
            } else {
                break;
            };
            if let Ok(n) = moved {
                self.written += n as u64;
            }
            match moved {
                Ok(0) if self.owed.pipe > 0 => {
                    return State::Failed(io::Error::other("the rank's pipe ended mid-move"))
                }
                Ok(_) => {}
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock && !paused => {
                    std::thread::sleep(splice::DRAIN);
                    paused = true;
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return State::Full,
                Err(e) => return State::Broken(e),
            }
        }
        self.owed = Owed::default();
        State::Done
    }

    /// Copies all of `data` into stdout (through the scratch pipe), waiting for room as it
    /// must.
    async fn write_all(&mut self, data: &[u8]) -> io::Result<()> {
        self.owed = Owed { mem: data.to_vec(), ..Owed::default() };
        loop {
            // No bytes of the rank's pipe are owed: any descriptor will do.
            match self.pay(self.null.as_raw_fd()) {
                State::Done => return Ok(()),
                State::Full => self.room().await,
                State::Broken(e) | State::Failed(e) => {
                    self.owed = Owed::default();
                    return Err(e);
                }
            }
        }
    }

    /// Throws away the next `len` bytes of the pipe `from`, which holds them.
    fn throw_away(&self, from: RawFd, len: usize) -> io::Result<()> {
        match splice::splice_now(from, self.null.as_raw_fd(), len)? {
            moved if moved == len => Ok(()),
            _ => Err(io::ErrorKind::UnexpectedEof.into()),
        }
    }

    fn empty_scratch(&self) {
        let held = rlaunch_tree::fdio::pending(self.scratch.0.as_raw_fd()).unwrap_or(0);
        let _ = self.throw_away(self.scratch.0.as_raw_fd(), held);
    }
}

/// Writes what of `data` the scratch pipe `to` (empty, non-blocking) takes.
fn stage(to: RawFd, data: &[u8]) -> io::Result<usize> {
    loop {
        // SAFETY: writes from `data`, at most its length.
        let n = unsafe { libc::write(to, data.as_ptr().cast(), data.len()) };
        if n >= 0 {
            return Ok(n as usize);
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
}

/// Where the last whole line of `data` ends: the length up to and with its last newline.
fn last_line_end(data: &[u8]) -> Option<usize> {
    data.iter().rposition(|&b| b == b'\n').map(|i| i + 1)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};

    /// A rank's pipe (read end, write end as a File) and stdout (read end as a File).
    struct Rig {
        direct: Direct,
        pipe: OwnedFd,
        rank: File,
        stdout: File,
    }

    fn rig() -> Rig {
        let (pipe, rank) = splice::pipe(0).unwrap();
        rlaunch_tree::fdio::set_nonblocking(&pipe).unwrap();
        rlaunch_tree::fdio::enlarge_pipe(&rank, 1 << 20);
        let (stdout, sink) = splice::pipe(0).unwrap();
        rlaunch_tree::fdio::set_nonblocking(&stdout).unwrap();
        let mut direct = Direct::new(sink).unwrap();
        assert_eq!(direct.on_add(false), OnAdd::Take);
        direct.take(0);
        Rig { direct, pipe, rank: rank.into(), stdout: stdout.into() }
    }

    impl Rig {
        fn write(&mut self, data: &[u8]) {
            self.rank.write_all(data).unwrap();
        }

        /// One step over what the pipe holds; the bytes taken.
        fn step(&mut self) -> (usize, State) {
            let held = rlaunch_tree::fdio::pending(self.pipe.as_raw_fd()).unwrap();
            let step = self.direct.step(self.pipe.as_raw_fd(), held);
            (step.taken, step.state)
        }

        /// Reads stdout while the move goes on, from `state`, until it is done.
        fn until_done(&mut self, mut state: State) -> Vec<u8> {
            let mut got = Vec::new();
            loop {
                got.extend(self.stdout());
                match state {
                    State::Done => return got,
                    State::Full => state = self.direct.resume(self.pipe.as_raw_fd()),
                    State::Broken(e) | State::Failed(e) => panic!("{e}"),
                }
            }
        }

        fn stdout(&mut self) -> Vec<u8> {
            let mut got = Vec::new();
            let mut buf = vec![0; 1 << 16];
            loop {
                match self.stdout.read(&mut buf) {
                    Ok(0) => break,
                    Ok(n) => got.extend_from_slice(&buf[..n]),
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                    Err(e) => panic!("{e}"),
                }
            }
            got
        }
    }

    #[tokio::test]
    async fn only_whole_lines_go_out_and_a_line_start_waits_for_its_end() {
        let mut r = rig();
        r.write(b"one\ntwo\nthr");
        assert!(matches!(r.step(), (11, State::Done)));
        assert_eq!(r.stdout(), b"one\ntwo\n");
        assert_eq!(
            rlaunch_tree::fdio::pending(r.pipe.as_raw_fd()).unwrap(),
            0,
            "the line start is taken"
        );
        // Only more of the line: still nothing out.
        r.write(b"ee and");
        assert!(matches!(r.step(), (6, State::Done)));
        assert_eq!(r.stdout(), b"");
        r.write(b" more\nfour\n");
        assert!(matches!(r.step(), (11, State::Done)));
        assert_eq!(r.stdout(), b"three and more\nfour\n");
        // The end of the stream writes the last line start as it is.
        r.write(b"last");
        r.step();
        r.direct.finish().await.unwrap();
        assert_eq!(r.stdout(), b"last");
    }

    #[tokio::test]
    async fn a_chunk_whose_last_newline_is_far_from_its_end_is_copied_whole_lines_first() {
        let mut r = rig();
        let long = vec![b'x'; 3 * TAIL];
        let mut data = b"short\n".to_vec();
        data.extend_from_slice(&long);
        r.write(&data);
        assert!(matches!(r.step(), (n, State::Done) if n == data.len()));
        assert_eq!(r.stdout(), b"short\n");
        r.write(b"\n");
        r.step();
        let mut want = long.clone();
        want.push(b'\n');
        assert_eq!(r.stdout(), want);
    }

    #[tokio::test]
    async fn a_line_start_past_the_limit_is_written_cut() {
        let mut r = rig();
        let long = vec![b'y'; MAX_PARTIAL + 1];
        r.write(&long);
        let (_, state) = r.step();
        assert_eq!(r.until_done(state), long);
    }

    #[tokio::test]
    async fn a_full_stdout_holds_the_move_until_it_has_room_and_nothing_is_lost() {
        let mut r = rig();
        let line = [b'z'; 99].iter().chain(b"\n").copied().collect::<Vec<_>>();
        let lines: Vec<u8> = line.iter().copied().cycle().take(100 * 3000).collect();
        r.write(&lines);
        r.write(b"open");
        // stdout is a 64 KiB pipe: 300,000 bytes do not fit.
        assert!(matches!(r.step(), (n, State::Full) if n == lines.len() + 4));
        // A rank added now waits for the move.
        assert_eq!(r.direct.on_add(true), OnAdd::Hold);
        assert!(r.direct.hand_back().is_none());
        assert_eq!(r.until_done(State::Full), lines);
        assert_eq!(rlaunch_tree::fdio::pending(r.pipe.as_raw_fd()).unwrap(), 0);
        // Then stdout goes back, with the line start to relay first.
        let (first, held) = r.direct.hand_back().expect("the move is done");
        assert_eq!((first.as_slice(), held.len()), (&b"open"[..], 0));
        assert!(!r.direct.moves(0));
    }

    #[tokio::test]
    async fn a_rank_added_between_moves_takes_stdout_back_at_once() {
        let mut r = rig();
        r.write(b"done\nopen");
        r.step();
        assert_eq!(r.direct.on_add(true), OnAdd::Relay { first: b"open".to_vec() });
        assert!(!r.direct.moves(0));
        assert_eq!(r.direct.on_add(true), OnAdd::Relay { first: Vec::new() });
    }

    #[tokio::test]
    async fn a_closed_stdout_is_broken() {
        let mut r = rig();
        drop(std::mem::replace(&mut r.stdout, File::open("/dev/null").unwrap()));
        r.write(b"line\n");
        assert!(matches!(r.step(), (_, State::Broken(e)) if e.raw_os_error() == Some(libc::EPIPE)));
    }
}
