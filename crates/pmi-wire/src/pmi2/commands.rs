//! The typed layer over [`Command`]: requests a rank sends and the replies it gets, with
//! their keys, counts and defaults (docs/pmi.md, *PMI-2*).

use std::collections::HashMap;
use std::str::FromStr;

use super::{missing, parse_frame, to_bool, to_number, Command, Pmi2Error};

/// A request from a rank (§3.3).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Request {
    /// `rank` comes from `pmirank` (or `pmiid`), sent only when the client's environment had
    /// one; `jobid` is the client's `PMI_JOBID`.
    FullInit {
        rank: Option<u32>,
        jobid: Option<String>,
        threaded: bool,
    },
    JobGetId,
    GetJobAttr {
        key: String,
    },
    KvsPut {
        key: String,
        value: String,
    },
    KvsFence,
    /// `srcid` is the putter's rank if the client knows it (-1 otherwise).
    KvsGet {
        jobid: Option<String>,
        srcid: Option<i64>,
        key: String,
    },
    PutNodeAttr {
        key: String,
        value: String,
    },
    /// With `wait` the reply is held until some rank on the node puts `key`.
    GetNodeAttr {
        key: String,
        wait: bool,
    },
    NamePublish {
        name: String,
        port: String,
        info: Vec<(String, String)>,
    },
    NameLookup {
        name: String,
        info: Vec<(String, String)>,
    },
    NameUnpublish {
        name: String,
        info: Vec<(String, String)>,
    },
    Spawn(Box<Spawn>),
    /// No exit code travels in PMI-2; the server picks a non-zero one.
    Abort {
        isworld: bool,
        msg: String,
    },
    JobConnect {
        jobid: String,
    },
    JobDisconnect {
        jobid: String,
    },
    Finalize,
    /// A well-formed command we do not serve, kept whole so the server can name it.
    Unknown(Command),
}

/// `PMI2_Job_Spawn`: all executables of one `MPI_Comm_spawn_multiple`, in one frame.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Spawn {
    /// Pairs to store in the new job's KVS before its ranks start.
    pub preput: Vec<(String, String)>,
    pub subcmds: Vec<SpawnSubcmd>,
}

#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct SpawnSubcmd {
    pub exe: String,
    pub maxprocs: u32,
    /// Arguments after the executable (`argv0` is the first of them).
    pub argv: Vec<String>,
    pub info: Vec<(String, String)>,
}

/// A typed request with the thread tag its reply must echo.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Envelope {
    pub thrid: Option<String>,
    pub request: Request,
}

/// [`parse_frame`], then [`Request::from_command`].
pub fn parse_request(buf: &[u8]) -> Result<Option<(Envelope, usize)>, Pmi2Error> {
    let Some((command, used)) = parse_frame(buf)? else { return Ok(None) };
    let thrid = command.thrid().map(str::to_string);
    Ok(Some((Envelope { thrid, request: Request::from_command(&command)? }, used)))
}

/// First occurrence of every key; keeps indexed lookups (`argvN`, `ppkeyN`) linear.
fn index<'a>(pairs: impl IntoIterator<Item = &'a (String, String)>) -> HashMap<&'a str, &'a str> {
    let mut map = HashMap::new();
    for (k, v) in pairs {
        map.entry(k.as_str()).or_insert(v.as_str());
    }
    map
}

/// Typed lookups over one group of pairs, with errors naming the command.
struct Fields<'a> {
    cmd: &'a str,
    map: HashMap<&'a str, &'a str>,
}

impl<'a> Fields<'a> {
    fn get(&self, key: &str) -> Result<&'a str, Pmi2Error> {
        self.map.get(key).copied().ok_or_else(|| missing(self.cmd, key))
    }

    fn string(&self, key: &str) -> Result<String, Pmi2Error> {
        self.get(key).map(str::to_string)
    }

    fn number<T: FromStr>(&self, key: &str) -> Result<T, Pmi2Error> {
        to_number(self.cmd, key, self.get(key)?)
    }

    /// Counts and flags that clients may leave out.
    fn number_or<T: FromStr>(&self, key: &str, default: T) -> Result<T, Pmi2Error> {
        if self.map.contains_key(key) {
            self.number(key)
        } else {
            Ok(default)
        }
    }

    fn boolean_or(&self, key: &str, default: bool) -> Result<bool, Pmi2Error> {
        self.map.get(key).map_or(Ok(default), |v| to_bool(self.cmd, key, v))
    }

    /// `count` pairs stored as `<key>0`, `<val>0`, `<key>1`, ...
    fn indexed_pairs(
        &self,
        count: &str,
        key: &str,
        val: &str,
    ) -> Result<Vec<(String, String)>, Pmi2Error> {
        (0..self.number_or::<u32>(count, 0)?)
            .map(|i| Ok((self.string(&format!("{key}{i}"))?, self.string(&format!("{val}{i}"))?)))
            .collect()
    }

    fn info(&self) -> Result<Vec<(String, String)>, Pmi2Error> {
        self.indexed_pairs("infokeycount", "infokey", "infoval")
    }
}

