//! What the connection answers itself and what goes to the node (docs/pmi.md, *Who answers what*: Hydra's proxy
//! answers the same set locally). Pure: the job's facts in, a [`Route`] out.

use pmi_wire::reply::Reply;
use pmi_wire::request::{Protocol, Request};
use rlaunch_protocol::control::SpawnOutcome;

use super::fault::Fault;
use super::{PmiAnswer, PmiCall, PmiJob, PmiPeer};

/// What becomes of one request.
#[derive(Debug, PartialEq)]
pub(crate) enum Route {
    /// Answered here, from the job's facts.
    Reply(Reply),
    /// The node's business; it answers later (abort: never).
    Call(PmiCall),
    /// The node is told, and the rank answered at once (put, finalize).
    Both(PmiCall, Reply),
}

impl Route {
    /// The call for the node and the reply for the rank, each if any.
    pub(crate) fn into_parts(self) -> (Option<PmiCall>, Option<Reply>) {
        match self {
            Route::Reply(reply) => (None, Some(reply)),
            Route::Call(call) => (Some(call), None),
            Route::Both(call, reply) => (Some(call), Some(reply)),
        }
    }
}

/// Routes one request of `peer`, whose requests carry `tag` (echoed in calls' answers).
pub(crate) fn route(
    job: &PmiJob,
    peer: &PmiPeer,
    protocol: Protocol,
    tag: Option<String>,
    request: Request,
) -> Result<Route, Fault> {
    Ok(match request {
        Request::FullInit => Route::Reply(Reply::FullInit {
            rank: peer.rank,
            size: job.size,
            appnum: peer.appnum,
            spawner: job.spawner.clone(),
        }),
        Request::GetMaxes => Route::Reply(Reply::Maxes),
        Request::GetAppnum => Route::Reply(Reply::Appnum(peer.appnum)),
        Request::GetKvsname => Route::Reply(Reply::Kvsname(job.kvsname.clone())),
        Request::GetUniverseSize => Route::Reply(Reply::UniverseSize(job.size)),
        // The failed ranks are the node's to say (`--on-failure continue`).
        Request::GetJobAttr { key } if key == DEAD_PROCESSES => {
            Route::Call(PmiCall::JobAttr { key, tag })
        }
        Request::GetJobAttr { key } => {
            Route::Reply(Reply::JobAttr(special_key(job, &key).flatten()))
        }
        Request::Put { kvsname, key, value } => {
            check_kvsname(job, kvsname, "a put")?;
            Route::Both(PmiCall::Put { key, value }, Reply::Put)
        }
        Request::Get { kvsname, key } => {
            let what = match protocol {
                Protocol::Pmi1 => "a get",
                Protocol::Pmi2 => "a kvs-get",
            };
            check_kvsname(job, kvsname, what)?;
            // The failed ranks are the node's to say (`--on-failure continue`).
            match special_key(job, &key).filter(|_| key != DEAD_PROCESSES) {
                Some(value) => Route::Reply(Reply::Get { key, value }),
                None => Route::Call(PmiCall::Get { key, tag }),
            }
        }
        Request::Fence => Route::Call(PmiCall::Fence { tag }),
        Request::PutNodeAttr { key, value } => {
            Route::Both(PmiCall::PutNodeAttr { key, value }, Reply::PutNodeAttr)
        }
        Request::GetNodeAttr { key, wait } => Route::Call(PmiCall::GetNodeAttr { key, wait, tag }),
        Request::Name(op) => Route::Call(PmiCall::Name { op, tag }),
        Request::Spawn(request) => Route::Call(PmiCall::Spawn { request, tag }),
        // Hydra's default when no code travels.
        Request::Abort { code, msg } => {
            Route::Call(PmiCall::Abort { code: code.unwrap_or(1), msg })
        }
        Request::JobConnect => Route::Reply(Reply::JobConnect),
        Request::JobDisconnect => Route::Reply(Reply::JobDisconnect),
        Request::Finalize => Route::Both(PmiCall::Finalized, Reply::Finalize),
    })
}

