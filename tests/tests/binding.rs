//! CPU binding (`--bind-to`, `--report-bindings`), end to end: real rlaunch, real proxies, and
//! ranks that print the CPUs the kernel lets them run on (`Cpus_allowed_list` in
//! /proc/self/status). Expectations come from this test's own allowed CPUs and the machine's
//! sysfs topology, so they hold on any machine, whatever its size or cpuset.

use std::collections::BTreeMap;

use rlaunch_tests::hosts::hostname;
use rlaunch_tests::output::by_rank;
use rlaunch_tests::Run;

/// Each rank prints its pid (`exec` keeps it: it is the pid the proxy started) and its CPUs.
const SHOW_CPUS: &str = "echo pid $$; exec grep Cpus_allowed_list /proc/self/status";

fn show_cpus() -> [&'static str; 3] {
    ["sh", "-c", SHOW_CPUS]
}

/// Parses a Linux cpulist: `0-3,8`.
fn parse_cpulist(text: &str) -> Vec<u32> {
    let mut cpus = Vec::new();
    for part in text.trim().split(',').filter(|p| !p.is_empty()) {
        match part.split_once('-') {
            Some((a, b)) => cpus.extend(a.parse::<u32>().unwrap()..=b.parse().unwrap()),
            None => cpus.push(part.parse().unwrap()),
        }
    }
    cpus
}

/// Formats CPU ids as a Linux cpulist, as the kernel prints them.
fn cpulist(cpus: &[u32]) -> String {
    let mut sorted = cpus.to_vec();
    sorted.sort_unstable();
    sorted.dedup();
    let mut ranges: Vec<(u32, u32)> = Vec::new();
    for cpu in sorted {
        match ranges.last_mut() {
            Some((_, end)) if *end + 1 == cpu => *end = cpu,
            _ => ranges.push((cpu, cpu)),
        }
    }
    let text: Vec<String> = ranges
        .into_iter()
        .map(|(a, b)| if a == b { a.to_string() } else { format!("{a}-{b}") })
        .collect();
    text.join(",")
}

/// The CPUs this test process may run on; rlaunch inherits them.
fn own_cpus() -> Vec<u32> {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let line = status.lines().find_map(|l| l.strip_prefix("Cpus_allowed_list:")).unwrap();
    parse_cpulist(line)
}

fn sysfs_number(path: &str) -> Option<i64> {
    std::fs::read_to_string(path).ok()?.trim().parse().ok()
}

#[derive(Clone, Copy)]
enum Unit {
    Hwthread,
    Core,
    Socket,
    Numa,
}

/// The objects of `unit` among `allowed`, each as its CPUs, in the order rlaunch hands them
/// out: by (socket, core, first cpu).
fn objects(unit: Unit, allowed: &[u32]) -> Vec<Vec<u32>> {
    let numa_of = |cpu: u32| -> i64 {
        let Ok(nodes) = std::fs::read_dir("/sys/devices/system/node") else { return 0 };
        for node in nodes.flatten() {
            let name = node.file_name().into_string().unwrap();
            let Some(id) = name.strip_prefix("node").and_then(|n| n.parse().ok()) else {
                continue;
            };
            let list = std::fs::read_to_string(node.path().join("cpulist")).unwrap();
            if parse_cpulist(&list).contains(&cpu) {
                return id;
            }
        }
        0
    };
    let mut cpus: Vec<(i64, i64, u32)> = allowed
        .iter()
        .map(|&cpu| {
            let topo = format!("/sys/devices/system/cpu/cpu{cpu}/topology");
            let socket = sysfs_number(&format!("{topo}/physical_package_id")).unwrap_or(0);
            let core = sysfs_number(&format!("{topo}/core_id")).unwrap_or(i64::from(cpu));
            (socket, core, cpu)
        })
        .collect();
    cpus.sort_unstable();
    let mut objects: Vec<((i64, i64), Vec<u32>)> = Vec::new();
    for (socket, core, cpu) in cpus {
        let key = match unit {
            Unit::Hwthread => (0, i64::from(cpu)),
            Unit::Core => (socket, core),
            Unit::Socket => (socket, 0),
            Unit::Numa => (0, numa_of(cpu)),
        };
        match objects.iter_mut().find(|(k, _)| *k == key) {
            Some((_, ids)) => ids.push(cpu),
            None => objects.push((key, vec![cpu])),
        }
    }
    objects.into_iter().map(|(_, ids)| ids).collect()
}

