//! Writes the ranks' output, whole lines at a time, to rlaunch's stdout and stderr or to
//! output files, with the prefixes the command line asks for.
//!
//! ```text
//!  link readers ──Chunk (credit-limited)► Writer ──► rlaunch's stdout and stderr
//!  root ──SpawnedJob (who is who)──────►  │  │ ──► output files
//!  root ◄──OutputEvent (stdout closed, ───┘  │
//!            a file failed)                  └── Roster: rank -> job, host, job id
//! ```
//!
//! One thread owns every sink and a [`Lane`] per rank and stream: the lane holds the rank's
//! partial line, its prefix (expanded once, when the rank starts) and where its lines go.
//! Only complete lines are written (or a partial line past [`MAX_PARTIAL`], or at end of
//! file), so lines of different ranks never interleave mid-line, on the terminal or in a file
//! several ranks share. Each chunk of output carries the room it takes in its link's window
//! (a `Debt`, see `rlaunch_tree::credit`), given back once the chunk is taken into a batch:
//! when a reader of rlaunch's stdout is slow, the thread blocks in write, the windows close,
//! and backpressure reaches the ranks, while the link readers go on reading everything else
//! at once. Nothing is dropped and memory stays bounded by the windows, until the job is torn
//! down and its grace is over: then the root drops the output (a [`Dropped`] flag), the link
//! readers throw away what comes, and this thread writes nothing more than the write it is
//! in; lines held back, partial or queued, go unwritten, so none is cut.
//!
//! Start with [`Writer::take`]; [`OutputSpec`] says what the options mean.

mod feed;
mod pattern;
mod roster;
mod sinks;
mod splice;
mod stamp;

use std::collections::HashMap;
use std::fmt::Write;
use std::path::PathBuf;

use rlaunch_protocol::ids::{Gid, Stream};
use tokio::sync::mpsc;

pub(crate) use feed::{feed, lone_rank_stdout, Chunk, Dropped, Feed, Queue};
pub(crate) use pattern::Pattern;
pub(crate) use roster::{Roster, SpawnedJob};
pub(crate) use sinks::FileFailure;
pub(crate) use splice::Spliced;

use pattern::RankFacts;
use roster::Place;
use sinks::{SinkId, Sinks, BATCH};
use stamp::Clock;

/// A partial line longer than this is written without waiting for its newline.
const MAX_PARTIAL: usize = 64 << 10;

/// How the ranks' output is written. Every prefix goes before every line, on the terminal
/// and in files alike, in this order: timestamp, tag, prepend pattern.
#[derive(Debug, Clone, Default)]
pub(crate) struct OutputSpec {
    /// `--prepend-pattern`, or `-l` (which is `[%r] `).
    pub prefix: Option<Pattern>,
    /// `--tag-output`: Open MPI's `[1,RANK]<stdout>:`.
    pub tag: bool,
    /// `--timestamp-output`: the UTC time rlaunch received the line.
    pub timestamp: bool,
    /// `--outfile-pattern`: each rank's stdout to a file instead of the terminal.
    pub outfile: Option<Pattern>,
    /// `--errfile-pattern`: the same for stderr.
    pub errfile: Option<Pattern>,
    /// `--output-filename`: a file per rank and stream in a directory tree.
    pub dir: Option<OutputDir>,
}

impl OutputSpec {
    /// Lines go out as the ranks wrote them, to rlaunch's stdout and stderr only: no prefix,
    /// tag, timestamp or output file.
    fn unchanged(&self) -> bool {
        let OutputSpec { prefix, tag, timestamp, outfile, errfile, dir } = self;
        let plain = prefix.is_none() && !tag && !timestamp;
        plain && outfile.is_none() && errfile.is_none() && dir.is_none()
    }
}

