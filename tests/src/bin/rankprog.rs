//! `rankprog`: a scriptable rank program for rlaunch's integration tests.
//!
//! Its argv is a script: commands run in order, each followed by its arguments as separate
//! words. A word `@R` (or `@R1,R2,...`) makes the command right after it run only on those
//! ranks; the rank is `PMI_RANK` (0 when unset).
//!
//! ```text
//! rankprog ready @0 print 3 @1,2 exit 7 wait-signal
//! ```
//!
//! | command           | effect                                                               |
//! |-------------------|----------------------------------------------------------------------|
//! | `print N`         | N lines `rank <R> line <i>` (i = 0..N) on stdout                     |
//! | `eprint N`        | the same on stderr                                                   |
//! | `echo WORD`       | `WORD` and a newline on stdout                                       |
//! | `noeol TEXT`      | `TEXT` on stdout, no newline                                         |
//! | `flood BYTES`     | BYTES rounded up to whole 64-byte lines on stdout (format below)     |
//! | `flood-for SECS`  | flood lines on stdout for SECS seconds, as fast as stdout takes them |
//! | `ragged BYTES`    | at least BYTES of lines of 22 to 3022 bytes on stdout (format below) |
//! | `binary`          | the bytes 0..=255 on stdout                                          |
//! | `exit C`          | exit with code C                                                     |
//! | `signal S`        | restore S's default disposition, unblock it and raise it (S: number or name) |
//! | `ignore-term`     | ignore SIGTERM from now on                                           |
//! | `ready`           | `ready <R> <pid>` on stdout: the line tests synchronize on            |
//! | `sleep SECS`      | sleep SECS seconds (fractions allowed)                               |
//! | `wait-signal`     | wait for one of INT/TERM/HUP/QUIT/USR1/USR2, then print `got <SIGNAME>` |
//! | `daemon PIDFILE`  | leave a careless daemon behind (see below), then go on               |
//! | `stdin-sum`       | read stdin to EOF, print `stdin <nbytes> <fnv1a-64 as 16 hex digits>` |
//! | `cat`             | copy stdin to stdout until EOF                                       |
//! | `env`             | the environment, one `K=V` line each, sorted by key                  |
//! | `cwd`             | the current directory                                                |
//! | `args`            | this process's whole argv (argv\[0\] included) joined by `\|`        |
//! | `stdin-is-devnull`| `stdin-devnull yes` or `stdin-devnull no`                             |
//! | `fds`             | the open descriptors, `fds 0,1,2`                                    |
//! | `pipe-sizes`      | `pipes stdout=<bytes> new=<bytes>`: stdout's pipe capacity, a new pipe's |
//! | `alloc MIB`       | allocate MIB MiB and write every page of it; kept until the rank ends |
//! | `spin SECS`       | burn SECS seconds of CPU time in user space (fractions allowed)      |
//!
//! Stdout and stderr are flushed after every command, so what one command printed is out
//! before the next one starts. SIGPIPE has its default disposition, as in a C program.
//!
//! **`flood` lines** are exactly 64 bytes: `r<rank, 6 digits> <seq, 12 digits> ` (21 bytes), then
//! 42 padding bytes, the i-th (from 0) being `b'a' + (rank + seq + i) % 26`, then `\n`. Sequence
//! numbers count from 0 per rank and command. They are written 1024 lines (64 KiB) per
//! `write(2)`, so the launcher's relay sees large reads; `rlaunch_tests::check_flood`
//! verifies them. A pipe takes such a write a whole page (64 lines) at a time, so a rank
//! killed in the middle of one leaves whole lines behind. `flood-for` looks at the clock
//! before each write: it ends within one write of its time, which a slow reader may make long.
//!
//! **`ragged` lines** are `r<rank, 6 digits> <seq, 12 digits> ` (21 bytes), then
//! `seq * 7919 % 3001` padding bytes as in a flood line, then `\n`; lines are written until
//! BYTES are out, in writes of 65521 bytes (the last shorter) that cut lines anywhere:
//! `rlaunch_tests::check_ragged` verifies them.
//!
//! **`wait-signal`** cannot miss a signal sent right after `ready`: when a rank's script holds a
//! `wait-signal`, the six signals are blocked from startup and taken with `sigwait`; after the
//! last `wait-signal` they are unblocked, so a second one gets its default action.
//! `ignore-term` takes SIGTERM out of that set.
//!
//! **`daemon PIDFILE`** forks; the child calls `setsid` and forks again, then exits; the grandchild
//! unblocks every signal, writes its pid to `PIDFILE.tmp`, renames that to `PIDFILE`, and sleeps
//! forever with stdin, stdout and stderr still open. The rank reaps the child, waits for
//! `PIDFILE` to appear and goes on with its script.
//!
//! Exit codes of its own: 99 for a bad script, 98 when a command fails at run time.

