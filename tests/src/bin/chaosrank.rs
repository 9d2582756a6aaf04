//! `chaosrank`: the rank program of the chaos runner (`chaos`). A PMI-1 rank that does one
//! phase's work forever (or until the job ends it), and that can fail on purpose.
//!
//! ```text
//! chaosrank DIR PHASE [FAULT_RANK FAULT WHEN]
//!   PHASE  launch   init, fence, finalize, exit 0
//!          fence    put a new key, fence, get the neighbour's, one line: forever
//!          output   64 lines (4096 bytes) per write: forever
//!          stdin    rank 0 copies stdin to stdout in whole lines, then finalizes at EOF;
//!                   the others wait
//!          exit     init, fence, 8 lines, a short pause (0-200 ms), finalize, exit 0
//!   FAULT  exit:C | signal:S | abort:C | pmi-close   what rank FAULT_RANK does...
//!   WHEN   start | usr1                               ...at once, or on SIGUSR1
//! ```
//!
//! Every line on stdout is a flood line of `rlaunch_tests::flood_line` (this rank's, from
//! sequence 0; the stdin phase passes the runner's lines through), written at most
//! `PIPE_BUF` bytes at a time, so that no kill tears one. Side files in DIR tell the runner
//! what happened without going through rlaunch:
//!
//! | file        | written                                                        |
//! |-------------|----------------------------------------------------------------|
//! | `pid.R`     | at start: the pid                                              |
//! | `ready.R`   | after the first fence                                          |
//! | `lines.R`   | after each write to stdout: lines written so far (20 digits)   |
//! | `told.R`    | under continue, once told that ranks failed: their list        |
//!
//! Under `--on-failure continue` (the runner's continue policy; `RLAUNCH_DEAD_RANKS_FILE` is
//! set) the phases that run forever end once a rank has failed: in the fence phase each rank
//! puts whether `PMI_dead_processes` lists a rank yet, and all stop after the first fence in
//! which one did (the same fence for all: a rank that stopped earlier would leave the others
//! in a fence for ever); the output and stdin phases look for the file of
//! failed ranks before each write (rank 0 of the stdin phase every 20 ms while stdin is
//! quiet); a rank that learns of a failure writes `told.R` (the list), finalizes and exits 0.
//!
//! In a later attempt of the job (`RLAUNCH_RESTART_COUNT` above 0, the runner's restart
//! policy) a rank only inits, fences and finalizes: no fault, no output, no side file (they
//! stay the first attempt's, which the runner judges).
//!
//! Faults: `exit:C` exits with C; `signal:S` dies by signal S (no core file); `abort:C` sends
//! PMI-1 `abort` with code C and waits to be killed; `pmi-close` shuts the PMI socket down and
//! exits 0 without finalize. Exit codes of its own: 2 bad arguments, 1 a PMI call failed.

use std::fs::File;
use std::io::{Read, Write};
use std::os::fd::AsFd;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use nix::sys::signal::{kill, signal, SigHandler, SigSet, Signal};
use nix::sys::socket::{shutdown, Shutdown};
use nix::unistd::{getpid, write};
use pmi_wire::client::{connect, PmiClient, Version};
use rlaunch_tests::{flood_line, FLOOD_LINE_LEN};

/// Bytes written at once: `PIPE_BUF`, so that a write is all or nothing.
const WRITE: usize = 4096;
/// Lines in one write.
const LINES_PER_WRITE: usize = WRITE / FLOOD_LINE_LEN;

/// Set once a fault begins: the main thread's PMI errors are then its doing.
static FAULTING: AtomicBool = AtomicBool::new(false);

#[derive(Clone, Copy, PartialEq, Eq)]
enum Phase {
    Launch,
    Fence,
    Output,
    Stdin,
    Exit,
}

#[derive(Clone, Copy)]
enum Fault {
    Exit(i32),
    Signal(Signal),
    Abort(i32),
    PmiClose,
}

fn usage(what: &str) -> ! {
    eprintln!("chaosrank: {what}; usage: chaosrank DIR PHASE [FAULT_RANK FAULT start|usr1]");
    std::process::exit(2);
}