/// Open MPI's `--output-filename DIR[:nocopy,nojobid]`: `DIR/1/rank.R/stdout` and
/// `.../stderr`, R zero-padded to the width of the job size as Open MPI 4 does.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct OutputDir {
    pub path: PathBuf,
    /// Still copy the output to the terminal (unless `nocopy`).
    pub copy: bool,
    /// Put a directory per job (`1/`, spawned jobs `2/`, ...) above the ranks' (unless
    /// `nojobid`).
    pub per_job: bool,
}

impl OutputDir {
    fn file(&self, place: &Place, stream: Stream) -> PathBuf {
        let mut path = self.path.clone();
        if self.per_job {
            path.push((place.job + 1).to_string());
        }
        let width = place.size.to_string().len();
        path.push(format!("rank.{:0width$}", place.rank));
        path.push(stream_name(stream));
        path
    }
}

/// What the writer thread tells the dispatcher.
#[derive(Debug)]
pub(crate) enum OutputEvent {
    /// rlaunch's stdout is closed (`| head -1`): the job should end.
    StdoutClosed,
    /// An output file cannot be created or written: the job should end.
    FileFailed(FileFailure),
}

/// Where a lane's lines go.
#[derive(Clone, Copy)]
enum Route {
    Terminal,
    File(SinkId),
    /// `--output-filename` without `nocopy`.
    FileAndTerminal(SinkId),
}

/// One rank's stream.
struct Lane {
    /// Tag and prepend pattern, expanded for the rank; empty when lines go out as they are.
    prefix: Box<[u8]>,
    route: Route,
    /// The start of a line whose newline has not arrived.
    partial: Vec<u8>,
}

pub(crate) struct Writer {
    spec: OutputSpec,
    roster: Roster,
    lanes: HashMap<(Gid, Stream), Lane>,
    sinks: Sinks,
    /// Set with `--timestamp-output`.
    clock: Option<Clock>,
    events: mpsc::UnboundedSender<OutputEvent>,
    dropped: Dropped,
    /// The launch's progress line, cleared before the first output is written.
    progress: Option<indicatif::ProgressBar>,
    /// Bytes of output that went through the stash.
    spliced: u64,
}

impl Writer {
    pub(crate) fn new(
        spec: OutputSpec,
        roster: Roster,
        events: mpsc::UnboundedSender<OutputEvent>,
        dropped: Dropped,
    ) -> Writer {
        let clock = spec.timestamp.then(Clock::default);
        let (lanes, sinks) = (HashMap::new(), Sinks::new());
        Writer { spec, roster, lanes, sinks, clock, events, dropped, progress: None, spliced: 0 }
    }

    /// Clears `progress` before the first output: the terminal's next line is the job's.
    pub(crate) fn clear_first(&mut self, progress: Option<indicatif::ProgressBar>) {
        self.progress = progress;
    }

    /// Runs until every sender is gone.
    /// Writes the output queued until every sender is gone; returns whether rlaunch's stderr
    /// was left mid-line (see `Sinks::ends_mid_line`).
    pub(crate) fn run(mut self, mut queue: Queue) -> bool {
        while let Some(chunk) = queue.next() {
            if *self.dropped.borrow() {
                // Emptied, so that the links' windows open and the proxies finish.
                if let Chunk::Spliced { output, .. } = chunk {
                    output.stash.discard(output.stashed);
                }
                queue.written();
                continue;
            }
            self.take(chunk);
            while self.sinks.buffered() < BATCH {
                match queue.try_next() {
                    Some(chunk) => self.take(chunk),
                    None => break,
                }
            }
            if *self.dropped.borrow() {
                self.sinks.discard();
                queue.written();
                continue;
            }
            self.flush();
            queue.written();
        }
        let direct = queue.direct();
        tracing::debug!(
            "{} bytes of output spliced, {direct} of them straight from the links",
            self.spliced + direct
        );
        if *self.dropped.borrow() {
            return self.sinks.ends_mid_line();
        }
        let stamp = stamp(&mut self.clock);
        for (&(_, stream), lane) in self.lanes.iter_mut().filter(|(_, l)| !l.partial.is_empty()) {
            let rest = std::mem::take(&mut lane.partial);
            emit(&mut self.sinks, stamp, stream, lane, &[], &rest);
        }
        self.flush();
        self.sinks.ends_mid_line()
    }