impl Request {
    pub fn from_command(command: &Command) -> Result<Request, Pmi2Error> {
        let f = Fields { cmd: &command.cmd, map: index(&command.pairs) };
        Ok(match command.cmd.as_str() {
            "fullinit" => Request::FullInit {
                rank: match f.map.get("pmirank").or(f.map.get("pmiid")) {
                    Some(v) => Some(to_number(&command.cmd, "pmirank", v)?),
                    None => None,
                },
                jobid: f.map.get("pmijobid").map(|v| v.to_string()),
                threaded: f.boolean_or("threaded", false)?,
            },
            "job-getid" => Request::JobGetId,
            "info-getjobattr" => Request::GetJobAttr { key: f.string("key")? },
            "kvs-put" => Request::KvsPut { key: f.string("key")?, value: f.string("value")? },
            "kvs-fence" => Request::KvsFence,
            "kvs-get" => Request::KvsGet {
                jobid: f.map.get("jobid").map(|v| v.to_string()),
                srcid: match f.map.get("srcid") {
                    Some(v) => Some(to_number(&command.cmd, "srcid", v)?),
                    None => None,
                },
                key: f.string("key")?,
            },
            "info-putnodeattr" => {
                Request::PutNodeAttr { key: f.string("key")?, value: f.string("value")? }
            }
            "info-getnodeattr" => {
                Request::GetNodeAttr { key: f.string("key")?, wait: f.boolean_or("wait", false)? }
            }
            "name-publish" => Request::NamePublish {
                name: f.string("name")?,
                port: f.string("port")?,
                info: f.info()?,
            },
            "name-lookup" => Request::NameLookup { name: f.string("name")?, info: f.info()? },
            "name-unpublish" => Request::NameUnpublish { name: f.string("name")?, info: f.info()? },
            "spawn" => Request::Spawn(Box::new(spawn_from_command(command, &f)?)),
            "abort" => Request::Abort {
                isworld: f.boolean_or("isworld", true)?,
                msg: f.map.get("msg").unwrap_or(&"").to_string(),
            },
            "job-connect" => Request::JobConnect { jobid: f.string("jobid")? },
            "job-disconnect" => Request::JobDisconnect { jobid: f.string("jobid")? },
            "finalize" => Request::Finalize,
            _ => Request::Unknown(command.clone()),
        })
    }

