//! What rlaunch says about itself: `--help` (the common options), `--help-all` (every option
//! and spelling), both drawn from `args::OPTIONS` and ending with [`exit::TABLE`],
//! and `--info` (how it was built).

use crate::args::{Arg, Opt, Topic, OPTIONS};
use crate::{exit, plan};

const HELP_WIDTH: usize = 100;
const HELP_INDENT: usize = 30;

/// Words of `text` in lines of at most `width` characters.
fn wrap(text: &str, width: usize) -> Vec<String> {
    let mut lines: Vec<String> = Vec::new();
    for word in text.split_whitespace() {
        match lines.last_mut() {
            Some(line) if line.len() + 1 + word.len() <= width => {
                line.push(' ');
                line.push_str(word);
            }
            _ => lines.push(word.to_string()),
        }
    }
    lines
}

/// `--help` (common options, rlaunch's spelling) or `--help-all` (everything).
pub fn help(all: bool) -> String {
    let mut out = String::from(
        "rlaunch: launch an MPI-style parallel job, one proxy per node, ranks under the proxies.\n\n\
         Usage: rlaunch [OPTIONS] [-n N] PROGRAM [ARGS]... [: [OPTIONS] PROGRAM [ARGS]...]...\n",
    );
    let mut topics: Vec<Topic> = OPTIONS.iter().map(|o| o.topic).collect();
    topics.sort();
    topics.dedup();
    for topic in topics {
        let shown: Vec<&Opt> =
            OPTIONS.iter().filter(|o| o.topic == topic && (all || o.common)).collect();
        if shown.is_empty() {
            continue;
        }
        out.push_str(&format!("\n{}:\n", title(topic)));
        for o in shown {
            let names = if all {
                o.names.join(", ")
            } else {
                // The one-letter spelling too, if there is one: it is what people type.
                let short = o.names.iter().find(|n| n.len() == 2 && !n.starts_with("--"));
                match short {
                    Some(s) if *s != o.names[0] => format!("{s}, {}", o.names[0]),
                    _ => o.names[0].to_string(),
                }
            };
            let arg = match o.arg {
                Arg::None => String::new(),
                Arg::Value(v) => format!(" {v}"),
                Arg::Pair => " NAME VALUE".into(),
            };
            let head = format!("  {names}{arg}");
            let mut lines = wrap(o.help, HELP_WIDTH - HELP_INDENT).into_iter();
            if head.len() < HELP_INDENT {
                let first = lines.next().unwrap_or_default();
                out.push_str(&format!("{head:<HELP_INDENT$}{first}\n"));
            } else {
                out.push_str(&format!("{head}\n"));
            }
            for line in lines {
                out.push_str(&format!("{:<HELP_INDENT$}{line}\n", ""));
            }
        }
    }
    if all {
        out.push_str(
            "\nOptions before the first program apply to every segment; -n, -env*, -hosts and \
             -wdir after\na ':' apply to their segment. A rank's environment, later wins: \
             rlaunch's environment (all of it,\nor as filtered by -genvnone/-genvlist, or by \
             the segment's own -envall/-envnone/-envlist), then\n-genv and -x in order, then \
             the segment's -env in order, then the PMI variables rlaunch sets.\nSettings from \
             the environment: the command line wins over RLAUNCH_HOSTFILE, RLAUNCH_LAUNCHER,\n\
             RLAUNCH_LAUNCHER_EXEC, RLAUNCH_TIMEOUT, which win over HYDRA_HOST_FILE, \
             HYDRA_LAUNCHER,\nHYDRA_LAUNCHER_EXEC, MPIEXEC_TIMEOUT.\n",
        );
    } else {
        out.push_str(
            "\n`rlaunch --help-all` lists every option with its Hydra and Open MPI spellings.\n",
        );
    }
    out.push('\n');
    out.push_str(&exit_status());
    out
}

/// The "Exit status:" section, from [`exit::TABLE`], code spans without their backticks.
fn exit_status() -> String {
    let width = exit::TABLE.iter().map(|row| row.status.len()).max().unwrap_or(0) + 2;
    let mut out = String::from("Exit status:\n");
    for row in exit::TABLE {
        let lines = wrap(&row.meaning.replace('`', ""), HELP_WIDTH - 2 - width);
        for (i, line) in lines.iter().enumerate() {
            let status = if i == 0 { row.status } else { "" };
            out.push_str(&format!("  {status:<width$}{line}\n"));
        }
    }
    out
}
pub(crate) fn title(topic: Topic) -> &'static str {
    match topic {
        Topic::Job => "Job",
        Topic::Hosts => "Hosts and launching",
        Topic::Environment => "Environment and working directory",
        Topic::Output => "Output",
        Topic::Binding => "CPUs and GPUs (docs/topology.md)",
        Topic::Information => "Information",
        Topic::Compatibility => "Accepted for compatibility",
    }
}