fn parse_fault(word: &str) -> Option<Fault> {
    if word == "pmi-close" {
        return Some(Fault::PmiClose);
    }
    let (kind, value) = word.split_once(':')?;
    match kind {
        "exit" => value.parse().ok().map(Fault::Exit),
        "abort" => value.parse().ok().map(Fault::Abort),
        "signal" => {
            value.parse::<i32>().ok().and_then(|n| Signal::try_from(n).ok()).map(Fault::Signal)
        }
        _ => None,
    }
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.len() != 2 && args.len() != 5 {
        usage("wrong number of arguments");
    }
    let dir = PathBuf::from(&args[0]);
    let phase = match args[1].as_str() {
        "launch" => Phase::Launch,
        "fence" => Phase::Fence,
        "output" => Phase::Output,
        "stdin" => Phase::Stdin,
        "exit" => Phase::Exit,
        other => usage(&format!("unknown phase {other:?}")),
    };
    let rank: u32 = std::env::var("PMI_RANK").ok().and_then(|r| r.parse().ok()).unwrap_or(0);
    let mut fault = None;
    if args.len() == 5 {
        let target: u32 = args[2].parse().unwrap_or_else(|_| usage("bad FAULT_RANK"));
        let kind = parse_fault(&args[3]).unwrap_or_else(|| usage("bad FAULT"));
        let at_start = match args[4].as_str() {
            "start" => true,
            "usr1" => false,
            _ => usage("bad WHEN"),
        };
        if target == rank {
            fault = Some((kind, at_start));
        }
    }
    let attempt = std::env::var("RLAUNCH_RESTART_COUNT").ok().and_then(|a| a.parse().ok());
    if attempt.unwrap_or(0u32) > 0 {
        let mut pmi = connect(Version::Pmi1).unwrap_or_else(|e| pmi_failed("init", &e));
        pmi.fence().unwrap_or_else(|e| pmi_failed("fence", &e));
        pmi.finalize().unwrap_or_else(|e| pmi_failed("finalize", &e));
        return;
    }
    side_file(&dir, "pid", rank, getpid().to_string().as_bytes());
    // No core files from the faults, whatever the machine's core pattern.
    let _ = nix::sys::resource::setrlimit(nix::sys::resource::Resource::RLIMIT_CORE, 0, 0);
    let pmi_fd: i32 = std::env::var("PMI_FD").ok().and_then(|f| f.parse().ok()).unwrap_or(-1);

    match fault {
        Some((kind, true)) if !matches!(kind, Fault::Abort(_) | Fault::PmiClose) => {
            strike(kind, pmi_fd)
        }
        Some((kind, false)) => {
            let mut usr1 = SigSet::empty();
            usr1.add(Signal::SIGUSR1);
            usr1.thread_block().unwrap_or_else(|e| usage(&format!("cannot block SIGUSR1: {e}")));
            std::thread::spawn(move || {
                if usr1.wait().is_ok() {
                    strike(kind, pmi_fd);
                }
            });
        }
        _ => {}
    }

    let mut pmi = connect(Version::Pmi1).unwrap_or_else(|e| pmi_failed("init", &e));
    if let Some((kind @ (Fault::Abort(_) | Fault::PmiClose), true)) = fault {
        strike(kind, pmi_fd);
    }
    let size = pmi.size();
    pmi.put(&format!("k{rank}"), "0").unwrap_or_else(|e| pmi_failed("put", &e));
    pmi.fence().unwrap_or_else(|e| pmi_failed("fence", &e));
    side_file(&dir, "ready", rank, b"");

    let mut out = Output::new(&dir, rank);
    let told = Told::new(&dir, rank);
    match phase {
        Phase::Launch => {}
        Phase::Fence => {
            let dead = |pmi: &mut Box<dyn PmiClient + Send>| {
                let list = pmi.get("PMI_dead_processes").unwrap_or_else(|e| pmi_failed("get", &e));
                list.unwrap_or_default()
            };
            for epoch in 1u64.. {
                let key = |r: u32| format!("k{r}.{epoch}");
                let value = |r: u32| format!("{r}.{epoch}");
                // Under continue the survivors must stop after the same fence, or those still
                // fencing wait for ever for those that stopped: each says in this epoch's
                // pairs whether it has heard of a failure, and all read the same pairs.
                let heard = told.watching() && !dead(&mut pmi).is_empty();
                pmi.put(&key(rank), &value(rank)).unwrap_or_else(|e| pmi_failed("put", &e));
                if told.watching() {
                    let flag = if heard { "1" } else { "0" };
                    pmi.put(&format!("h{rank}.{epoch}"), flag)
                        .unwrap_or_else(|e| pmi_failed("put", &e));
                }
                pmi.fence().unwrap_or_else(|e| pmi_failed("fence", &e));
                if told.watching() {
                    let flag = |r: u32| pmi.get(&format!("h{r}.{epoch}"));
                    let any = (0..size).map(flag).any(|f| matches!(f, Ok(Some(f)) if f == "1"));
                    // The failure is known on this node before the fence that shows it ends.
                    let list = dead(&mut pmi);
                    if any && told.heard(&list) {
                        break;
                    }
                    if !list.is_empty() {
                        // The neighbour may be the failed rank, with no key of this epoch.
                        continue;
                    }
                }
                let neighbour = (rank + 1) % size;
                let got = pmi.get(&key(neighbour)).unwrap_or_else(|e| pmi_failed("get", &e));
                if got != Some(value(neighbour)) {
                    eprintln!("chaosrank {rank}: {} is {got:?}", key(neighbour));
                    std::process::exit(1);
                }
                out.lines(1);
                std::thread::sleep(Duration::from_millis(2));
            }
        }
        Phase::Output => {
            while !told.by_file() {
                out.lines(LINES_PER_WRITE);
            }
        }
        Phase::Stdin if rank == 0 => out.copy_stdin(&told),
        Phase::Stdin => loop {
            match told.watching() {
                true if told.by_file() => break,
                true => std::thread::sleep(Duration::from_millis(20)),
                false => std::thread::sleep(Duration::from_secs(3600)),
            }
        },
        Phase::Exit => {
            out.lines(8);
            let pause = u64::from(getpid().as_raw().unsigned_abs()) * 7919 % 200;
            std::thread::sleep(Duration::from_millis(pause));
        }
    }
    pmi.finalize().unwrap_or_else(|e| pmi_failed("finalize", &e));
}