    /// The command a client sends (no `thrid`).
    pub fn to_command(&self) -> Command {
        let info = |mut c: Command, info: &[(String, String)]| {
            c = c.with("infokeycount", info.len().to_string());
            for (i, (k, v)) in info.iter().enumerate() {
                c = c.with(format!("infokey{i}"), k).with(format!("infoval{i}"), v);
            }
            c
        };
        match self {
            Request::FullInit { rank, jobid, threaded } => {
                let mut c = Command::new("fullinit");
                if let Some(rank) = rank {
                    c = c.with("pmirank", rank.to_string());
                }
                if let Some(jobid) = jobid {
                    c = c.with("pmijobid", jobid);
                }
                c.with_bool("threaded", *threaded)
            }
            Request::JobGetId => Command::new("job-getid"),
            Request::GetJobAttr { key } => Command::new("info-getjobattr").with("key", key),
            Request::KvsPut { key, value } => {
                Command::new("kvs-put").with("key", key).with("value", value)
            }
            Request::KvsFence => Command::new("kvs-fence"),
            Request::KvsGet { jobid, srcid, key } => {
                let mut c = Command::new("kvs-get");
                if let Some(jobid) = jobid {
                    c = c.with("jobid", jobid);
                }
                if let Some(srcid) = srcid {
                    c = c.with("srcid", srcid.to_string());
                }
                c.with("key", key)
            }
            Request::PutNodeAttr { key, value } => {
                Command::new("info-putnodeattr").with("key", key).with("value", value)
            }
            Request::GetNodeAttr { key, wait } => {
                Command::new("info-getnodeattr").with("key", key).with_bool("wait", *wait)
            }
            Request::NamePublish { name, port, info: i } => {
                info(Command::new("name-publish").with("name", name).with("port", port), i)
            }
            Request::NameLookup { name, info: i } => {
                info(Command::new("name-lookup").with("name", name), i)
            }
            Request::NameUnpublish { name, info: i } => {
                info(Command::new("name-unpublish").with("name", name), i)
            }
            Request::Spawn(spawn) => spawn.to_command(),
            Request::Abort { isworld, msg } => {
                Command::new("abort").with_bool("isworld", *isworld).with("msg", msg)
            }
            Request::JobConnect { jobid } => Command::new("job-connect").with("jobid", jobid),
            Request::JobDisconnect { jobid } => Command::new("job-disconnect").with("jobid", jobid),
            Request::Finalize => Command::new("finalize"),
            Request::Unknown(command) => command.clone(),
        }
    }
}

/// The per-executable keys repeat once per `subcmd`, so the frame is read in order: each
/// `subcmd` opens a group that runs to the next one.
fn spawn_from_command(command: &Command, f: &Fields<'_>) -> Result<Spawn, Pmi2Error> {
    let ncmds: u32 = f.number("ncmds")?;
    let first_sub =
        command.pairs.iter().position(|(k, _)| k == "subcmd").unwrap_or(command.pairs.len());
    let (head, mut rest) = command.pairs.split_at(first_sub);
    let head = Fields { cmd: f.cmd, map: index(head) };
    let preput = head.indexed_pairs("preputcount", "ppkey", "ppval")?;
    let mut groups: Vec<&[(String, String)]> = Vec::new();
    while let Some(((_, _), tail)) = rest.split_first() {
        let end = tail.iter().position(|(k, _)| k == "subcmd").map_or(rest.len(), |p| p + 1);
        groups.push(&rest[..end]);
        rest = &rest[end..];
    }
    if groups.len() != ncmds as usize {
        return Err(Pmi2Error::SpawnCount { ncmds, found: groups.len() });
    }
    let subcmds = groups
        .into_iter()
        .map(|group| {
            let g = Fields { cmd: f.cmd, map: index(&group[1..]) };
            Ok(SpawnSubcmd {
                exe: group[0].1.clone(),
                maxprocs: g.number("maxprocs")?,
                argv: (0..g.number_or::<u32>("argc", 0)?)
                    .map(|i| g.string(&format!("argv{i}")))
                    .collect::<Result<_, _>>()?,
                info: g.info()?,
            })
        })
        .collect::<Result<_, Pmi2Error>>()?;
    Ok(Spawn { preput, subcmds })
}

impl Spawn {
    fn to_command(&self) -> Command {
        let mut c = Command::new("spawn")
            .with("ncmds", self.subcmds.len().to_string())
            .with("preputcount", self.preput.len().to_string());
        for (i, (k, v)) in self.preput.iter().enumerate() {
            c = c.with(format!("ppkey{i}"), k).with(format!("ppval{i}"), v);
        }
        for sub in &self.subcmds {
            c = c
                .with("subcmd", &sub.exe)
                .with("maxprocs", sub.maxprocs.to_string())
                .with("argc", sub.argv.len().to_string());
            for (i, arg) in sub.argv.iter().enumerate() {
                c = c.with(format!("argv{i}"), arg);
            }
            c = c.with("infokeycount", sub.info.len().to_string());
            for (i, (k, v)) in sub.info.iter().enumerate() {
                c = c.with(format!("infokey{i}"), k).with(format!("infoval{i}"), v);
            }
        }
        c
    }
}

