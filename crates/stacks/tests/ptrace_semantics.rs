//! Kernel-behaviour and robustness tests for the ptrace layer (run as root or with CAP_SYS_PTRACE).
use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use nix::sys::ptrace;
use nix::unistd::Pid;
use rlaunch_stacks::ptrace::{list_tids, thread_stat};

/// Reads `pid` on a thread of its own, as the proxy does.
fn read(pid: i32) -> rlaunch_stacks::Process {
    std::thread::spawn(move || rlaunch_stacks::Reader::new().read(pid)).join().unwrap()
}

/// The tests wait4(-1) on all children, so they must not run concurrently.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

/// Kills the child when dropped (also when a test panics), so no helper outlives its test.
struct Reap(std::process::Child);
impl Drop for Reap {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn helper(name: &str) -> String {
    let out = format!("{}/{name}", env!("CARGO_TARGET_TMPDIR"));
    let src = format!("{}/tests/helpers/{name}.c", env!("CARGO_MANIFEST_DIR"));
    let ok = Command::new("cc").args(["-g", "-O0", "-pthread", "-o", &out, &src]).status().unwrap();
    assert!(ok.success());
    out
}

fn spawn_ready(path: &str, args: &[&str]) -> (Reap, BufReader<std::process::ChildStdout>) {
    let mut c =
        Command::new(path).args(args).stdout(Stdio::piped()).stderr(Stdio::null()).spawn().unwrap();
    let mut r = BufReader::new(c.stdout.take().unwrap());
    let c = Reap(c);
    if path.ends_with("sigcount") {
        let mut l = String::new();
        r.read_line(&mut l).unwrap();
        assert_eq!(l, "ready\n");
    } else {
        std::thread::sleep(Duration::from_millis(200));
    }
    (c, r)
}

/// Verifies: a plain `wait4(-1, WNOHANG)` (no WUNTRACED, no __WALL) in the tracer DOES report
/// the ptrace-stops of every traced thread, leader and non-leader alike (Linux >= 4.7 treats
/// ptraced children as __WALL), with WIFSTOPPED status (SIGTRAP | PTRACE_EVENT_STOP << 8).
#[test]
fn plain_wait4_reports_ptrace_stops_of_all_threads() {
    let _g = serial();
    let prog = helper("cprog");
    let (child, _r) = spawn_ready(&prog, &["sleep", "3"]);
    let pid = child.0.id() as i32;
    let tids = list_tids(pid).unwrap();
    assert_eq!(tids.len(), 3);
    for &t in &tids {
        ptrace::seize(Pid::from_raw(t), ptrace::Options::empty()).unwrap();
        ptrace::interrupt(Pid::from_raw(t)).unwrap();
    }
    let t0 = Instant::now();
    while !tids.iter().all(|&t| thread_stat(pid, t).unwrap().0 == 't') {
        assert!(t0.elapsed() < Duration::from_secs(2));
        std::thread::sleep(Duration::from_millis(1));
    }
    let mut seen = Vec::new();
    loop {
        let mut st = 0;
        let r = unsafe { libc::wait4(-1, &mut st, libc::WNOHANG, std::ptr::null_mut()) };
        if r <= 0 {
            break;
        }
        assert!(libc::WIFSTOPPED(st) && !libc::WIFEXITED(st) && !libc::WIFSIGNALED(st));
        assert_eq!(st >> 8, libc::SIGTRAP | (libc::PTRACE_EVENT_STOP << 8));
        seen.push(r);
    }
    seen.sort();
    assert_eq!(seen, tids, "wait4(-1, WNOHANG) reports every traced thread's stop");
    for &t in &tids {
        ptrace::detach(Pid::from_raw(t), None).unwrap();
    }
}

/// Signals that arrive while we hold the threads (signal-delivery-stops) must be re-injected on
/// detach.  RT signals queue, so the child's count must equal the number we sent.  A concurrent
/// wait4(-1) reaper thread steals stop notifications meanwhile; dumps must still work.
#[test]
fn no_signal_lost_and_reaper_tolerated() {
    let _g = serial();
    let prog = helper("sigcount");
    let (mut child, mut out) = spawn_ready(&prog, &[]);
    let pid = child.0.id() as i32;
    let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let d2 = done.clone();
    let sender = std::thread::spawn(move || {
        let mut sent = 0;
        for _ in 0..4000 {
            if unsafe { libc::kill(pid, libc::SIGRTMIN()) } == 0 {
                sent += 1;
            }
            std::thread::sleep(Duration::from_micros(100));
        }
        d2.store(true, std::sync::atomic::Ordering::SeqCst);
        sent
    });
    let reaper_done = done.clone();
    let reaper = std::thread::spawn(move || {
        let mut stolen = 0;
        while !reaper_done.load(std::sync::atomic::Ordering::SeqCst) {
            let mut st = 0;
            let r = unsafe { libc::wait4(-1, &mut st, libc::WNOHANG, std::ptr::null_mut()) };
            if r > 0 {
                assert!(libc::WIFSTOPPED(st), "reaper must only ever see stops here");
                stolen += 1;
            }
            std::thread::sleep(Duration::from_micros(50));
        }
        stolen
    });
    // One reader on one thread for every dump, as the proxy reads its ranks: the files are
    // read once, and the dumps come fast while the signals fly.
    let reading = done.clone();
    let dumps = std::thread::spawn(move || {
        let mut reader = rlaunch_stacks::Reader::new();
        let mut dumps = 0;
        while !reading.load(std::sync::atomic::Ordering::SeqCst) {
            let d = reader.read(pid);
            assert_eq!(d.threads.len(), 3);
            assert!(d.threads.iter().all(|t| t.note.is_none()), "{:?}", d.threads);
            dumps += 1;
        }
        dumps
    });
    let dumps = dumps.join().unwrap();
    let sent = sender.join().unwrap();
    let stolen = reaper.join().unwrap();
    unsafe { libc::kill(pid, libc::SIGRTMIN() + 1) };
    let mut l = String::new();
    out.read_line(&mut l).unwrap();
    child.0.wait().unwrap();
    eprintln!(
        "dumps {dumps}, signals sent {sent}, received {}, stops stolen by reaper {stolen}",
        l.trim()
    );
    assert!(dumps > 5);
    assert_eq!(l.trim().parse::<i32>().unwrap(), sent);
}

/// A dump of a C program built with -g shows our functions with file:line.
#[test]
fn c_program_frames() {
    let _g = serial();
    let prog = helper("cprog");
    let (child, _r) = spawn_ready(&prog, &["sleep", "2"]);
    let d = read(child.0.id() as i32);
    assert_eq!(d.threads.len(), 2);
    for t in &d.threads {
        let names: Vec<&str> = t.frames.iter().map(|f| f.function.as_str()).collect();
        assert!(names.contains(&"sleep_forever"), "{names:?}");
        let f = t.frames.iter().find(|f| f.function == "sleep_forever").unwrap();
        assert!(f.file.as_deref().unwrap().ends_with("cprog.c") && f.line == Some(9), "{f:?}");
    }
}