/// The node's answer as a reply, and the tag it echoes.
pub(crate) fn reply_to(answer: PmiAnswer) -> (Reply, Option<String>) {
    match answer {
        PmiAnswer::Get { key, value, tag } => (Reply::Get { key, value }, tag),
        PmiAnswer::JobAttr { value, tag } => (Reply::JobAttr(value), tag),
        PmiAnswer::Fence { tag } => (Reply::Fence, tag),
        PmiAnswer::GetNodeAttr { value, tag } => (Reply::NodeAttr(value), tag),
        PmiAnswer::Name { answer, tag } => (Reply::Name(answer), tag),
        PmiAnswer::Spawn { outcome: SpawnOutcome::Started { kvsname }, tag } => {
            (Reply::Spawn { jobid: kvsname }, tag)
        }
        PmiAnswer::Spawn { outcome: SpawnOutcome::Refused { reason }, tag } => {
            (Reply::SpawnFailed { reason }, tag)
        }
    }
}

/// A request may only name its own job's KVS.
fn check_kvsname(job: &PmiJob, kvsname: Option<String>, what: &'static str) -> Result<(), Fault> {
    match kvsname {
        Some(kvsname) if kvsname != job.kvsname => {
            Err(Fault::ForeignKvs { what, kvsname, expected: job.kvsname.clone() })
        }
        _ => Ok(()),
    }
}

/// The key Hydra lists failed processes under (`0-2,5`), empty while there is none: MPICH
/// reads it (`MPIR_pmi_get_failed_procs`) to learn which processes failed.
pub(crate) const DEAD_PROCESSES: &str = "PMI_dead_processes";

