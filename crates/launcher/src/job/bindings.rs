//! `--report-bindings`: a line per rank as it starts, with the CPUs and GPUs it was given.

use rlaunch_protocol::ids::Gid;
use rlaunch_protocol::record::GpuUse;

use super::Root;

impl Root {
    /// `--report-bindings`: one line per rank as it starts (route sends RankStarted here
    /// only then).
    pub(super) fn report_binding(
        &self,
        rank: Gid,
        pid: u32,
        cpus: Option<String>,
        gpus: Option<Vec<GpuUse>>,
    ) {
        if !self.roll.contains(rank) {
            tracing::warn!(%rank, "start report for an unknown rank");
            return;
        }
        let bound = match cpus {
            Some(cpus) => format!("bound to cpus {cpus}"),
            None => "not bound".to_string(),
        };
        let gpus = match gpus.as_deref() {
            None => String::new(),
            Some([]) => ", no GPU".to_string(),
            Some(gpus) => {
                let each: Vec<String> = gpus.iter().map(describe_gpu).collect();
                format!(", {} {}", if gpus.len() == 1 { "GPU" } else { "GPUs" }, each.join(", "))
            }
        };
        let (who, host) = (self.roll.name(rank), self.roll.host(rank));
        eprintln!("rlaunch: {who} on {host} (pid {pid}) {bound}{gpus}");
    }
}

/// A GPU as `--report-bindings` names it: `4 (amd 0000:d1:00.0, NUMA 0)`.
fn describe_gpu(gpu: &GpuUse) -> String {
    match (&gpu.pci, gpu.numa) {
        (Some(pci), Some(numa)) => format!("{} ({} {pci}, NUMA {numa})", gpu.entry, gpu.vendor),
        _ => format!("{} ({})", gpu.entry, gpu.vendor),
    }
}
