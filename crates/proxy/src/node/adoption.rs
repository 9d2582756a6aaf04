//! A proxy below the top whose parent is lost while the job goes on (`--on-failure
//! continue`) dials rlaunch to be adopted instead of taking its subtree down with it: rlaunch
//! listens for such orphans (`Job::adoption`). Its ranks and child proxies run on
//! meanwhile; what they send up waits in the pump's queues.
//!
//! ```text
//!  parent lost ──seek──► dial rlaunch, prove the secret, hello + greeting ──► Adopted
//!      │ (in flight: a spawned job's fence)                     │ no answer within the silence
//!      ▼                                                        ▼
//!  the node goes down, as before                           the node goes down
//!  Adopted: the pump writes to the new link, a new reader reads it; this node's ranks' ends,
//!  the PMIx fence data it sent up (its own and its children's, each node's announced by
//!  `Up::PmixFenceAgain`), its unanswered fence entries and direct modex requests go up
//!  again, and every node below sends its ends again
//!  (`Down::Resend`): what the lost parent held may never have reached rlaunch.
//! ```
//!
//! A proxy is adopted once: its new parent is rlaunch, whose loss is the job's end.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rlaunch_protocol::control::{Adoption, Down, Frame, LinkUp, Up, ADOPTION_DIAL};
use rlaunch_protocol::ids::NodeId;
use rlaunch_protocol::io::FrameReader;
use rlaunch_tree::credit::Window;
use rlaunch_tree::link::{LinkRead, LinkWrite};
use rlaunch_tree::secure::{self, Secret};
use tokio::io::AsyncWriteExt;
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;
use tokio::time::Instant;

use super::{Event, Node};

/// What it takes to move this proxy's link up to a new parent: the pump's next writer,
/// and what a new reader of the link shares with the first.
pub(crate) struct Rehome {
    pub(super) pump: mpsc::UnboundedSender<LinkWrite>,
    /// Whether the pump, its link failing, waits for the next (see `link::Rehoming`).
    pub(super) wanted: watch::Sender<bool>,
    pub(super) window: Arc<Window>,
    pub(super) link: mpsc::WeakUnboundedSender<LinkUp>,
    pub(super) probed: Arc<watch::Sender<u32>>,
    /// The task reading the current parent's link.
    pub(super) reader: Option<JoinHandle<()>>,
    /// The PMIx fence data that went up (this node's and its children's) and that the
    /// fence's end has not answered: it may have been lost with the parent.
    pub(super) pmix_sent: PmixSent,
}

/// PMIx fence parts sent up for the fence under way, in order: (epoch, node, data). Shared
/// with the relays of the child links, which send their nodes' parts on themselves.
pub(crate) type PmixSent = Arc<Mutex<Vec<(u64, NodeId, Vec<u8>)>>>;

/// The link to rlaunch, past its hello, once it adopted this proxy.
pub(crate) type Rehomed = (FrameReader<LinkRead>, LinkWrite);

/// Where this proxy stands with its parent's loss.
#[derive(Debug, Default, PartialEq, Eq)]
pub(super) enum Orphan {
    #[default]
    No,
    /// Its parent is lost (how: its link closed, or it fell silent); it dials rlaunch.
    Seeking(super::Loss),
    /// rlaunch took it on: it is a top proxy now.
    Adopted,
    /// rlaunch could not be reached: the node went down.
    Refused,
}

/// How long one dial of rlaunch may take before it is tried again.
const DIAL_TRY: Duration = Duration::from_secs(1);
/// Between tries.
const DIAL_PAUSE: Duration = Duration::from_millis(200);

impl Node {
    /// Whether this proxy, its parent lost, seeks adoption rather than going down: the job
    /// goes on, rlaunch listens for orphans, this proxy is below the top, and no spawned
    /// job's fence entry was on its way up (it is not kept to be sent again).
    pub(super) fn may_seek_adoption(&self) -> bool {
        let wanted = self.adoptable() && !self.over;
        let free = self.orphan == Orphan::No && !self.kill.started();
        if self.up.rehome.is_none() || !(wanted && free) {
            return false;
        }
        if !self.job_fences_up.is_empty() {
            tracing::debug!(
                "a spawned job's fence is on its way up: the node goes with its parent"
            );
            return false;
        }
        true
    }

