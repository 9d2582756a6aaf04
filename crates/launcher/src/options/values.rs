//! Reading the values of options: seconds, launchers, commands, `NAME=VALUE` pairs, CPU
//! binding, and the output options checked together.

use std::os::unix::ffi::OsStrExt;
use std::time::Duration;

use rlaunch_protocol::control::{Binding, CpuUnit, GpuBind, Mapping};

use super::MapBy;

use super::{LauncherKind, OptionError};
use crate::args::Item;
use crate::output::{OutputDir, OutputSpec, Pattern};

/// The output options as written, before [`output_spec`] checks them.
#[derive(Debug, Default)]
pub(super) struct OutputOptions {
    pub prepend_rank: bool,
    pub prepend_pattern: Option<String>,
    pub tag: bool,
    pub timestamp: bool,
    pub outfile: Option<String>,
    pub errfile: Option<String>,
    /// `--output-filename DIR[:nocopy]`.
    pub dir: Option<String>,
}

/// The output options, checked: patterns parsed, `--output-filename`'s options known.
pub(super) fn output_spec(o: &OutputOptions) -> Result<OutputSpec, OptionError> {
    let pattern = |option, text: &Option<String>| {
        let parse = |t: &String| {
            Pattern::parse(t).map_err(|e| OptionError::Pattern {
                option,
                pattern: t.clone(),
                reason: e.to_string(),
            })
        };
        text.as_ref().map(parse).transpose()
    };
    let prefix = match (o.prepend_rank, &o.prepend_pattern) {
        (true, Some(_)) => return Err(OptionError::TwoPrefixes),
        (true, None) => Some(Pattern::parse("[%r] ").expect("-l's pattern is valid")),
        (false, text) => pattern("--prepend-pattern", text)?,
    };
    Ok(OutputSpec {
        prefix,
        tag: o.tag,
        timestamp: o.timestamp,
        outfile: pattern("--outfile-pattern", &o.outfile)?,
        errfile: pattern("--errfile-pattern", &o.errfile)?,
        dir: o.dir.as_deref().map(output_dir).transpose()?,
    })
}

/// `--output-filename DIR[:OPTION,...]`, Open MPI's syntax.
fn output_dir(arg: &str) -> Result<OutputDir, OptionError> {
    let (path, options) = match arg.rsplit_once(':') {
        Some((path, options)) => (path, options.split(',').collect()),
        None => (arg, Vec::new()),
    };
    if path.is_empty() {
        return Err(OptionError::NoOutputDir(arg.to_string()));
    }
    let mut dir = OutputDir { path: path.into(), copy: true, per_job: true };
    for option in options {
        match option.to_ascii_lowercase().as_str() {
            "nocopy" => dir.copy = false,
            "nojobid" => dir.per_job = false,
            _ => {
                let (arg, option) = (arg.to_string(), option.to_string());
                return Err(OptionError::OutputDirOption { arg, option });
            }
        }
    }
    Ok(dir)
}

/// `NAME=VALUE` into its two halves; the name must be a name.
pub(super) fn split_pair(item: &Item) -> Result<(Vec<u8>, Vec<u8>), OptionError> {
    let bytes = item.value.as_ref().expect("pairs have a value").as_bytes();
    let eq = bytes.iter().position(|&b| b == b'=').expect("pairs hold '='");
    let (name, value) = (&bytes[..eq], &bytes[eq + 1..]);
    if name.is_empty() {
        let pair = String::from_utf8_lossy(bytes).into_owned();
        return Err(OptionError::EmptyName { option: item.name, pair });
    }
    Ok((name.to_vec(), value.to_vec()))
}

/// Longest duration any option takes: about 31 years. Past it a deadline could overflow the
/// clock (`--timeout 1e30` panicked; found by fuzzing).
const MAX_SECONDS: f64 = 1e9;

pub(super) fn parse_seconds(name: &'static str, value: &str) -> Result<Duration, OptionError> {
    value
        .trim()
        .parse::<f64>()
        .ok()
        .filter(|s| s.is_finite() && (0.0..=MAX_SECONDS).contains(s))
        .and_then(|s| Duration::try_from_secs_f64(s).ok())
        .ok_or_else(|| expected(name, value, "a number of seconds, at most 1000000000"))
}

pub(super) fn parse_launcher(name: &'static str, value: &str) -> Result<LauncherKind, OptionError> {
    match value {
        "fork" => Ok(LauncherKind::Fork),
        "ssh" => Ok(LauncherKind::Ssh),
        "rsh" => Ok(LauncherKind::Rsh),
        "slurm" | "srun" => Ok(LauncherKind::Slurm),
        "sge" | "qrsh" => Ok(LauncherKind::Sge),
        "lsf" | "blaunch" => Ok(LauncherKind::Lsf),
        _ => Err(expected(name, value, "fork, ssh, rsh, slurm, sge or lsf")),
    }
}

