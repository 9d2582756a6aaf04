//! The link reader's side of splicing: what of a large output frame to read, what to splice.

use rlaunch_protocol::ids::Gid;
use std::collections::HashSet;
use std::future::Future;
use std::io;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::pin::Pin;
use std::time::Duration;

use nix::libc;
use rlaunch_protocol::ids::Stream;
use rlaunch_protocol::io::ReadError;
use tokio::io::unix::AsyncFd;
use tokio::io::Interest;

use rlaunch_tree::fdio::pending;
use rlaunch_tree::splice::{self, read_exact_now, registered_dup, Bulk, SPLICE_MIN};

use super::{Piece, Spliced, Splicer, PEEK_HEAD, PEEK_TAIL, STASH_HALF};

/// A piece of a frame is taken once this much of it (or all of it) has arrived.
const GATHER: usize = 64 << 10;
/// How long a piece waits for room in a full stash before it is read instead: short, so
/// that a link whose output waits for a reader of rlaunch's stdout that went away (or paused)
/// is still read, its heartbeats with it.
const ROOM_WAIT: Duration = Duration::from_millis(50);
/// How long a piece smaller than [`GATHER`] waits for more of its frame before it is taken
/// as it is. The rest follows the head at once, but a channel can be full with less than
/// `GATHER` in it: a pipe's 16 slots each holding a page spliced in part, a socket's buffer
/// counted with its overhead. Its writer then waits for this reader, and without this bound
/// the link would stall until its parent's silence timeout took it for lost (beside two
/// busy loops, the chaos runner's floods lost a proxy so, 1 run of 40 trials in 4).
const GATHER_WAIT: Duration = Duration::from_millis(20);

/// The rest of a large output frame, still in the socket.
struct Rest {
    rank: Gid,
    stream: Stream,
    rest: usize,
    /// The frame's bytes after the last newline handed out: held until the frame is all
    /// in, so that a frame cut short by a lost link leaves no line cut in the output.
    held: Vec<u8>,
}

/// A link reader's splicing: the link's socket (a duplicate of the reader's descriptor,
/// registered on its own), the large output frame it is taking, and which ranks' streams
/// have a line open (their last byte seen was not a newline).
pub(crate) struct LinkSplice {
    socket: AsyncFd<OwnedFd>,
    state: State,
}

struct State {
    splicer: Splicer,
    bulk: Option<Rest>,
    open_lines: HashSet<(Gid, Stream)>,
    /// The stash had no room for the piece in time: it is read.
    impatient: bool,
    /// No more of the frame came in time: the piece is taken as it is.
    hurried: bool,
}

/// What the socket and the stash allow.
enum Take {
    Piece(Piece),
    /// Wait for the frame's next bytes: none are here.
    Data,
    /// Wait for more of the frame, a while: some are here, fewer than [`GATHER`].
    More,
    /// Wait for room in the stash.
    Room,
}

impl LinkSplice {
    /// Splicing for the link whose reader reads `socket` (borrowed: duplicated here).
    pub(crate) fn new(splicer: Splicer, socket: RawFd) -> io::Result<LinkSplice> {
        let socket = registered_dup(socket, Interest::READABLE)?;
        let open_lines = HashSet::new();
        let state = State { splicer, bulk: None, open_lines, impatient: false, hurried: false };
        Ok(LinkSplice { socket, state })
    }

    /// Notes output of a rank's stream read the usual way: whether it leaves a line open.
    pub(crate) fn saw(&mut self, rank: Gid, stream: Stream, data: &[u8]) {
        self.state.saw(rank, stream, data);
    }

    /// An output frame of `rank`'s `stream` begins with `first`, and its next `rest` bytes
    /// are still in the socket: [`LinkSplice::next_piece`] takes them all, `first` with them.
    pub(crate) fn begin(&mut self, rank: Gid, stream: Stream, first: Vec<u8>, rest: usize) {
        self.state.bulk = Some(Rest { rank, stream, rest, held: first });
    }

