//! The hosts of a batch scheduler's allocation, as its environment describes them:
//!
//! | scheduler | hosts | slots per host |
//! |---|---|---|
//! | Slurm | `SLURM_JOB_NODELIST` (compressed: `n[01-16,20]`) | `SLURM_TASKS_PER_NODE` (`2(x3),1`), else `SLURM_JOB_CPUS_PER_NODE` |
//! | Grid Engine | `PE_HOSTFILE`: `host slots queue processors` per line | on each line |
//! | PBS / Torque | `PBS_NODEFILE`: a host per line, once per slot | lines per host |
//! | LSF | `LSB_MCPU_HOSTS` (`hostA 4 hostB 2`), else `LSB_DJOB_HOSTFILE` (as PBS) | in the list |
//!
//! Inside a Slurm step (`srun ... rlaunch`, `SLURM_STEP_ID` set), the tasks per node are the
//! step's: the job's allocation is `SLURM_JOB_CPUS_PER_NODE` then, and proxies need a step
//! that may overlap the one rlaunch runs in ([`Allocation::nested`]).
//!
//! Reading is pure but for the files these name; errors name the variable or file:line.

mod files;
pub(crate) mod slurm;

use std::path::PathBuf;

use crate::hosts::Host;
use crate::quote::cut;

pub(crate) use slurm::FormError;

/// A batch scheduler whose allocation rlaunch can read (`--rmk`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scheduler {
    Slurm,
    GridEngine,
    Pbs,
    Lsf,
}

impl Scheduler {
    /// `--rmk`'s spelling (Hydra's: `slurm`, `sge`, `pbs`, `lsf`).
    pub(crate) fn parse(name: &str) -> Option<Scheduler> {
        match name {
            "slurm" => Some(Scheduler::Slurm),
            "sge" => Some(Scheduler::GridEngine),
            "pbs" => Some(Scheduler::Pbs),
            "lsf" => Some(Scheduler::Lsf),
            _ => None,
        }
    }

    pub(crate) fn name(self) -> &'static str {
        match self {
            Scheduler::Slurm => "Slurm",
            Scheduler::GridEngine => "Grid Engine",
            Scheduler::Pbs => "PBS",
            Scheduler::Lsf => "LSF",
        }
    }
}

/// What the scheduler gave the job.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Allocation {
    pub scheduler: Scheduler,
    /// In the scheduler's order, each with its slots.
    pub hosts: Vec<Host>,
    /// rlaunch runs inside a Slurm step, whose resources a new step must overlap (a plain
    /// srun there waits for them for ever).
    pub nested: bool,
}

/// What `--info` says of the allocation rlaunch runs in.
pub(crate) fn describe(getenv: impl Fn(&str) -> Option<String>) -> String {
    let Some(scheduler) = detect(&getenv) else {
        return "none found (no Slurm, Grid Engine, PBS or LSF job variables)".to_string();
    };
    match read(scheduler, &getenv) {
        Ok(a) => {
            let nested = if a.nested { ", inside a step (srun --overlap)" } else { "" };
            let name = scheduler.name();
            format!("{name}: {} hosts, {} slots{nested}", a.hosts.len(), a.slots())
        }
        Err(e) => format!("{}, but: {e}", scheduler.name()),
    }
}

/// The scheduler whose allocation rlaunch runs in, if any, by the variables it gives a job.
pub(crate) fn detect(getenv: impl Fn(&str) -> Option<String>) -> Option<Scheduler> {
    let set = |name: &str| getenv(name).is_some_and(|v| !v.trim().is_empty());
    if set("SLURM_JOB_ID") && (set("SLURM_JOB_NODELIST") || set("SLURM_NODELIST")) {
        Some(Scheduler::Slurm)
    } else if set("PE_HOSTFILE") && set("JOB_ID") {
        Some(Scheduler::GridEngine)
    } else if set("PBS_NODEFILE") && set("PBS_JOBID") {
        Some(Scheduler::Pbs)
    } else if set("LSB_JOBID") && (set("LSB_MCPU_HOSTS") || set("LSB_DJOB_HOSTFILE")) {
        Some(Scheduler::Lsf)
    } else {
        None
    }
}

impl Allocation {
    pub(crate) fn slots(&self) -> u32 {
        self.hosts.iter().fold(0u32, |sum, h| sum.saturating_add(h.slots))
    }
}