/// The IPv4 address of the network interface `name` (`--iface`).
pub(super) fn interface_address(
    option: &'static str,
    name: &str,
) -> Result<std::net::IpAddr, OptionError> {
    let addresses =
        nix::ifaddrs::getifaddrs().map_err(|_| expected(option, name, "an interface"))?;
    let mut known = Vec::new();
    for ifa in addresses {
        let ipv4 = ifa.address.as_ref().and_then(|a| a.as_sockaddr_in()).map(|a| a.ip());
        match ipv4 {
            Some(ip) if ifa.interface_name == name => return Ok(std::net::IpAddr::V4(ip)),
            Some(_) if !known.contains(&ifa.interface_name) => known.push(ifa.interface_name),
            _ => {}
        }
    }
    Err(OptionError::NoInterface {
        option,
        name: name.chars().take(40).collect(),
        known: known.join(", "),
    })
}

pub(super) fn parse_command(name: &'static str, value: &str) -> Result<Vec<String>, OptionError> {
    let words: Vec<String> = value.split_whitespace().map(String::from).collect();
    if words.is_empty() {
        return Err(OptionError::EmptyCommand(name));
    }
    Ok(words)
}

/// `core`, `socket:2`, `none`.
pub(super) fn parse_bind_to(
    name: &'static str,
    value: &str,
) -> Result<Option<Binding>, OptionError> {
    let bad =
        || expected(name, value, "none, hwthread, core, l3cache, numa or socket, optionally :N");
    let (unit, count) = match value.split_once(':') {
        Some((unit, n)) => (unit, n.parse::<u32>().ok().filter(|&n| n > 0).ok_or_else(bad)?),
        None => (value, 1),
    };
    if unit == "none" && count == 1 {
        return Ok(None);
    }
    Ok(Some(Binding { unit: cpu_unit(unit).ok_or_else(bad)?, count }))
}

/// A topology level as Open MPI, Hydra and hwloc spell it.
fn cpu_unit(word: &str) -> Option<CpuUnit> {
    Some(match word.to_ascii_lowercase().as_str() {
        "hwthread" | "hwthreads" | "thread" | "threads" | "pu" => CpuUnit::Hwthread,
        "core" | "cores" => CpuUnit::Core,
        "l3cache" | "l3" | "l3caches" => CpuUnit::L3,
        "numa" | "numanode" | "numanodes" | "numa-node" => CpuUnit::Numa,
        "socket" | "sockets" | "package" | "packages" => CpuUnit::Socket,
        _ => return None,
    })
}

/// `--map-by` as given: how ranks are spread over the hosts, and within each.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct MapSpec {
    pub(super) over_hosts: MapBy,
    /// `ppr:N:node`: ranks per host.
    pub(super) ppn: Option<u32>,
    /// Within each host.
    pub(super) mapping: Option<Mapping>,
    /// `:PE=n`: each rank binds n cores.
    pub(super) pe: Option<u32>,
}

/// `slot`, `node`, `core`, `socket:PE=4`, `ppr:2:numa`, `l3cache:oversubscribe` (Open MPI's
/// spellings; the byslot/bynode flags come here as their own names).
pub(super) fn parse_map_by(name: &'static str, value: &str) -> Result<MapSpec, OptionError> {
    const WHAT: &str = "slot, node, hwthread, core, l3cache, numa, socket, or ppr:N:UNIT, \
                        optionally :PE=n";
    let bad = || expected(name, value, WHAT);
    let mut spec = MapSpec { over_hosts: MapBy::Slot, ppn: None, mapping: None, pe: None };
    let mut words = value.split(':');
    match words.next().unwrap_or_default().to_ascii_lowercase().as_str() {
        "slot" | "--byslot" | "-byslot" => {}
        "node" | "--bynode" | "-bynode" => spec.over_hosts = MapBy::Node,
        "ppr" => {
            let n = words.next().and_then(|n| n.parse::<u32>().ok()).filter(|&n| n > 0);
            let n = n.ok_or_else(bad)?;
            match words.next().ok_or_else(bad)?.to_ascii_lowercase().as_str() {
                "node" => spec.ppn = Some(n),
                unit => {
                    let unit = cpu_unit(unit).ok_or_else(bad)?;
                    spec.mapping = Some(Mapping { unit, per: Some(n) });
                }
            }
        }
        unit => spec.mapping = Some(Mapping { unit: cpu_unit(unit).ok_or_else(bad)?, per: None }),
    }
    for modifier in words {
        let upper = modifier.to_ascii_uppercase();
        if let Some(n) = upper.strip_prefix("PE=") {
            spec.pe = Some(n.parse::<u32>().ok().filter(|&n| n > 0).ok_or_else(bad)?);
        } else if upper != "OVERSUBSCRIBE" {
            // rlaunch always oversubscribes, as Hydra does.
            return Err(bad());
        }
    }
    Ok(spec)
}