/// What each rank printed with [`SHOW_CPUS`] under `-l`: rank -> (pid, cpulist).
fn seen(lines: &[String]) -> BTreeMap<u32, (u32, String)> {
    let mut pids = BTreeMap::new();
    let mut cpus = BTreeMap::new();
    for (rank, printed) in by_rank(lines) {
        for line in printed {
            if let Some(pid) = line.strip_prefix("pid ") {
                pids.insert(rank, pid.parse::<u32>().unwrap());
            } else if let Some(list) = line.strip_prefix("Cpus_allowed_list:") {
                cpus.insert(rank, list.trim().to_string());
            }
        }
    }
    assert_eq!(pids.len(), cpus.len(), "{lines:?}");
    cpus.into_iter().map(|(rank, list)| (rank, (pids[&rank], list))).collect()
}

/// Just the cpulists of [`seen`].
fn seen_cpus(lines: &[String]) -> BTreeMap<u32, String> {
    seen(lines).into_iter().map(|(rank, (_, list))| (rank, list)).collect()
}

/// rank -> cpulist for the ranks of one node, local rank i getting object i (mod their
/// number).
fn expected(
    ranks: impl IntoIterator<Item = (u32, usize)>,
    objs: &[Vec<u32>],
) -> BTreeMap<u32, String> {
    ranks.into_iter().map(|(rank, local)| (rank, cpulist(&objs[local % objs.len()]))).collect()
}

fn wrap_notices(stderr: &[String]) -> Vec<&String> {
    stderr.iter().filter(|l| l.contains("bindings wrap around")).collect()
}

fn plural(n: usize, what: &str) -> String {
    format!("{n} {what}{}", if n == 1 { "" } else { "s" })
}

#[test]
fn bind_to_core_gives_each_rank_its_own_core() {
    let cores = objects(Unit::Core, &own_cpus());
    let out = Run::new(&["-l", "-n", "2", "--bind-to", "core"]).args(show_cpus()).run();
    out.assert_code(0);
    assert_eq!(seen_cpus(&out.lines()), expected([(0, 0), (1, 1)], &cores), "{out}");
    // Past one core per rank only: no notice on a machine with room for both.
    assert_eq!(wrap_notices(&out.stderr_lines()).len(), usize::from(cores.len() < 2), "{out}");
}

#[test]
fn hydra_spelling_of_bind_to_works() {
    let cores = objects(Unit::Core, &own_cpus());
    let out = Run::new(&["-bind-to", "core", "-l", "-n", "2"]).args(show_cpus()).run();
    out.assert_code(0);
    assert_eq!(seen_cpus(&out.lines()), expected([(0, 0), (1, 1)], &cores), "{out}");
}

#[test]
fn every_unit_binds_local_rank_i_to_object_i() {
    let allowed = own_cpus();
    for (unit, name) in [
        (Unit::Hwthread, "hwthread"),
        (Unit::Core, "core"),
        (Unit::Socket, "socket"),
        (Unit::Numa, "numa"),
    ] {
        let objs = objects(unit, &allowed);
        let out = Run::new(&["-l", "-n", "2", "--bind-to", name]).args(show_cpus()).run();
        out.assert_code(0);
        assert_eq!(seen_cpus(&out.lines()), expected([(0, 0), (1, 1)], &objs), "{name}: {out}");
    }
}

#[test]
fn a_count_binds_each_rank_to_that_many_objects() {
    let cores = objects(Unit::Core, &own_cpus());
    let out = Run::new(&["-l", "-n", "1", "--bind-to", "core:2"]).args(show_cpus()).run();
    out.assert_code(0);
    let want: Vec<u32> = (0..2).flat_map(|i| cores[i % cores.len()].clone()).collect();
    assert_eq!(seen_cpus(&out.lines())[&0], cpulist(&want), "{out}");
}

