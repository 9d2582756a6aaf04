//! `pmiprog`: a PMI rank program for rlaunch's integration tests (`tests/tests/pmi.rs`), built
//! on the Rust client of `pmi_wire::client`, with a raw mode that sends any bytes at all.
//!
//! ```text
//! pmiprog [@R [--sync DIR]] COMMAND, where COMMAND is one of
//!
//! v1|v2 allgather         put k<rank>, fence, get every rank's key, finalize
//! v1|v2 visibility        two rounds: put, get every key, fence, get them again
//! v1|v2 get KEY           v1: a KVS get; v2: a job attribute
//! v1|v2 fence             init, fence, finalize
//! v1|v2 survive           rank 1 exits 3 after init; the others fence, read
//!                         PMI_dead_processes (v2: as a KVS key and a job attribute, which
//!                         must agree), fence again, finalize (--on-failure continue)
//! v1|v2 quit              init, then exit 0 without finalize
//! v1|v2 flood-puts BYTES  put 800-byte values under new keys until BYTES are put, no fence
//! raw [--init] BYTES      write BYTES on PMI_FD (after a PMI-1 init with --init), then
//!                         read until end of file
//! ```
//!
//! With `@R` only rank R runs the command; every other rank is a bystander that inits with
//! PMI-1, prints `waiting <rank>`, and blocks in a fence that cannot complete while rank R
//! misbehaves (the job must be torn down around it), then finalizes. With `@R --sync DIR`,
//! each bystander also creates `DIR/waiting-<rank>` just before its fence, and rank R starts
//! only once all of them exist (`PMI_SIZE` - 1 files, 10 s at most): whatever rank R does
//! then, the others are already waiting.
//!
//! What each command prints, `<R>` being the rank and `<N>` the job size:
//!
//! | command      | output                                                                  |
//! |--------------|-------------------------------------------------------------------------|
//! | `allgather`  | `allgather ok <R> <N>` once every key had its value                     |
//! | `visibility` | per round E (1, 2): `round E before <R> found=<ranks>` and `round E after <R> found=<ranks>`: the ranks whose key of that round a get found, comma-separated, `-` for none |
//! | `get KEY`    | `get <R> KEY=VALUE` or `get <R> KEY not-found`                          |
//! | `fence`      | `fenced <R>`                                                            |
//! | `survive`    | `survived <R> dead=<value>` (rank 1: nothing)                           |
//! | `quit`       | `quitting <R>`                                                          |
//! | `flood-puts` | `flooded <R> <bytes>` once every put was answered                       |
//! | `raw`        | `init ok` (with --init), `sent <n> bytes` (or `send failed: ...`), a line `reply <bytes>` per read, then `eof` |
//!
//! Every value put is `v<R>=x;y<R>`: an `=` and a `;` that PMI-2 must escape. In `raw`, BYTES
//! may hold the escapes `\n`, `\r`, `\t`, `\0`, `\\` and `\xHH`; replies are printed with
//! the same escapes.
//!
//! Exit codes: 0 done; 1 a PMI call failed or a value was wrong (the reason on stderr);
//! 2 bad arguments; 3 `raw` saw neither end of file nor an error within [`RAW_PATIENCE`];
//! 4 the whole program ran longer than [`WATCHDOG`]: no pmiprog outlives a hung test.

use std::io::{Read, Write};
use std::os::unix::io::FromRawFd;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process;
use std::time::{Duration, Instant};

use pmi_wire::client::{ClientError, Connection, Pmi1Client, Pmi2Client, PmiClient};

/// How long `raw` waits for the server to answer or hang up.
const RAW_PATIENCE: Duration = Duration::from_secs(20);
/// After this, pmiprog exits whatever it is doing.
const WATCHDOG: Duration = Duration::from_secs(40);
/// How long `--sync` waits for the bystanders.
const SYNC_PATIENCE: Duration = Duration::from_secs(10);

const EXIT_FAILED: i32 = 1;
const EXIT_USAGE: i32 = 2;
const EXIT_RAW_TIMEOUT: i32 = 3;
const EXIT_WATCHDOG: i32 = 4;

#[derive(Clone, Copy, PartialEq, Eq)]
enum Version {
    V1,
    V2,
}

enum Command {
    Allgather,
    Visibility,
    Get(String),
    Fence,
    Survive,
    Quit,
    /// Put this many bytes of values, fences none.
    FloodPuts(u64),
    Raw {
        init: bool,
        bytes: Vec<u8>,
    },
}

