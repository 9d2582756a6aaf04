//! The PMI-2 side of the client.

use super::{expect_cmd, pmi1_failure, ClientError, Connection, JobInfo, PmiClient};
use crate::pmi1;
use crate::pmi2::{self, Command};

/// A PMI-2 client: a PMI-1 `init` line, then framed commands.
pub struct Pmi2Client {
    conn: Connection,
    info: JobInfo,
    /// The parent's job id if this job was started by a spawn.
    spawner_jobid: Option<String>,
}

impl Pmi2Client {
    pub fn from_env() -> Result<Pmi2Client, ClientError> {
        Pmi2Client::init(Connection::from_env()?)
    }

    /// The PMI-1 handshake for version 2.0, then `fullinit` and `job-getid`.
    pub fn init(mut conn: Connection) -> Result<Pmi2Client, ClientError> {
        conn.send(&pmi1::Request::Init { version: 2, subversion: 0 }.encode())?;
        let reply = conn.read_line()?;
        expect_cmd(&reply, "response_to_init")?;
        if reply.get("rc") != Some("0") {
            return Err(pmi1_failure("init", &reply));
        }
        let fullinit = pmi2::Request::FullInit {
            rank: conn.rank,
            jobid: conn.pmi_jobid.clone(),
            threaded: false,
        };
        let mut client = Pmi2Client {
            conn,
            info: JobInfo { rank: 0, size: 0, appnum: 0, jobid: String::new() },
            spawner_jobid: None,
        };
        let reply = client.call(&fullinit)?;
        client.info.rank = reply.require_number("rank")?;
        client.info.size = reply.require_number("size")?;
        client.info.appnum = reply.require_number("appnum")?;
        client.spawner_jobid = reply.get("spawner-jobid").map(str::to_string);
        client.info.jobid = client.call(&pmi2::Request::JobGetId)?.require("jobid")?.to_string();
        Ok(client)
    }

    pub fn info(&self) -> &JobInfo {
        &self.info
    }

    /// The parent job's id, if this job was spawned.
    pub fn spawner_jobid(&self) -> Option<&str> {
        self.spawner_jobid.as_deref()
    }

    /// Sends a request and reads its reply, checking only the reply's command.
    fn exchange(&mut self, request: &pmi2::Request) -> Result<Command, ClientError> {
        let command = request.to_command();
        check_frame(&command)?;
        self.conn.send(&command.encode_left())?;
        let reply = self.conn.read_with(pmi2::parse_frame)?;
        let expected = format!("{}-response", command.cmd);
        if reply.cmd != expected {
            return Err(ClientError::UnexpectedReply { expected, got: reply.cmd });
        }
        Ok(reply)
    }

    /// [`exchange`](Self::exchange), failing on a non-zero `rc`.
    fn call(&mut self, request: &pmi2::Request) -> Result<Command, ClientError> {
        let reply = self.exchange(request)?;
        match reply.require_number::<i32>("rc")? {
            0 => Ok(reply),
            rc => {
                let reason = reply.get("errmsg").map_or_else(|| format!("rc={rc}"), str::to_string);
                let op = reply.cmd.trim_end_matches("-response").to_string();
                Err(ClientError::Failed { op, reason })
            }
        }
    }

    /// The `value` of a `found=TRUE` reply.
    fn found_value(reply: &Command) -> Result<Option<String>, ClientError> {
        match reply.boolean("found")? {
            Some(true) => Ok(Some(reply.require("value")?.to_string())),
            _ => Ok(None),
        }
    }

    pub fn put(&mut self, key: &str, value: &str) -> Result<(), ClientError> {
        self.call(&pmi2::Request::KvsPut { key: key.to_string(), value: value.to_string() })
            .map(drop)
    }

    pub fn fence(&mut self) -> Result<(), ClientError> {
        self.call(&pmi2::Request::KvsFence).map(drop)
    }

    pub fn get(&mut self, key: &str) -> Result<Option<String>, ClientError> {
        let request = pmi2::Request::KvsGet {
            jobid: Some(self.info.jobid.clone()),
            srcid: Some(-1),
            key: key.to_string(),
        };
        let reply = self.call(&request)?;
        Pmi2Client::found_value(&reply)
    }

