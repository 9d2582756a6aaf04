//! `--bcast` at the root: the top proxies are fed the files' bytes from the files rlaunch
//! opened when it planned the job (rlaunch-tree's `bcast`), each attempt from the start, and
//! told once every node has them (`Down::BcastDone`: only then do ranks start anywhere); a
//! node that cannot write them, or rlaunch that cannot read them any more, ends the job.

use rlaunch_tree::bcast::{Feeds, Source};

use super::cause::Cause;
use super::Root;

/// The files and how far each top proxy's subtree has them.
pub(super) struct Broadcast {
    source: Source,
    total: u64,
    feeds: Feeds,
    /// Reading the files failed: the job is ending.
    failed: bool,
    /// Every top proxy was told that every node has the files, when there were this many.
    released: Option<usize>,
}

impl Root {
    /// The attempt's top proxies are started: they are fed from the start (the files were
    /// opened by the plan; a restart sends them again, to fresh directories).
    pub(super) fn bcast_begin(&mut self) {
        if let Some(b) = self.bcast.as_mut() {
            (b.feeds, b.released) = (Feeds::default(), None);
            return;
        }
        let files = std::mem::take(&mut self.plan.bcast_files);
        if files.is_empty() {
            return;
        }
        let source = Source::new(files);
        let total = source.total();
        let feeds = Feeds::default();
        self.bcast = Some(Broadcast { source, total, feeds, failed: false, released: None });
    }

    /// Top proxy `child`'s subtree has `bytes` of the files.
    pub(super) fn bcast_acked(&mut self, child: usize, bytes: u64) {
        if let Some(b) = self.bcast.as_mut() {
            b.feeds.acked(child, bytes);
        }
    }

    /// Feeds every top proxy what its window allows: after any event (an acknowledgement,
    /// a proxy attached or adopted, one lost).
    pub(super) fn bcast_step(&mut self) {
        let Some(b) = self.bcast.as_mut().filter(|b| !b.failed) else { return };
        // Nothing to do once every node was told, unless a proxy joined since (adopted).
        if b.released == Some(self.children.len()) {
            return;
        }
        if let Err(why) = b.feeds.feed(&self.children, &mut b.source, b.total) {
            b.failed = true;
            return self.fail(Cause::Bcast { host: None, why });
        }
        // Every node has them: the ranks may start everywhere.
        if b.feeds.release(&self.children, b.total) {
            b.released = Some(self.children.len());
        }
    }
}
