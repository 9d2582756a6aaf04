//! Writing frames to a link: control first, output as its window allows, many frames per
//! write.

use std::io;
use std::os::fd::{AsRawFd, OwnedFd};

use tokio::io::unix::AsyncFd;
use tokio::io::{AsyncWrite, AsyncWriteExt};
use tokio::sync::mpsc;

use rlaunch_protocol::control::{self, Frame, Up};

use crate::credit::{Outbox, Queued};
use crate::fdio::Gather;
use crate::splice::Carried;

/// Writes frames to `out` until every sender is gone. The link's own messages (`link`:
/// heartbeats, credit, clock probes and echoes) go first, then the job's control messages;
/// the data path (`data`: output, as its window allows, and the frames ordered with it) fills the rest
/// of each write. Messages that are ready together are written with one syscall; on a link
/// that takes vectored writes, large output goes from where it lies, not copied into the
/// batch ([`Batch`]), and output in a carrier is spliced from it into `splice_to` (`out`'s
/// descriptor, registered on its own). A queued frame's debt is repaid once it is written
/// (see [`crate::credit`]).
pub async fn pump<L: Frame, M: Frame>(
    mut out: impl AsyncWrite + Unpin,
    hello: bool,
    link: &mut mpsc::UnboundedReceiver<L>,
    control: &mut mpsc::UnboundedReceiver<M>,
    mut data: Option<&mut Outbox>,
    splice_to: Option<&AsyncFd<OwnedFd>>,
) -> io::Result<()> {
    let mut batch = Batch::new(out.is_write_vectored(), splice_to.is_some());
    if hello {
        batch.bytes(&control::hello());
    }
    // The pump ends with the job's channel (and the data path); the link's own channel may
    // close before it, or outlive it: what is left on it then is not written.
    let (mut link_open, mut control_open) = (true, true);
    loop {
        if batch.is_empty() {
            if !control_open && data.is_none() {
                return Ok(());
            }
            enum Got<L, M> {
                Link(Option<L>),
                Control(Option<M>),
                Data(Option<Queued>),
            }
            let got = tokio::select! {
                biased;
                l = link.recv(), if link_open => Got::Link(l),
                m = control.recv(), if control_open => Got::Control(m),
                q = next_data(&mut data) => Got::Data(q),
            };
            match got {
                Got::Link(Some(l)) => batch.frame(&l),
                Got::Control(Some(m)) => batch.frame(&m),
                Got::Data(Some(q)) => batch.queued(q),
                Got::Link(None) => link_open = false,
                Got::Control(None) => control_open = false,
                Got::Data(None) => data = None,
            }
            if batch.is_empty() {
                continue;
            }
        }
        while batch.len < Batch::MAX {
            if let Ok(l) = link.try_recv() {
                batch.frame(&l);
            } else if let Ok(m) = control.try_recv() {
                batch.frame(&m);
            } else if let Some(q) = data.as_mut().and_then(|d| d.try_next()) {
                batch.queued(q);
            } else {
                break;
            }
        }
        batch.write_to(&mut out, splice_to).await?;
        // An encrypted link holds the last record until flushed; a pipe has nothing to flush.
        out.flush().await?;
        batch.clear();
    }
}

/// Frames to write in one go: encoded bytes, and output whose data is written where it lies.
struct Batch {
    vectored: bool,
    /// Output in carriers is spliced (else read out of them).
    splicing: bool,
    /// Encoded frames, and the heads of the output frames held.
    buf: Vec<u8>,
    pieces: Vec<Piece>,
    /// Output frames whose data is written in place; dropped (repaid) once written.
    held: Vec<Queued>,
    /// Bytes in the batch.
    len: usize,
}

#[derive(Clone, Copy)]
enum Piece {
    Buf(usize, usize),
    Held(usize),
}

impl Batch {
    /// Bytes per batch, about.
    const MAX: usize = 256 << 10;
    /// Output smaller than this is copied: a slice of its own costs more.
    const IN_PLACE: usize = 4 << 10;