    /// Whether a frame's data is still to be taken.
    pub(crate) fn busy(&self) -> bool {
        self.state.bulk.is_some()
    }

    /// The next piece of the frame begun, once the socket holds some of it. Cancel-safe: it
    /// only waits before it takes anything.
    pub(crate) async fn next_piece(&mut self) -> Result<Piece, ReadError> {
        // Look at the socket again at once, not when it is next readable: after a wait in
        // which nothing changed there (the stash's room came, or no more of the frame did).
        let mut look_now = false;
        loop {
            let mut guard = match look_now {
                true => None,
                false => Some(self.socket.readable().await?),
            };
            look_now = false;
            let closed = guard.as_ref().is_some_and(|g| g.ready().is_read_closed());
            match self.state.try_piece(self.socket.get_ref().as_raw_fd(), closed)? {
                Take::Piece(piece) => return Ok(piece),
                Take::Data => {
                    if let Some(guard) = guard.as_mut() {
                        guard.clear_ready();
                    }
                }
                Take::More => {
                    if let Some(mut guard) = guard {
                        guard.clear_ready();
                    }
                    if tokio::time::timeout(GATHER_WAIT, self.socket.readable()).await.is_err() {
                        (self.state.hurried, look_now) = (true, true);
                    }
                }
                Take::Room => {
                    let stash = self.state.splicer.stash.clone();
                    if tokio::time::timeout(ROOM_WAIT, stash.half_empty()).await.is_err() {
                        self.state.impatient = true;
                    }
                }
            }
        }
    }
}

impl Bulk for LinkSplice {
    fn saw(&mut self, rank: Gid, stream: Stream, data: &[u8]) {
        LinkSplice::saw(self, rank, stream, data)
    }

    fn begin(&mut self, rank: Gid, stream: Stream, first: Vec<u8>, rest: usize) {
        LinkSplice::begin(self, rank, stream, first, rest)
    }

    fn busy(&self) -> bool {
        LinkSplice::busy(self)
    }

    fn next_piece(
        &mut self,
    ) -> Pin<Box<dyn Future<Output = Result<splice::Piece, ReadError>> + Send + '_>> {
        Box::pin(async move {
            Ok(match LinkSplice::next_piece(self).await? {
                Piece::Read { rank, stream, data } => splice::Piece::Read { rank, stream, data },
                Piece::Spliced(s) => splice::Piece::Taken { len: s.len(), output: Box::new(s) },
            })
        })
    }
}

impl State {
    fn saw(&mut self, rank: Gid, stream: Stream, data: &[u8]) {
        match data.last() {
            Some(b'\n') => {
                self.open_lines.remove(&(rank, stream));
            }
            Some(_) => {
                self.open_lines.insert((rank, stream));
            }
            None => {}
        }
    }