/// By default each rank gets its share of the node's cores (ranks no more than cores);
/// `--bind-to none`, and more ranks than cores, leave them the launcher's CPUs.
#[test]
fn by_default_ranks_get_their_shares_of_the_cores_and_none_binds_nothing() {
    let own = cpulist(&own_cpus());
    let cores = objects(Unit::Core, &own_cpus());
    assert!(cores.len() >= 2, "this test needs 2 cores at least: {cores:?}");
    let n = cores.len();
    let share = |rank: usize| -> String {
        let (start, end) = (rank * n / 2, ((rank + 1) * n / 2).max(rank * n / 2 + 1));
        cpulist(&cores[start..end].concat())
    };
    for (extra, ranks, bound) in
        [(&[][..], 2, true), (&["--bind-to", "none"][..], 2, false), (&[][..], n + 1, false)]
    {
        let count = ranks.to_string();
        let out = Run::new(&["-l", "-n", &count, "--report-bindings"])
            .args(extra)
            .args(show_cpus())
            .run();
        out.assert_code(0);
        let seen = seen(&out.lines());
        assert_eq!(seen.len(), ranks, "{out}");
        for (&rank, (pid, cpus)) in &seen {
            let host = hostname();
            let (want, report) = if bound {
                let cpus = share(rank as usize);
                let report =
                    format!("rlaunch: rank {rank} on {host} (pid {pid}) bound to cpus {cpus}");
                (cpus, report)
            } else {
                (own.clone(), format!("rlaunch: rank {rank} on {host} (pid {pid}) not bound"))
            };
            assert_eq!(cpus, &want, "rank {rank} {extra:?}: {out}");
            assert!(out.stderr_lines().contains(&report), "missing {report:?}: {out}");
        }
    }
}

/// Fake nodes share this machine's cores: no node spreads its ranks over them alone.
#[test]
fn fake_nodes_on_one_machine_do_not_spread_their_ranks() {
    let own = cpulist(&own_cpus());
    let out = Run::new(&["-l", "--launcher", "fork", "--hosts", "n1:2,n2:2", "-n", "4"])
        .args(show_cpus())
        .run();
    out.assert_code(0);
    let seen = seen(&out.lines());
    assert_eq!(seen.len(), 4, "{out}");
    for (rank, (_, cpus)) in &seen {
        assert_eq!(cpus, &own, "rank {rank}: {out}");
    }
}

#[test]
fn more_ranks_than_cores_wrap_around_with_one_notice() {
    let cores = objects(Unit::Core, &own_cpus());
    let n = cores.len() + 1;
    let out = Run::new(&["-l", "-n", &n.to_string(), "--bind-to", "core"]).args(show_cpus()).run();
    out.assert_code(0);
    let ranks = (0..n).map(|i| (i as u32, i));
    assert_eq!(seen_cpus(&out.lines()), expected(ranks, &cores), "{out}");
    let notice = |host: &str| {
        format!(
            "rlaunch: note: on {host}: {} x 1 core but only {} here: bindings wrap around",
            plural(n, "rank"),
            plural(cores.len(), "core")
        )
    };
    assert_eq!(wrap_notices(&out.stderr_lines()), [&notice(&hostname())], "{out}");

    // From a host started over a remote shell too: the notice travels up the tree.
    let out = Run::new(&["--launcher", "ssh", "--launcher-exec", &rlaunch_tests::fakessh()])
        .args(["--hosts", &format!("r1:{n}"), "-l", "-n", &n.to_string(), "--bind-to", "core"])
        .args(show_cpus())
        .run();
    out.assert_code(0);
    assert_eq!(wrap_notices(&out.stderr_lines()), [&notice("r1")], "{out}");
}

#[test]
fn report_bindings_says_what_each_rank_sees() {
    let out = Run::new(&["-l", "-n", "3", "--bind-to", "hwthread", "--report-bindings"])
        .args(show_cpus())
        .run();
    out.assert_code(0);
    let seen = seen(&out.lines());
    assert_eq!(seen.len(), 3, "{out}");
    let reports: Vec<String> =
        out.stderr_lines().into_iter().filter(|l| l.starts_with("rlaunch: rank ")).collect();
    assert_eq!(reports.len(), 3, "one line per rank: {out}");
    for (rank, (pid, cpus)) in &seen {
        let want =
            format!("rlaunch: rank {rank} on {} (pid {pid}) bound to cpus {cpus}", hostname());
        assert!(reports.contains(&want), "missing {want:?}: {out}");
    }
}