/// A reply from the server, worded as Hydra words it (§3.3).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Response {
    /// `spawner_jobid` is set only for spawned jobs; its presence is what marks them.
    FullInit {
        rank: u32,
        size: u32,
        appnum: u32,
        spawner_jobid: Option<String>,
    },
    JobGetId {
        jobid: String,
    },
    GetJobAttr {
        value: Option<String>,
    },
    KvsPut,
    KvsFence,
    KvsGet {
        value: Option<String>,
    },
    PutNodeAttr,
    GetNodeAttr {
        value: Option<String>,
    },
    NamePublish,
    NameLookup {
        port: Option<String>,
    },
    NameUnpublish,
    Spawn {
        jobid: String,
    },
    JobConnect,
    JobDisconnect,
    Finalize,
    /// Any request refused: `rc=1` and a message. `cmd` is the request's command.
    Failed {
        cmd: String,
        errmsg: String,
    },
}

impl Response {
    /// The reply as a command, `thrid` echoed right after `cmd`.
    pub fn to_command(&self, thrid: Option<&str>) -> Command {
        let reply = |cmd: &str| Command::response(cmd, thrid);
        let found = |c: Command, value: &Option<String>| match value {
            Some(v) => c.with_bool("found", true).with("value", v).ok(),
            None => c.with_bool("found", false).ok(),
        };
        match self {
            Response::FullInit { rank, size, appnum, spawner_jobid } => {
                let mut c = reply("fullinit")
                    .with("pmi-version", "2")
                    .with("pmi-subversion", "0")
                    .with("rank", rank.to_string())
                    .with("size", size.to_string())
                    .with("appnum", appnum.to_string());
                if let Some(parent) = spawner_jobid {
                    c = c.with("spawner-jobid", parent);
                }
                c.with_bool("debugged", false).with_bool("pmiverbose", false).ok()
            }
            Response::JobGetId { jobid } => reply("job-getid").with("jobid", jobid).ok(),
            Response::GetJobAttr { value } => found(reply("info-getjobattr"), value),
            Response::KvsPut => reply("kvs-put").ok(),
            Response::KvsFence => reply("kvs-fence").ok(),
            Response::KvsGet { value } => found(reply("kvs-get"), value),
            Response::PutNodeAttr => reply("info-putnodeattr").ok(),
            Response::GetNodeAttr { value } => found(reply("info-getnodeattr"), value),
            Response::NamePublish => reply("name-publish").ok(),
            Response::NameLookup { port: Some(port) } => {
                reply("name-lookup").with("port", port).with_bool("found", true).ok()
            }
            // Hydra's miss is rc=1 with found=FALSE and no errmsg.
            Response::NameLookup { port: None } => {
                reply("name-lookup").with_bool("found", false).with("rc", "1")
            }
            Response::NameUnpublish => reply("name-unpublish").ok(),
            Response::Spawn { jobid } => {
                reply("spawn").with("rc", "0").with("jobid", jobid).with("nerrs", "0")
            }
            Response::JobConnect => reply("job-connect").with_bool("kvscopy", false).ok(),
            Response::JobDisconnect => reply("job-disconnect").ok(),
            Response::Finalize => reply("finalize").ok(),
            Response::Failed { cmd, errmsg } => reply(cmd).failed(1, errmsg),
        }
    }