    /// The next piece of the frame from what `fd` holds, or what to wait for: more of the
    /// frame (it follows its head at once, so a piece smaller than [`GATHER`] is worth
    /// waiting for, unless the peer is gone: `closed`), or room in the stash.
    fn try_piece(&mut self, fd: RawFd, closed: bool) -> Result<Take, ReadError> {
        let bulk = self.bulk.as_ref().expect("a frame begun");
        let (rank, stream) = (bulk.rank, bulk.stream);
        let mut avail = pending(fd)?.min(bulk.rest);
        let hurried = std::mem::take(&mut self.hurried);
        if !closed && !hurried && avail > 0 && avail < bulk.rest.min(GATHER) {
            return Ok(Take::More);
        }
        if avail == 0 && bulk.rest > 0 {
            // Nothing yet, or the end of the stream in the middle of the frame.
            return match peek_at(fd, 0, &mut [0]) {
                Ok(0) => Err(ReadError::Truncated),
                Ok(_) => Ok(Take::Data),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => Ok(Take::Data),
                Err(e) => Err(e.into()),
            };
        }
        let mut splices = self.splicer.wants(stream) && avail >= SPLICE_MIN;
        if splices && !std::mem::take(&mut self.impatient) {
            // A smaller piece, what the stash takes, or none until it takes a large one.
            match self.splicer.stash.room() {
                room if room >= avail.min(STASH_HALF) => avail = avail.min(room),
                _ if !closed => return Ok(Take::Room),
                _ => splices = false,
            }
        }
        // A line is open if the bytes held leave one open, or else if the output handed out
        // did.
        let open = match bulk.held.last() {
            Some(&last) => last != b'\n',
            None => self.open_lines.contains(&(rank, stream)),
        };
        let frame_ends = avail == bulk.rest;
        // Nothing of the rank's stream waits to go before this piece: no bytes held (not even
        // the frame's first, read with its head, which may end a line), no line open.
        let clear = bulk.held.is_empty() && !open;
        let spliced = match splices {
            true => self.splice_piece(fd, (rank, stream), open, clear, avail, frame_ends)?,
            false => None,
        };
        let (mut piece, taken) = match spliced {
            Some((s, taken)) if s.direct > 0 || s.stashed > 0 => (Piece::Spliced(s), taken),
            Some((s, taken)) => {
                (Piece::Read { rank, stream, data: [s.head, s.after].concat() }, taken)
            }
            None => (Piece::Read { rank, stream, data: read_exact_now(fd, avail)? }, avail),
        };
        let bulk = self.bulk.as_mut().expect("a frame begun");
        bulk.rest -= taken;
        let held = std::mem::take(&mut bulk.held);
        let done = bulk.rest == 0;
        // The bytes held go first; the frame's last open line is held back until its end.
        let last = match &mut piece {
            Piece::Read { data, .. } => {
                let mut all = held;
                all.extend_from_slice(data);
                *data = all;
                data
            }
            Piece::Spliced(s) => {
                let mut head = held;
                head.extend_from_slice(&s.head);
                s.head = head;
                &mut s.after
            }
        };
        if !done {
            let end = last.iter().rposition(|&b| b == b'\n').map_or(0, |nl| nl + 1);
            let open_end = last.split_off(end);
            self.bulk.as_mut().expect("a frame begun").held = open_end;
        } else {
            self.bulk = None;
        }
        match &piece {
            Piece::Read { data, .. } => self.saw(rank, stream, data),
            Piece::Spliced(s) if !s.after.is_empty() => self.saw(rank, stream, &s.after),
            // Stashed lines end with a newline: all of them when `after` is empty.
            Piece::Spliced(_) => self.saw(rank, stream, b"\n"),
        }
        if matches!(&piece, Piece::Read { data, .. } if data.is_empty()) {
            // All of it held (a piece with no newline): take the next one, or wait for it.
            return match done {
                true => Ok(Take::Piece(piece)),
                false => self.try_piece(fd, closed),
            };
        }
        Ok(Take::Piece(piece))
    }

    /// Takes the first `avail` bytes of the socket as a piece whose whole lines are spliced,
    /// with how many bytes it took, or `None` (nothing taken) if there are too few of them
    /// to be worth it. The lines go straight into the sink when the piece is `clear`
    /// (nothing of its stream waits to go before it) and the writer is idle. Unless the
    /// piece is where the frame ends, the start of its last line is left in the socket, so
    /// that the next piece starts on a line, and may be clear too.
    fn splice_piece(
        &self,
        fd: RawFd,
        (rank, stream): (Gid, Stream),
        open: bool,
        clear: bool,
        avail: usize,
        frame_ends: bool,
    ) -> io::Result<Option<(Spliced, usize)>> {
        let head_len = match open {
            false => 0,
            true => match first_newline(fd, avail.min(PEEK_HEAD))? {
                Some(at) => at + 1,
                None => return Ok(None),
            },
        };
        let k = PEEK_TAIL.min(avail - head_len);
        let mut window = [0; PEEK_TAIL];
        let peeked = peek_at(fd, avail - k, &mut window[..k])?;
        let Some(last) = window[..peeked].iter().rposition(|&b| b == b'\n') else {
            return Ok(None);
        };
        let lines_end = avail - k + last + 1;
        if lines_end < head_len + SPLICE_MIN {
            return Ok(None);
        }
        let head = read_exact_now(fd, head_len)?;
        let lines = lines_end - head_len;
        let direct = match clear {
            true => self.splicer.splice_direct(fd, stream, lines),
            false => 0,
        };
        let stashed = self.splicer.stash.fill(fd, lines - direct)?;
        let whole = direct + stashed == lines;
        let taken = match whole && !frame_ends {
            true => lines_end,
            false => avail,
        };
        let after = read_exact_now(fd, taken - head_len - direct - stashed)?;
        let stash = self.splicer.stash.clone();
        Ok(Some((Spliced { rank, stream, direct, head, stashed, whole, after, stash }, taken)))
    }
}

