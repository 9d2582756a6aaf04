//! The messages between a proxy and its PMIx host process (`pmix/host.c`), and their codec.
//! A message is a little-endian u32 length, a tag byte, then fields: u32/i32 little-endian,
//! strings and blobs as a u32 length and the bytes. Pure: no I/O.
//!
//! ```text
//!   proxy ──Command──► host: Setup, Clients, FenceDone, OpDone, LookupDone
//!   proxy ◄──Event──── host: Ready, Env, Fence, Abort, Publish, Lookup, ...
//! ```

/// A PMIx status: 0 is success, negative values are PMIx's error codes.
pub type Status = i32;

pub const SUCCESS: Status = 0;
pub const ERR_NOT_FOUND: Status = -46;
pub const ERR_NOT_SUPPORTED: Status = -47;
pub const ERR_DUPLICATE_KEY: Status = -53;

/// Proxy to host.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Command {
    /// Register the job's namespace (node `node` of `hosts`) and define its process sets.
    Setup {
        nspace: String,
        jobid: String,
        node: u32,
        hosts: Vec<String>,
        rank_node: Vec<u32>,
        rank_app: Vec<u32>,
        psets: Vec<(String, Vec<u32>)>,
    },
    /// Register these local ranks as clients and answer each with its environment.
    Clients { uid: u32, gid: u32, ranks: Vec<u32> },
    /// A fence the host entered (its `id`) is complete with every node's data, or a direct
    /// modex request is answered.
    ModexDone { id: u32, status: Status, data: Vec<u8> },
    /// An abort, publish or unpublish is done.
    OpDone { id: u32, status: Status },
    /// A lookup is done: (key, value, publisher's rank) found.
    LookupDone { id: u32, status: Status, found: Vec<(String, String, u32)> },
}

/// Host to proxy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    /// The server is up; libpmix's version string.
    Ready {
        version: String,
    },
    /// The server cannot serve the job; why.
    Failed {
        why: String,
    },
    /// The namespace is registered.
    SetupDone,
    /// A rank's environment from `PMIx_server_setup_fork` (`NAME=value` each), or the
    /// status that kept it from one.
    Env {
        rank: u32,
        status: Status,
        vars: Vec<Vec<u8>>,
    },
    /// Every local rank entered a fence over the whole job; `data` is this node's share.
    Fence {
        id: u32,
        collect: bool,
        data: Vec<u8>,
    },
    /// A rank called `PMIx_Abort`.
    Abort {
        id: u32,
        rank: u32,
        status: i32,
        msg: String,
    },
    Publish {
        id: u32,
        rank: u32,
        pairs: Vec<(String, String)>,
    },
    Lookup {
        id: u32,
        rank: u32,
        keys: Vec<String>,
    },
    Unpublish {
        id: u32,
        rank: u32,
        keys: Vec<String>,
    },
    Connected {
        rank: u32,
    },
    Finalized {
        rank: u32,
    },
    /// libpmix wants a rank's data from the node that owns it (direct modex).
    Dmodex {
        id: u32,
        rank: u32,
    },
    /// Something worth a line in the log.
    Notice {
        text: String,
    },
}

/// Why a message from the host cannot be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WireError {
    #[error("a message from the PMIx host is cut short")]
    Short,
    #[error("unknown message {0} from the PMIx host")]
    UnknownTag(u8),
}

/// Longest message either side accepts.
pub const MAX_MESSAGE: usize = 1 << 30;

struct Out(Vec<u8>);

impl Out {
    fn new(tag: u8) -> Out {
        Out(vec![0, 0, 0, 0, tag])
    }
    fn u32(&mut self, v: u32) {
        self.0.extend_from_slice(&v.to_le_bytes());
    }
    fn i32(&mut self, v: i32) {
        self.0.extend_from_slice(&v.to_le_bytes());
    }
    fn bytes(&mut self, b: &[u8]) {
        self.u32(b.len() as u32);
        self.0.extend_from_slice(b);
    }
    fn str(&mut self, s: &str) {
        self.bytes(s.as_bytes());
    }
    fn done(mut self) -> Vec<u8> {
        let len = (self.0.len() - 4) as u32;
        self.0[..4].copy_from_slice(&len.to_le_bytes());
        self.0
    }
}

impl Command {
    /// The message, length prefix included.
    pub fn encode(&self) -> Vec<u8> {
        match self {
            Command::Setup { nspace, jobid, node, hosts, rank_node, rank_app, psets } => {
                let mut o = Out::new(1);
                o.str(nspace);
                o.str(jobid);
                o.u32(rank_node.len() as u32);
                o.u32(*node);
                o.u32(hosts.len() as u32);
                hosts.iter().for_each(|h| o.str(h));
                rank_node.iter().for_each(|n| o.u32(*n));
                rank_app.iter().for_each(|a| o.u32(*a));
                o.u32(psets.len() as u32);
                for (name, members) in psets {
                    o.str(name);
                    o.u32(members.len() as u32);
                    members.iter().for_each(|m| o.u32(*m));
                }
                o.done()
            }
            Command::Clients { uid, gid, ranks } => {
                let mut o = Out::new(2);
                o.u32(*uid);
                o.u32(*gid);
                o.u32(ranks.len() as u32);
                ranks.iter().for_each(|r| o.u32(*r));
                o.done()
            }
            Command::ModexDone { id, status, data } => {
                let mut o = Out::new(3);
                o.u32(*id);
                o.i32(*status);
                o.bytes(data);
                o.done()
            }
            Command::OpDone { id, status } => {
                let mut o = Out::new(4);
                o.u32(*id);
                o.i32(*status);
                o.done()
            }
            Command::LookupDone { id, status, found } => {
                let mut o = Out::new(5);
                o.u32(*id);
                o.i32(*status);
                o.u32(found.len() as u32);
                for (key, value, rank) in found {
                    o.str(key);
                    o.str(value);
                    o.u32(*rank);
                }
                o.done()
            }
        }
    }
}