    fn new(vectored: bool, splicing: bool) -> Batch {
        let buf = Vec::with_capacity(64 << 10);
        Batch { vectored, splicing, buf, pieces: Vec::new(), held: Vec::new(), len: 0 }
    }

    fn is_empty(&self) -> bool {
        self.len == 0
    }

    fn bytes(&mut self, bytes: &[u8]) {
        let start = self.buf.len();
        self.buf.extend_from_slice(bytes);
        self.encoded(start);
    }

    fn frame<M: Frame>(&mut self, m: &M) {
        let start = self.buf.len();
        m.encode(&mut self.buf);
        self.encoded(start);
    }

    /// `buf[start..]` was just encoded.
    fn encoded(&mut self, start: usize) {
        let end = self.buf.len();
        self.len += end - start;
        match self.pieces.last_mut() {
            Some(Piece::Buf(_, last)) if *last == start => *last = end,
            _ => self.pieces.push(Piece::Buf(start, end)),
        }
    }

    fn queued(&mut self, mut q: Queued) {
        if let Some(carried) = q.carried.take_if(|_| !self.splicing) {
            // Not expected: carriers are for links that splice. Read out, then as any output.
            match (carried.into_bytes(), &mut q.up) {
                (Ok(bytes), Up::Output { data, .. }) => *data = bytes,
                (Err(e), _) => tracing::debug!("cannot read output out of its carrier: {e}"),
                _ => {}
            }
        }
        // Output in a carrier, and large output on a vectored link, is written from where it
        // lies, after its head.
        let in_place = q
            .output_len()
            .filter(|&len| q.carried.is_some() || (self.vectored && len >= Self::IN_PLACE));
        match (in_place, &q.up) {
            (Some(len), Up::Output { rank, stream, .. }) => {
                let start = self.buf.len();
                control::encode_output_head(*rank, *stream, len, &mut self.buf);
                self.encoded(start);
                self.len += len;
                self.pieces.push(Piece::Held(self.held.len()));
                self.held.push(q);
            }
            // Written from the batch's own bytes: its debt is repaid here.
            _ => self.frame(&q.up),
        }
    }

    fn part(&self, piece: Piece) -> &[u8] {
        match piece {
            Piece::Buf(start, end) => &self.buf[start..end],
            Piece::Held(i) => match &self.held[i] {
                Queued { carried: Some(_), .. } => &[],
                Queued { up: Up::Output { data, .. }, .. } => data,
                _ => unreachable!("only output is held"),
            },
        }
    }

    /// Writes the batch: the pieces in memory gathered, each carrier's bytes spliced in
    /// their place.
    async fn write_to(
        &mut self,
        out: &mut (impl AsyncWrite + Unpin),
        splice_to: Option<&AsyncFd<OwnedFd>>,
    ) -> io::Result<()> {
        if self.held.is_empty() {
            return out.write_all(&self.buf).await;
        }
        let mut from = 0;
        for i in 0..self.pieces.len() {
            let Piece::Held(h) = self.pieces[i] else { continue };
            let (Some(to), true) = (splice_to, self.held[h].carried.is_some()) else { continue };
            self.write_gathered(out, from..i).await?;
            let carried = self.held[h].carried.as_mut().expect("looked at above");
            match splice_all(carried, to).await {
                Err(e) if e.raw_os_error() == Some(nix::libc::EINVAL) => {
                    // The channel takes no splices after all: read out, and no more carriers.
                    tracing::debug!("the upstream channel takes no splices: {e}");
                    self.splicing = false;
                    let carried = self.held[h].carried.take().expect("looked at above");
                    out.write_all(&carried.into_bytes()?).await?;
                }
                spliced => spliced?,
            }
            from = i + 1;
        }
        self.write_gathered(out, from..self.pieces.len()).await
    }