use std::ffi::{OsStr, OsString};
use std::io::{self, Read, Write};
use std::os::fd::AsFd;
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::path::{Path, PathBuf};
use std::process;
use std::str::FromStr;
use std::time::{Duration, Instant};

use nix::errno::Errno;
use nix::fcntl::{fcntl, FcntlArg};
use nix::sys::signal::{raise, signal, SigHandler, SigSet, SigmaskHow, Signal};
use nix::sys::stat::{fstat, stat, SFlag};
use nix::sys::wait::{waitpid, WaitStatus};
use nix::unistd::{fork, getpid, setsid, ForkResult};

/// Exit code for a script that cannot be parsed.
const EXIT_BAD_SCRIPT: i32 = 99;
/// Exit code for a command that failed while running.
const EXIT_FAILED: i32 = 98;

const FLOOD_LINE: usize = 64;
const FLOOD_LINES_PER_WRITE: u64 = 1024;

/// The signals `wait-signal` waits for.
const WATCHED: [Signal; 6] = [
    Signal::SIGINT,
    Signal::SIGTERM,
    Signal::SIGHUP,
    Signal::SIGQUIT,
    Signal::SIGUSR1,
    Signal::SIGUSR2,
];

enum Command {
    Print(u64),
    Eprint(u64),
    Echo(OsString),
    NoEol(OsString),
    Flood(u64),
    FloodFor(Duration),
    Ragged(u64),
    Binary,
    Exit(i32),
    Raise(Signal),
    IgnoreTerm,
    Ready,
    Sleep(Duration),
    WaitSignal,
    Daemon(PathBuf),
    StdinSum,
    Cat,
    Env,
    Cwd,
    Args,
    StdinIsDevnull,
    Fds,
    PipeSizes,
    Alloc(usize),
    Spin(Duration),
}

struct Step {
    /// `None`: every rank runs it.
    ranks: Option<Vec<u32>>,
    command: Command,
}

/// What a running script shares between commands.
struct Rank {
    rank: u32,
    /// `wait-signal` commands still to come; the watched signals stay blocked while it is
    /// not zero.
    waits_left: usize,
    /// What `alloc` took, held until the end.
    held: Vec<Vec<u8>>,
}

fn main() {
    let words: Vec<OsString> = std::env::args_os().skip(1).collect();
    let steps = parse(&words).unwrap_or_else(|e| {
        eprintln!("rankprog: {e}");
        process::exit(EXIT_BAD_SCRIPT)
    });
    let rank = match std::env::var("PMI_RANK") {
        Err(_) => 0,
        Ok(text) => text.trim().parse().unwrap_or_else(|_| {
            eprintln!("rankprog: PMI_RANK is not a rank: {text:?}");
            process::exit(EXIT_BAD_SCRIPT)
        }),
    };
    let commands: Vec<Command> = steps
        .into_iter()
        .filter(|step| match &step.ranks {
            None => true,
            Some(ranks) => ranks.contains(&rank),
        })
        .map(|step| step.command)
        .collect();

    let mut state = Rank {
        rank,
        waits_left: commands.iter().filter(|c| matches!(c, Command::WaitSignal)).count(),
        held: Vec::new(),
    };
    let setup = restore_sigpipe().and_then(|()| {
        if state.waits_left > 0 {
            mask(SigmaskHow::SIG_BLOCK, &watched())
        } else {
            Ok(())
        }
    });
    if let Err(e) = setup {
        eprintln!("rankprog: rank {rank}: {e}");
        process::exit(EXIT_FAILED);
    }
    for command in commands {
        let result = run(command, &mut state).and_then(|()| flush_all());
        if let Err(e) = result {
            eprintln!("rankprog: rank {rank}: {e}");
            process::exit(EXIT_FAILED);
        }
    }
}

