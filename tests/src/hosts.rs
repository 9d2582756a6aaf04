//! The hosts ranks are placed on: this machine, and fake nodes.
//!
//! Under `--launcher fork` every name in `--hosts` is a node of its own: rlaunch starts a proxy
//! for it on this machine, and its ranks see the name as their host
//! (`MPIR_CVAR_CH3_INTERFACE_HOSTNAME`). Under ssh (`fakessh`, the cluster of multihost.rs) the
//! same lists name the hosts to reach.

use std::collections::BTreeMap;
use std::time::Duration;

use crate::{rankprog_str, Job, Run};

/// How long [`waiting_fake_node_job`] waits for its ranks to be ready.
const READY: Duration = Duration::from_secs(30);

/// This machine's host name, as `gethostname` (and so `MPI_Get_processor_name`) gives it.
pub fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .unwrap_or_else(|e| panic!("cannot read the host name: {e}"))
        .trim()
        .to_owned()
}

/// `n1,n2,...,n<count>`, for `--hosts`.
pub fn node_list(count: usize) -> String {
    nodes(count).collect::<Vec<_>>().join(",")
}

/// `n1:<slots>,...,n<count>:<slots>`, for `--hosts`.
pub fn node_list_with_slots(count: usize, slots: u32) -> String {
    nodes(count).map(|node| format!("{node}:{slots}")).collect::<Vec<_>>().join(",")
}

/// `ranks` ranks over the fake nodes `hosts` (with `more` options), each waiting (`rankprog
/// ready sleep 60`); returns the job once every rank is ready, and each rank's pid.
pub fn waiting_fake_node_job(hosts: &str, ranks: u32, more: &[&str]) -> (Job, BTreeMap<u32, i32>) {
    let (n, rankprog) = (ranks.to_string(), rankprog_str());
    let placement = ["--launcher", "fork", "--hosts", hosts, "-n", &n];
    let args = [&placement[..], more, &[&rankprog, "ready", "sleep", "60"]].concat();
    let mut job = Run::new(&args).spawn();
    let ready = job.wait_for_ready(ranks as usize, READY);
    let pids = ready.into_iter().map(|(rank, pid)| (rank, pid.as_raw())).collect();
    (job, pids)
}

fn nodes(count: usize) -> impl Iterator<Item = String> {
    (1..=count).map(|i| format!("n{i}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn node_lists() {
        assert_eq!(node_list(3), "n1,n2,n3");
        assert_eq!(node_list_with_slots(2, 4), "n1:4,n2:4");
        assert_eq!(node_list(0), "");
    }
}
