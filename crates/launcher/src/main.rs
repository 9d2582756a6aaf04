//! `rlaunch`: parse the command line, build the plan, run the job, exit with its status.

mod cli;
mod hosts;
mod job;
mod output;
mod plan;
mod stdin;

use std::ffi::OsString;
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::time::{SystemTime, UNIX_EPOCH};

use cli::{Cli, LauncherKind, MapBy};
use output::{OutputDir, OutputSpec, Pattern};
use pmi_wire::control::{Bootstrap, Job, NodePlan, RankPlan, Segment, StdinTarget};

/// Exit status for command-line errors.
const EXIT_USAGE: i32 = 2;
/// Exit status when rlaunch itself cannot run the job.
const EXIT_INTERNAL: i32 = 255;

fn main() {
    rlaunch_proxy::procs::cloexec_inherited_fds();
    let cli = Cli::parse_args();
    if cli.verbose > 0 && std::env::var_os("RLAUNCH_LOG").is_none() {
        let level = if cli.verbose == 1 { "info" } else { "debug" };
        // Before any thread exists; the proxies inherit it.
        std::env::set_var("RLAUNCH_LOG", level);
    }
    rlaunch_proxy::init_logging("rlaunch");
    raise_fd_limit();
    let plan = match build_plan(&cli) {
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
    let runtime =
        tokio::runtime::Builder::new_current_thread().enable_all().build().expect("tokio runtime");
    let code = runtime.block_on(job::run(plan));
    std::process::exit(code);
}

enum PlanError {
    Usage(String),
    Setup(String),
}

fn build_plan(cli: &Cli) -> Result<job::Plan, PlanError> {
    let usage = PlanError::Usage;
    let own_host = hostname::get()
        .map(|h| h.to_string_lossy().into_owned())
        .unwrap_or_else(|_| "localhost".into());
    let size = cli.np.unwrap_or(1);
    if size == 0 {
        return Err(usage("-n must be at least 1".into()));
    }
    let hostfile =
        cli.hostfile.clone().or_else(|| std::env::var_os("HYDRA_HOST_FILE").map(Into::into));
    let mut hosts = match (&cli.hosts, &hostfile) {
        (Some(list), _) => hosts::parse_host_list(list).map_err(usage)?,
        (None, Some(file)) => hosts::read_hostfile(file).map_err(usage)?,
        (None, None) => {
            vec![hosts::Host { name: own_host.clone(), slots: cli.ppn.unwrap_or(size) }]
        }
    };
    if let Some(ppn) = cli.ppn {
        if ppn == 0 {
            return Err(usage("--ppn must be at least 1".into()));
        }
        hosts.iter_mut().for_each(|h| h.slots = ppn);
    }
    let bootstrap = match cli.launcher {
        Some(LauncherKind::Fork) => Bootstrap::Fork,
        kind => {
            let argv = match &cli.launcher_exec {
                Some(cmd) => cmd.split_whitespace().map(str::to_string).collect(),
                None if kind == Some(LauncherKind::Rsh) => vec!["rsh".to_string()],
                None => vec!["ssh".into(), "-x".into(), "-oBatchMode=yes".into()],
            };
            if argv.is_empty() {
                return Err(usage("--launcher-exec: empty command".into()));
            }
            let proxy_path = match &cli.proxy_path {
                Some(p) => p.clone(),
                None => proxy_exe().map_err(PlanError::Setup)?.to_string_lossy().into_owned(),
            };
            Bootstrap::Remote { argv, proxy_path }
        }
    };
    let forced_remote = matches!(cli.launcher, Some(LauncherKind::Ssh | LauncherKind::Rsh));
    let fork_host = |name: &str| {
        bootstrap == Bootstrap::Fork || (!forced_remote && hosts::is_local(name, &own_host))
    };
    let stdin = match cli.stdin.as_str() {
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
    if !(cli.kill_grace.is_finite() && cli.kill_grace >= 0.0) {
        return Err(usage(format!("--kill-grace {}: expected seconds", cli.kill_grace)));
    }
    let timeout = cli.timeout().map_err(usage)?;
    let output = output_spec(cli).map_err(usage)?;

    let (exe, args) = cli.command.split_first().ok_or_else(|| usage("no program given".into()))?;
    let wdir = std::env::current_dir()
        .map_err(|e| PlanError::Setup(format!("cannot read the current directory: {e}")))?;
    let segment = Segment {
        exe: exe.as_bytes().to_vec(),
        args: args.iter().map(|a| a.as_bytes().to_vec()).collect(),
        inherit_env: true,
        env: Vec::new(),
        wdir: wdir.into_os_string().into_vec(),
    };
    let placed = match cli.map_by {
        MapBy::Slot => plan::place_block(&hosts, size),
        MapBy::Node => plan::place_round_robin(&hosts, size),
    };
    let mut rank_node = vec![0u32; size as usize];
    let mut node_hosts = Vec::new();
    let nodes = placed
        .into_iter()
        .enumerate()
        .map(|(i, (host, ranks))| {
            for &r in &ranks {
                rank_node[r as usize] = i as u32;
            }
            node_hosts.push(host.clone());
            NodePlan {
                index: i as u32,
                fork: fork_host(&host),
                host,
                ranks: ranks.into_iter().map(|rank| RankPlan { rank, segment: 0 }).collect(),
                children: Vec::new(),
            }
        })
        .collect();
    let roots = plan::build_tree(nodes, cli.tree_width);
    tracing::debug!(nodes = node_hosts.len(), depth = plan::depth(&roots), "plan ready");

    let job = Job {
        jobid: job_id(),
        size,
        segments: vec![segment],
        env: std::env::vars_os().map(|(k, v)| (k.into_vec(), v.into_vec())).collect(),
        stdin,
        kill_grace_ms: (cli.kill_grace * 1000.0) as u64,
        bootstrap,
        process_mapping: plan::process_mapping(&rank_node),
        pmi_port: cli.pmi_port,
        binding: None,
    };
    Ok(job::Plan {
        job,
        roots,
        node_hosts,
        proxy_exe: proxy_exe().map_err(PlanError::Setup)?,
        output,
        print_all_exit_codes: cli.print_all_exit_codes,
        timeout,
    })
}

/// The output options, checked: patterns parsed, `--output-filename`'s options known.
fn output_spec(cli: &Cli) -> Result<OutputSpec, String> {
    let pattern = |flag: &str, text: &Option<String>| {
        let parse = |t: &String| Pattern::parse(t).map_err(|e| format!("{flag} {t}: {e}"));
        text.as_ref().map(parse).transpose()
    };
    let prefix = match (cli.prepend_rank, &cli.prepend_pattern) {
        (true, Some(_)) => {
            return Err("-l and --prepend-pattern both set the line prefix; give one".into())
        }
        (true, None) => Some(Pattern::parse("[%r] ").expect("-l's pattern is valid")),
        (false, text) => pattern("--prepend-pattern", text)?,
    };
    Ok(OutputSpec {
        prefix,
        tag: cli.tag_output,
        timestamp: cli.timestamp_output,
        outfile: pattern("--outfile-pattern", &cli.outfile_pattern)?,
        errfile: pattern("--errfile-pattern", &cli.errfile_pattern)?,
        dir: cli.output_filename.as_deref().map(output_dir).transpose()?,
    })
}

/// `--output-filename DIR[:OPTION,...]`, Open MPI's syntax.
fn output_dir(arg: &str) -> Result<OutputDir, String> {
    let (path, options) = match arg.rsplit_once(':') {
        Some((path, options)) => (path, options.split(',').collect()),
        None => (arg, Vec::new()),
    };
    if path.is_empty() {
        return Err(format!("--output-filename {arg}: no directory given"));
    }
    let mut dir = OutputDir { path: path.into(), copy: true, per_job: true };
    for option in options {
        match option.to_ascii_lowercase().as_str() {
            "nocopy" => dir.copy = false,
            "nojobid" => dir.per_job = false,
            _ => {
                return Err(format!(
                    "--output-filename {arg}: unknown option {option} (known: nocopy, nojobid)"
                ))
            }
        }
    }
    Ok(dir)
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

/// The `rlaunch-proxy` installed next to this `rlaunch`.
fn proxy_exe() -> Result<OsString, String> {
    let me = std::env::current_exe().map_err(|e| format!("cannot find my own executable: {e}"))?;
    let proxy = me.with_file_name("rlaunch-proxy");
    if !proxy.is_file() {
        return Err(format!(
            "cannot find rlaunch-proxy at {} (install it next to rlaunch)",
            proxy.display()
        ));
    }
    Ok(proxy.into_os_string())
}

/// Unique per run: also the PMI kvsname, so short and free of spaces.
fn job_id() -> String {
    let nanos = SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.subsec_nanos()).unwrap_or(0);
    format!("rlaunch_{}_{:08x}", std::process::id(), nanos)
}