struct Script {
    /// `@R`: only this rank runs the command; the others are bystanders.
    only: Option<u32>,
    /// `--sync DIR`: where bystanders say they are waiting.
    sync: Option<PathBuf>,
    version: Version,
    command: Command,
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let script = parse(&args).unwrap_or_else(|e| {
        eprintln!("pmiprog: {e}");
        eprintln!("usage: pmiprog [@R [--sync DIR]] v1|v2 allgather|visibility|fence|quit|get KEY");
        eprintln!("       pmiprog [@R [--sync DIR]] raw [--init] BYTES");
        process::exit(EXIT_USAGE)
    });
    let rank: u32 = std::env::var("PMI_RANK").ok().and_then(|r| r.parse().ok()).unwrap_or(0);
    std::thread::spawn(move || {
        std::thread::sleep(WATCHDOG);
        eprintln!("pmiprog: rank {rank}: still running after {WATCHDOG:?}; giving up");
        process::exit(EXIT_WATCHDOG);
    });
    let sync = script.sync.as_deref();
    let result = if script.only.is_some_and(|only| only != rank) {
        with_client(Version::V1, Command::Fence, Role::Bystander { sync })
    } else {
        sync.map_or(Ok(()), wait_for_bystanders).and_then(|()| match script.command {
            Command::Raw { init, bytes } => raw(init, &bytes),
            command => with_client(script.version, command, Role::Main),
        })
    };
    if let Err(e) = result {
        eprintln!("pmiprog: rank {rank}: {e}");
        process::exit(EXIT_FAILED);
    }
}

fn parse(args: &[String]) -> Result<Script, String> {
    let mut words = args.iter().map(String::as_str);
    let mut word = words.next();
    let (mut only, mut sync) = (None, None);
    if let Some(rank) = word.and_then(|w| w.strip_prefix('@')) {
        only = Some(rank.parse().map_err(|_| format!("bad rank in @{rank}"))?);
        word = words.next();
        if word == Some("--sync") {
            sync = Some(PathBuf::from(words.next().ok_or("--sync: missing DIR")?));
            word = words.next();
        }
    }
    let (version, command) = match word {
        Some("raw") => {
            let mut next = words.next();
            let init = next == Some("--init");
            if init {
                next = words.next();
            }
            let text = next.ok_or("raw: missing BYTES")?;
            (Version::V1, Command::Raw { init, bytes: unescape(text)? })
        }
        Some(v @ ("v1" | "v2")) => {
            let version = if v == "v1" { Version::V1 } else { Version::V2 };
            let command = match words.next() {
                Some("allgather") => Command::Allgather,
                Some("visibility") => Command::Visibility,
                Some("fence") => Command::Fence,
                Some("survive") => Command::Survive,
                Some("quit") => Command::Quit,
                Some("flood-puts") => {
                    let n = words.next().ok_or("flood-puts: missing BYTES")?;
                    Command::FloodPuts(n.parse().map_err(|_| format!("bad byte count {n:?}"))?)
                }
                Some("get") => Command::Get(words.next().ok_or("get: missing KEY")?.to_string()),
                Some(other) => return Err(format!("unknown command {other:?}")),
                None => return Err("missing command".into()),
            };
            (version, command)
        }
        Some(other) => return Err(format!("expected v1, v2 or raw, not {other:?}")),
        None => return Err("missing arguments".into()),
    };
    if let Some(extra) = words.next() {
        return Err(format!("unexpected argument {extra:?}"));
    }
    Ok(Script { only, sync, version, command })
}

/// Either protocol's client: the shared operations through [`PmiClient`], plus `get`, whose
/// meaning differs (a KVS get in PMI-1, a job attribute in PMI-2).
enum Client {
    V1(Pmi1Client),
    V2(Pmi2Client),
}

impl Client {
    fn connect(version: Version) -> Result<Client, ClientError> {
        let conn = Connection::from_env()?;
        Ok(match version {
            Version::V1 => Client::V1(Pmi1Client::init(conn)?),
            Version::V2 => Client::V2(Pmi2Client::init(conn)?),
        })
    }

    fn pmi(&mut self) -> &mut dyn PmiClient {
        match self {
            Client::V1(c) => c,
            Client::V2(c) => c,
        }
    }

    fn attribute(&mut self, key: &str) -> Result<Option<String>, ClientError> {
        match self {
            Client::V1(c) => c.get(key),
            Client::V2(c) => c.get_job_attr(key),
        }
    }
}

fn value_of(rank: u32) -> String {
    format!("v{rank}=x;y{rank}")
}

