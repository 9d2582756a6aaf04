//! The PMI-1 side of the client.

use super::{check_token, expect_cmd, pmi1_failure, ClientError, Connection, JobInfo, PmiClient};
use crate::pmi1::{self, Line};

/// A PMI-1 ("simple PMI" 1.1) client, the protocol of Debian's MPICH.
pub struct Pmi1Client {
    conn: Connection,
    info: JobInfo,
}

impl Pmi1Client {
    pub fn from_env() -> Result<Pmi1Client, ClientError> {
        Pmi1Client::init(Connection::from_env()?)
    }

    /// The same opening `MPI_Init` makes: init, maxes, appnum, kvsname.
    pub fn init(conn: Connection) -> Result<Pmi1Client, ClientError> {
        let rank = conn.rank.unwrap_or(0);
        let size = conn.size.unwrap_or(1);
        let mut client =
            Pmi1Client { conn, info: JobInfo { rank, size, appnum: 0, jobid: String::new() } };
        let reply =
            client.call(&pmi1::Request::Init { version: 1, subversion: 1 }, "response_to_init")?;
        if reply.get("rc") != Some("0") {
            return Err(pmi1_failure("init", &reply));
        }
        client.call(&pmi1::Request::GetMaxes, "maxes")?;
        client.info.appnum =
            client.call(&pmi1::Request::GetAppnum, "appnum")?.require_number("appnum")?;
        let reply = client.call(&pmi1::Request::GetMyKvsname, "my_kvsname")?;
        client.info.jobid = reply.require("kvsname")?.to_string();
        Ok(client)
    }

    pub fn info(&self) -> &JobInfo {
        &self.info
    }

    fn call(&mut self, request: &pmi1::Request, expected: &str) -> Result<Line, ClientError> {
        let bytes = request.encode();
        if bytes.len() > pmi1::MAX_LINE {
            return Err(ClientError::Invalid {
                what: format!("a {expected} request of {} bytes", bytes.len()),
                reason: "pmi-1 lines are at most 1024 bytes",
            });
        }
        self.conn.send(&bytes)?;
        let line = self.conn.read_line()?;
        expect_cmd(&line, expected)?;
        Ok(line)
    }

    pub fn put(&mut self, key: &str, value: &str) -> Result<(), ClientError> {
        check_token(|| format!("key {key:?}"), key)?;
        check_token(|| format!("the value of {key}"), value)?;
        let request = pmi1::Request::Put {
            kvsname: self.info.jobid.clone(),
            key: key.to_string(),
            value: value.to_string(),
        };
        let reply = self.call(&request, "put_result")?;
        match reply.get("rc") {
            Some("0") => Ok(()),
            _ => Err(pmi1_failure("put", &reply)),
        }
    }

    pub fn fence(&mut self) -> Result<(), ClientError> {
        self.call(&pmi1::Request::BarrierIn, "barrier_out").map(drop)
    }

    pub fn get(&mut self, key: &str) -> Result<Option<String>, ClientError> {
        check_token(|| format!("key {key:?}"), key)?;
        let request = pmi1::Request::Get { kvsname: self.info.jobid.clone(), key: key.to_string() };
        let reply = self.call(&request, "get_result")?;
        // MPICH reads a missing rc as success here.
        match reply.get("rc").unwrap_or("0") {
            "0" => Ok(Some(reply.require("value")?.to_string())),
            _ => Ok(None),
        }
    }

    /// `MPI_UNIVERSE_SIZE`; `None` when the launcher does not know it.
    pub fn universe_size(&mut self) -> Result<Option<u32>, ClientError> {
        let size: i64 =
            self.call(&pmi1::Request::GetUniverseSize, "universe_size")?.require_number("size")?;
        Ok(u32::try_from(size).ok())
    }

    pub fn publish(&mut self, service: &str, port: &str) -> Result<(), ClientError> {
        check_token(|| format!("service {service:?}"), service)?;
        check_token(|| format!("port {port:?}"), port)?;
        let request =
            pmi1::Request::PublishName { service: service.to_string(), port: port.to_string() };
        let reply = self.call(&request, "publish_result")?;
        match reply.get("rc") {
            Some("0") => Ok(()),
            _ => Err(pmi1_failure("publish", &reply)),
        }
    }

    pub fn lookup(&mut self, service: &str) -> Result<Option<String>, ClientError> {
        check_token(|| format!("service {service:?}"), service)?;
        let reply = self
            .call(&pmi1::Request::LookupName { service: service.to_string() }, "lookup_result")?;
        match reply.get("rc") {
            Some("0") => Ok(Some(reply.require("port")?.to_string())),
            _ => Ok(None),
        }
    }

    pub fn unpublish(&mut self, service: &str) -> Result<(), ClientError> {
        check_token(|| format!("service {service:?}"), service)?;
        let request = pmi1::Request::UnpublishName { service: service.to_string() };
        let reply = self.call(&request, "unpublish_result")?;
        match reply.get("rc") {
            Some("0") => Ok(()),
            _ => Err(pmi1_failure("unpublish", &reply)),
        }
    }

    /// Asks the launcher to kill the job with `exitcode`; there is no reply.
    pub fn abort(&mut self, exitcode: i32) -> Result<(), ClientError> {
        self.conn.send(&pmi1::Request::Abort { exitcode: Some(exitcode) }.encode())
    }

    pub fn finalize(&mut self) -> Result<(), ClientError> {
        self.call(&pmi1::Request::Finalize, "finalize_ack")?;
        self.conn.shutdown();
        Ok(())
    }
}

impl PmiClient for Pmi1Client {
    fn info(&self) -> &JobInfo {
        &self.info
    }
    fn put(&mut self, key: &str, value: &str) -> Result<(), ClientError> {
        Pmi1Client::put(self, key, value)
    }
    fn fence(&mut self) -> Result<(), ClientError> {
        Pmi1Client::fence(self)
    }
    fn get(&mut self, key: &str) -> Result<Option<String>, ClientError> {
        Pmi1Client::get(self, key)
    }
    fn finalize(&mut self) -> Result<(), ClientError> {
        Pmi1Client::finalize(self)
    }
    fn abort(&mut self, exitcode: i32, _msg: &str) -> Result<(), ClientError> {
        Pmi1Client::abort(self, exitcode)
    }
}