fn parse(words: &[OsString]) -> Result<Vec<Step>, String> {
    let mut steps = Vec::new();
    let mut words = words.iter();
    let mut ranks = None;
    while let Some(word) = words.next() {
        let word = word.to_str().ok_or_else(|| format!("not a command: {word:?}"))?;
        if let Some(list) = word.strip_prefix('@') {
            if ranks.is_some() {
                return Err(format!("two rank filters in a row before {word:?}"));
            }
            ranks = Some(parse_ranks(list)?);
            continue;
        }
        let mut arg =
            |what: &str| words.next().cloned().ok_or_else(|| format!("{word}: missing {what}"));
        let command = match word {
            "print" => Command::Print(number(word, &arg("line count")?)?),
            "eprint" => Command::Eprint(number(word, &arg("line count")?)?),
            "echo" => Command::Echo(arg("word")?),
            "noeol" => Command::NoEol(arg("text")?),
            "flood" => Command::Flood(number(word, &arg("byte count")?)?),
            "flood-for" => Command::FloodFor(seconds(word, &arg("seconds")?)?),
            "ragged" => Command::Ragged(number(word, &arg("byte count")?)?),
            "binary" => Command::Binary,
            "exit" => Command::Exit(number(word, &arg("exit code")?)?),
            "signal" => Command::Raise(parse_signal(&arg("signal")?)?),
            "ignore-term" => Command::IgnoreTerm,
            "ready" => Command::Ready,
            "sleep" => Command::Sleep(seconds(word, &arg("seconds")?)?),
            "wait-signal" => Command::WaitSignal,
            "daemon" => Command::Daemon(PathBuf::from(arg("pid file")?)),
            "stdin-sum" => Command::StdinSum,
            "cat" => Command::Cat,
            "env" => Command::Env,
            "cwd" => Command::Cwd,
            "args" => Command::Args,
            "stdin-is-devnull" => Command::StdinIsDevnull,
            "fds" => Command::Fds,
            "pipe-sizes" => Command::PipeSizes,
            "alloc" => Command::Alloc(number(word, &arg("MiB")?)?),
            "spin" => Command::Spin(seconds(word, &arg("seconds")?)?),
            _ => return Err(format!("unknown command {word:?}")),
        };
        steps.push(Step { ranks: ranks.take(), command });
    }
    if ranks.is_some() {
        return Err("a rank filter at the end of the script applies to nothing".into());
    }
    Ok(steps)
}

fn parse_ranks(list: &str) -> Result<Vec<u32>, String> {
    list.split(',')
        .map(|r| r.parse().map_err(|_| format!("bad rank filter @{list}: {r:?} is not a rank")))
        .collect()
}

fn number<T: FromStr>(command: &str, word: &OsStr) -> Result<T, String> {
    word.to_str()
        .and_then(|w| w.parse().ok())
        .ok_or_else(|| format!("{command}: not a number: {word:?}"))
}

/// Seconds, fractions allowed.
fn seconds(command: &str, word: &OsStr) -> Result<Duration, String> {
    let secs: f64 = number(command, word)?;
    Duration::try_from_secs_f64(secs).map_err(|_| format!("{command}: not a duration: {secs}"))
}

/// Accepts `15`, `TERM` or `SIGTERM`.
fn parse_signal(word: &OsStr) -> Result<Signal, String> {
    let text = word.to_str().unwrap_or_default();
    let signal = match text.parse::<i32>() {
        Ok(n) => Signal::try_from(n).ok(),
        Err(_) if text.starts_with("SIG") => Signal::from_str(text).ok(),
        Err(_) => Signal::from_str(&format!("SIG{text}")).ok(),
    };
    signal.ok_or_else(|| format!("signal: not a signal: {word:?}"))
}

