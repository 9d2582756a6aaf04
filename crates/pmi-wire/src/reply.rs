//! The server's answer to a [`crate::request::Request`], worded per protocol as Hydra words
//! it (docs/pmi.md, *PMI-1* and *PMI-2*).
//!
//! ```text
//!  Reply ──into_pmi1──► pmi1::Response ──encode──► "cmd=get_result rc=0 msg=success value=v\n"
//!        ──into_pmi2──► pmi2::Response ──encode──► "    43cmd=kvs-get-response;found=TRUE;..."
//! ```
//!
//! Each protocol's spelling of a failed name-service request is written here once.

use crate::pmi1::Response as Resp1;
use crate::pmi2::Response as Resp2;
use crate::request::Protocol;
use crate::services::{NameAnswer, NameValue};

/// An answer to one request. Replies that only one protocol has (PMI-1 `maxes`, PMI-2
/// node attributes) have no wording in the other: nothing is sent there.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reply {
    /// `spawner` is the parent job's kvsname, for a job started by `MPI_Comm_spawn`.
    FullInit {
        rank: u32,
        size: u32,
        appnum: u32,
        spawner: Option<String>,
    },
    Maxes,
    Appnum(u32),
    Kvsname(String),
    UniverseSize(u32),
    JobAttr(Option<String>),
    Put,
    /// `key` is PMI-1's: a miss names it.
    Get {
        key: String,
        value: Option<String>,
    },
    Fence,
    PutNodeAttr,
    NodeAttr(Option<String>),
    Name(NameAnswer),
    /// `jobid` is the new job's kvsname.
    Spawn {
        jobid: String,
    },
    /// The spawn did not happen, for `reason` (a sentence).
    SpawnFailed {
        reason: String,
    },
    JobConnect,
    JobDisconnect,
    Finalize,
}

impl Reply {
    /// The PMI-1 wording, if PMI-1 has one.
    pub fn into_pmi1(self) -> Option<Resp1> {
        Some(match self {
            Reply::Maxes => Resp1::Maxes,
            Reply::Appnum(appnum) => Resp1::Appnum { appnum },
            Reply::Kvsname(kvsname) => Resp1::MyKvsname { kvsname },
            // PMI-1 sizes are signed (negative is "unknown"); this is Hydra's cast.
            Reply::UniverseSize(size) => Resp1::UniverseSize { size: size as i32 },
            Reply::Put => Resp1::PutOk,
            Reply::Get { value: Some(value), .. } => Resp1::GetFound { value },
            Reply::Get { key, value: None } => Resp1::GetNotFound { key },
            Reply::Fence => Resp1::BarrierOut,
            Reply::Name(NameAnswer::Published(true)) => Resp1::PublishOk,
            Reply::Name(NameAnswer::Published(false)) => Resp1::PublishDuplicate,
            Reply::Name(NameAnswer::Unpublished(true)) => Resp1::UnpublishOk,
            Reply::Name(NameAnswer::Unpublished(false)) => Resp1::UnpublishNotFound,
            Reply::Name(NameAnswer::Lookup(Some(NameValue::Text(port)))) => {
                Resp1::LookupFound { port }
            }
            // A PMIx value of another type is no port name PMI could carry.
            Reply::Name(NameAnswer::Lookup(_)) => Resp1::LookupNotFound,
            Reply::Spawn { .. } => Resp1::SpawnOk { errcodes: Vec::new() },
            Reply::SpawnFailed { reason } => Resp1::SpawnFailed { reason },
            Reply::Finalize => Resp1::FinalizeAck,
            Reply::FullInit { .. }
            | Reply::JobAttr(_)
            | Reply::PutNodeAttr
            | Reply::NodeAttr(_)
            | Reply::JobConnect
            | Reply::JobDisconnect => return None,
        })
    }

