//! The job's name service (MPI_Publish_name, MPI_Lookup_name, and Open MPI's connect/accept
//! exchanges): one table at the root. A lookup that asks to wait (PMIx's `PMIX_WAIT`) is
//! parked here until its service is published, its wait runs out, or the job ends.
//!
//! ```text
//!   Publish ──► table ──► parked lookups of that service, oldest first
//!   Lookup  ──► found: answered │ not found: answered, or parked (with a deadline)
//!   its rank ends ──► its parked lookups are dropped
//! ```

use rlaunch_protocol::ids::Gid;
use std::collections::HashMap;
use std::time::Duration;

pub(crate) use rlaunch_protocol::control::NameAnswer;
use rlaunch_protocol::control::{LookupWait, NameOp, NameValue};
use tokio::time::Instant;

/// Who asked: the rank its answer goes to, and the tag it echoes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Asker {
    pub rank: Gid,
    pub tag: Option<String>,
}

/// A published service.
struct Entry {
    value: NameValue,
    /// Withdrawn by the first lookup that finds it.
    once: bool,
}

/// A lookup waiting for its service.
struct Parked {
    asker: Asker,
    service: String,
    /// `None`: until the job ends.
    deadline: Option<Instant>,
}

#[derive(Default)]
pub(crate) struct Names {
    published: HashMap<String, Entry>,
    /// In the order they came.
    parked: Vec<Parked>,
}

impl Names {
    /// Serves a request; returns the answers to send (a publish may release parked lookups,
    /// a lookup that waits may answer nothing yet).
    pub(crate) fn serve(
        &mut self,
        asker: Asker,
        op: NameOp,
        now: Instant,
    ) -> Vec<(Asker, NameAnswer)> {
        match op {
            NameOp::Publish { service, value, once } => {
                if self.published.contains_key(&service) {
                    return vec![(asker, NameAnswer::Published(false))];
                }
                self.published.insert(service.clone(), Entry { value, once });
                let mut answers = vec![(asker, NameAnswer::Published(true))];
                self.release(&service, &mut answers);
                answers
            }
            NameOp::Unpublish { service } => {
                let found = self.published.remove(&service).is_some();
                vec![(asker, NameAnswer::Unpublished(found))]
            }
            NameOp::Lookup { service, wait } => match self.find(&service) {
                Some(value) => vec![(asker, NameAnswer::Lookup(Some(value)))],
                None => {
                    let deadline = match wait {
                        LookupWait::No => return vec![(asker, NameAnswer::Lookup(None))],
                        LookupWait::For { ms } => Some(now + Duration::from_millis(ms)),
                        LookupWait::UntilJobEnd => None,
                    };
                    self.parked.push(Parked { asker, service, deadline });
                    Vec::new()
                }
            },
        }
    }

    /// The value of `service`, withdrawn if it was published for one lookup.
    fn find(&mut self, service: &str) -> Option<NameValue> {
        let entry = self.published.get(service)?;
        if entry.once {
            return self.published.remove(service).map(|e| e.value);
        }
        Some(entry.value.clone())
    }

    /// Answers the lookups parked on a service just published, oldest first, while it is
    /// there to find.
    fn release(&mut self, service: &str, answers: &mut Vec<(Asker, NameAnswer)>) {
        while let Some(at) = self.parked.iter().position(|p| p.service == service) {
            let Some(value) = self.find(service) else { return };
            let parked = self.parked.remove(at);
            answers.push((parked.asker, NameAnswer::Lookup(Some(value))));
        }
    }

    /// Rank `rank` ended: its parked lookups go, unanswered. Were they kept, a publish would
    /// answer a dead rank, and a value published for one read would go to it.
    pub(crate) fn forget(&mut self, rank: Gid) {
        self.parked.retain(|p| p.asker.rank != rank);
    }

    /// When the first parked lookup runs out of time, if one can.
    pub(crate) fn deadline(&self) -> Option<Instant> {
        self.parked.iter().filter_map(|p| p.deadline).min()
    }

    /// Fails the parked lookups whose time is up.
    pub(crate) fn expire(&mut self, now: Instant) -> Vec<(Asker, NameAnswer)> {
        let (over, left) = std::mem::take(&mut self.parked)
            .into_iter()
            .partition(|p| p.deadline.is_some_and(|d| d <= now));
        self.parked = left;
        over.into_iter().map(|p: Parked| (p.asker, NameAnswer::Lookup(None))).collect()
    }