/// Stdout, and the count of lines written to it in `lines.R`.
struct Output {
    rank: u32,
    written: u64,
    count: File,
}

impl Output {
    fn new(dir: &Path, rank: u32) -> Output {
        let path = dir.join(format!("lines.{rank}"));
        let count = File::create(&path)
            .unwrap_or_else(|e| usage(&format!("cannot create {}: {e}", path.display())));
        Output { rank, written: 0, count }
    }

    /// Writes `n` (at most [`LINES_PER_WRITE`]) of this rank's lines in one write.
    fn lines(&mut self, n: usize) {
        let mut block = Vec::with_capacity(n * FLOOD_LINE_LEN);
        for seq in self.written..self.written + n as u64 {
            block.extend_from_slice(&flood_line(self.rank, seq));
        }
        self.write(&block);
    }

    /// Copies stdin to stdout, whole lines at a time, until EOF (or, under continue, until
    /// told that a rank failed).
    fn copy_stdin(&mut self, told: &Told) {
        let mut stdin = std::io::stdin().lock();
        let mut buf = vec![0; WRITE];
        let mut filled = 0;
        loop {
            if told.watching() {
                use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
                let quiet = loop {
                    if told.by_file() {
                        return;
                    }
                    let mut fds = [PollFd::new(stdin.as_fd(), PollFlags::POLLIN)];
                    match poll(&mut fds, PollTimeout::from(20u16)) {
                        Ok(0) | Err(nix::errno::Errno::EINTR) => continue,
                        Ok(_) => break false,
                        Err(_) => break true,
                    }
                };
                if quiet {
                    return;
                }
            }
            let n = match stdin.read(&mut buf[filled..]) {
                Ok(0) => return,
                Ok(n) => n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) => usage(&format!("cannot read stdin: {e}")),
            };
            filled += n;
            let whole = filled / FLOOD_LINE_LEN * FLOOD_LINE_LEN;
            if whole > 0 {
                let block = buf[..whole].to_vec();
                self.write(&block);
                buf.copy_within(whole..filled, 0);
                filled -= whole;
            }
        }
    }

    fn write(&mut self, block: &[u8]) {
        let stdout = std::io::stdout();
        let mut done = 0;
        while done < block.len() {
            match write(stdout.as_fd(), &block[done..]) {
                Ok(n) => done += n,
                Err(nix::errno::Errno::EINTR) => continue,
                // The launcher is gone: the job is being torn down.
                Err(_) => idle(),
            }
        }
        self.written += (block.len() / FLOOD_LINE_LEN) as u64;
        let _ = self.count.write_all_at(format!("{:020}", self.written).as_bytes(), 0);
    }
}