    fn flush(&mut self) {
        let flushed = self.sinks.flush();
        if flushed.stdout_closed {
            let _ = self.events.send(OutputEvent::StdoutClosed);
        }
        for failure in flushed.files {
            let _ = self.events.send(OutputEvent::FileFailed(failure));
        }
    }

    fn take(&mut self, chunk: Chunk) {
        match chunk {
            Chunk::Data { rank, stream, data, debt: _debt } => self.take_data(rank, stream, data),
            Chunk::Spliced { output, debt: _debt } => self.take_spliced(output),
            Chunk::Started { rank, pid } => {
                if !self.lanes.contains_key(&(rank, Stream::Stdout)) {
                    self.open_lanes(rank, Some(pid));
                }
            }
            Chunk::End { rank, stream } => {
                let Some(lane) = self.lanes.get_mut(&(rank, stream)) else { return };
                if !lane.partial.is_empty() {
                    let stamp = stamp(&mut self.clock);
                    let rest = std::mem::take(&mut lane.partial);
                    emit(&mut self.sinks, stamp, stream, lane, &[], &rest);
                }
            }
            Chunk::Say(line) => {
                let newline = self.sinks.ends_mid_line();
                let text = format!("{}rlaunch: {line}\n", if newline { "\n" } else { "" });
                let len = text.len();
                self.sinks.put_owned(Stream::Stderr, text.into_bytes(), 0..len);
            }
        }
    }

    /// Output is coming for `rank`'s `stream`: the progress line goes, and the lane is
    /// opened if the output came before the rank's start (always, for plain output, whose
    /// writer is not told of starts: `Feed::wants_starts`).
    fn output_for(&mut self, rank: Gid, stream: Stream) {
        if let Some(bar) = self.progress.take() {
            bar.finish_and_clear();
        }
        if !self.lanes.contains_key(&(rank, stream)) {
            if !self.spec.unchanged() {
                tracing::debug!(%rank, "output before the rank's start");
            }
            self.open_lanes(rank, None);
        }
    }

    fn take_data(&mut self, rank: Gid, stream: Stream, data: Vec<u8>) {
        if data.is_empty() {
            return;
        }
        self.output_for(rank, stream);
        let lane = self.lanes.get_mut(&(rank, stream)).expect("opened");
        let stamp = stamp(&mut self.clock);
        let Some(nl) = data.iter().rposition(|&b| b == b'\n') else {
            lane.partial.extend_from_slice(&data);
            if lane.partial.len() > MAX_PARTIAL {
                let long = std::mem::take(&mut lane.partial);
                emit(&mut self.sinks, stamp, stream, lane, &[], &long);
            }
            return;
        };
        let tail = data[nl + 1..].to_vec();
        let head = std::mem::replace(&mut lane.partial, tail);
        let plain = head.is_empty() && stamp.is_empty() && lane.prefix.is_empty();
        match lane.route {
            // Whole lines with nothing to add: written from the chunk itself.
            Route::Terminal if plain => self.sinks.put_owned(stream, data, 0..nl + 1),
            _ => emit(&mut self.sinks, stamp, stream, lane, &head, &data[..=nl]),
        }
    }

