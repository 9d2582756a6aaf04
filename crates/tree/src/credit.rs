//! Output flow control by credit, on every link of the tree.
//!
//! ```text
//!  child proxy                                    parent (proxy or rlaunch)
//!  Outbox ──Output (within its Window)──► link reader ──► queue ──► taken on (pump, writer)
//!     ▲                                       (never waits)               │ the Debt drops
//!     └──────────── LinkDown::Credit ◄──── ChildCredit ◄── repaid ────────────┘
//! ```
//!
//! A child may have at most its window of output bytes on the way to its parent: sent and
//! not yet taken on by the parent (written by rlaunch's writer, or passed up by a proxy's
//! pump). So the parent reads its links all the time, whatever the reader of rlaunch's
//! output does, and a rank's end or a fence never waits behind megabytes of output in a
//! socket (a Ctrl-C under a slow reader took 2.3 s to end 1024 ranks that were gone in
//! 0.1 s: their ends sat behind output). Memory stays bounded by the windows, and each link
//! gets its share of a slow reader in proportion to the ranks behind it.
//!
//! Each output chunk a parent queues carries a [`Debt`]; dropping it (the chunk was taken on,
//! or thrown away) repays its creditor, which gives credit back to the child in
//! [`LinkDown::Credit`] frames once a quarter of a window has gathered. A node's own ranks are
//! held to a budget the same way ([`Local`]).

use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::Arc;

use rlaunch_protocol::control::{LinkDown, Up};
use tokio::sync::{mpsc, watch, Notify, Semaphore};

use crate::splice::Carried;

/// What rlaunch lets its whole tree have on the way to it, shared among its links.
pub const ROOT_BUDGET: u64 = 8 << 20;
/// What a proxy lets its child proxies have on the way to it, shared among them.
pub const CHILDREN_BUDGET: u64 = 4 << 20;
/// What a proxy's own ranks may have read and queued, not yet sent up.
pub const LOCAL_BUDGET: usize = 1 << 20;
/// A link's window is never smaller than this (an output chunk) ...
const MIN_WINDOW: u64 = 128 << 10;
/// ... nor larger than this.
const MAX_WINDOW: u64 = 8 << 20;

/// The window of a child link with `ranks` of the `total` ranks behind it, out of `budget`:
/// its share, clamped to [`MIN_WINDOW`, `MAX_WINDOW`].
pub fn window(budget: u64, ranks: usize, total: usize) -> u64 {
    let share = budget * ranks.max(1) as u64 / total.max(1) as u64;
    share.clamp(MIN_WINDOW, MAX_WINDOW)
}

/// Someone who lent room for output and wants it back when the output is taken on.
pub trait Creditor: Send + Sync {
    fn repay(&self, bytes: u64);
}

/// Room for `bytes` of output, lent by a creditor: repaid when dropped.
pub struct Debt {
    to: Arc<dyn Creditor>,
    bytes: u64,
}

impl Debt {
    pub fn new(to: Arc<dyn Creditor>, bytes: usize) -> Debt {
        Debt { to, bytes: bytes as u64 }
    }
}

impl Drop for Debt {
    fn drop(&mut self) {
        self.to.repay(self.bytes);
    }
}

impl std::fmt::Debug for Debt {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Debt({} bytes)", self.bytes)
    }
}

/// The parent's side of one child link: what the child's output taken on gives back.
pub struct ChildCredit {
    link: mpsc::UnboundedSender<LinkDown>,
    /// Repaid and not yet given back.
    owed: AtomicU64,
    /// Given back once this much is owed.
    batch: u64,
}

impl ChildCredit {
    /// Opens the child's window: sends it `window` of credit now, on its link's own channel.
    pub fn open(link: mpsc::UnboundedSender<LinkDown>, window: u64) -> Arc<ChildCredit> {
        let _ = link.send(LinkDown::Credit { bytes: window });
        Arc::new(ChildCredit { link, owed: AtomicU64::new(0), batch: (window / 4).max(1) })
    }
}

impl Creditor for ChildCredit {
    fn repay(&self, bytes: u64) {
        let owed = self.owed.fetch_add(bytes, Ordering::AcqRel) + bytes;
        if owed >= self.batch {
            let all = self.owed.swap(0, Ordering::AcqRel);
            if all > 0 {
                let _ = self.link.send(LinkDown::Credit { bytes: all });
            }
        }
    }
}