    /// Whether this proxy could ever be adopted (its launch says): then its pump waits for
    /// a new link when the old one fails.
    pub(super) fn adoptable(&self) -> bool {
        self.job.goes_on && self.job.adoption.is_some() && !self.top && !self.late
    }

    /// The parent is lost (`why`, `loss`): dials rlaunch, while the ranks run on.
    pub(super) fn seek_adoption(&mut self, why: &str, loss: super::Loss) {
        tracing::debug!("lost upstream ({why}): asking rlaunch to adopt this proxy");
        self.orphan = Orphan::Seeking(loss);
        self.parent.detach();
        // Its channel is gone, and it goes on: the guard would kill it.
        rlaunch_tree::guard::dismiss();
        let adoption = self.job.adoption.clone().expect("may_seek_adoption");
        let until = Instant::now() + ADOPTION_DIAL;
        let (host, events) = (self.plan.host.clone(), self.events.clone());
        tokio::spawn(async move {
            let dialed = dial(&adoption, &host, until).await;
            let _ = events.send(Event::Adopted(dialed.map(Box::new)));
        });
    }

    /// rlaunch answered the orphan's call (`Ok`: the link to it), or it could not be reached.
    pub(super) fn adopted(&mut self, dialed: Result<Box<Rehomed>, String>) {
        let rehome = self.up.rehome.as_mut().expect("seeking adoption");
        let (reader, writer) = match dialed {
            Ok(link) => *link,
            Err(why) => {
                // Its children may still be adopted if its link closed (rlaunch refuses a node
                // it has counted lost already: they are not); not if its parent fell silent
                // (rlaunch itself may be stopped: they would all wait on it).
                let loss = match self.orphan {
                    Orphan::Seeking(loss) => loss,
                    _ => super::Loss::Silent,
                };
                self.orphan = Orphan::Refused;
                let why = format!("its parent is lost, and rlaunch did not adopt it: {why}");
                return self.lose_upstream(&why, loss);
            }
        };
        tracing::debug!("adopted by rlaunch");
        self.orphan = Orphan::Adopted;
        // Adopted once: a failure of this link is the end.
        rehome.wanted.send_replace(false);
        if let Some(old) = rehome.reader.take() {
            old.abort();
        }
        let _ = rehome.pump.send(writer);
        // What the first link's reader still said is no news of this one.
        self.upstream_link += 1;
        let (window, link, probed) =
            (rehome.window.clone(), rehome.link.clone(), rehome.probed.clone());
        let upstream =
            super::upstream::UpReader { link: self.upstream_link, events: self.events.clone() };
        let read = super::upstream::read_upstream(reader, window, link, probed, upstream);
        rehome.reader = Some(tokio::spawn(read));
        self.parent.adopted(Instant::now());
        self.resend();
        self.resend_pmix_data();
        if let Some((epoch, pairs)) = self.fence_entry.clone() {
            let _ = self.up.control.send(Up::FenceIn { epoch, pairs });
        }
        if let Some((epoch, served)) = self.pmix_entry {
            let _ = self.up.control.send(Up::PmixFenceIn { epoch, served });
        }
        for ask in self.asks_out.values() {
            let _ = self.up.control.send(Up::DmodexAsk(ask.clone()));
        }
        // rlaunch feeds the broadcast files again from their start: it hears anew how far
        // this subtree has them.
        self.bcast_again();
    }

    /// This node's part of PMIx fence `epoch` goes up, kept to be sent again.
    pub(super) fn pmix_data_up(&self, epoch: u64, data: &[u8]) {
        if let Some(rehome) = self.up.rehome.as_ref().filter(|_| self.adoptable()) {
            let mut sent = rehome.pmix_sent.lock().expect("not poisoned");
            sent.push((epoch, self.plan.index, data.to_vec()));
        }
    }

    /// The PMIx fence under way is complete: no data of it is on its way up any more.
    pub(super) fn pmix_data_answered(&self) {
        if let Some(rehome) = &self.up.rehome {
            rehome.pmix_sent.lock().expect("not poisoned").clear();
        }
    }