    /// The PMI-2 wording, if PMI-2 has one.
    pub fn into_pmi2(self) -> Option<Resp2> {
        let failed =
            |cmd: &str, errmsg: &str| Resp2::Failed { cmd: cmd.into(), errmsg: errmsg.into() };
        Some(match self {
            Reply::FullInit { rank, size, appnum, spawner } => {
                Resp2::FullInit { rank, size, appnum, spawner_jobid: spawner }
            }
            Reply::Kvsname(jobid) => Resp2::JobGetId { jobid },
            // Asked for as the job attribute universeSize.
            Reply::UniverseSize(size) => Resp2::GetJobAttr { value: Some(size.to_string()) },
            Reply::JobAttr(value) => Resp2::GetJobAttr { value },
            Reply::Put => Resp2::KvsPut,
            Reply::Get { value, .. } => Resp2::KvsGet { value },
            Reply::Fence => Resp2::KvsFence,
            Reply::PutNodeAttr => Resp2::PutNodeAttr,
            Reply::NodeAttr(value) => Resp2::GetNodeAttr { value },
            Reply::Name(NameAnswer::Published(true)) => Resp2::NamePublish,
            Reply::Name(NameAnswer::Published(false)) => {
                failed("name-publish", "duplicate_service")
            }
            Reply::Name(NameAnswer::Unpublished(true)) => Resp2::NameUnpublish,
            Reply::Name(NameAnswer::Unpublished(false)) => {
                failed("name-unpublish", "service_not_found")
            }
            Reply::Name(NameAnswer::Lookup(value)) => {
                let port = match value {
                    Some(NameValue::Text(port)) => Some(port),
                    _ => None,
                };
                Resp2::NameLookup { port }
            }
            Reply::Spawn { jobid } => Resp2::Spawn { jobid },
            Reply::SpawnFailed { reason } => failed("spawn-response", &reason),
            Reply::JobConnect => Resp2::JobConnect,
            Reply::JobDisconnect => Resp2::JobDisconnect,
            Reply::Finalize => Resp2::Finalize,
            Reply::Maxes | Reply::Appnum(_) => return None,
        })
    }

