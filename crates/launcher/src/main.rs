//! `rlaunch`: parse the command line, build the plan, run the job, exit with its status.

mod args;
mod configfile;
mod help;
mod hosts;
mod job;
mod options;
mod output;
mod plan;
mod stdin;

use std::ffi::OsString;
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::time::{SystemTime, UNIX_EPOCH};

use options::{LauncherKind, MapBy, Options, Request};
use pmi_wire::control::{Bootstrap, Job, Segment, StdinTarget};

/// Exit status for command-line errors.
const EXIT_USAGE: i32 = 2;
/// Exit status when rlaunch itself cannot run the job.
const EXIT_INTERNAL: i32 = 255;

fn main() {
    rlaunch_proxy::tune_malloc();
    rlaunch_proxy::procs::cloexec_inherited_fds();
    let args: Vec<OsString> = std::env::args_os().skip(1).collect();
    let env: Vec<(OsString, OsString)> = std::env::vars_os().collect();
    let cwd = match std::env::current_dir() {
        Ok(dir) => dir,
        Err(e) => {
            eprintln!("rlaunch: cannot read the current directory: {}", hosts::plain(&e));
            std::process::exit(EXIT_INTERNAL);
        }
    };
    let options = match options::parse(&args, &env, &cwd) {
        Ok(Request::Run(options)) => options,
        Ok(Request::Help { all }) => {
            print!("{}", help::help(all));
            return;
        }
        Ok(Request::Version) => {
            println!("rlaunch {}", env!("CARGO_PKG_VERSION"));
            return;
        }
        Ok(Request::Info) => {
            print!("{}", help::info());
            return;
        }
        Err(msg) => {
            eprintln!("rlaunch: {msg}");
            std::process::exit(EXIT_USAGE);
        }
    };
    if options.verbose > 0 && std::env::var_os("RLAUNCH_LOG").is_none() {
        let level = if options.verbose == 1 { "info" } else { "debug" };
        // Before any thread exists; the proxies inherit it.
        std::env::set_var("RLAUNCH_LOG", level);
    }
    rlaunch_proxy::init_logging("rlaunch");
    raise_fd_limit();
    for notice in &options.notices {
        eprintln!("rlaunch: {notice}");
    }
    let mut plan = match build_plan(&options, &env) {
        Ok(plan) => plan,
        Err(PlanError::Usage(msg)) => {
            eprintln!("rlaunch: {msg}");
            std::process::exit(EXIT_USAGE);
        }
        Err(PlanError::Setup(msg)) => {
            eprintln!("rlaunch: {msg}");
            std::process::exit(EXIT_INTERNAL);
        }
    };
    // Still the only thread: the runtime and the writer thread come after.
    job::fork_local_proxies(&mut plan);
    let runtime =
        tokio::runtime::Builder::new_current_thread().enable_all().build().expect("tokio runtime");
    let code = runtime.block_on(job::run(plan));
    std::process::exit(code);
}

enum PlanError {
    Usage(String),
    Setup(String),
}