/// Waits until every other rank has created its `waiting-<rank>` file in `dir`.
fn wait_for_bystanders(dir: &Path) -> Result<(), String> {
    let size: u32 = std::env::var("PMI_SIZE").ok().and_then(|s| s.parse().ok()).unwrap_or(1);
    let deadline = Instant::now() + SYNC_PATIENCE;
    loop {
        let waiting = std::fs::read_dir(dir)
            .map_err(|e| format!("cannot read {}: {e}", dir.display()))?
            .filter_map(Result::ok)
            .filter(|entry| entry.file_name().to_string_lossy().starts_with("waiting-"))
            .count();
        if waiting + 1 >= size as usize {
            return Ok(());
        }
        if Instant::now() > deadline {
            return Err(format!("only {waiting} bystanders waiting after {SYNC_PATIENCE:?}"));
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// What this rank is for under `@R`.
enum Role<'a> {
    /// Rank R, or every rank without `@R`.
    Main,
    /// Another rank: it only waits, and says so in `sync` (the `--sync` directory).
    Bystander { sync: Option<&'a Path> },
}

fn with_client(version: Version, command: Command, role: Role) -> Result<(), String> {
    let mut client = Client::connect(version).map_err(|e| format!("init failed: {e}"))?;
    let pmi = client.pmi();
    let (rank, size) = (pmi.rank(), pmi.size());
    let fail = |what: &str, e: ClientError| format!("{what} failed: {e}");
    match command {
        Command::Allgather => {
            pmi.put(&format!("k{rank}"), &value_of(rank)).map_err(|e| fail("put", e))?;
            pmi.fence().map_err(|e| fail("fence", e))?;
            for r in 0..size {
                let got = pmi.get(&format!("k{r}")).map_err(|e| fail("get", e))?;
                if got.as_deref() != Some(value_of(r).as_str()) {
                    return Err(format!("k{r} is {got:?}, expected {:?}", value_of(r)));
                }
            }
            say(&format!("allgather ok {rank} {size}"));
        }
        Command::Visibility => {
            // The second round checks that an earlier fence does not make later puts visible.
            for round in 1..=2 {
                let key = |r: u32| format!("r{round}k{r}");
                pmi.put(&key(rank), &value_of(rank)).map_err(|e| fail("put", e))?;
                let before = found_keys(pmi, size, key)?;
                say(&format!("round {round} before {rank} found={before}"));
                pmi.fence().map_err(|e| fail("fence", e))?;
                let after = found_keys(pmi, size, key)?;
                say(&format!("round {round} after {rank} found={after}"));
            }
        }
        Command::Get(key) => {
            let value = client.attribute(&key).map_err(|e| fail("get", e))?;
            match value {
                Some(value) => say(&format!("get {rank} {key}={value}")),
                None => say(&format!("get {rank} {key} not-found")),
            }
        }
        Command::Fence => {
            if let Role::Bystander { sync } = role {
                say(&format!("waiting {rank}"));
                if let Some(dir) = sync {
                    let flag = dir.join(format!("waiting-{rank}"));
                    std::fs::write(&flag, b"")
                        .map_err(|e| format!("cannot create {}: {e}", flag.display()))?;
                }
            }
            pmi.fence().map_err(|e| fail("fence", e))?;
            say(&format!("fenced {rank}"));
        }
        Command::Survive => {
            if rank == 1 {
                process::exit(3);
            }
            // Completes once rank 1 is gone and the job goes on without it.
            pmi.fence().map_err(|e| fail("fence", e))?;
            let dead = pmi.get("PMI_dead_processes").map_err(|e| fail("get", e))?;
            // PMI-2 has it as a job attribute too (MPICH asks info-getjobattr): the same list.
            let attr = client.attribute("PMI_dead_processes").map_err(|e| fail("get", e))?;
            if attr != dead {
                return Err(format!(
                    "PMI_dead_processes: a get says {dead:?}, an attribute {attr:?}"
                ));
            }
            say(&format!("survived {rank} dead={}", dead.as_deref().unwrap_or("-")));
            client.pmi().fence().map_err(|e| fail("second fence", e))?;
        }
        Command::Quit => {
            say(&format!("quitting {rank}"));
            // The socket closes with the process: end of file before finalize.
            process::exit(0);
        }
        Command::FloodPuts(bytes) => {
            // Values as long as a PMI-1 line lets them be, each under a key of its own.
            let value = "v".repeat(800);
            let mut put = 0u64;
            let mut i = 0u64;
            while put < bytes {
                pmi.put(&format!("f{rank}.{i}"), &value)
                    .map_err(|e| fail(&format!("put after {put} bytes"), e))?;
                put += value.len() as u64;
                i += 1;
            }
            say(&format!("flooded {rank} {put}"));
        }
        Command::Raw { .. } => unreachable!("raw mode has no client"),
    }
    client.pmi().finalize().map_err(|e| fail("finalize", e))
}

/// Gets every rank's `key(rank)`; returns the ranks whose key was found, as `0,1,...` or `-`.
fn found_keys(
    pmi: &mut dyn PmiClient,
    size: u32,
    key: impl Fn(u32) -> String,
) -> Result<String, String> {
    let mut found = Vec::new();
    for r in 0..size {
        let k = key(r);
        match pmi.get(&k).map_err(|e| format!("get {k} failed: {e}"))? {
            Some(v) if v == value_of(r) => found.push(r.to_string()),
            Some(v) => return Err(format!("{k} is {v:?}, expected {:?}", value_of(r))),
            None => {}
        }
    }
    Ok(if found.is_empty() { "-".to_string() } else { found.join(",") })
}

fn say(line: &str) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{line}");
    let _ = out.flush();
}

/// The rank's PMI socket as it is, no client in between.
fn raw_socket() -> Result<UnixStream, String> {
    let fd: i32 = std::env::var("PMI_FD")
        .map_err(|_| "raw needs PMI_FD (not --pmi-port)".to_string())?
        .parse()
        .map_err(|_| "PMI_FD is not a number".to_string())?;
    if std::fs::symlink_metadata(format!("/proc/self/fd/{fd}")).is_err() {
        return Err(format!("PMI_FD={fd} is not open"));
    }
    // SAFETY: the launcher left this descriptor open for us and nothing else in this process
    // uses it.
    Ok(unsafe { UnixStream::from_raw_fd(fd) })
}

fn raw(init: bool, bytes: &[u8]) -> Result<(), String> {
    let mut socket = raw_socket()?;
    socket.set_read_timeout(Some(RAW_PATIENCE)).map_err(|e| e.to_string())?;
    if init {
        socket
            .write_all(b"cmd=init pmi_version=1 pmi_subversion=1\n")
            .map_err(|e| format!("cannot send init: {e}"))?;
        let mut reply = Vec::new();
        let mut byte = [0u8; 1];
        while reply.last() != Some(&b'\n') {
            match socket.read(&mut byte) {
                Ok(0) => return Err("end of file instead of the init reply".into()),
                Ok(_) => reply.push(byte[0]),
                Err(e) => return Err(format!("no init reply: {e}")),
            }
        }
        let text = String::from_utf8_lossy(&reply);
        if !text.starts_with("cmd=response_to_init ") || !text.contains(" rc=0") {
            return Err(format!("bad init reply {text:?}"));
        }
        say("init ok");
    }
    // The server may hang up in the middle of a long write: that is an answer too.
    match socket.write_all(bytes) {
        Ok(()) => say(&format!("sent {} bytes", bytes.len())),
        Err(e) => say(&format!("send failed: {e}")),
    }
    let mut buf = [0u8; 4096];
    loop {
        match socket.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => say(&format!("reply {}", escape(&buf[..n]))),
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                eprintln!("pmiprog: no end of file within {RAW_PATIENCE:?}");
                process::exit(EXIT_RAW_TIMEOUT);
            }
            // A reset is the server hanging up with our bytes unread.
            Err(e) => {
                say(&format!("read failed: {e}"));
                break;
            }
        }
    }
    say("eof");
    Ok(())
}