fn run(command: Command, state: &mut Rank) -> Result<(), String> {
    let rank = state.rank;
    match command {
        Command::Print(n) => (0..n).try_for_each(|i| out(format!("rank {rank} line {i}\n"))),
        Command::Eprint(n) => (0..n).try_for_each(|i| {
            io::stderr()
                .write_all(format!("rank {rank} line {i}\n").as_bytes())
                .map_err(|e| format!("cannot write stderr: {e}"))
        }),
        Command::Echo(word) => {
            let mut line = word.into_vec();
            line.push(b'\n');
            out(line)
        }
        Command::NoEol(text) => out(text.into_vec()),
        Command::Flood(bytes) => {
            let lines = bytes.div_ceil(FLOOD_LINE as u64);
            flood(rank, |seq| (seq < lines).then(|| (lines - seq).min(FLOOD_LINES_PER_WRITE)))
        }
        Command::FloodFor(time) => {
            let end = Instant::now() + time;
            flood(rank, |_| (Instant::now() < end).then_some(FLOOD_LINES_PER_WRITE))
        }
        Command::Ragged(bytes) => ragged(rank, bytes),
        Command::Binary => out((0..=255).collect::<Vec<u8>>()),
        Command::Exit(code) => {
            flush_all()?;
            process::exit(code)
        }
        Command::Raise(sig) => raise_default(sig),
        Command::IgnoreTerm => {
            // SAFETY: SIG_IGN runs no code in the signal context.
            unsafe { signal(Signal::SIGTERM, SigHandler::SigIgn) }
                .map_err(|e| format!("cannot ignore SIGTERM: {e}"))?;
            // Blocked, an ignored signal would stay pending for `wait-signal`.
            mask(SigmaskHow::SIG_UNBLOCK, &set_of(&[Signal::SIGTERM]))
        }
        Command::Ready => out(format!("ready {rank} {}\n", getpid())),
        Command::Sleep(time) => {
            std::thread::sleep(time);
            Ok(())
        }
        Command::Alloc(mib) => {
            // Written, not just reserved: every page counts in the peak resident set.
            state.held.push(vec![1u8; mib << 20]);
            Ok(())
        }
        Command::Spin(cpu) => {
            let mut x = 0u64;
            while cpu_time() < cpu {
                for i in 0..100_000u64 {
                    x = std::hint::black_box(x.wrapping_mul(31).wrapping_add(i));
                }
            }
            Ok(())
        }
        Command::WaitSignal => wait_signal(state),
        Command::Daemon(pidfile) => daemon(pidfile),
        Command::StdinSum => {
            let mut input = Vec::new();
            io::stdin().read_to_end(&mut input).map_err(|e| format!("cannot read stdin: {e}"))?;
            out(format!("stdin {} {:016x}\n", input.len(), fnv1a64(&input)))
        }
        Command::Cat => cat(),
        Command::Env => {
            let mut vars: Vec<(OsString, OsString)> = std::env::vars_os().collect();
            vars.sort();
            let mut text = Vec::new();
            for (key, value) in vars {
                text.extend_from_slice(key.as_bytes());
                text.push(b'=');
                text.extend_from_slice(value.as_bytes());
                text.push(b'\n');
            }
            out(text)
        }
        Command::Cwd => {
            let dir = std::env::current_dir().map_err(|e| format!("cannot get cwd: {e}"))?;
            let mut line = dir.into_os_string().into_vec();
            line.push(b'\n');
            out(line)
        }
        Command::Args => {
            let argv: Vec<OsString> = std::env::args_os().collect();
            let mut line = argv.join(OsStr::new("|")).into_vec();
            line.push(b'\n');
            out(line)
        }
        Command::StdinIsDevnull => {
            let answer = if stdin_is_devnull() { "yes" } else { "no" };
            out(format!("stdin-devnull {answer}\n"))
        }
        Command::Fds => {
            let fds = open_fds()?;
            let list: Vec<String> = fds.iter().map(i32::to_string).collect();
            out(format!("fds {}\n", list.join(",")))
        }
        Command::PipeSizes => {
            use std::os::fd::AsRawFd;
            let size = |fd: std::os::fd::BorrowedFd| {
                fcntl(fd.as_raw_fd(), FcntlArg::F_GETPIPE_SZ)
                    .map_err(|e| format!("F_GETPIPE_SZ: {e}"))
            };
            let stdout = size(io::stdout().as_fd())?;
            let (_r, w) = nix::unistd::pipe().map_err(|e| format!("cannot make a pipe: {e}"))?;
            out(format!("pipes stdout={stdout} new={}\n", size(w.as_fd())?))
        }
    }
}

fn out(bytes: impl AsRef<[u8]>) -> Result<(), String> {
    io::stdout().write_all(bytes.as_ref()).map_err(|e| format!("cannot write stdout: {e}"))
}

fn flush_all() -> Result<(), String> {
    io::stdout().flush().map_err(|e| format!("cannot write stdout: {e}"))?;
    io::stderr().flush().map_err(|e| format!("cannot write stderr: {e}"))
}