/// Where the first newline in the socket is, looking no further than `limit` bytes: a
/// short peek first, since lines are usually short.
fn first_newline(fd: RawFd, limit: usize) -> io::Result<Option<usize>> {
    let mut short = [0; 512];
    let n = peek_at(fd, 0, &mut short[..limit.min(512)])?;
    if let Some(at) = short[..n].iter().position(|&b| b == b'\n') {
        return Ok(Some(at));
    }
    if n < 512 || limit <= 512 {
        return Ok(None);
    }
    let mut long = vec![0; limit];
    let n = peek_at(fd, 0, &mut long)?;
    Ok(long[..n].iter().position(|&b| b == b'\n'))
}

/// Copies the socket's bytes from `offset` into `buf`, leaving them in the socket.
fn peek_at(fd: RawFd, offset: usize, buf: &mut [u8]) -> io::Result<usize> {
    let set = |off: libc::c_int| {
        // SAFETY: SO_PEEK_OFF takes one int.
        let rc = unsafe {
            libc::setsockopt(
                fd,
                libc::SOL_SOCKET,
                libc::SO_PEEK_OFF,
                (&off as *const libc::c_int).cast(),
                std::mem::size_of::<libc::c_int>() as libc::socklen_t,
            )
        };
        if rc != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    };
    if offset > 0 {
        set(offset as libc::c_int)?;
    }
    // SAFETY: recv writes at most buf.len() bytes into buf.
    let n = unsafe {
        libc::recv(fd, buf.as_mut_ptr().cast(), buf.len(), libc::MSG_PEEK | libc::MSG_DONTWAIT)
    };
    let result = if n < 0 { Err(io::Error::last_os_error()) } else { Ok(n as usize) };
    if offset > 0 {
        set(-1)?;
    }
    result
}

#[cfg(test)]
mod tests {
    use super::super::tests::{lines, stash_contents};
    use super::super::Stash;
    use super::*;
    use std::fs::File;
    use std::io::Write;
    use std::os::unix::net::UnixStream;
    use std::sync::Arc;

    /// A link splicing as `splicer` says, and the other end of its socket.
    fn link_to(splicer: Splicer) -> (LinkSplice, UnixStream) {
        let (tx, rx) = UnixStream::pair().unwrap();
        rx.set_nonblocking(true).unwrap();
        // The link reads a duplicate of `rx`.
        (LinkSplice::new(splicer, rx.as_raw_fd()).unwrap(), tx)
    }