/// Under `--on-failure continue`: whether ranks failed, from the node's file of them or
/// from `PMI_dead_processes`, said once in `told.R`.
struct Told {
    file: Option<PathBuf>,
    side: (PathBuf, u32),
}

impl Told {
    fn new(dir: &Path, rank: u32) -> Told {
        let file = std::env::var_os("RLAUNCH_DEAD_RANKS_FILE").map(PathBuf::from);
        Told { file, side: (dir.to_path_buf(), rank) }
    }

    /// The job goes on past a failed rank: this rank watches for one.
    fn watching(&self) -> bool {
        self.file.is_some()
    }

    /// The node's file lists failed ranks (it is written whole, then renamed into place).
    fn by_file(&self) -> bool {
        let listed = self.file.as_deref().and_then(|f| std::fs::read_to_string(f).ok());
        self.heard(listed.as_deref().unwrap_or_default().trim())
    }

    /// `dead` (ranges) names failed ranks: said in `told.R`.
    fn heard(&self, dead: &str) -> bool {
        if dead.is_empty() {
            return false;
        }
        side_file(&self.side.0, "told", self.side.1, dead.as_bytes());
        true
    }
}

/// Does the fault, from whichever thread.
fn strike(fault: Fault, pmi_fd: i32) -> ! {
    FAULTING.store(true, Ordering::SeqCst);
    match fault {
        Fault::Exit(code) => std::process::exit(code),
        Fault::Signal(sig) => {
            // SAFETY: SIG_DFL runs no code.
            let _ = unsafe { signal(sig, SigHandler::SigDfl) };
            let mut set = SigSet::empty();
            set.add(sig);
            let _ = set.thread_unblock();
            let _ = kill(getpid(), sig);
            idle()
        }
        Fault::Abort(code) => {
            // One write: the main thread may be waiting for a fence's answer on this socket.
            let line = format!("cmd=abort exitcode={code}\n");
            // SAFETY: the PMI socket lives as long as the process; only borrowed here.
            let fd = unsafe { std::os::fd::BorrowedFd::borrow_raw(pmi_fd) };
            let _ = write(fd, line.as_bytes());
            idle()
        }
        Fault::PmiClose => {
            let _ = shutdown(pmi_fd, Shutdown::Both);
            std::process::exit(0)
        }
    }
}

/// Waits to be killed.
fn idle() -> ! {
    loop {
        std::thread::sleep(Duration::from_secs(3600));
    }
}

fn pmi_failed(op: &str, e: &dyn std::fmt::Display) -> ! {
    if FAULTING.load(Ordering::SeqCst) {
        idle();
    }
    eprintln!("chaosrank: pmi {op} failed: {e}");
    std::process::exit(1);
}

fn side_file(dir: &Path, name: &str, rank: u32, contents: &[u8]) {
    let path = dir.join(format!("{name}.{rank}"));
    let tmp = dir.join(format!(".{name}.{rank}"));
    let written = File::create(&tmp).and_then(|mut f| f.write_all(contents));
    if let Err(e) = written.and_then(|()| std::fs::rename(&tmp, &path)) {
        usage(&format!("cannot write {}: {e}", path.display()));
    }
}