/// Rust starts programs with SIGPIPE ignored; a rank should die of it like a C program.
fn restore_sigpipe() -> Result<(), String> {
    // SAFETY: SIG_DFL runs no code in the signal context.
    unsafe { signal(Signal::SIGPIPE, SigHandler::SigDfl) }
        .map(drop)
        .map_err(|e| format!("cannot restore SIGPIPE: {e}"))
}

fn set_of(signals: &[Signal]) -> SigSet {
    let mut set = SigSet::empty();
    for &sig in signals {
        set.add(sig);
    }
    set
}

fn watched() -> SigSet {
    set_of(&WATCHED)
}

fn mask(how: SigmaskHow, set: &SigSet) -> Result<(), String> {
    nix::sys::signal::sigprocmask(how, Some(set), None)
        .map_err(|e| format!("cannot change the signal mask: {e}"))
}

fn raise_default(sig: Signal) -> Result<(), String> {
    // SAFETY: SIG_DFL runs no code in the signal context.
    match unsafe { signal(sig, SigHandler::SigDfl) } {
        // SIGKILL and SIGSTOP have no disposition to restore.
        Ok(_) | Err(Errno::EINVAL) => {}
        Err(e) => return Err(format!("cannot restore the default action of {sig}: {e}")),
    }
    mask(SigmaskHow::SIG_UNBLOCK, &set_of(&[sig]))?;
    flush_all()?;
    raise(sig).map_err(|e| format!("cannot raise {sig}: {e}"))
}

fn wait_signal(state: &mut Rank) -> Result<(), String> {
    let blocked =
        SigSet::thread_get_mask().map_err(|e| format!("cannot read the signal mask: {e}"))?;
    let waited = set_of(&WATCHED.into_iter().filter(|&s| blocked.contains(s)).collect::<Vec<_>>());
    let sig = waited.wait().map_err(|e| format!("cannot wait for a signal: {e}"))?;
    out(format!("got {}\n", sig.as_str()))?;
    flush_all()?;
    state.waits_left -= 1;
    if state.waits_left == 0 {
        mask(SigmaskHow::SIG_UNBLOCK, &watched())?;
    }
    Ok(())
}

/// The `r<rank> <seq> ` head of every line; see the crate doc for the whole format.
fn flood_line(rank: u32, seq: u64, line: &mut Vec<u8>) {
    let start = line.len();
    line.extend_from_slice(format!("r{rank:06} {seq:012} ").as_bytes());
    let pad = FLOOD_LINE - 1 - (line.len() - start);
    let base = u64::from(rank) + seq;
    line.extend((0..pad as u64).map(|i| b'a' + ((base + i) % 26) as u8));
    line.push(b'\n');
}

/// Writes flood lines from sequence number 0, as many per write as `next(seq)` says, until
/// it says `None`.
fn flood(rank: u32, mut next: impl FnMut(u64) -> Option<u64>) -> Result<(), String> {
    flush_all()?;
    let mut chunk = Vec::with_capacity(FLOOD_LINE * FLOOD_LINES_PER_WRITE as usize);
    let mut seq = 0;
    while let Some(count) = next(seq) {
        chunk.clear();
        for s in seq..seq + count {
            flood_line(rank, s, &mut chunk);
        }
        write_stdout_raw(&chunk)?;
        seq += count;
    }
    Ok(())
}

/// One `write(2)` per call as far as the pipe allows, past std's line buffering.
/// Writes ragged lines until `bytes` are out, 65521 bytes per write.
fn ragged(rank: u32, bytes: u64) -> Result<(), String> {
    const WRITE: usize = 65521;
    flush_all()?;
    let (mut pending, mut written, mut seq) = (Vec::new(), 0u64, 0u64);
    while written < bytes {
        let start = pending.len();
        pending.extend_from_slice(format!("r{rank:06} {seq:012} ").as_bytes());
        let pad = seq * 7919 % 3001;
        let base = u64::from(rank) + seq;
        pending.extend((0..pad).map(|i| b'a' + ((base + i) % 26) as u8));
        pending.push(b'\n');
        written += (pending.len() - start) as u64;
        seq += 1;
        while pending.len() >= WRITE {
            write_stdout_raw(&pending[..WRITE])?;
            pending.drain(..WRITE);
        }
    }
    write_stdout_raw(&pending)
}

fn write_stdout_raw(mut buf: &[u8]) -> Result<(), String> {
    let stdout = io::stdout();
    while !buf.is_empty() {
        match nix::unistd::write(stdout.as_fd(), buf) {
            Ok(n) => buf = &buf[n..],
            Err(Errno::EINTR) => {}
            Err(e) => return Err(format!("cannot write stdout: {e}")),
        }
    }
    Ok(())
}