#[test]
fn each_node_binds_its_own_ranks_from_local_rank_zero() {
    // Two fake nodes on this machine: each proxy binds its ranks by their local index.
    let cores = objects(Unit::Core, &own_cpus());
    let out = Run::new(&[
        "--launcher",
        "fork",
        "--hosts",
        "n1:2,n2:2",
        "-l",
        "-n",
        "4",
        "--bind-to",
        "core",
        "--report-bindings",
    ])
    .args(show_cpus())
    .run();
    out.assert_code(0);
    let seen = seen(&out.lines());
    assert_eq!(
        seen.iter().map(|(r, (_, c))| (*r, c.clone())).collect::<BTreeMap<_, _>>(),
        expected([(0, 0), (1, 1), (2, 0), (3, 1)], &cores),
        "{out}"
    );
    for (rank, (pid, cpus)) in &seen {
        let host = if *rank < 2 { "n1" } else { "n2" };
        let want = format!("rlaunch: rank {rank} on {host} (pid {pid}) bound to cpus {cpus}");
        assert!(out.stderr_lines().contains(&want), "missing {want:?}: {out}");
    }
}

#[test]
fn under_taskset_ranks_get_only_the_allowed_cpu() {
    // The last CPU, so that "the first core" would be a different answer on most machines.
    let cpu = *own_cpus().last().unwrap();
    let rlaunch = rlaunch_tests::rlaunch();
    let out = Run::program("taskset", &["-c", &cpu.to_string()])
        .arg(rlaunch)
        .args(["-l", "-n", "2", "--bind-to", "core", "--report-bindings"])
        .args(show_cpus())
        .run();
    out.assert_code(0);
    let seen = seen(&out.lines());
    assert_eq!(seen.len(), 2, "{out}");
    for (rank, (pid, cpus)) in &seen {
        assert_eq!(cpus, &cpu.to_string(), "rank {rank}: {out}");
        let want =
            format!("rlaunch: rank {rank} on {} (pid {pid}) bound to cpus {cpu}", hostname());
        assert!(out.stderr_lines().contains(&want), "missing {want:?}: {out}");
    }
    assert_eq!(wrap_notices(&out.stderr_lines()).len(), 1, "{out}");
}

#[test]
fn a_bad_bind_to_value_is_a_one_line_usage_error() {
    // Not "cores": the command line being rewritten on main takes plurals as synonyms.
    for bad in ["bogus", "core:0", "core:x", "user:0,1"] {
        let out = Run::new(&["-n", "1", "--bind-to", bad, "true"]).run();
        out.assert_code(2);
        assert_eq!(
            out.stderr_lines(),
            [format!(
                "rlaunch: --bind-to {bad}: expected none, hwthread, core, l3cache, numa or socket, optionally :N"
            )],
            "{out}"
        );
    }
}

#[test]
fn map_by_an_object_binds_to_it_on_this_machine() {
    // Open MPI's rule: mapped by an object and not told otherwise, a rank is bound to it.
    let allowed = own_cpus();
    for (unit, name) in [(Unit::Core, "core"), (Unit::Numa, "numa"), (Unit::Socket, "socket")] {
        let objs = objects(unit, &allowed);
        let out = Run::new(&["-l", "-n", "2", "--map-by", name]).args(show_cpus()).run();
        out.assert_code(0);
        assert_eq!(seen_cpus(&out.lines()), expected([(0, 0), (1, 1)], &objs), "{name}: {out}");
    }
    // --bind-to none keeps them unbound.
    let own = cpulist(&allowed);
    let out = Run::new(&["-l", "-n", "2", "--map-by", "core", "--bind-to", "none"])
        .args(show_cpus())
        .run();
    out.assert_code(0);
    assert_eq!(
        seen_cpus(&out.lines()).into_values().collect::<Vec<_>>(),
        [own.as_str(), own.as_str()],
        "{out}"
    );
}