fn build_plan(o: &Options, env: &[(OsString, OsString)]) -> Result<job::Plan, PlanError> {
    let usage = PlanError::Usage;
    let own_host = hostname::get()
        .map(|h| h.to_string_lossy().into_owned())
        .unwrap_or_else(|_| "localhost".into());

    // Host lists, each read once however many segments use it.
    let mut sources = Vec::new();
    let mut lists = Vec::new();
    let mut counts = Vec::new();
    for seg in &o.segments {
        let list = match sources.iter().position(|s| *s == seg.hosts.as_ref()) {
            Some(i) => i,
            None => {
                let mut hosts =
                    options::read_hosts(seg.hosts.as_ref(), &own_host).map_err(usage)?;
                if let Some(ppn) = o.ppn {
                    hosts.iter_mut().for_each(|h| h.slots = ppn);
                }
                sources.push(seg.hosts.as_ref());
                lists.push(hosts);
                lists.len() - 1
            }
        };
        let slots: u32 = lists[list].iter().map(|h| h.slots).sum();
        counts.push((list, seg.np.unwrap_or(slots)));
    }
    let size = counts.iter().try_fold(0u32, |sum, (_, n)| sum.checked_add(*n));
    let size = size.ok_or_else(|| usage("too many ranks".into()))?;
    let rank_hosts = plan::place_segments(&lists, &counts, o.map_by == MapBy::Node);

    let proxy_exe = plan::proxy_exe().map_err(PlanError::Setup)?;
    let bootstrap = match o.launcher {
        Some(LauncherKind::Fork) => Bootstrap::Fork,
        kind => {
            let argv = match &o.launcher_exec {
                Some(argv) => argv.clone(),
                None if kind == Some(LauncherKind::Rsh) => vec!["rsh".to_string()],
                None => vec!["ssh".into(), "-x".into(), "-oBatchMode=yes".into()],
            };
            let proxy_path = match &o.proxy_path {
                Some(p) => p.clone(),
                None => proxy_exe.to_string_lossy().into_owned(),
            };
            Bootstrap::Remote { argv, proxy_path }
        }
    };
    let forced_remote = matches!(o.launcher, Some(LauncherKind::Ssh | LauncherKind::Rsh));
    let fork_host = |name: &str| {
        bootstrap == Bootstrap::Fork || (!forced_remote && hosts::is_local(name, &own_host))
    };
    let stdin = match o.stdin.as_str() {
        "all" => StdinTarget::All,
        "none" => StdinTarget::None,
        r => match r.parse::<u32>() {
            Ok(rank) if rank < size => StdinTarget::Rank(rank),
            Ok(rank) => {
                return Err(usage(format!("--stdin {rank}: the job has only {size} ranks")))
            }
            Err(_) => {
                return Err(usage(format!("--stdin {r}: expected a rank number, 'all' or 'none'")))
            }
        },
    };

    let mut genv = o.env_base.filter(env);
    genv.extend(o.genv.iter().cloned());
    let segments = o
        .segments
        .iter()
        .map(|seg| {
            let (exe, args) = seg.command.split_first().expect("every segment has a program");
            let (inherit_env, mut vars) = match &seg.env_base {
                None => (true, Vec::new()),
                Some(base) => {
                    let mut vars = base.filter(env);
                    vars.extend(o.genv.iter().cloned());
                    (false, vars)
                }
            };
            vars.extend(seg.env.iter().cloned());
            Segment {
                exe: exe.as_bytes().to_vec(),
                args: args.iter().map(|a| a.as_bytes().to_vec()).collect(),
                inherit_env,
                env: vars,
                wdir: seg.wdir.clone().into_os_string().into_vec(),
            }
        })
        .collect();

    let rank_segments =
        counts.iter().enumerate().flat_map(|(s, (_, n))| (0..*n).map(move |_| s as u32));
    let plan::Nodes { nodes, hosts: node_hosts, rank_node } =
        plan::group_nodes(&rank_hosts, rank_segments, fork_host);
    let roots = plan::build_tree(nodes, o.tree_width);
    tracing::debug!(nodes = node_hosts.len(), depth = plan::depth(&roots), "plan ready");

    let job = Job {
        jobid: job_id(),
        size,
        segments,
        env: genv,
        stdin,
        kill_grace_ms: o.kill_grace.as_millis() as u64,
        bootstrap,
        process_mapping: plan::process_mapping(&rank_node),
        pmi_port: o.pmi_port,
        binding: o.binding,
    };
    Ok(job::Plan {
        job,
        roots,
        node_hosts,
        rank_node,
        proxy_exe,
        output: o.output.clone(),
        print_all_exit_codes: o.print_all_exit_codes,
        timeout: o.timeout,
        report_bindings: o.report_bindings,
        forked: Vec::new(),
    })
}

/// Raises the soft limit on open files to the hard limit: with an output file per rank,
/// a large job needs more than the usual 1024. The proxies rlaunch forks inherit it, and
/// need it too with many ranks on one node.
fn raise_fd_limit() {
    use nix::sys::resource::{getrlimit, setrlimit, Resource};
    match getrlimit(Resource::RLIMIT_NOFILE) {
        Ok((soft, hard)) if soft < hard => {
            if let Err(e) = setrlimit(Resource::RLIMIT_NOFILE, hard, hard) {
                tracing::debug!("cannot raise the open-file limit to {hard}: {e}");
            }
        }
        _ => {}
    }
}

/// Unique per run: also the PMI kvsname, so short and free of spaces.
fn job_id() -> String {
    let nanos = SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.subsec_nanos()).unwrap_or(0);
    format!("rlaunch_{}_{:08x}", std::process::id(), nanos)
}