    async fn write_gathered(
        &self,
        out: &mut (impl AsyncWrite + Unpin),
        pieces: std::ops::Range<usize>,
    ) -> io::Result<()> {
        let parts = self.pieces[pieces].iter().map(|&p| self.part(p)).collect();
        let mut gather = Gather::new(parts);
        while !gather.is_done() {
            let n = out.write_vectored(&gather.slices()).await?;
            if n == 0 {
                return Err(io::ErrorKind::WriteZero.into());
            }
            gather.advance(n);
        }
        Ok(())
    }

    fn clear(&mut self) {
        self.buf.clear();
        self.pieces.clear();
        self.held.clear();
        self.len = 0;
        if self.buf.capacity() > Self::MAX * 2 {
            self.buf.shrink_to(64 << 10);
        }
    }
}

/// Splices all that `carried` holds into `to`, as fast as it takes it.
async fn splice_all(carried: &mut Carried, to: &AsyncFd<OwnedFd>) -> io::Result<()> {
    while !carried.is_empty() {
        let mut guard = to.writable().await?;
        if let Ok(moved) = guard.try_io(|fd| carried.splice_into(fd.as_raw_fd())) {
            moved?;
        }
    }
    Ok(())
}

/// Where a proxy's pump gets its next link up: one that rlaunch adopted (see
/// `Job::adoption`) is handed the link to rlaunch. `wanted`: the proxy may be adopted, so
/// a link that fails leaves what is queued waiting for the next; otherwise the pump ends
/// with its link, as it always did (a parent gone at the very end must not hold it up).
pub struct Rehoming {
    pub links: mpsc::UnboundedReceiver<crate::link::LinkWrite>,
    pub wanted: tokio::sync::watch::Receiver<bool>,
}

/// [`pump`] until `abandon` turns true; from then on, and once the pump ends, what is still
/// sent is dropped: with no one to deliver to, senders must never block (a proxy that lost
/// its parent, whose socket will never drain). A new link from `rehome` takes the old
/// one's place: the proxy, adopted, goes on on it, with no hello (the proxy wrote it, and
/// its greeting, first) and no splicing (the new link is encrypted). What was being written
/// when the old link failed, or when the new one came, is lost: the proxy sends again what
/// matters (its ranks' ends, its fence entries). The sender of `rehome.links` must live as
/// long as the pump (its end would cut a write short).
#[allow(clippy::too_many_arguments)]
pub async fn pump_until_abandoned<L: Frame, M: Frame>(
    out: crate::link::LinkWrite,
    hello: bool,
    mut link: mpsc::UnboundedReceiver<L>,
    mut control: mpsc::UnboundedReceiver<M>,
    mut data: Outbox,
    mut splice_to: Option<AsyncFd<OwnedFd>>,
    mut abandon: tokio::sync::watch::Receiver<bool>,
    rehome: Rehoming,
) {
    let Rehoming { links: mut rehome, mut wanted } = rehome;
    enum Next {
        Abandoned,
        Unwanted,
        Rehomed(Option<crate::link::LinkWrite>),
        Pumped(io::Result<()>),
    }
    let (mut out, mut hello, mut rehome_open) = (Some(out), hello, true);
    loop {
        let linkless = out.is_none();
        let current = out.as_mut();
        let pumped = async {
            match current {
                Some(out) => {
                    let to = splice_to.as_ref();
                    pump(out, hello, &mut link, &mut control, Some(&mut data), to).await
                }
                None => std::future::pending().await,
            }
        };
        let next = tokio::select! {
            // Abandon first: what is sent once it is raised (a node's teardown right after it
            // lost its parent) must not go out, even when the pump is ready too; polled in a
            // random order, the ranks' ends of a node that took itself down reached a parent
            // that resumed (chaos: kill -STOP rlaunch during an ssh launch).
            biased;
            _ = crate::raised(&mut abandon) => Next::Abandoned,
            new = rehome.recv(), if rehome_open => Next::Rehomed(new),
            // Waiting for a link that will not come: the proxy is not adopted after all.
            _ = wanted.wait_for(|w| !*w), if linkless => Next::Unwanted,
            // A dropped sender abandons nothing: the pump goes on to flush the last frames.
            pumped = pumped => Next::Pumped(pumped),
        };
        match next {
            Next::Abandoned | Next::Unwanted | Next::Pumped(Ok(())) => break,
            Next::Rehomed(Some(new)) => {
                tracing::debug!("the link up goes to a new parent");
                (out, hello, splice_to) = (Some(new), false, None);
            }
            // Nobody will bring another link (the proxy holds its sender until the pump
            // ends, so this is a test's doing): the pump goes on with the one it has.
            Next::Rehomed(None) => rehome_open = false,
            Next::Pumped(Err(e)) if rehome_open && *wanted.borrow() => {
                tracing::debug!("the link up failed: {e}");
                (out, hello) = (None, false);
            }
            Next::Pumped(Err(_)) => break,
        }
    }
    tokio::join!(
        async { while link.recv().await.is_some() {} },
        async { while control.recv().await.is_some() {} },
        data.discard_all()
    );
}