    /// The whole frame, right-justified header.
    pub fn encode(&self, thrid: Option<&str>) -> Vec<u8> {
        self.to_command(thrid).encode()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_roundtrip() {
        let all = [
            Request::FullInit { rank: Some(0), jobid: None, threaded: false },
            Request::FullInit { rank: None, jobid: Some("j".into()), threaded: true },
            Request::JobGetId,
            Request::GetJobAttr { key: "PMI_process_mapping".into() },
            Request::KvsPut { key: "k".into(), value: "a;b".into() },
            Request::KvsFence,
            Request::KvsGet { jobid: Some("kvs_1".into()), srcid: Some(-1), key: "k".into() },
            Request::PutNodeAttr { key: "k".into(), value: "v".into() },
            Request::GetNodeAttr { key: "k".into(), wait: true },
            Request::NamePublish { name: "s".into(), port: "p".into(), info: vec![] },
            Request::NameLookup { name: "s".into(), info: vec![("a".into(), "b".into())] },
            Request::NameUnpublish { name: "s".into(), info: vec![] },
            Request::Spawn(Box::new(Spawn {
                preput: vec![("PARENT_ROOT_PORT_NAME".into(), "port;1".into())],
                subcmds: vec![
                    SpawnSubcmd {
                        exe: "/bin/a".into(),
                        maxprocs: 2,
                        argv: vec!["x y".into(), "z".into()],
                        info: vec![("wdir".into(), "/tmp".into())],
                    },
                    SpawnSubcmd { exe: "/bin/b".into(), maxprocs: 1, argv: vec![], info: vec![] },
                ],
            })),
            Request::Abort { isworld: true, msg: "out of cheese".into() },
            Request::JobConnect { jobid: "j".into() },
            Request::JobDisconnect { jobid: "j".into() },
            Request::Finalize,
            Request::Unknown(Command::new("frobnicate").with("a", "b")),
        ];
        for req in all {
            let mut command = req.to_command();
            command.pairs.insert(0, ("thrid".into(), "0x7f".into()));
            let (env, used) = parse_request(&command.encode_left()).unwrap().unwrap();
            assert_eq!(used, command.encode_left().len());
            assert_eq!(env.thrid.as_deref(), Some("0x7f"));
            match req {
                // Kept whole, thrid included, so that the server can name and answer it.
                Request::Unknown(_) => assert_eq!(env.request, Request::Unknown(command)),
                req => assert_eq!(env.request, req),
            }
        }
    }

    #[test]
    fn captured_requests_parse() {
        let (env, _) =
            parse_request(b"38    cmd=fullinit;pmirank=0;threaded=FALSE;").unwrap().unwrap();
        assert_eq!(env.request, Request::FullInit { rank: Some(0), jobid: None, threaded: false });
        let body = "cmd=spawn;ncmds=1;preputcount=0;subcmd=/bin/a;maxprocs=1;argc=2;argv0=x;";
        let frame = format!("{:<6}{body}", body.len());
        assert_eq!(
            parse_request(frame.as_bytes()),
            Err(Pmi2Error::MissingKey { cmd: "spawn".into(), key: "argv1".into() })
        );
        let body = "cmd=spawn;ncmds=2;preputcount=0;subcmd=/bin/a;maxprocs=1;";
        let frame = format!("{:<6}{body}", body.len());
        assert_eq!(
            parse_request(frame.as_bytes()),
            Err(Pmi2Error::SpawnCount { ncmds: 2, found: 1 })
        );
    }

    #[test]
    fn replies_are_hydras_words() {
        let body = |r: Response, thrid: Option<&str>| r.to_command(thrid).body();
        assert_eq!(
            body(Response::FullInit { rank: 0, size: 2, appnum: 0, spawner_jobid: None }, None),
            "cmd=fullinit-response;pmi-version=2;pmi-subversion=0;rank=0;size=2;appnum=0;\
             debugged=FALSE;pmiverbose=FALSE;rc=0;"
        );
        assert_eq!(
            body(Response::GetJobAttr { value: Some("(vector,(0,1,1))".into()) }, None),
            "cmd=info-getjobattr-response;found=TRUE;value=(vector,(0,1,1));rc=0;"
        );
        assert_eq!(
            body(Response::KvsGet { value: None }, None),
            "cmd=kvs-get-response;found=FALSE;rc=0;"
        );
        assert_eq!(body(Response::KvsFence, Some("t1")), "cmd=kvs-fence-response;thrid=t1;rc=0;");
        assert_eq!(
            body(Response::NameLookup { port: None }, None),
            "cmd=name-lookup-response;found=FALSE;rc=1;"
        );
        assert_eq!(
            body(
                Response::Failed {
                    cmd: "name-publish".into(),
                    errmsg: "duplicate_service_S".into()
                },
                None
            ),
            "cmd=name-publish-response;rc=1;errmsg=duplicate_service_S;"
        );
        assert_eq!(
            body(Response::Spawn { jobid: "kvs_2".into() }, None),
            "cmd=spawn-response;rc=0;jobid=kvs_2;nerrs=0;"
        );
        assert_eq!(
            body(Response::JobConnect, None),
            "cmd=job-connect-response;kvscopy=FALSE;rc=0;"
        );
        let frame = Response::Finalize.encode(None);
        assert_eq!(frame, b"    27cmd=finalize-response;rc=0;");
        let request = Command::new("kvs-get").with("thrid", "9").with("key", "k");
        assert_eq!(Command::reply_to(&request).ok().body(), "cmd=kvs-get-response;thrid=9;rc=0;");
    }
}