struct In<'a>(&'a [u8]);

impl In<'_> {
    fn u32(&mut self) -> Result<u32, WireError> {
        let (head, rest) = self.0.split_first_chunk::<4>().ok_or(WireError::Short)?;
        self.0 = rest;
        Ok(u32::from_le_bytes(*head))
    }
    fn i32(&mut self) -> Result<i32, WireError> {
        self.u32().map(|v| v as i32)
    }
    fn bytes(&mut self) -> Result<Vec<u8>, WireError> {
        let n = self.u32()? as usize;
        if self.0.len() < n {
            return Err(WireError::Short);
        }
        let (head, rest) = self.0.split_at(n);
        self.0 = rest;
        Ok(head.to_vec())
    }
    fn str(&mut self) -> Result<String, WireError> {
        Ok(String::from_utf8_lossy(&self.bytes()?).into_owned())
    }
    /// A count of items that each take at least `min` bytes, checked against what is left.
    fn count(&mut self, min: usize) -> Result<usize, WireError> {
        let n = self.u32()? as usize;
        if n.saturating_mul(min) > self.0.len() {
            return Err(WireError::Short);
        }
        Ok(n)
    }
    fn strs(&mut self) -> Result<Vec<String>, WireError> {
        let n = self.count(4)?;
        (0..n).map(|_| self.str()).collect()
    }
}

impl Event {
    /// Decodes one message body (after the length prefix).
    pub fn decode(body: &[u8]) -> Result<Event, WireError> {
        let (&tag, rest) = body.split_first().ok_or(WireError::Short)?;
        let mut i = In(rest);
        Ok(match tag {
            101 => Event::Ready { version: i.str()? },
            102 => Event::Failed { why: i.str()? },
            103 => {
                let rank = i.u32()?;
                let status = i.i32()?;
                let n = i.count(4)?;
                let vars = (0..n).map(|_| i.bytes()).collect::<Result<_, _>>()?;
                Event::Env { rank, status, vars }
            }
            104 => Event::Fence { id: i.u32()?, collect: i.u32()? != 0, data: i.bytes()? },
            105 => Event::Abort { id: i.u32()?, rank: i.u32()?, status: i.i32()?, msg: i.str()? },
            106 => {
                let (id, rank) = (i.u32()?, i.u32()?);
                let n = i.count(8)?;
                let pairs = (0..n).map(|_| Ok((i.str()?, i.str()?))).collect::<Result<_, _>>()?;
                Event::Publish { id, rank, pairs }
            }
            107 => Event::Lookup { id: i.u32()?, rank: i.u32()?, keys: i.strs()? },
            108 => Event::Unpublish { id: i.u32()?, rank: i.u32()?, keys: i.strs()? },
            109 => Event::Connected { rank: i.u32()? },
            110 => Event::Finalized { rank: i.u32()? },
            111 => Event::Dmodex { id: i.u32()?, rank: i.u32()? },
            113 => Event::Notice { text: i.str()? },
            114 => Event::SetupDone,
            other => return Err(WireError::UnknownTag(other)),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A host message, built the way host.c builds it.
    fn host_message(tag: u8, fields: &[&[u8]]) -> Vec<u8> {
        let mut body = vec![tag];
        fields.iter().for_each(|f| body.extend_from_slice(f));
        body
    }

    fn blob(b: &[u8]) -> Vec<u8> {
        let mut v = (b.len() as u32).to_le_bytes().to_vec();
        v.extend_from_slice(b);
        v
    }

    #[test]
    fn commands_carry_their_length() {
        let m = Command::OpDone { id: 7, status: ERR_NOT_FOUND }.encode();
        assert_eq!(u32::from_le_bytes(m[..4].try_into().unwrap()) as usize, m.len() - 4);
        assert_eq!(m[4], 4);
        assert_eq!(&m[5..9], &7u32.to_le_bytes());
        assert_eq!(&m[9..13], &(-46i32).to_le_bytes());
    }

    #[test]
    fn events_decode_as_the_host_writes_them() {
        let env = host_message(
            103,
            &[
                &3u32.to_le_bytes(),
                &0i32.to_le_bytes(),
                &2u32.to_le_bytes(),
                &blob(b"A=1"),
                &blob(b"B=2"),
            ],
        );
        assert_eq!(
            Event::decode(&env),
            Ok(Event::Env { rank: 3, status: 0, vars: vec![b"A=1".to_vec(), b"B=2".to_vec()] })
        );
        let fence = host_message(104, &[&1u32.to_le_bytes(), &1u32.to_le_bytes(), &blob(b"xy")]);
        assert_eq!(
            Event::decode(&fence),
            Ok(Event::Fence { id: 1, collect: true, data: b"xy".to_vec() })
        );
    }

    #[test]
    fn cut_or_unknown_messages_are_errors_not_panics() {
        let env =
            host_message(103, &[&3u32.to_le_bytes(), &0i32.to_le_bytes(), &u32::MAX.to_le_bytes()]);
        assert_eq!(Event::decode(&env), Err(WireError::Short));
        for cut in 0..9 {
            let fence =
                host_message(104, &[&1u32.to_le_bytes(), &1u32.to_le_bytes(), &blob(b"xy")]);
            assert!(Event::decode(&fence[..cut]).is_err(), "cut at {cut}");
        }
        assert_eq!(Event::decode(&[99]), Err(WireError::UnknownTag(99)));
    }
}