    /// Through the tree's `Bulk`, as the link reader calls it: a spliced piece comes back as
    /// the launcher's own `Spliced`, its length what its room in the window is counted by.
    #[tokio::test]
    async fn the_link_reader_gets_spliced_pieces_back_through_bulk() {
        let stash = Stash::new().unwrap();
        let (link, mut tx) =
            link_to(Splicer { stash: stash.clone(), streams: [true, true], direct: None });
        let mut bulk: Box<dyn Bulk> = Box::new(link);
        let data = lines(0, 2000, 40);
        tx.write_all(&data).unwrap();
        bulk.begin(Gid(5), Stream::Stderr, Vec::new(), data.len());
        assert!(bulk.busy());
        let splice::Piece::Taken { len, output } = bulk.next_piece().await.unwrap() else {
            panic!("not spliced")
        };
        assert!(!bulk.busy());
        let s = output.downcast::<Spliced>().expect("the launcher's own piece");
        assert_eq!((s.rank, s.stream, s.stashed, len), (Gid(5), Stream::Stderr, 80_000, 80_000));
        assert!(s.head.is_empty() && s.after.is_empty() && s.whole);
        assert_eq!(stash_contents(&stash, 80_000), data);
    }

    #[tokio::test]
    async fn pieces_splice_whole_lines_and_read_the_open_ends() {
        let stash = Stash::new().unwrap();
        let (mut link, mut tx) =
            link_to(Splicer { stash: stash.clone(), streams: [true, false], direct: None });
        // The stream left a line open: "part"; the frame's data ends it, has 1000 lines of
        // 50 bytes, and leaves another open.
        link.saw(Gid(3), Stream::Stdout, b"part");
        let mut data = b"-end\n".to_vec();
        data.extend(lines(0, 1000, 50));
        data.extend_from_slice(b"open");
        tx.write_all(&data).unwrap();
        link.begin(Gid(3), Stream::Stdout, Vec::new(), data.len());
        let Piece::Spliced(s) = link.next_piece().await.unwrap() else { panic!("not spliced") };
        assert!(!link.busy());
        assert_eq!(
            (s.rank, s.stream, &s.head[..], s.whole, &s.after[..]),
            (Gid(3), Stream::Stdout, &b"-end\n"[..], true, &b"open"[..])
        );
        assert_eq!(s.stashed, 50_000);
        assert_eq!(stash_contents(&stash, 50_000), lines(0, 1000, 50));
        assert!(link.state.open_lines.contains(&(Gid(3), Stream::Stdout)));

        // Stderr is not spliced here: read.
        tx.write_all(&data).unwrap();
        link.begin(Gid(3), Stream::Stderr, Vec::new(), data.len());
        let Piece::Read { data: got, .. } = link.next_piece().await.unwrap() else { panic!() };
        assert_eq!(got, data);
    }

    /// A frame's rest that stops short of GATHER (its writer waits for this reader, as on a
    /// channel full with less than that in it) is taken as it is, after a short wait, not
    /// waited for until the link's silence timeout.
    #[tokio::test]
    async fn a_piece_short_of_gather_is_taken_once_no_more_comes() {
        let stash = Stash::new().unwrap();
        let (mut link, mut tx) =
            link_to(Splicer { stash: stash.clone(), streams: [true, true], direct: None });
        // 20,000 bytes of a frame of 200,000 are here; the rest does not come.
        let data = lines(0, 400, 50);
        tx.write_all(&data).unwrap();
        link.begin(Gid(1), Stream::Stdout, Vec::new(), 200_000);
        let started = std::time::Instant::now();
        let piece = tokio::time::timeout(std::time::Duration::from_secs(5), link.next_piece());
        let piece = piece.await.expect("taken, not waited for until more comes");
        let Piece::Spliced(s) = piece.unwrap() else { panic!("not spliced") };
        let waited = started.elapsed();
        assert!(waited >= GATHER_WAIT, "taken after {waited:?}, before any wait");
        // All of it, whole lines; the frame goes on.
        assert_eq!((s.head.len(), s.stashed, s.whole), (0, data.len(), true));
        assert!(link.busy());
    }

    /// A stash filled with `len` bytes of other output, as by another link's pieces.
    fn fill_stash(stash: &Stash, len: usize) {
        let (mut tx, rx) = UnixStream::pair().unwrap();
        let writer = std::thread::spawn(move || tx.write_all(&vec![b'x'; len]).unwrap());
        let mut filled = 0;
        while filled < len {
            filled += stash.fill(rx.as_raw_fd(), len - filled).unwrap();
        }
        writer.join().unwrap();
    }