/// A node's own ranks' output, read but not yet sent up, held to [`LOCAL_BUDGET`].
pub struct Local(Semaphore);

impl Local {
    pub fn new() -> Arc<Local> {
        Arc::new(Local(Semaphore::new(LOCAL_BUDGET)))
    }

    /// Waits for room for `bytes` (at most the whole budget, so a chunk larger than it still
    /// goes) and returns the debt that gives it back.
    pub async fn borrow(self: &Arc<Self>, bytes: usize) -> Debt {
        let room = bytes.min(LOCAL_BUDGET) as u32;
        self.0.acquire_many(room).await.expect("never closed").forget();
        Debt::new(self.clone(), room as usize)
    }
}

impl Creditor for Local {
    fn repay(&self, bytes: u64) {
        self.0.add_permits(bytes as usize);
    }
}

/// The child's side of its link: the output bytes its parent still takes.
#[derive(Default)]
pub struct Window {
    left: AtomicI64,
    opened: Notify,
}

impl Window {
    /// Credit from the parent.
    pub fn grant(&self, bytes: u64) {
        self.left.fetch_add(bytes as i64, Ordering::AcqRel);
        self.opened.notify_one();
    }

    fn open(&self) -> bool {
        self.left.load(Ordering::Acquire) > 0
    }

    /// Output of `bytes` goes: the window may go below zero by one chunk.
    fn spend(&self, bytes: usize) {
        self.left.fetch_sub(bytes as i64, Ordering::AcqRel);
    }
}

/// A frame waiting to go up, with the room its output was lent.
pub struct Queued {
    pub up: Up,
    pub debt: Option<Debt>,
    /// The output's data, when it is in a carrier instead of in `up` (see
    /// [`crate::splice::Carriers`]).
    pub carried: Option<Carried>,
}

impl Queued {
    /// A frame that owes no window (a parent's own, not relayed output).
    pub fn uncredited(up: Up) -> Queued {
        Queued { up, debt: None, carried: None }
    }

    /// Output relayed from a child, owing its window.
    pub fn owing(up: Up, debt: Debt) -> Queued {
        Queued { up, debt: Some(debt), carried: None }
    }

    /// Bytes of output, wherever they are.
    pub fn output_len(&self) -> Option<usize> {
        match (&self.up, &self.carried) {
            (Up::Output { .. }, Some(carried)) => Some(carried.len()),
            (Up::Output { data, .. }, None) => Some(data.len()),
            _ => None,
        }
    }
}

/// What a node sends up on its data path (output, and the frames ordered with it), as the
/// window allows: output waits for credit, the frames behind it wait with it. Once the
/// output is shed (rlaunch dropped it), output is thrown away instead, credit or not.
pub struct Outbox {
    rx: mpsc::UnboundedReceiver<Queued>,
    window: Arc<Window>,
    shed: watch::Receiver<bool>,
    /// Taken off the queue, waiting for credit.
    head: Option<Queued>,
}

impl Outbox {
    pub fn new(
        rx: mpsc::UnboundedReceiver<Queued>,
        window: Arc<Window>,
        shed: watch::Receiver<bool>,
    ) -> Outbox {
        Outbox { rx, window, shed, head: None }
    }

    /// The next frame that may go now; `None` once every sender is gone and the queue is
    /// empty.
    pub async fn next(&mut self) -> Option<Queued> {
        loop {
            if let Some(q) = self.ready() {
                return Some(q);
            }
            if self.head.is_none() {
                self.head = Some(self.rx.recv().await?);
                continue;
            }
            // Output at the head and no credit: wait for credit, or for the output to be shed.
            tokio::select! {
                _ = self.window.opened.notified() => {}
                _ = crate::raised(&mut self.shed) => {}
            }
        }
    }

    /// The next frame that may go now, without waiting.
    pub fn try_next(&mut self) -> Option<Queued> {
        loop {
            if let Some(q) = self.ready() {
                return Some(q);
            }
            if self.head.is_some() {
                return None;
            }
            self.head = Some(self.rx.try_recv().ok()?);
        }
    }

    /// Takes the head if it may go: a frame other than output, or output within the window
    /// (shed output is dropped here, and the next looked at).
    fn ready(&mut self) -> Option<Queued> {
        loop {
            let len = self.head.as_ref()?.output_len();
            match len {
                None => return self.head.take(),
                Some(_) if *self.shed.borrow() => self.head = None,
                Some(len) if self.window.open() => {
                    self.window.spend(len);
                    return self.head.take();
                }
                Some(_) => return None,
            }
            // The shed head is gone: look at the next frame already queued.
            self.head = self.rx.try_recv().ok();
        }
    }

