//! What the launched job's ranks wait for before they start on this node, and the launcher's
//! stdin that comes meanwhile. Pure: the Node starts the ranks when a call says the gate
//! opened.
//!
//! ```text
//!  find_rendezvous ─wait(Rendezvous)─┐            ┌─ came(Rendezvous): Down::Rendezvous
//!  start_pmix ─wait(Environments)────┤  Gate  ◄───┼─ came(Environments): every env in,
//!  start_bcast ─wait(Files)──────────┤    │       │      or the server lost (ranks on PMI)
//!  Down::Stdin while closed ─hold────┘    │       ├─ came(Files): every broadcast file in
//!                                         │       └─ give_up: the node goes down
//!                              opened ──► start_launched_ranks (in a teardown: never run),
//!                                         then take_held: stdin to the ranks, in order
//! ```

use crate::rank::StdinChunk;

/// Something the launched job's ranks wait for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Wait {
    /// The frameworks' rendezvous, which rank 0's proxy chooses (`Job::rendezvous` was
    /// `None` and rank 0 is elsewhere).
    Rendezvous,
    /// Their PMIx environments, from this node's server.
    Environments,
    /// The files broadcast to every node (`--bcast`), whole and checked.
    Files,
}

#[derive(Debug, Default)]
pub(super) struct Gate {
    rendezvous: bool,
    environments: bool,
    files: bool,
    /// The launcher's stdin that came while the ranks waited, in order.
    held_stdin: Vec<StdinChunk>,
}

impl Gate {
    /// The ranks wait for `wait` too.
    pub(super) fn wait(&mut self, wait: Wait) {
        *self.flag(wait) = true;
    }

    pub(super) fn waits_for(&self, wait: Wait) -> bool {
        match wait {
            Wait::Rendezvous => self.rendezvous,
            Wait::Environments => self.environments,
            Wait::Files => self.files,
        }
    }

    /// The ranks still wait for something.
    pub(super) fn closed(&self) -> bool {
        self.rendezvous || self.environments || self.files
    }

    /// `wait` is over: true if that opened the gate (the ranks start now), false if they
    /// still wait for something else or were not waiting for it.
    pub(super) fn came(&mut self, wait: Wait) -> bool {
        std::mem::take(self.flag(wait)) && !self.closed()
    }

    /// The node goes down: nothing more is waited for. True if the ranks were waiting: they
    /// never start, and are to be reported so.
    pub(super) fn give_up(&mut self) -> bool {
        let closed = self.closed();
        (self.rendezvous, self.environments, self.files) = (false, false, false);
        closed
    }

    /// Keeps `chunk` for the ranks while they wait; gives it back when the gate is open.
    pub(super) fn hold(&mut self, chunk: StdinChunk) -> Option<StdinChunk> {
        if !self.closed() {
            return Some(chunk);
        }
        self.held_stdin.push(chunk);
        None
    }

    /// The stdin held while the ranks waited, in the order it came.
    pub(super) fn take_held(&mut self) -> Vec<StdinChunk> {
        std::mem::take(&mut self.held_stdin)
    }

    fn flag(&mut self, wait: Wait) -> &mut bool {
        match wait {
            Wait::Rendezvous => &mut self.rendezvous,
            Wait::Environments => &mut self.environments,
            Wait::Files => &mut self.files,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_gate_opens_when_the_last_wait_is_over_and_only_then() {
        let mut gate = Gate::default();
        assert!(!gate.closed(), "nothing to wait for: the ranks start at once");
        gate.wait(Wait::Rendezvous);
        gate.wait(Wait::Environments);
        assert!(!gate.came(Wait::Environments), "the rendezvous is still to come");
        assert!(gate.closed() && gate.waits_for(Wait::Rendezvous));
        assert!(gate.came(Wait::Rendezvous), "the last wait opens it");
        assert!(!gate.closed());
        // News of what was not waited for (a late server's environments) opens nothing.
        assert!(!gate.came(Wait::Environments));
    }

    #[test]
    fn a_teardown_gives_up_only_on_ranks_that_were_waiting() {
        let mut gate = Gate::default();
        assert!(!gate.give_up(), "ranks that started are not reported as never run");
        gate.wait(Wait::Environments);
        assert!(gate.give_up(), "waiting ranks never start");
        assert!(!gate.closed());
        assert!(!gate.came(Wait::Environments), "environments that come later start nothing");
    }

    #[test]
    fn stdin_waits_with_the_ranks_in_order() {
        let mut gate = Gate::default();
        let chunk = |seq| StdinChunk::Data { seq, data: std::sync::Arc::from(vec![seq as u8]) };
        assert!(gate.hold(chunk(1)).is_some(), "an open gate holds nothing");
        gate.wait(Wait::Rendezvous);
        assert!(gate.hold(chunk(2)).is_none() && gate.hold(StdinChunk::Eof).is_none());
        assert!(gate.came(Wait::Rendezvous));
        let held = gate.take_held();
        assert!(matches!(held[..], [StdinChunk::Data { seq: 2, .. }, StdinChunk::Eof]), "{held:?}");
        assert!(gate.take_held().is_empty());
    }
}
