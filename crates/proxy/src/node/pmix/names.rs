//! The PMIx name service (PMIx_Publish, PMIx_Lookup, PMIx_Unpublish: MPI_Publish_name and
//! friends). A local client's request goes to the root as a PMI rank's does, tagged with the
//! server's id of it; the root's answer comes back to the server. rlaunch carries one key a
//! request: a request of none is done at once, one of several is not supported.

use rlaunch_protocol::control::{LookupWait, NameAnswer, NameOp, NameValue, Up};
use rlaunch_protocol::ids::Gid;

use super::server::{Act, State};
use crate::pmix::wire::{self, Proc};
use crate::pmix::Command;

/// Marks a name-service request as PMIx's: the tag its answer comes back with.
const TAG_PREFIX: &str = "\0pmix:";

/// The tag of the server's request `id`.
pub(super) fn tag(id: u32) -> Option<String> {
    Some(format!("{TAG_PREFIX}{id}"))
}

/// The host's id in a PMIx name-service answer's tag.
pub(in crate::node) fn pmix_id(tag: &Option<String>) -> Option<u32> {
    tag.as_deref()?.strip_prefix(TAG_PREFIX)?.parse().ok()
}

impl State {
    /// The rank a request is the root's business of: the client's global id.
    fn asker(&self, proc: &Proc) -> Gid {
        self.gid(proc).unwrap_or(Gid(proc.rank))
    }

    pub(super) fn publish(
        &mut self,
        id: u32,
        proc: Proc,
        once: bool,
        mut pairs: Vec<(String, NameValue)>,
    ) -> Vec<Act> {
        if pairs.len() != 1 {
            let status = if pairs.is_empty() { wire::SUCCESS } else { wire::ERR_NOT_SUPPORTED };
            return vec![Act::Host(Command::OpDone { id, status })];
        }
        let (service, value) = pairs.remove(0);
        let packed = matches!(value, NameValue::Packed(_));
        tracing::debug!(%service, once, packed, "PMIx publish");
        let op = NameOp::Publish { service, value, once };
        vec![Act::Up(Up::Name { rank: self.asker(&proc), tag: tag(id), op })]
    }

    pub(super) fn unpublish(&mut self, id: u32, proc: Proc, mut keys: Vec<String>) -> Vec<Act> {
        if keys.len() != 1 {
            return vec![Act::Host(Command::OpDone { id, status: wire::ERR_NOT_SUPPORTED })];
        }
        let op = NameOp::Unpublish { service: keys.remove(0) };
        vec![Act::Up(Up::Name { rank: self.asker(&proc), tag: tag(id), op })]
    }

    /// A lookup's key is kept until its answer: the server is answered with it.
    pub(super) fn lookup(
        &mut self,
        id: u32,
        proc: Proc,
        wait: LookupWait,
        mut keys: Vec<String>,
    ) -> Vec<Act> {
        if keys.len() != 1 {
            let (status, found) = (wire::ERR_NOT_SUPPORTED, Vec::new());
            return vec![Act::Host(Command::LookupDone { id, status, found })];
        }
        let service = keys.remove(0);
        tracing::debug!(%service, ?wait, "PMIx lookup");
        self.lookups.insert(id, service.clone());
        let op = NameOp::Lookup { service, wait };
        vec![Act::Up(Up::Name { rank: self.asker(&proc), tag: tag(id), op })]
    }

    /// The root's answer to a PMIx name-service request of a local rank.
    pub(super) fn name_answer(&mut self, id: u32, answer: NameAnswer) -> Command {
        match answer {
            NameAnswer::Published(ok) => {
                let status = if ok { wire::SUCCESS } else { wire::ERR_DUPLICATE_KEY };
                Command::OpDone { id, status }
            }
            NameAnswer::Unpublished(ok) => {
                let status = if ok { wire::SUCCESS } else { wire::ERR_NOT_FOUND };
                Command::OpDone { id, status }
            }
            NameAnswer::Lookup(value) => {
                let key = self.lookups.remove(&id).unwrap_or_default();
                // The publisher is not recorded: PMIX_RANK_UNDEF.
                match value {
                    Some(value) => Command::LookupDone {
                        id,
                        status: wire::SUCCESS,
                        found: vec![(key, value, u32::MAX)],
                    },
                    None => Command::LookupDone { id, status: wire::ERR_NOT_FOUND, found: vec![] },
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::node::pmix::server::tests::{here, host, one, proc, up, JOB};
    use crate::pmix::Event;
    use tokio::time::Instant;

    #[test]
    fn name_service_requests_go_up_tagged_and_a_lookup_is_answered_with_its_key() {
        let now = Instant::now();
        let mut state = State::new(JOB, 4, now);
        let lookup = Event::Lookup {
            id: 5,
            proc: proc(JOB, 3),
            wait: LookupWait::No,
            keys: vec!["svc".into()],
        };
        let Up::Name { rank, tag, op } = up(one(state.on_event(lookup, &here(true), now))) else {
            panic!("not a name request")
        };
        assert_eq!((rank, pmix_id(&tag)), (Gid(3), Some(5)));
        assert_eq!(op, NameOp::Lookup { service: "svc".into(), wait: LookupWait::No });
        let value = NameValue::Text("port".into());
        let found = vec![("svc".to_string(), value.clone(), u32::MAX)];
        let answer = state.name_answer(5, NameAnswer::Lookup(Some(value)));
        assert_eq!(answer, Command::LookupDone { id: 5, status: wire::SUCCESS, found });
        let taken = state.name_answer(6, NameAnswer::Published(false));
        assert_eq!(taken, Command::OpDone { id: 6, status: wire::ERR_DUPLICATE_KEY });
        assert_eq!(pmix_id(&Some("5".into())), None, "a PMI request's tag is not PMIx's");

        let pairs = |n| (0..n).map(|i| (format!("k{i}"), NameValue::Text("v".into()))).collect();
        let publish =
            |n| Event::Publish { id: 1, proc: proc(JOB, 0), once: false, pairs: pairs(n) };
        let none = host(one(state.on_event(publish(0), &here(true), now)));
        assert_eq!(none, Command::OpDone { id: 1, status: wire::SUCCESS });
        let two = host(one(state.on_event(publish(2), &here(true), now)));
        assert_eq!(two, Command::OpDone { id: 1, status: wire::ERR_NOT_SUPPORTED });
        assert!(matches!(up(one(state.on_event(publish(1), &here(true), now))), Up::Name { .. }));
    }
}