    /// Drops what is queued and what comes, until every sender is gone: the parent is lost.
    pub async fn discard_all(&mut self) {
        self.head = None;
        while self.rx.recv().await.is_some() {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rlaunch_protocol::ids::NodeId;

    fn output(n: usize) -> Queued {
        Queued::uncredited(Up::Output {
            rank: rlaunch_protocol::ids::Gid(0),
            stream: rlaunch_protocol::ids::Stream::Stdout,
            data: vec![b'x'; n],
        })
    }

    #[test]
    fn windows_share_the_budget_by_ranks_within_bounds() {
        assert_eq!(window(ROOT_BUDGET, 1, 1), MAX_WINDOW);
        assert_eq!(window(ROOT_BUDGET, 16, 1024), MIN_WINDOW);
        assert_eq!(window(ROOT_BUDGET, 256, 1024), 2 << 20);
        assert_eq!(window(32 << 20, 512, 1024), MAX_WINDOW);
        assert_eq!(window(ROOT_BUDGET, 0, 0), MAX_WINDOW);
    }

    #[tokio::test]
    async fn output_waits_for_credit_and_frames_behind_it_wait_too() {
        let (tx, rx) = mpsc::unbounded_channel();
        let window = Arc::new(Window::default());
        let (_shed_tx, shed) = watch::channel(false);
        let mut outbox = Outbox::new(rx, window.clone(), shed);
        tx.send(Queued::uncredited(Up::Started { node: NodeId(1) })).unwrap();
        tx.send(output(100)).unwrap();
        tx.send(Queued::uncredited(Up::NodeDone { node: NodeId(1), record: Box::default() }))
            .unwrap();
        assert!(matches!(outbox.try_next().map(|q| q.up), Some(Up::Started { .. })));
        assert!(outbox.try_next().is_none(), "output went without credit");
        window.grant(10);
        assert!(matches!(outbox.next().await.map(|q| q.up), Some(Up::Output { .. })));
        assert!(matches!(outbox.try_next().map(|q| q.up), Some(Up::NodeDone { .. })));
        // The window is overdrawn by 90: the next output waits for more than that.
        tx.send(output(1)).unwrap();
        window.grant(90);
        assert!(outbox.try_next().is_none());
        window.grant(1);
        assert!(outbox.try_next().is_some());
    }

    #[tokio::test]
    async fn shed_output_goes_without_credit_and_is_not_sent() {
        let (tx, rx) = mpsc::unbounded_channel();
        let (shed_tx, shed) = watch::channel(false);
        let mut outbox = Outbox::new(rx, Arc::new(Window::default()), shed);
        tx.send(output(5)).unwrap();
        tx.send(output(5)).unwrap();
        tx.send(Queued::uncredited(Up::NodeDone { node: NodeId(2), record: Box::default() }))
            .unwrap();
        drop(tx);
        assert!(outbox.try_next().is_none());
        shed_tx.send_replace(true);
        assert!(matches!(outbox.next().await.map(|q| q.up), Some(Up::NodeDone { .. })));
        assert!(outbox.next().await.is_none());
    }

    #[tokio::test]
    async fn a_child_gets_its_window_then_credit_back_in_quarters() {
        let (down, mut sent) = mpsc::unbounded_channel();
        let credit = ChildCredit::open(down, 1000);
        assert_eq!(sent.try_recv().unwrap(), LinkDown::Credit { bytes: 1000 });
        drop(Debt::new(credit.clone(), 200));
        assert!(sent.try_recv().is_err(), "credit given back before a quarter gathered");
        drop(Debt::new(credit.clone(), 100));
        assert_eq!(sent.try_recv().unwrap(), LinkDown::Credit { bytes: 300 });
    }

    #[tokio::test]
    async fn local_room_comes_back_when_the_debt_drops() {
        let local = Local::new();
        let all = local.borrow(LOCAL_BUDGET * 2).await;
        let more = local.clone();
        let waiting = tokio::spawn(async move { more.borrow(1).await });
        tokio::task::yield_now().await;
        assert!(!waiting.is_finished());
        drop(all);
        waiting.await.unwrap();
    }
}