    #[tokio::test]
    async fn a_piece_waits_for_the_writer_to_empty_a_full_stash() {
        let stash = Stash::new().unwrap();
        fill_stash(&stash, 900 << 10);
        let (mut link, mut tx) =
            link_to(Splicer { stash: stash.clone(), streams: [true, true], direct: None });
        let data = lines(0, 2000, 100);
        tx.write_all(&data).unwrap();
        link.begin(Gid(2), Stream::Stdout, Vec::new(), data.len());
        // The writer thread empties the stash a little later.
        let emptier = stash.clone();
        let writer = std::thread::spawn(move || {
            std::thread::sleep(std::time::Duration::from_millis(20));
            emptier.discard(900 << 10);
        });
        let Piece::Spliced(s) = link.next_piece().await.unwrap() else { panic!("not spliced") };
        writer.join().unwrap();
        assert!(!link.busy());
        assert_eq!((s.head.len(), s.stashed, s.whole, s.after.len()), (0, data.len(), true, 0));
        assert_eq!(stash_contents(&stash, data.len()), data);
    }

    #[tokio::test]
    async fn a_stash_that_stays_full_has_the_piece_taken_after_a_short_wait() {
        let stash = Stash::new().unwrap();
        fill_stash(&stash, 1 << 20);
        let (mut link, mut tx) =
            link_to(Splicer { stash: stash.clone(), streams: [true, true], direct: None });
        let data = lines(0, 2000, 100);
        tx.write_all(&data).unwrap();
        link.begin(Gid(2), Stream::Stdout, Vec::new(), data.len());
        let started = std::time::Instant::now();
        let piece = link.next_piece().await.unwrap();
        assert!(started.elapsed() >= ROOM_WAIT, "{:?}", started.elapsed());
        // Whatever room the pipe had beyond the count is used; the rest is read.
        let got = match piece {
            Piece::Read { data, .. } => data,
            Piece::Spliced(s) => {
                stash.discard(1 << 20);
                [s.head, stash_contents(&stash, s.stashed), s.after].concat()
            }
        };
        assert_eq!(got, data);
        assert!(!link.busy());
    }

    /// A writer thread as the link readers see it: idle or not.
    struct Writer(bool, std::sync::atomic::AtomicUsize);

    impl super::super::WriterState for Writer {
        fn idle(&self) -> bool {
            self.0
        }

        fn wrote(&self, bytes: usize) {
            self.1.fetch_add(bytes, std::sync::atomic::Ordering::Relaxed);
        }
    }

    /// A link whose stdout goes straight into a pipe of 64 KiB (returned: its read end)
    /// while the writer is `idle`, and the link's other end.
    fn direct_link(idle: bool) -> (LinkSplice, UnixStream, File, Arc<Stash>, Arc<Writer>) {
        let (read, write) = rlaunch_tree::splice::pipe(0).unwrap();
        rlaunch_tree::fdio::enlarge_pipe(&write, 64 << 10);
        let writer = Arc::new(Writer(idle, 0.into()));
        let sinks = [Some(write.as_raw_fd()), None];
        let direct = super::super::Direct { sinks, writer: writer.clone() };
        let stash = Stash::new().unwrap();
        let splicer = Splicer { stash: stash.clone(), streams: [true, true], direct: Some(direct) };
        let (link, tx) = link_to(splicer);
        // The sink's write end must outlive the link: leaked on purpose.
        std::mem::forget(write);
        (link, tx, File::from(read), stash, writer)
    }

    fn read_pipe(pipe: &mut File, len: usize) -> Vec<u8> {
        let mut got = vec![0; len];
        std::io::Read::read_exact(pipe, &mut got).unwrap();
        got
    }