    /// Output partly in the stash: its head ends the line the lane had open, the stashed
    /// bytes are whole lines (unless the stash was full: then `after` ends the last), and
    /// `after` starts the next line. Only spliced when lines go out as they are, to the
    /// terminal.
    fn take_spliced(&mut self, output: Spliced) {
        let Spliced { rank, stream, head, stashed, whole, mut after, stash, .. } = output;
        self.take_data(rank, stream, head);
        self.output_for(rank, stream);
        let lane = self.lanes.get_mut(&(rank, stream)).expect("opened");
        if !lane.partial.is_empty() {
            // Not expected (the link reader knows where the lane's lines end); the line is
            // cut rather than put after the bytes that follow it.
            tracing::debug!(%rank, "spliced output after a line still open");
            let open = std::mem::take(&mut lane.partial);
            self.sinks.put(SinkId::terminal(stream), &[], &[], &[], &open);
        }
        if stashed > 0 {
            self.sinks.put_stash(stream, stash, stashed);
            self.spliced += stashed as u64;
        }
        if !whole {
            // The stash took part of a line: its end goes right after it.
            let end = after.iter().position(|&b| b == b'\n').map_or(after.len(), |nl| nl + 1);
            let rest = after.split_off(end);
            self.sinks.put_owned(stream, after, 0..end);
            after = rest;
        }
        self.take_data(rank, stream, after);
    }

    /// Sets up both lanes of a process: expands its prefix and opens its files, once.
    fn open_lanes(&mut self, gid: Gid, pid: Option<u32>) {
        let place = self.roster.place(gid);
        let facts =
            RankFacts { rank: gid.0, pid: pid.unwrap_or(0), host: place.host, jobid: place.jobid };
        for stream in [Stream::Stdout, Stream::Stderr] {
            let mut prefix = String::new();
            if self.spec.tag {
                // Writing into a String cannot fail.
                let _ =
                    write!(prefix, "[{},{}]<{}>:", place.job + 1, place.rank, stream_name(stream));
            }
            if let Some(pattern) = &self.spec.prefix {
                pattern.expand_into(&facts, &mut prefix);
            }
            let file = match stream {
                Stream::Stdout => &self.spec.outfile,
                Stream::Stderr => &self.spec.errfile,
            };
            let whose = || match place.job {
                0 => format!("{} of rank {}", stream_name(stream), place.rank),
                job => {
                    format!("{} of rank {} of spawned job {job}", stream_name(stream), place.rank)
                }
            };
            let (route, failure) = match (file, &self.spec.dir) {
                (Some(pattern), _) => {
                    let path = PathBuf::from(pattern.expand(&facts));
                    let (sink, failure) = self.sinks.open(&path, false, whose);
                    (Route::File(sink), failure)
                }
                (None, Some(dir)) => {
                    let (sink, failure) = self.sinks.open(&dir.file(&place, stream), true, whose);
                    let route =
                        if dir.copy { Route::FileAndTerminal(sink) } else { Route::File(sink) };
                    (route, failure)
                }
                (None, None) => (Route::Terminal, None),
            };
            if let Some(failure) = failure {
                let _ = self.events.send(OutputEvent::FileFailed(failure));
            }
            let lane = Lane { prefix: prefix.into_bytes().into(), route, partial: Vec::new() };
            self.lanes.insert((gid, stream), lane);
        }
    }
}

/// Writes `head` + `body` of a lane where it goes; see [`Sinks::put`].
fn emit(sinks: &mut Sinks, stamp: &[u8], stream: Stream, lane: &Lane, head: &[u8], body: &[u8]) {
    match lane.route {
        Route::Terminal => sinks.put(SinkId::terminal(stream), stamp, &lane.prefix, head, body),
        Route::File(file) => sinks.put(file, stamp, &lane.prefix, head, body),
        Route::FileAndTerminal(file) => {
            sinks.put(file, stamp, &lane.prefix, head, body);
            sinks.put(SinkId::terminal(stream), stamp, &lane.prefix, head, body);
        }
    }
}

/// The timestamp for lines taken now, empty without `--timestamp-output`.
fn stamp(clock: &mut Option<Clock>) -> &[u8] {
    match clock {
        Some(clock) => clock.now(),
        None => &[],
    }
}

fn stream_name(stream: Stream) -> &'static str {
    match stream {
        Stream::Stdout => "stdout",
        Stream::Stderr => "stderr",
    }
}