    /// A job attribute such as `PMI_process_mapping` or `universeSize`.
    pub fn get_job_attr(&mut self, key: &str) -> Result<Option<String>, ClientError> {
        let reply = self.call(&pmi2::Request::GetJobAttr { key: key.to_string() })?;
        Pmi2Client::found_value(&reply)
    }

    pub fn put_node_attr(&mut self, key: &str, value: &str) -> Result<(), ClientError> {
        self.call(&pmi2::Request::PutNodeAttr { key: key.to_string(), value: value.to_string() })
            .map(drop)
    }

    /// With `wait`, blocks until some rank on this node puts `key`.
    pub fn get_node_attr(&mut self, key: &str, wait: bool) -> Result<Option<String>, ClientError> {
        let reply = self.call(&pmi2::Request::GetNodeAttr { key: key.to_string(), wait })?;
        Pmi2Client::found_value(&reply)
    }

    pub fn publish(&mut self, name: &str, port: &str) -> Result<(), ClientError> {
        let request = pmi2::Request::NamePublish {
            name: name.to_string(),
            port: port.to_string(),
            info: vec![],
        };
        self.call(&request).map(drop)
    }

    pub fn lookup(&mut self, name: &str) -> Result<Option<String>, ClientError> {
        // A miss is rc=1 with found=FALSE, so the rc alone does not mean failure here.
        let reply =
            self.exchange(&pmi2::Request::NameLookup { name: name.to_string(), info: vec![] })?;
        match (reply.boolean("found")?, reply.number::<i32>("rc")?) {
            (Some(true), Some(0)) => Ok(Some(reply.require("port")?.to_string())),
            _ => Ok(None),
        }
    }

    pub fn unpublish(&mut self, name: &str) -> Result<(), ClientError> {
        self.call(&pmi2::Request::NameUnpublish { name: name.to_string(), info: vec![] }).map(drop)
    }

    /// Asks the launcher to kill the whole job, naming the reason; there is no reply.
    pub fn abort(&mut self, msg: &str) -> Result<(), ClientError> {
        let command = pmi2::Request::Abort { isworld: true, msg: msg.to_string() }.to_command();
        check_frame(&command)?;
        self.conn.send(&command.encode_left())
    }

    pub fn finalize(&mut self) -> Result<(), ClientError> {
        self.call(&pmi2::Request::Finalize)?;
        self.conn.shutdown();
        Ok(())
    }
}

/// The limits the server enforces, checked before sending so the caller gets the reason.
pub(crate) fn check_frame(command: &Command) -> Result<(), ClientError> {
    let invalid = |what: String, reason| Err(ClientError::Invalid { what, reason });
    for (key, value) in &command.pairs {
        if key.len() > pmi2::MAX_KEY {
            return invalid(format!("key {key:?}"), "pmi-2 keys are at most 64 bytes");
        }
        if key.is_empty() || key.contains(['=', ';']) {
            return invalid(
                format!("key {key:?}"),
                "pmi-2 keys cannot be empty or hold '=' or ';'",
            );
        }
        if value.len() > pmi2::MAX_VALUE {
            return invalid(format!("the value of {key}"), "pmi-2 values are at most 1024 bytes");
        }
    }
    if command.body().len() > pmi2::MAX_BODY {
        return invalid(format!("a {} request", command.cmd), "pmi-2 frames are at most 64 KiB");
    }
    Ok(())
}

impl PmiClient for Pmi2Client {
    fn info(&self) -> &JobInfo {
        &self.info
    }
    fn put(&mut self, key: &str, value: &str) -> Result<(), ClientError> {
        Pmi2Client::put(self, key, value)
    }
    fn fence(&mut self) -> Result<(), ClientError> {
        Pmi2Client::fence(self)
    }
    fn get(&mut self, key: &str) -> Result<Option<String>, ClientError> {
        Pmi2Client::get(self, key)
    }
    fn finalize(&mut self) -> Result<(), ClientError> {
        Pmi2Client::finalize(self)
    }
    fn abort(&mut self, _exitcode: i32, msg: &str) -> Result<(), ClientError> {
        Pmi2Client::abort(self, msg)
    }
}