fn unescape(text: &str) -> Result<Vec<u8>, String> {
    let mut out = Vec::with_capacity(text.len());
    let mut bytes = text.bytes();
    while let Some(b) = bytes.next() {
        if b != b'\\' {
            out.push(b);
            continue;
        }
        match bytes.next() {
            Some(b'n') => out.push(b'\n'),
            Some(b'r') => out.push(b'\r'),
            Some(b't') => out.push(b'\t'),
            Some(b'0') => out.push(0),
            Some(b'\\') => out.push(b'\\'),
            Some(b'x') => {
                let hex: Vec<u8> = bytes.by_ref().take(2).collect();
                let hex = std::str::from_utf8(&hex).unwrap_or("");
                let byte = u8::from_str_radix(hex, 16)
                    .ok()
                    .filter(|_| hex.len() == 2)
                    .ok_or_else(|| format!("bad escape \\x{hex}"))?;
                out.push(byte);
            }
            Some(other) => return Err(format!("bad escape \\{}", other as char)),
            None => return Err("a lone \\ at the end".into()),
        }
    }
    Ok(out)
}

fn escape(bytes: &[u8]) -> String {
    let mut out = String::new();
    for &b in bytes {
        match b {
            b'\n' => out.push_str("\\n"),
            b'\r' => out.push_str("\\r"),
            b'\t' => out.push_str("\\t"),
            b'\\' => out.push_str("\\\\"),
            0x20..=0x7e => out.push(b as char),
            _ => out.push_str(&format!("\\x{b:02x}")),
        }
    }
    out
}