    /// Fails every parked lookup: the job is ending.
    pub(crate) fn give_up(&mut self) -> Vec<(Asker, NameAnswer)> {
        let parked = std::mem::take(&mut self.parked);
        parked.into_iter().map(|p| (p.asker, NameAnswer::Lookup(None))).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn asker(rank: u32) -> Asker {
        Asker { rank: Gid(rank), tag: Some(format!("t{rank}")) }
    }

    fn text(v: &str) -> NameValue {
        NameValue::Text(v.into())
    }

    fn publish(value: NameValue, once: bool) -> NameOp {
        NameOp::Publish { service: "s".into(), value, once }
    }

    fn lookup(wait: LookupWait) -> NameOp {
        NameOp::Lookup { service: "s".into(), wait }
    }

    #[test]
    fn a_name_is_published_once_found_and_withdrawn() {
        let mut names = Names::default();
        let now = Instant::now();
        let mut serve = |op| names.serve(asker(0), op, now).remove(0).1;
        assert_eq!(serve(publish(text("p1"), false)), NameAnswer::Published(true));
        assert_eq!(serve(publish(text("p2"), false)), NameAnswer::Published(false));
        assert_eq!(serve(lookup(LookupWait::No)), NameAnswer::Lookup(Some(text("p1"))));
        assert_eq!(serve(lookup(LookupWait::No)), NameAnswer::Lookup(Some(text("p1"))));
        let unpublish = || NameOp::Unpublish { service: "s".into() };
        assert_eq!(serve(unpublish()), NameAnswer::Unpublished(true));
        assert_eq!(serve(unpublish()), NameAnswer::Unpublished(false));
        assert_eq!(serve(lookup(LookupWait::No)), NameAnswer::Lookup(None));
    }

    #[test]
    fn a_waiting_lookup_is_answered_by_the_publish() {
        let mut names = Names::default();
        let now = Instant::now();
        assert_eq!(names.serve(asker(1), lookup(LookupWait::UntilJobEnd), now), vec![]);
        assert_eq!(names.deadline(), None);
        let packed = NameValue::Packed(vec![0, 1, 255]);
        let answers = names.serve(asker(0), publish(packed.clone(), false), now);
        assert_eq!(
            answers,
            vec![
                (asker(0), NameAnswer::Published(true)),
                (asker(1), NameAnswer::Lookup(Some(packed))),
            ]
        );
        assert!(names.give_up().is_empty());
    }

    #[test]
    fn a_value_published_for_one_read_goes_to_one_lookup() {
        let mut names = Names::default();
        let now = Instant::now();
        for rank in [1, 2] {
            assert_eq!(names.serve(asker(rank), lookup(LookupWait::UntilJobEnd), now), vec![]);
        }
        let answers = names.serve(asker(0), publish(text("v"), true), now);
        assert_eq!(answers[1], (asker(1), NameAnswer::Lookup(Some(text("v")))));
        assert_eq!(answers.len(), 2, "{answers:?}");
        // Read once: gone, and the same service may be published again.
        let answers = names.serve(asker(0), publish(text("w"), true), now);
        assert_eq!(answers[1], (asker(2), NameAnswer::Lookup(Some(text("w")))));
        assert_eq!(
            names.serve(asker(3), lookup(LookupWait::No), now)[0].1,
            NameAnswer::Lookup(None)
        );
    }

    #[test]
    fn the_lookups_of_a_rank_that_ended_are_dropped_and_leave_the_value_to_others() {
        let mut names = Names::default();
        let now = Instant::now();
        for rank in [1, 2, 1] {
            assert_eq!(names.serve(asker(rank), lookup(LookupWait::UntilJobEnd), now), vec![]);
        }
        names.forget(Gid(1));
        let answers = names.serve(asker(0), publish(text("v"), true), now);
        assert_eq!(
            answers,
            vec![
                (asker(0), NameAnswer::Published(true)),
                (asker(2), NameAnswer::Lookup(Some(text("v")))),
            ]
        );
        assert_eq!(names.give_up(), vec![]);
    }

    #[test]
    fn waiting_lookups_fail_at_their_deadline_or_when_the_job_ends() {
        let mut names = Names::default();
        let now = Instant::now();
        names.serve(asker(1), lookup(LookupWait::For { ms: 1000 }), now);
        names.serve(asker(2), lookup(LookupWait::UntilJobEnd), now);
        let deadline = now + Duration::from_secs(1);
        assert_eq!(names.deadline(), Some(deadline));
        assert_eq!(names.expire(deadline - Duration::from_millis(1)), vec![]);
        assert_eq!(names.expire(deadline), vec![(asker(1), NameAnswer::Lookup(None))]);
        assert_eq!(names.deadline(), None);
        assert_eq!(names.give_up(), vec![(asker(2), NameAnswer::Lookup(None))]);
    }
}