/// `--gpu-bind`: `closest`, `none`, `map:3,2,1,0` (Slurm's `map_gpu:` too); `None` for
/// `none`.
pub(super) fn parse_gpu_bind(
    name: &'static str,
    value: &str,
) -> Result<Option<GpuBind>, OptionError> {
    let bad = || expected(name, value, "closest, none or map:LIST (GPU indexes: 3,2,1,0)");
    match value {
        "closest" => Ok(Some(GpuBind::Closest)),
        "none" => Ok(None),
        _ => {
            let list = value
                .strip_prefix("map:")
                .or_else(|| value.strip_prefix("map_gpu:"))
                .ok_or_else(bad)?;
            let ids: Option<Vec<u32>> = list.split(',').map(|i| i.trim().parse().ok()).collect();
            let ids = ids.filter(|ids| !ids.is_empty()).ok_or_else(bad)?;
            Ok(Some(GpuBind::Map(ids)))
        }
    }
}

pub(super) fn expected(option: &'static str, value: &str, what: &'static str) -> OptionError {
    OptionError::Expected { option, value: value.to_string(), what }
}

/// `--pset NAME=RANKS`: the name and the rank ranges (`0-3,8` is 0..=3 and 8..=8), checked
/// against the job's size once it is known.
pub(super) fn pset(value: &str) -> Option<(String, Vec<(u32, u32)>)> {
    let (name, ranks) = value.split_once('=')?;
    if name.is_empty() || name.len() > 255 || name.contains(|c: char| c.is_control()) {
        return None;
    }
    let ranges = ranks
        .split(',')
        .map(|part| {
            let (first, last) = part.split_once('-').unwrap_or((part, part));
            let (first, last) = (first.parse::<u32>().ok()?, last.parse::<u32>().ok()?);
            (first <= last).then_some((first, last))
        })
        .collect::<Option<Vec<_>>>()?;
    Some((name.to_string(), ranges))
}

/// `--bcast FILE[:DEST]`: the file, and its name in each node's directory (by default the
/// file's own name). DEST must stay inside the directory: relative, no `..`, no `.`. A FILE
/// whose name holds a `:` needs its DEST.
pub(super) fn bcast(value: &str) -> Option<(String, String)> {
    use std::path::{Component, Path};
    let (file, dest) = match value.rsplit_once(':') {
        Some((file, dest)) => (file, dest.to_string()),
        None => (value, Path::new(value).file_name()?.to_str()?.to_string()),
    };
    let inside = Path::new(&dest).components().all(|c| matches!(c, Component::Normal(_)));
    let fits = dest.len() <= 4096 && !dest.contains(|c: char| c.is_control());
    (!file.is_empty() && !dest.is_empty() && inside && fits && !dest.ends_with('/'))
        .then(|| (file.to_string(), dest))
}

#[cfg(test)]
mod bcast_tests {
    use super::bcast;

    #[test]
    fn bcast_takes_a_file_and_a_relative_name_inside_the_directory() {
        let pair = |a: &str, b: &str| Some((a.to_string(), b.to_string()));
        assert_eq!(bcast("data/in.bin"), pair("data/in.bin", "in.bin"));
        assert_eq!(bcast("/opt/app:bin/app"), pair("/opt/app", "bin/app"));
        assert_eq!(bcast("env.tar:env.tar"), pair("env.tar", "env.tar"));
        for bad in ["", ":x", "a:", "a:/etc/x", "a:../x", "a:x/../y", "a:./x", "..", "a:x/", "/"] {
            assert_eq!(bcast(bad), None, "{bad}");
        }
    }
}

#[cfg(test)]
mod pset_tests {
    use super::pset;

    #[test]
    fn psets_are_names_and_rank_ranges() {
        assert_eq!(pset("io=0-3,8"), Some(("io".into(), vec![(0, 3), (8, 8)])));
        assert_eq!(pset("a:b=5"), Some(("a:b".into(), vec![(5, 5)])));
        for bad in ["io", "=1", "io=", "io=3-1", "io=x", "io=1,,2", "io=-1"] {
            assert_eq!(pset(bad), None, "{bad}");
        }
    }
}