    /// Where the relays of child links keep the PMIx fence data they send up, when this
    /// proxy may be adopted (see [`Rehome::pmix_sent`]).
    pub(super) fn pmix_data_kept(&self) -> Option<PmixSent> {
        self.up.rehome.as_ref().filter(|_| self.adoptable()).map(|r| r.pmix_sent.clone())
    }

    /// Sends up again the PMIx fence data sent for the fence under way: rlaunch takes each
    /// node's anew from its `PmixFenceAgain` (and drops what comes for a fence it completed
    /// meanwhile: its data had arrived).
    fn resend_pmix_data(&self) {
        let Some(rehome) = &self.up.rehome else { return };
        let sent = rehome.pmix_sent.lock().expect("not poisoned");
        let mut announced = std::collections::BTreeSet::new();
        for (epoch, node, data) in sent.iter() {
            if announced.insert((*epoch, *node)) {
                let _ = self.up.control.send(Up::PmixFenceAgain { epoch: *epoch, node: *node });
            }
            let (epoch, node, data) = (*epoch, *node, data.clone());
            let _ = self.up.control.send(Up::PmixFencePart { epoch, node, data });
        }
    }

    /// What a lost parent may have held of this subtree goes up again: this node's ranks'
    /// ends here, every node below's by [`Down::Resend`].
    pub(super) fn resend(&mut self) {
        self.children.broadcast(&Down::Resend);
        for end in &self.ends_sent {
            let _ = self.up.control.send(end.clone());
        }
    }

    /// Sends a rank's end up, kept to be sent again should this proxy (or one above it) be
    /// adopted.
    pub(super) fn send_end(&mut self, end: Up) {
        if self.adoptable() {
            self.ends_sent.push(end.clone());
        }
        let _ = self.up.control.send(end);
    }
}

/// Dials rlaunch at `adoption`'s address until `until`: proves the job's secret, then says
/// hello and greets as `host`. Returns the link, or why there is none.
async fn dial(
    adoption: &Adoption,
    host: &str,
    until: Instant,
) -> Result<(FrameReader<LinkRead>, LinkWrite), String> {
    let address: SocketAddr =
        adoption.address.parse().map_err(|_| "rlaunch's address is malformed".to_string())?;
    let secret = Secret::from_bytes(adoption.secret);
    let mut greeting = rlaunch_protocol::control::hello().to_vec();
    LinkUp::Greeting { host: host.to_string(), pid: std::process::id() }.encode(&mut greeting);
    loop {
        let attempt = async {
            let stream = tokio::net::TcpStream::connect(address).await?;
            stream.set_nodelay(true)?;
            let (r, w) = stream.into_split();
            let mut link =
                secure::connect(r, w, &secret, DIAL_TRY).await.map_err(std::io::Error::other)?;
            link.writer.write_all(&greeting).await?;
            link.writer.flush().await?;
            // rlaunch's hello comes first, as on any link down.
            let mut reader = FrameReader::with_chunk(Box::new(link.reader) as LinkRead, 16 << 10);
            let (found, _) = reader.read_hello().await.map_err(std::io::Error::other)?;
            if found.version != rlaunch_protocol::control::PROTOCOL_VERSION {
                return Err(std::io::Error::other("rlaunch speaks another protocol version"));
            }
            Ok::<_, std::io::Error>((reader, Box::new(link.writer) as LinkWrite))
        };
        let why = match tokio::time::timeout(DIAL_TRY, attempt).await {
            Ok(Ok(link)) => return Ok(link),
            // Nothing listens there: rlaunch is gone.
            Ok(Err(e)) if e.kind() == std::io::ErrorKind::ConnectionRefused => {
                return Err(e.to_string())
            }
            Ok(Err(e)) => e.to_string(),
            Err(_) => format!("no answer from {address} within {} s", DIAL_TRY.as_secs()),
        };
        if Instant::now() + DIAL_PAUSE >= until {
            return Err(why);
        }
        tracing::debug!("dialing rlaunch at {address} failed ({why}); trying again");
        tokio::time::sleep(DIAL_PAUSE).await;
    }
}
