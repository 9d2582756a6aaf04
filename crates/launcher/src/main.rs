//! `rlaunch`: parse the command line, build the plan, run the job, exit with its status.
//! What each step does is in the `rlaunch` library (`lib.rs`).

use std::ffi::OsString;
use std::fmt::Display;

use rlaunch::error::SetupError;
use rlaunch::options::{self, Request};
use rlaunch::plan::{self, PlanError};
use rlaunch::{ctl, exit, help, job, process, timeline_page};

fn main() {
    rlaunch_tree::tune_malloc();
    rlaunch_tree::procs::cloexec_inherited_fds();
    let args: Vec<OsString> = std::env::args_os().skip(1).collect();
    // `rlaunch timeline TRACE.json -o PAGE.html`: draws a --timeline trace. Only as the very
    // first word: `rlaunch -n 1 timeline` runs a program of that name.
    if args.first().is_some_and(|a| a == "timeline") {
        match timeline_page::run(&args[1..]) {
            Ok(page) => return println!("{}", page.display()),
            Err(e) => fail(&e, e.exit_code()),
        }
    }
    // `rlaunch ps [PID]`, `rlaunch stacks [PID]`: ask a running job where its ranks are
    // (docs/hangs.md). Only as the very first word, as `timeline`.
    if let Some(ask) = args.first().and_then(|a| ctl::Ask::from_word(a)) {
        match ctl::ask(ask, &args[1..]) {
            Ok(answer) => return print!("{answer}"),
            Err(e) => fail(&e, e.exit_code()),
        }
    }
    let env: Vec<(OsString, OsString)> = std::env::vars_os().collect();
    let cwd =
        std::env::current_dir().unwrap_or_else(|e| fail(SetupError::CurrentDir(e), exit::FAILURE));
    let options = match options::parse(&args, &env, &cwd) {
        Ok(Request::Run(options)) => options,
        Ok(Request::Help { all }) => return print!("{}", help::help(all)),
        Ok(Request::Version) => return println!("{}", rlaunch::help::version()),
        Ok(Request::Info) => {
            let getenv = |name: &str| std::env::var(name).ok();
            return print!("{}", help::info(getenv));
        }
        Err(e) => fail(e, exit::USAGE),
    };
    process::start_logging(options.verbose);
    process::raise_fd_limit();
    for notice in &options.notices {
        eprintln!("rlaunch: {notice}");
    }
    let mut plan = match plan::build(&options, &env) {
        Ok(plan) => plan,
        Err(PlanError::Usage(e)) => fail(e, exit::USAGE),
        Err(PlanError::Setup(e)) => fail(e, exit::FAILURE),
    };
    for notice in &plan.notices {
        eprintln!("rlaunch: {notice}");
    }
    // Still the only thread: the runtime and the writer thread come after.
    job::fork_local_proxies(&mut plan);
    let runtime =
        tokio::runtime::Builder::new_current_thread().enable_all().build().expect("tokio runtime");
    std::process::exit(runtime.block_on(job::run(plan)));
}

/// Ends rlaunch before the job starts: one line saying why, and the status for its kind.
fn fail(error: impl Display, status: i32) -> ! {
    eprintln!("rlaunch: {error}");
    std::process::exit(status)
}