#[derive(Debug, thiserror::Error)]
pub enum AllocationError {
    #[error("--rmk {rmk}: {var} is not set: no {scheduler} allocation here")]
    Missing { rmk: &'static str, var: &'static str, scheduler: &'static str },
    /// `value` is cut to a printable length.
    #[error("{var} {value}: {error}")]
    Form { var: &'static str, value: String, error: FormError },
    #[error("{counts_var} gives {counts} counts, but SLURM_JOB_NODELIST names {hosts} hosts")]
    Counts { counts_var: &'static str, counts: usize, hosts: usize },
    #[error("cannot read {var} {}: {cause}", .path.display())]
    Read { var: &'static str, path: PathBuf, cause: String },
    /// `line` is 1-based.
    #[error("{}:{line}: {what}", .path.display())]
    Line { path: PathBuf, line: usize, what: String },
    #[error("{var} names no host")]
    Empty { var: &'static str },
}

/// Reads `scheduler`'s allocation from the environment `getenv` gives.
pub(crate) fn read(
    scheduler: Scheduler,
    getenv: impl Fn(&str) -> Option<String>,
) -> Result<Allocation, AllocationError> {
    let need = |rmk: &'static str, vars: &[&'static str]| {
        vars.iter()
            .find_map(|&v| getenv(v).filter(|s| !s.trim().is_empty()).map(|s| (v, s)))
            .ok_or(AllocationError::Missing { rmk, var: vars[0], scheduler: scheduler.name() })
    };
    let nested = scheduler == Scheduler::Slurm && getenv("SLURM_STEP_ID").is_some();
    let hosts = match scheduler {
        Scheduler::Slurm => {
            let (list_var, list) = need("slurm", &["SLURM_JOB_NODELIST", "SLURM_NODELIST"])?;
            let counts = if nested {
                ["SLURM_JOB_CPUS_PER_NODE", "SLURM_TASKS_PER_NODE"]
            } else {
                ["SLURM_TASKS_PER_NODE", "SLURM_JOB_CPUS_PER_NODE"]
            };
            let (counts_var, counts) = need("slurm", &counts)?;
            slurm_hosts(list_var, &list, counts_var, &counts)?
        }
        Scheduler::GridEngine => {
            let (var, path) = need("sge", &["PE_HOSTFILE"])?;
            files::read(var, path.into(), files::pe_hostfile)?
        }
        Scheduler::Pbs => {
            let (var, path) = need("pbs", &["PBS_NODEFILE"])?;
            files::read(var, path.into(), files::one_host_per_slot)?
        }
        Scheduler::Lsf => match getenv("LSB_MCPU_HOSTS").filter(|s| !s.trim().is_empty()) {
            Some(list) => files::lsf_mcpu_hosts(&list)?,
            None => {
                let (var, path) = need("lsf", &["LSB_MCPU_HOSTS", "LSB_DJOB_HOSTFILE"])?;
                files::read(var, path.into(), files::one_host_per_slot)?
            }
        },
    };
    Ok(Allocation { scheduler, hosts, nested })
}

fn slurm_hosts(
    list_var: &'static str,
    list: &str,
    counts_var: &'static str,
    counts: &str,
) -> Result<Vec<Host>, AllocationError> {
    let form = |var, value: &str, error| AllocationError::Form { var, value: cut(value), error };
    let names = slurm::expand_hostlist(list).map_err(|e| form(list_var, list, e))?;
    let slots = slurm::expand_counts(counts).map_err(|e| form(counts_var, counts, e))?;
    if slots.len() != names.len() {
        return Err(AllocationError::Counts {
            counts_var,
            counts: slots.len(),
            hosts: names.len(),
        });
    }
    let mut hosts = crate::hosts::HostList::default();
    for (name, slots) in names.into_iter().zip(slots) {
        hosts.add(&name, slots);
    }
    Ok(hosts.into_hosts())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env<'a>(vars: &'a [(&'a str, &'a str)]) -> impl Fn(&str) -> Option<String> + 'a {
        move |name| vars.iter().find(|(k, _)| *k == name).map(|(_, v)| v.to_string())
    }

    fn h(name: &str, slots: u32) -> Host {
        Host { name: name.into(), slots }
    }

    #[test]
    fn a_slurm_allocation_is_its_nodelist_with_tasks_per_node() {
        let vars = [("SLURM_JOB_NODELIST", "n[1-3]"), ("SLURM_TASKS_PER_NODE", "2(x2),1")];
        let alloc = read(Scheduler::Slurm, env(&vars)).unwrap();
        assert_eq!(alloc.hosts, [h("n1", 2), h("n2", 2), h("n3", 1)]);
        assert_eq!(alloc.slots(), 5);
        // Without tasks per node, the CPUs per node.
        let vars = [("SLURM_JOB_NODELIST", "a,b"), ("SLURM_JOB_CPUS_PER_NODE", "4(x2)")];
        assert_eq!(read(Scheduler::Slurm, env(&vars)).unwrap().hosts, [h("a", 4), h("b", 4)]);
    }

    #[test]
    fn a_bad_slurm_allocation_is_named() {
        let err =
            |vars: &[(&str, &str)]| read(Scheduler::Slurm, env(vars)).unwrap_err().to_string();
        assert_eq!(
            err(&[("SLURM_TASKS_PER_NODE", "1")]),
            "--rmk slurm: SLURM_JOB_NODELIST is not set: no Slurm allocation here"
        );
        assert_eq!(
            err(&[("SLURM_JOB_NODELIST", "n[1-3"), ("SLURM_TASKS_PER_NODE", "1")]),
            "SLURM_JOB_NODELIST n[1-3: unclosed '['"
        );
        assert_eq!(
            err(&[("SLURM_JOB_NODELIST", "n[1-3]"), ("SLURM_TASKS_PER_NODE", "2(x2)")]),
            "SLURM_TASKS_PER_NODE gives 2 counts, but SLURM_JOB_NODELIST names 3 hosts"
        );
        let long = format!("n[1-2]{}", "x".repeat(200));
        let text = err(&[("SLURM_JOB_NODELIST", &long), ("SLURM_TASKS_PER_NODE", "1(x3)")]);
        assert!(text.len() < 160, "the value is cut: {text}");
    }

    #[test]
    fn inside_a_step_the_jobs_allocation_is_read() {
        let vars = [
            ("SLURM_JOB_NODELIST", "n[1-3]"),
            ("SLURM_TASKS_PER_NODE", "1"),
            ("SLURM_JOB_CPUS_PER_NODE", "2(x2),1"),
            ("SLURM_STEP_ID", "0"),
        ];
        let alloc = read(Scheduler::Slurm, env(&vars)).unwrap();
        assert_eq!(alloc.hosts, [h("n1", 2), h("n2", 2), h("n3", 1)]);
        assert!(alloc.nested);
        let with_job = [&vars[..], &[("SLURM_JOB_ID", "5")]].concat();
        assert_eq!(
            describe(env(&with_job)),
            "Slurm: 3 hosts, 5 slots, inside a step (srun --overlap)"
        );
        assert!(describe(env(&[])).starts_with("none found"));
    }

    #[test]
    fn a_scheduler_is_detected_by_its_job_variables() {
        let vars = [("SLURM_JOB_ID", "7"), ("SLURM_JOB_NODELIST", "n1")];
        assert_eq!(detect(env(&vars)), Some(Scheduler::Slurm));
        assert_eq!(detect(env(&[("SLURM_JOB_NODELIST", "n1")])), None);
        let pbs = [("PBS_NODEFILE", "/x"), ("PBS_JOBID", "1")];
        assert_eq!(detect(env(&pbs)), Some(Scheduler::Pbs));
        let sge = [("PE_HOSTFILE", "/x"), ("JOB_ID", "3")];
        assert_eq!(detect(env(&sge)), Some(Scheduler::GridEngine));
        let lsf = [("LSB_JOBID", "4"), ("LSB_MCPU_HOSTS", "a 1")];
        assert_eq!(detect(env(&lsf)), Some(Scheduler::Lsf));
        assert_eq!(detect(env(&[("JOB_ID", "3")])), None);
    }

    #[test]
    fn lsf_reads_its_host_list_from_the_environment() {
        let vars = [("LSB_MCPU_HOSTS", "hostA 4 hostB 2")];
        assert_eq!(read(Scheduler::Lsf, env(&vars)).unwrap().hosts, [h("hostA", 4), h("hostB", 2)]);
        let e = read(Scheduler::Lsf, env(&[])).unwrap_err().to_string();
        assert_eq!(e, "--rmk lsf: LSB_MCPU_HOSTS is not set: no LSF allocation here");
    }

    #[test]
    fn scheduler_names_are_hydras() {
        assert_eq!(Scheduler::parse("sge"), Some(Scheduler::GridEngine));
        assert_eq!(Scheduler::parse("slurm").map(Scheduler::name), Some("Slurm"));
        assert_eq!(Scheduler::parse("none"), None);
    }
}