async fn next_data(data: &mut Option<&mut Outbox>) -> Option<Queued> {
    match data {
        Some(outbox) => outbox.next().await,
        None => std::future::pending().await,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::credit::Window;
    use rlaunch_protocol::control::{LinkUp, UpFrame};
    use rlaunch_protocol::io::FrameReader;
    use std::sync::Arc;

    /// The frames a link carried, read to its end.
    async fn frames(read: tokio::io::DuplexStream, hello: bool) -> Vec<UpFrame> {
        let mut reader = FrameReader::with_chunk(read, 4096);
        if hello {
            reader.read_hello().await.expect("a hello first");
        }
        let mut got = Vec::new();
        while let Ok(Some(frame)) = reader.next::<UpFrame>().await {
            got.push(frame);
        }
        got
    }

    #[tokio::test]
    async fn a_pump_whose_link_fails_goes_on_on_the_next_one() {
        let (link_tx, link_rx) = mpsc::unbounded_channel::<LinkUp>();
        let (control_tx, control_rx) = mpsc::unbounded_channel::<Up>();
        let (data_tx, data_rx) = mpsc::unbounded_channel();
        let outbox = Outbox::new(data_rx, Arc::new(Window::default()), watch_false());
        let (_abandon, abandoned) = tokio::sync::watch::channel(false);
        let (rehome_tx, rehome_rx) = mpsc::unbounded_channel();
        let (_wanted, wanted_rx) = tokio::sync::watch::channel(true);
        // The first link's far end is gone: the pump's first write fails.
        let (first, first_far) = tokio::io::duplex(1 << 16);
        drop(first_far);
        let pump = tokio::spawn(pump_until_abandoned(
            Box::new(first) as crate::link::LinkWrite,
            true,
            link_rx,
            control_rx,
            outbox,
            None,
            abandoned,
            Rehoming { links: rehome_rx, wanted: wanted_rx },
        ));
        control_tx.send(Up::StdoutClosed).unwrap();
        // What comes while no link is there waits for the next.
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        control_tx.send(Up::StdinAck { seq: 7, node: rlaunch_protocol::ids::NodeId(0) }).unwrap();
        let (second, second_far) = tokio::io::duplex(1 << 16);
        rehome_tx.send(Box::new(second)).unwrap();
        control_tx.send(Up::StdinAck { seq: 8, node: rlaunch_protocol::ids::NodeId(0) }).unwrap();
        drop((control_tx, link_tx, data_tx));
        let got = frames(second_far, false).await;
        pump.await.unwrap();
        // The frame being written when the first link failed is lost with it.
        let acks: Vec<u64> = (got.iter())
            .filter_map(|f| match f {
                UpFrame::Job(Up::StdinAck { seq, .. }) => Some(*seq),
                _ => None,
            })
            .collect();
        assert_eq!(acks, [7, 8], "{got:?}");
        drop(rehome_tx);
    }

    fn watch_false() -> tokio::sync::watch::Receiver<bool> {
        let (tx, rx) = tokio::sync::watch::channel(false);
        std::mem::forget(tx);
        rx
    }
}