    #[tokio::test]
    async fn whole_lines_go_straight_into_the_sink_while_the_writer_is_idle() {
        let (mut link, mut tx, mut pipe, _stash, writer) = direct_link(true);
        let mut data = lines(0, 500, 100);
        data.extend_from_slice(b"open");
        tx.write_all(&data).unwrap();
        link.begin(Gid(0), Stream::Stdout, Vec::new(), data.len());
        let Piece::Spliced(s) = link.next_piece().await.unwrap() else { panic!("not spliced") };
        assert_eq!((s.direct, s.head.len(), s.stashed, s.whole), (50_000, 0, 0, true));
        // The open line is the writer's, to hold in its lane.
        assert!(s.for_writer());
        assert_eq!(s.after, b"open");
        assert_eq!(read_pipe(&mut pipe, 50_000), lines(0, 500, 100));
        assert_eq!(writer.1.load(std::sync::atomic::Ordering::Relaxed), 50_000);

        // The stream has a line open now: its end and what follows go through the stash.
        let data = lines(500, 500, 100);
        tx.write_all(&data).unwrap();
        link.begin(Gid(0), Stream::Stdout, Vec::new(), data.len());
        let Piece::Spliced(s) = link.next_piece().await.unwrap() else { panic!("not spliced") };
        assert_eq!((s.direct, s.head.len(), s.stashed), (0, 100, 49_900));
    }

    #[tokio::test]
    async fn a_piece_leaves_its_last_open_line_in_the_socket_until_the_frame_ends() {
        let (mut link, mut tx, mut pipe, stash, _) = direct_link(true);
        // More than a piece waits for, and than the sink takes.
        let mut data = lines(0, 700, 100);
        data.extend_from_slice(b"open");
        tx.write_all(&data).unwrap();
        // The frame goes on: its open line is left for the next piece to start with.
        link.begin(Gid(0), Stream::Stdout, Vec::new(), data.len() + 6);
        let Piece::Spliced(s) = link.next_piece().await.unwrap() else { panic!("not spliced") };
        assert_eq!((s.direct + s.stashed, s.whole, s.after.len()), (70_000, true, 0));
        let mut got = read_pipe(&mut pipe, s.direct);
        got.extend(stash_contents(&stash, s.stashed));
        assert_eq!(got, lines(0, 700, 100));
        assert!(link.busy());
        tx.write_all(b"-line\n").unwrap();
        let Piece::Read { data, .. } = link.next_piece().await.unwrap() else { panic!() };
        assert_eq!(data, b"open-line\n");
        assert!(!link.busy());
    }

    #[tokio::test]
    async fn a_frames_first_bytes_go_before_its_lines_even_when_they_end_one() {
        let (mut link, mut tx, _pipe, stash, writer) = direct_link(true);
        // Read with the frame's head: a whole line, held by the reader until it hands the
        // piece out. Nothing may go straight into the sink ahead of it.
        let data = lines(1, 500, 100);
        tx.write_all(&data).unwrap();
        link.begin(Gid(0), Stream::Stdout, lines(0, 1, 100), data.len());
        let Piece::Spliced(s) = link.next_piece().await.unwrap() else { panic!("not spliced") };
        assert_eq!((s.direct, &s.head[..], s.stashed), (0, &lines(0, 1, 100)[..], 50_000));
        assert_eq!(stash_contents(&stash, 50_000), data);
        assert_eq!(writer.1.load(std::sync::atomic::Ordering::Relaxed), 0);
    }

    #[tokio::test]
    async fn what_a_full_sink_does_not_take_goes_through_the_stash_next() {
        let (mut link, mut tx, mut pipe, stash, _) = direct_link(true);
        let data = lines(0, 2000, 100);
        tx.write_all(&data[..150_000]).unwrap();
        let sender = std::thread::spawn(move || tx.write_all(&data[150_000..]).map(|_| tx));
        link.begin(Gid(0), Stream::Stdout, Vec::new(), 200_000);
        let mut got = Vec::new();
        while link.busy() {
            let piece = link.next_piece().await.unwrap();
            let Piece::Spliced(s) = piece else { panic!("not spliced") };
            // The sink took what it had room for, mid-line maybe; the stash the rest.
            assert!(s.head.is_empty() && s.whole, "{} {}", s.head.len(), s.whole);
            got.extend(read_pipe(&mut pipe, s.direct));
            got.extend(stash_contents(&stash, s.stashed));
            got.extend(s.after);
        }
        sender.join().unwrap().unwrap();
        assert_eq!(got, lines(0, 2000, 100));
    }