/// `--version`: one line, as tools that run `mpirun --version` read it (the exit status, or
/// the first line): the version, the commit it was built from, and its PMIx.
pub fn version() -> String {
    let pmix = match rlaunch_proxy::pmix::version() {
        Some(v) => format!("OpenPMIx {v}"),
        None => "not built in".to_string(),
    };
    format!(
        "rlaunch {} (commit {}, PMIx: {pmix})",
        env!("CARGO_PKG_VERSION"),
        env!("RLAUNCH_COMMIT")
    )
}

/// `--info`: what this rlaunch is and can do.
pub fn info(getenv: impl Fn(&str) -> Option<String>) -> String {
    let allocation = crate::allocation::describe(&getenv);
    let proxy = match plan::proxy_exe() {
        Ok(p) => p.to_string_lossy().into_owned(),
        Err(e) => e.to_string(),
    };
    format!(
        "rlaunch {version}
  built:      {profile} build for {arch}-{os}, control protocol v{protocol}
  proxy:      {proxy}
  launchers:  fork (this machine), ssh, rsh, or any remote shell (--launcher-exec)
  schedulers: Slurm (proxies by one srun, dialing back over Noise-encrypted TCP), Grid
              Engine (qrsh -inherit), PBS/Torque (ssh), LSF (blaunch): found, or --rmk
  allocation: {allocation}
  PMI:        PMI-1 (MPICH's simple PMI, with spawn and name service), PMI-2 (wire v2)
              over an inherited socket (PMI_FD) or a loopback port (--pmi-port)
  PMIx:       {pmix}
  binding:    --bind-to hwthread, core, l3cache, numa or socket (:N of them); --map-by
              slot, node, the same units, ppr:N:UNIT, :PE=N; read from /sys (no hwloc)
  GPUs:       NVIDIA, AMD and Intel, found on the PCI bus: --gpus-per-rank, --gpu-bind
  this node:  {node}
  topology:   proxy tree of width --tree-width (default 32)
",
        node = this_node(&getenv),
        version = env!("CARGO_PKG_VERSION"),
        profile = if cfg!(debug_assertions) { "debug" } else { "release" },
        arch = std::env::consts::ARCH,
        os = std::env::consts::OS,
        protocol = rlaunch_protocol::control::PROTOCOL_VERSION,
        pmix = match rlaunch_proxy::pmix::version() {
            Some(v) =>
                format!("OpenPMIx {v} server on every node, for programs that can use it (--pmi)"),
            None => format!(
                "not built in: Open MPI programs cannot run (MPICH's can); to have it,\n{:14}{}",
                "",
                rlaunch_proxy::pmix::GET_PMIX
            ),
        },
    )
}

/// What a proxy on this machine would see of it: its CPUs by unit and its GPUs by vendor.
fn this_node(getenv: impl Fn(&str) -> Option<String>) -> String {
    use rlaunch_protocol::control::CpuUnit;
    use rlaunch_topology::gpu::Visible;
    let machine = match rlaunch_topology::Machine::of_this_process(true) {
        Ok(machine) => machine,
        Err(e) => return e,
    };
    let count = |unit, one: &str| {
        let n = machine.objects(unit).len();
        format!("{n} {one}{}", if n == 1 { "" } else { "s" })
    };
    let mut cpus = format!(
        "{} ({}, {}, {}, {})",
        count(CpuUnit::Hwthread, "CPU"),
        count(CpuUnit::Core, "core"),
        count(CpuUnit::L3, "L3 cache"),
        count(CpuUnit::Numa, "NUMA node"),
        count(CpuUnit::Socket, "socket"),
    );
    if machine.stand_in {
        cpus.push_str(&format!(" (a copy: {})", rlaunch_topology::ROOT_VAR));
    }
    let visible = Visible::of(&machine.gpus, getenv);
    let mut vendors: Vec<(&str, usize)> = Vec::new();
    for gpu in &visible.gpus {
        match vendors.iter_mut().find(|(name, _)| *name == gpu.vendor.name()) {
            Some((_, n)) => *n += 1,
            None => vendors.push((gpu.vendor.name(), 1)),
        }
    }
    let gpus = if vendors.is_empty() {
        "no GPUs".to_string()
    } else {
        let each: Vec<String> = vendors.iter().map(|(name, n)| format!("{n} {name}")).collect();
        format!("GPUs: {}", each.join(", "))
    };
    format!("{cpus}; {gpus}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn both_help_screens_end_with_every_exit_status() {
        for all in [false, true] {
            let help = help(all);
            let section = help.split_once("\nExit status:\n").expect("an exit status section").1;
            let statuses: Vec<&str> = section
                .lines()
                .filter(|l| !l.starts_with(&" ".repeat(4)))
                .map(|l| l.trim_start().split("  ").next().unwrap())
                .collect();
            let table: Vec<&str> = exit::TABLE.iter().map(|row| row.status).collect();
            assert_eq!(statuses, table);
            assert!(section.lines().all(|l| l.len() <= HELP_WIDTH), "{section}");
        }
    }
}
