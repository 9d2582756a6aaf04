//! Test driver.
//!   stackdump [opts] PID
//!   stackdump [opts] --spawn MS -- CMD ARGS...   (we are the parent, as the rlaunch proxy is)
//! opts: --deadline-ms N  --no-python  --repeat N  --quiet
//!       --reaper   install a SIGCHLD handler that reaps with wait4(-1, WNOHANG) like the proxy
use std::sync::atomic::{AtomicUsize, AtomicU64, Ordering};
use std::time::Duration;

static REAPED: [AtomicU64; 64] = [const { AtomicU64::new(0) }; 64];
static NREAPED: AtomicUsize = AtomicUsize::new(0);

extern "C" fn on_sigchld(_: libc::c_int) {
    loop {
        let mut st = 0;
        let pid = unsafe { libc::wait4(-1, &mut st, libc::WNOHANG, std::ptr::null_mut()) };
        if pid <= 0 {
            break;
        }
        let i = NREAPED.fetch_add(1, Ordering::SeqCst);
        if i < 64 {
            REAPED[i].store(((pid as u64) << 32) | st as u32 as u64, Ordering::SeqCst);
        }
    }
}

fn describe(st: i32) -> String {
    if libc::WIFEXITED(st) {
        format!("exited {}", libc::WEXITSTATUS(st))
    } else if libc::WIFSIGNALED(st) {
        format!("killed by signal {}", libc::WTERMSIG(st))
    } else if libc::WIFSTOPPED(st) {
        format!("STOPPED sig {} event {} (status 0x{st:x})", libc::WSTOPSIG(st), (st >> 16) & 0xff)
    } else {
        format!("other 0x{st:x}")
    }
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mut opts = stackdump::Options::default();
    let (mut repeat, mut quiet, mut reaper, mut spawn_ms, mut pid) = (1usize, false, false, None, None);
    let (mut nocldstop, mut reaper_thread, mut linger_ms, mut same_thread) = (false, false, 0u64, false);
    let mut cmd: Vec<String> = Vec::new();
    let mut i = 0;
    while i < args.len() {
        match args[i].as_str() {
            "--deadline-ms" => {
                i += 1;
                opts.stop_deadline = Duration::from_millis(args[i].parse().unwrap());
            }
            "--no-python" => opts.python = Some(false),
            "--repeat" => {
                i += 1;
                repeat = args[i].parse().unwrap();
            }
            "--quiet" => quiet = true,
            "--same-thread" => same_thread = true,
            "--linger" => {
                i += 1;
                linger_ms = args[i].parse().unwrap();
            }
            "--reaper" => reaper = true,
            "--nocldstop" => nocldstop = true,
            "--reaper-thread" => reaper_thread = true,
            "--spawn" => {
                i += 1;
                spawn_ms = Some(args[i].parse::<u64>().unwrap());
            }
            "--" => {
                cmd = args[i + 1..].to_vec();
                break;
            }
            a => pid = Some(a.parse::<i32>().expect("pid")),
        }
        i += 1;
    }
    if reaper {
        unsafe {
            let mut sa: libc::sigaction = std::mem::zeroed();
            sa.sa_sigaction = on_sigchld as *const () as usize;
            sa.sa_flags = libc::SA_RESTART | if nocldstop { libc::SA_NOCLDSTOP } else { 0 };
            libc::sigaction(libc::SIGCHLD, &sa, std::ptr::null_mut());
        }
    }
    if reaper_thread {
        // Worst case: a thread that polls wait4(-1, WNOHANG) continuously.
        reaper = true;
        std::thread::spawn(|| loop {
            on_sigchld(0);
            std::thread::sleep(Duration::from_micros(20));
        });
    }
    let mut child = None;
    if let Some(ms) = spawn_ms {
        let c = std::process::Command::new(&cmd[0]).args(&cmd[1..]).spawn().expect("spawn");
        pid = Some(c.id() as i32);
        child = Some(c);
        std::thread::sleep(Duration::from_millis(ms));
    }
    let pid = pid.expect("usage: stackdump [opts] PID | --spawn MS -- CMD...");

    let mut errors = std::collections::BTreeMap::new();
    let mut stopped = Vec::new();
    let mut totals = Vec::new();
    for n in 0..repeat {
        let r = if same_thread {
            stackdump::dump_on_this_thread(pid, &opts)
        } else {
            stackdump::dump(pid, &opts)
        };
        let d = match r {
            Ok(d) => d,
            Err(e) => {
                eprintln!("dump failed: {e}");
                std::process::exit(1);
            }
        };
        if n == 0 && !quiet {
            print!("{}", stackdump::format_dump(&d));
        }
        if n == 0 {
            let t = &d.timings;
            println!(
                "timings: preload {:.2?}, stop {:.2?}, unwind+py {:.2?}, resume {:.2?}, stopped total {:.2?}, symbolize {:.2?}, total {:.2?}",
                t.preload, t.stop, t.read, t.resume, t.stopped_total, t.symbolize, t.total
            );
        }
        for t in &d.threads {
            if let Some(e) = &t.error {
                *errors.entry(e.clone()).or_insert(0usize) += 1;
            }
        }
        stopped.push(d.timings.stopped_total);
        totals.push(d.timings.total);
    }
    if repeat > 1 {
        stopped.sort();
        totals.sort();
        println!(
            "repeat {repeat}: stopped median {:.2?} max {:.2?}; total median {:.2?} max {:.2?}",
            stopped[repeat / 2], stopped[repeat - 1], totals[repeat / 2], totals[repeat - 1]
        );
        println!("thread errors over all repeats: {errors:?}");
    }
    if linger_ms > 0 {
        // Stay alive (so only the tracer *thread* has exited) and watch the target.
        std::thread::sleep(Duration::from_millis(linger_ms));
        let st = stackdump::ptrace::thread_stat(pid, pid).map(|s| s.0);
        let tracer = std::fs::read_to_string(format!("/proc/{pid}/status"))
            .ok()
            .and_then(|s| s.lines().find(|l| l.starts_with("TracerPid")).map(|l| l.to_string()));
        println!("after {linger_ms} ms with dumper alive: target state {st:?}, {tracer:?}");
    }
    if reaper {
        std::thread::sleep(Duration::from_millis(50));
        let n = NREAPED.load(Ordering::SeqCst).min(64);
        println!("reaper saw {n} wait4(-1, WNOHANG) results during the dump:");
        for r in &REAPED[..n] {
            let v = r.load(Ordering::SeqCst);
            println!("  pid {}: {}", v >> 32, describe(v as u32 as i32));
        }
    }
    if let Some(mut c) = child {
        let alive = unsafe { libc::kill(pid, 0) } == 0;
        let state = stackdump::ptrace::thread_stat(pid, pid).map(|s| s.0);
        println!("child after dump: alive={alive} state={state:?}");
        let _ = c.kill();
        let _ = c.wait();
    }
}