    #[tokio::test]
    async fn nothing_goes_straight_into_the_sink_while_the_writer_has_work() {
        let (mut link, mut tx, _pipe, stash, writer) = direct_link(false);
        let data = lines(0, 500, 100);
        tx.write_all(&data).unwrap();
        link.begin(Gid(0), Stream::Stdout, Vec::new(), data.len());
        let Piece::Spliced(s) = link.next_piece().await.unwrap() else { panic!("not spliced") };
        assert_eq!((s.direct, s.stashed), (0, 50_000));
        assert_eq!(stash_contents(&stash, 50_000), data);
        assert_eq!(writer.1.load(std::sync::atomic::Ordering::Relaxed), 0);
    }

    #[tokio::test]
    async fn a_full_stash_takes_what_it_can_and_the_rest_is_read() {
        let stash = Stash::new().unwrap();
        // A stash of 16 pages, 15 of them taken: the writer thread is behind.
        rlaunch_tree::fdio::enlarge_pipe(&stash.write, 64 << 10);
        File::from(stash.write.try_clone().unwrap()).write_all(&[b'x'; 60 << 10]).unwrap();
        let (mut link, mut tx) =
            link_to(Splicer { stash: stash.clone(), streams: [true, true], direct: None });
        let data = lines(0, 500, 100);
        tx.write_all(&data).unwrap();
        link.begin(Gid(1), Stream::Stderr, Vec::new(), data.len());
        let Piece::Spliced(s) = link.next_piece().await.unwrap() else { panic!("not spliced") };
        assert!(!link.busy());
        assert!(
            !s.whole && s.head.is_empty() && s.stashed > 0 && s.stashed <= 4096,
            "{}",
            s.stashed
        );
        stash.discard(60 << 10);
        let mut got = stash_contents(&stash, s.stashed);
        got.extend_from_slice(&s.after);
        assert_eq!(got, data);
        assert!(!link.state.open_lines.contains(&(Gid(1), Stream::Stderr)));
    }

    #[tokio::test]
    async fn a_frame_cut_short_hands_out_its_whole_lines_only() {
        let (mut link, mut tx) =
            link_to(Splicer { stash: Stash::new().unwrap(), streams: [true, true], direct: None });
        // The frame's first bytes came with its head; then "c\nde", then the link is lost.
        tx.write_all(b"c\nde").unwrap();
        drop(tx);
        link.begin(Gid(0), Stream::Stdout, b"ab".to_vec(), 1000);
        let Piece::Read { data, .. } = link.next_piece().await.unwrap() else { panic!() };
        assert_eq!(data, b"abc\n");
        assert!(matches!(link.next_piece().await, Err(ReadError::Truncated)));
    }

    #[tokio::test]
    async fn a_frame_in_pieces_holds_its_open_line_until_the_piece_that_ends_it() {
        let (mut link, mut tx) =
            link_to(Splicer { stash: Stash::new().unwrap(), streams: [true, true], direct: None });
        tx.write_all(b"xy").unwrap();
        link.begin(Gid(0), Stream::Stdout, b"w".to_vec(), 5);
        // No newline yet: nothing handed out.
        let wait = std::time::Duration::from_millis(50);
        assert!(tokio::time::timeout(wait, link.next_piece()).await.is_err());
        tx.write_all(b"z\nq").unwrap();
        let Piece::Read { data, .. } = link.next_piece().await.unwrap() else { panic!() };
        // The frame is all in: its open end goes too, for the writer's lane to hold.
        assert_eq!(data, b"wxyz\nq");
        assert!(!link.busy());
    }
}