fn cat() -> Result<(), String> {
    let mut input = io::stdin().lock();
    let mut output = io::stdout().lock();
    let mut buf = vec![0; 64 * 1024];
    loop {
        let n = match input.read(&mut buf) {
            Ok(0) => return Ok(()),
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(format!("cannot read stdin: {e}")),
        };
        output
            .write_all(&buf[..n])
            .and_then(|()| output.flush())
            .map_err(|e| format!("cannot write stdout: {e}"))?;
    }
}

/// The null device is the character device with null's device number, whichever inode
/// (and device-file system) it was opened through.
fn stdin_is_devnull() -> bool {
    let (Ok(stdin), Ok(null)) = (fstat(0), stat("/dev/null")) else {
        return false;
    };
    let is_chr = |mode| SFlag::from_bits_truncate(mode) & SFlag::S_IFMT == SFlag::S_IFCHR;
    is_chr(stdin.st_mode) && is_chr(null.st_mode) && stdin.st_rdev == null.st_rdev
}

fn open_fds() -> Result<Vec<i32>, String> {
    let entries = std::fs::read_dir("/proc/self/fd")
        .map_err(|e| format!("cannot list /proc/self/fd: {e}"))?;
    let mut fds: Vec<i32> =
        entries.filter_map(|entry| entry.ok()?.file_name().to_str()?.parse().ok()).collect();
    // The listing includes the directory's own descriptor, closed by now.
    fds.retain(|&fd| fcntl(fd, FcntlArg::F_GETFD).is_ok());
    fds.sort_unstable();
    Ok(fds)
}

fn daemon(pidfile: PathBuf) -> Result<(), String> {
    flush_all()?;
    let mut tmp = pidfile.clone().into_os_string();
    tmp.push(".tmp");
    let tmp = PathBuf::from(tmp);
    // SAFETY: rankprog has a single thread, so the child may run any code.
    match unsafe { fork() }.map_err(|e| format!("cannot fork: {e}"))? {
        ForkResult::Child => {
            let _ = setsid();
            // SAFETY: still a single thread.
            match unsafe { fork() } {
                Ok(ForkResult::Child) => daemon_body(&tmp, &pidfile),
                // SAFETY: _exit skips atexit handlers, which belong to the rank.
                Ok(ForkResult::Parent { .. }) => unsafe { nix::libc::_exit(0) },
                Err(_) => unsafe { nix::libc::_exit(EXIT_FAILED) },
            }
        }
        ForkResult::Parent { child } => {
            match waitpid(child, None) {
                Ok(WaitStatus::Exited(_, 0)) => {}
                Ok(status) => return Err(format!("daemon: the first child ended: {status:?}")),
                Err(e) => return Err(format!("daemon: cannot wait for the first child: {e}")),
            }
            let deadline = Instant::now() + Duration::from_secs(30);
            while !pidfile.exists() {
                if Instant::now() > deadline {
                    return Err(format!("daemon: {} never appeared", pidfile.display()));
                }
                std::thread::sleep(Duration::from_millis(5));
            }
            Ok(())
        }
    }
}

fn daemon_body(tmp: &Path, pidfile: &Path) -> ! {
    let _ = mask(SigmaskHow::SIG_SETMASK, &SigSet::empty());
    let written =
        std::fs::write(tmp, format!("{}\n", getpid())).and_then(|()| std::fs::rename(tmp, pidfile));
    if let Err(e) = written {
        eprintln!("rankprog: daemon: cannot write {}: {e}", pidfile.display());
        // SAFETY: as for the first child.
        unsafe { nix::libc::_exit(EXIT_FAILED) }
    }
    loop {
        std::thread::sleep(Duration::from_secs(3600));
    }
}

/// FNV-1a, 64 bits: the same as `rlaunch_tests::fnv1a64`.
fn fnv1a64(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |hash, &b| {
        (hash ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

/// The CPU time this process has used so far.
fn cpu_time() -> Duration {
    let mut t = nix::libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: clock_gettime writes one timespec, ours.
    unsafe { nix::libc::clock_gettime(nix::libc::CLOCK_PROCESS_CPUTIME_ID, &mut t) };
    Duration::new(t.tv_sec as u64, t.tv_nsec as u32)
}
