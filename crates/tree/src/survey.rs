//! A survey on its way through one level of the tree: asked of every child that can still
//! answer, merged as their answers come, and finished when all have answered or its time is
//! up. A proxy gathers its subtree's ranks so; rlaunch gathers the whole job's.
//!
//! Each level gives its children three quarters of its own time, so that a child's answer
//! naming its own silent children still comes before its parent gives up on it.

use rlaunch_protocol::control::Down;
use rlaunch_protocol::survey::Survey;
use std::time::Duration;
use tokio::time::Instant;

use crate::children::Children;

/// One survey being gathered at this level.
pub struct Gather {
    pub id: u32,
    survey: Survey,
    /// The children asked that have not answered: (index, host).
    awaiting: Vec<(usize, String)>,
    /// This level's own part is still to come (its ranks' stacks, read on a thread).
    own_due: bool,
    /// The stacks were asked for.
    pub stacks: bool,
    pub deadline: Instant,
}

impl Gather {
    /// Asks every child that can still answer for survey `id` (with the ranks' stacks if
    /// `stacks`), with `own` (this level's ranks) for a start; gives up on the children
    /// after `within`.
    pub fn start(
        id: u32,
        within: Duration,
        stacks: bool,
        own: Survey,
        children: &Children,
    ) -> Gather {
        let down = Down::Survey { id, within_ms: (within * 3 / 4).as_millis() as u64, stacks };
        let awaiting = children.send_to_live(&down);
        Gather {
            id,
            survey: own,
            awaiting,
            own_due: false,
            stacks,
            deadline: Instant::now() + within,
        }
    }

    /// This level's own part will come later ([`Gather::own_came`]): the survey is not
    /// settled before it, or its time, is up.
    pub fn own_later(&mut self) {
        self.own_due = true;
    }

    /// This level's own part of survey `id`; false if that was no part of this one.
    pub fn own_came(&mut self, id: u32, part: Survey) -> bool {
        if id != self.id || !self.own_due {
            return false;
        }
        self.own_due = false;
        self.survey.merge(part);
        true
    }

    /// Child `child` answered survey `id`; false if that was no answer to this one.
    pub fn answered(&mut self, child: usize, id: u32, survey: Survey) -> bool {
        let Some(at) = self.awaiting.iter().position(|&(c, _)| c == child) else { return false };
        if id != self.id {
            return false;
        }
        self.awaiting.swap_remove(at);
        self.survey.merge(survey);
        true
    }

    /// Whether no more answers can come: every child asked has answered, or can no longer
    /// (one lost is named in the survey; one that finished has no rank left).
    pub fn settled(&mut self, children: &Children) -> bool {
        let survey = &mut self.survey;
        self.awaiting.retain(|(child, host)| {
            if children.lost(*child) {
                survey.unanswered.push(host.clone());
            }
            !children.gone(*child)
        });
        self.awaiting.is_empty() && !self.own_due
    }

    /// What was gathered; the children that did not answer are named in it.
    pub fn finish(self) -> Survey {
        let mut survey = self.survey;
        survey.unanswered.extend(self.awaiting.into_iter().map(|(_, host)| host));
        survey
    }
}