    /// The bytes to send, in `protocol`, echoing `tag` (PMI-2 only); empty when the protocol
    /// has no such reply.
    pub fn encode(self, protocol: Protocol, tag: Option<&str>) -> Vec<u8> {
        match protocol {
            Protocol::Pmi1 => self.into_pmi1().map(|r| r.encode()),
            Protocol::Pmi2 => self.into_pmi2().map(|r| r.encode(tag)),
        }
        .unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pmi1(reply: Reply) -> String {
        String::from_utf8(reply.encode(Protocol::Pmi1, Some("ignored"))).unwrap()
    }

    /// The body only: the length header is pmi2.rs's business.
    fn pmi2(reply: Reply, tag: Option<&str>) -> String {
        let frame = reply.encode(Protocol::Pmi2, tag);
        String::from_utf8(frame.get(6..).unwrap_or_default().to_vec()).unwrap()
    }

    fn s(text: &str) -> String {
        text.to_string()
    }

    /// Every reply, its PMI-1 line and its PMI-2 body ("" where the protocol has none).
    fn all() -> Vec<(Reply, &'static str, &'static str)> {
        vec![
            (
                Reply::FullInit { rank: 1, size: 2, appnum: 0, spawner: None },
                "",
                "cmd=fullinit-response;pmi-version=2;pmi-subversion=0;rank=1;size=2;appnum=0;\
                 debugged=FALSE;pmiverbose=FALSE;rc=0;",
            ),
            (
                Reply::FullInit { rank: 0, size: 1, appnum: 2, spawner: Some(s("kvs_1")) },
                "",
                "cmd=fullinit-response;pmi-version=2;pmi-subversion=0;rank=0;size=1;appnum=2;\
                 spawner-jobid=kvs_1;debugged=FALSE;pmiverbose=FALSE;rc=0;",
            ),
            (Reply::Maxes, "cmd=maxes kvsname_max=256 keylen_max=64 vallen_max=1024\n", ""),
            (Reply::Appnum(3), "cmd=appnum appnum=3\n", ""),
            (
                Reply::Kvsname(s("kvs_1")),
                "cmd=my_kvsname kvsname=kvs_1\n",
                "cmd=job-getid-response;jobid=kvs_1;rc=0;",
            ),
            (
                Reply::UniverseSize(4),
                "cmd=universe_size size=4\n",
                "cmd=info-getjobattr-response;found=TRUE;value=4;rc=0;",
            ),
            (
                Reply::JobAttr(Some(s("(vector,(0,1,2))"))),
                "",
                "cmd=info-getjobattr-response;found=TRUE;value=(vector,(0,1,2));rc=0;",
            ),
            (Reply::JobAttr(None), "", "cmd=info-getjobattr-response;found=FALSE;rc=0;"),
            (Reply::Put, "cmd=put_result rc=0 msg=success\n", "cmd=kvs-put-response;rc=0;"),
            (
                Reply::Get { key: s("k"), value: Some(s("a;b")) },
                "cmd=get_result rc=0 msg=success value=a;b\n",
                "cmd=kvs-get-response;found=TRUE;value=a;;b;rc=0;",
            ),
            (
                Reply::Get { key: s("k"), value: None },
                "cmd=get_result rc=-1 msg=key_k_not_found value=unknown\n",
                "cmd=kvs-get-response;found=FALSE;rc=0;",
            ),
            (Reply::Fence, "cmd=barrier_out\n", "cmd=kvs-fence-response;rc=0;"),
            (Reply::PutNodeAttr, "", "cmd=info-putnodeattr-response;rc=0;"),
            (
                Reply::NodeAttr(Some(s("v"))),
                "",
                "cmd=info-getnodeattr-response;found=TRUE;value=v;rc=0;",
            ),
            (Reply::NodeAttr(None), "", "cmd=info-getnodeattr-response;found=FALSE;rc=0;"),
            (
                Reply::Name(NameAnswer::Published(true)),
                "cmd=publish_result info=ok rc=0 msg=success\n",
                "cmd=name-publish-response;rc=0;",
            ),
            (
                Reply::Name(NameAnswer::Published(false)),
                "cmd=publish_result info=ok rc=1 msg=key_already_present\n",
                "cmd=name-publish-response;rc=1;errmsg=duplicate_service;",
            ),
            (
                Reply::Name(NameAnswer::Unpublished(true)),
                "cmd=unpublish_result info=ok rc=0 msg=success\n",
                "cmd=name-unpublish-response;rc=0;",
            ),
            (
                Reply::Name(NameAnswer::Unpublished(false)),
                "cmd=unpublish_result info=ok rc=1 msg=service_not_found\n",
                "cmd=name-unpublish-response;rc=1;errmsg=service_not_found;",
            ),
            (
                Reply::Name(NameAnswer::Lookup(Some(NameValue::Text(s("P"))))),
                "cmd=lookup_result port=P info=ok rc=0 msg=success\n",
                "cmd=name-lookup-response;port=P;found=TRUE;rc=0;",
            ),
            (
                Reply::Name(NameAnswer::Lookup(None)),
                "cmd=lookup_result rc=1 msg=service_not_found\n",
                "cmd=name-lookup-response;found=FALSE;rc=1;",
            ),
            (
                Reply::Spawn { jobid: s("kvs_2") },
                "cmd=spawn_result rc=0\n",
                "cmd=spawn-response;rc=0;jobid=kvs_2;nerrs=0;",
            ),
            (Reply::JobConnect, "", "cmd=job-connect-response;kvscopy=FALSE;rc=0;"),
            (Reply::JobDisconnect, "", "cmd=job-disconnect-response;rc=0;"),
            (Reply::Finalize, "cmd=finalize_ack\n", "cmd=finalize-response;rc=0;"),
        ]
    }

    #[test]
    fn every_reply_in_both_protocols() {
        for (reply, line, body) in all() {
            assert_eq!(pmi1(reply.clone()), line, "{reply:?}");
            assert_eq!(pmi2(reply, None), body);
        }
    }

    #[test]
    fn pmi2_replies_echo_the_tag_after_cmd() {
        for (reply, _, body) in all().into_iter().filter(|(_, _, body)| !body.is_empty()) {
            let (cmd, rest) = body.split_once(';').unwrap();
            assert_eq!(pmi2(reply, Some("0x7f")), format!("{cmd};thrid=0x7f;{rest}"));
        }
    }

    #[test]
    fn pmi2_frames_carry_their_length() {
        assert_eq!(
            Reply::Finalize.encode(Protocol::Pmi2, None),
            b"    27cmd=finalize-response;rc=0;"
        );
    }
}