/// Keys served without any put: `Some(value)` (`None` inside: known to be absent) for them,
/// `None` for ordinary keys.
fn special_key(job: &PmiJob, key: &str) -> Option<Option<String>> {
    match key {
        "PMI_process_mapping" => Some(job.process_mapping.clone()),
        DEAD_PROCESSES => Some(Some(String::new())),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use rlaunch_protocol::control::{NameAnswer, NameOp, SpawnRequest};

    use super::*;

    fn job(mapping: Option<&str>) -> PmiJob {
        PmiJob {
            kvsname: "kvs_1".into(),
            size: 4,
            process_mapping: mapping.map(str::to_string),
            spawner: Some("kvs_0".into()),
        }
    }

    const PEER: PmiPeer = PmiPeer { local: 0, job: 1, rank: 2, appnum: 3 };

    /// Routes with the tag "t"; a fault as the user reads it.
    fn routed(protocol: Protocol, request: Request) -> Result<Route, String> {
        let tag = Some("t".to_string());
        route(&job(Some("(vector,(0,1,4))")), &PEER, protocol, tag, request)
            .map_err(|f| f.to_string())
    }

    fn s(text: &str) -> String {
        text.to_string()
    }

    fn t() -> Option<String> {
        Some(s("t"))
    }

    fn here(reply: Reply) -> Result<Route, String> {
        Ok(Route::Reply(reply))
    }

    fn node(call: PmiCall) -> Result<Route, String> {
        Ok(Route::Call(call))
    }

    #[test]
    fn the_table() {
        use Protocol::{Pmi1, Pmi2};
        let spawn = SpawnRequest { cmds: vec![], preput: vec![(s("k"), s("v"))] };
        let lookup =
            NameOp::Lookup { service: s("S"), wait: rlaunch_protocol::control::LookupWait::No };
        let mapping = Some(s("(vector,(0,1,4))"));
        let put = |kvsname: Option<&str>| Request::Put {
            kvsname: kvsname.map(str::to_string),
            key: s("k"),
            value: s("v"),
        };
        let get = |kvsname: Option<&str>, key: &str| Request::Get {
            kvsname: kvsname.map(str::to_string),
            key: s(key),
        };
        let put_ok = || Ok(Route::Both(PmiCall::Put { key: s("k"), value: s("v") }, Reply::Put));
        let foreign =
            |what: &str| format!("sent {what} for kvsname \"x\", but its job's kvsname is kvs_1");
        let cases = [
            (
                Pmi2,
                Request::FullInit,
                here(Reply::FullInit { rank: 2, size: 4, appnum: 3, spawner: Some(s("kvs_0")) }),
            ),
            (Pmi1, Request::GetMaxes, here(Reply::Maxes)),
            (Pmi1, Request::GetAppnum, here(Reply::Appnum(3))),
            (Pmi1, Request::GetKvsname, here(Reply::Kvsname(s("kvs_1")))),
            (Pmi2, Request::GetUniverseSize, here(Reply::UniverseSize(4))),
            (
                Pmi2,
                Request::GetJobAttr { key: s("PMI_process_mapping") },
                here(Reply::JobAttr(mapping.clone())),
            ),
            (
                Pmi2,
                Request::GetJobAttr { key: s("PMI_dead_processes") },
                node(PmiCall::JobAttr { key: s("PMI_dead_processes"), tag: t() }),
            ),
            (Pmi2, Request::GetJobAttr { key: s("other") }, here(Reply::JobAttr(None))),
            (Pmi1, put(Some("kvs_1")), put_ok()),
            (Pmi2, put(None), put_ok()),
            (Pmi1, put(Some("x")), Err(foreign("a put"))),
            (Pmi1, get(Some("kvs_1"), "k"), node(PmiCall::Get { key: s("k"), tag: t() })),
            (Pmi2, get(None, "k"), node(PmiCall::Get { key: s("k"), tag: t() })),
            (
                Pmi1,
                get(Some("kvs_1"), "PMI_process_mapping"),
                here(Reply::Get { key: s("PMI_process_mapping"), value: mapping }),
            ),
            (
                Pmi2,
                get(None, "PMI_dead_processes"),
                node(PmiCall::Get { key: s("PMI_dead_processes"), tag: t() }),
            ),
            (Pmi1, get(Some("x"), "k"), Err(foreign("a get"))),
            (Pmi2, get(Some("x"), "k"), Err(foreign("a kvs-get"))),
            (Pmi1, Request::Fence, node(PmiCall::Fence { tag: t() })),
            (
                Pmi2,
                Request::PutNodeAttr { key: s("k"), value: s("v") },
                Ok(Route::Both(
                    PmiCall::PutNodeAttr { key: s("k"), value: s("v") },
                    Reply::PutNodeAttr,
                )),
            ),
            (
                Pmi2,
                Request::GetNodeAttr { key: s("k"), wait: true },
                node(PmiCall::GetNodeAttr { key: s("k"), wait: true, tag: t() }),
            ),
            (Pmi1, Request::Name(lookup.clone()), node(PmiCall::Name { op: lookup, tag: t() })),
            (
                Pmi2,
                Request::Spawn(spawn.clone()),
                node(PmiCall::Spawn { request: spawn, tag: t() }),
            ),
            (
                Pmi1,
                Request::Abort { code: Some(42), msg: String::new() },
                node(PmiCall::Abort { code: 42, msg: String::new() }),
            ),
            (
                Pmi2,
                Request::Abort { code: None, msg: s("bye") },
                node(PmiCall::Abort { code: 1, msg: s("bye") }),
            ),
            (Pmi2, Request::JobConnect, here(Reply::JobConnect)),
            (Pmi2, Request::JobDisconnect, here(Reply::JobDisconnect)),
            (Pmi1, Request::Finalize, Ok(Route::Both(PmiCall::Finalized, Reply::Finalize))),
        ];
        for (protocol, request, expected) in cases {
            assert_eq!(routed(protocol, request.clone()), expected, "{request:?}");
        }
    }

    #[test]
    fn a_missing_mapping_is_a_miss() {
        let get = Request::Get { kvsname: None, key: s("PMI_process_mapping") };
        assert_eq!(
            route(&job(None), &PEER, Protocol::Pmi2, None, get),
            Ok(Route::Reply(Reply::Get { key: s("PMI_process_mapping"), value: None }))
        );
    }

    #[test]
    fn answers_become_replies() {
        let cases = [
            (
                PmiAnswer::Get { key: s("k"), value: None, tag: t() },
                Reply::Get { key: s("k"), value: None },
            ),
            (PmiAnswer::Fence { tag: t() }, Reply::Fence),
            (
                PmiAnswer::GetNodeAttr { value: Some(s("v")), tag: t() },
                Reply::NodeAttr(Some(s("v"))),
            ),
            (
                PmiAnswer::Name { answer: NameAnswer::Published(false), tag: t() },
                Reply::Name(NameAnswer::Published(false)),
            ),
            (
                PmiAnswer::Spawn {
                    outcome: SpawnOutcome::Started { kvsname: s("kvs_2") },
                    tag: t(),
                },
                Reply::Spawn { jobid: s("kvs_2") },
            ),
            (
                PmiAnswer::Spawn {
                    outcome: SpawnOutcome::Refused { reason: s("no such host") },
                    tag: t(),
                },
                Reply::SpawnFailed { reason: s("no such host") },
            ),
        ];
        for (answer, reply) in cases {
            assert_eq!(reply_to(answer), (reply, t()));
        }
    }
}
