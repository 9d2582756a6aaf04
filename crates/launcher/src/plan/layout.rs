//! The job's layout on each node, from the options: where ranks go within a node
//! (`--map-by UNIT`, `ppr:N:UNIT`), what they are bound to (`--bind-to`, else the mapping's
//! unit, `:PE=n` cores), and their GPUs (`--gpus-per-rank`, `--gpu-bind`, `--gpu-share`).
//! The proxies place; this only decides what they are asked.

use rlaunch_protocol::control::{Binding, CpuUnit, GpuBind, Gpus, Mapping};

use crate::error::{SetupError, UsageError};
use crate::options::{OptionError, Options};

use super::PlanError;

/// What every node is asked.
#[derive(Debug, PartialEq)]
pub(super) struct Layout {
    pub(super) mapping: Option<Mapping>,
    pub(super) binding: Option<Binding>,
    /// Nothing was said of binding or mapping: each node spreads its ranks over its cores
    /// (`Job::spread`).
    pub(super) spread: bool,
    pub(super) gpus: Option<Gpus>,
    /// Ranks per host: `--ppn`, or `ppr:N:UNIT` times the UNITs of a host.
    pub(super) ppn: Option<u32>,
}

/// The layout `o` asks for. `objects_here` counts a unit's objects on this machine: for
/// `ppr:N:socket`, whose ranks per host are N times a host's sockets, rlaunch counts its
/// own (each node checks that its ranks fit its own).
pub(super) fn layout(
    o: &Options,
    objects_here: impl FnOnce(CpuUnit) -> Result<usize, String>,
) -> Result<Layout, PlanError> {
    // PE counts cores, or hardware threads where ranks are mapped by them (Open MPI's
    // `--map-by hwthread:PE=2`).
    let pe_unit = match o.mapping {
        Some(Mapping { unit: CpuUnit::Hwthread, .. }) => CpuUnit::Hwthread,
        _ => CpuUnit::Core,
    };
    let binding = match (o.bind_given, o.binding, o.pe, o.mapping) {
        (true, Some(b), Some(pe), _) => Some(Binding { unit: b.unit, count: pe }),
        (true, binding, _, _) => binding,
        (false, _, Some(pe), _) => Some(Binding { unit: pe_unit, count: pe }),
        (false, _, None, Some(m)) => Some(Binding { unit: m.unit, count: 1 }),
        (false, binding, None, None) => binding,
    };
    let ppn = match o.mapping {
        Some(Mapping { unit, per: Some(per) }) if o.ppn.is_none() => {
            let here = objects_here(unit).map_err(SetupError::Topology)?;
            Some(per.saturating_mul(here as u32).max(1))
        }
        _ => o.ppn,
    };
    let spread = !o.bind_given && o.pe.is_none() && o.mapping.is_none();
    Ok(Layout { mapping: o.mapping, binding, spread, gpus: gpus(o)?, ppn })
}

/// Each segment's GPUs a rank, or `None` when the job asks for none.
fn gpus(o: &Options) -> Result<Option<Gpus>, UsageError> {
    let counts: Vec<Option<u32>> = o.segments.iter().map(|s| s.gpus.or(o.gpus)).collect();
    let asked = counts.iter().any(Option::is_some);
    let bind = match &o.gpu_bind {
        Some(None) => return Ok(None),
        Some(Some(bind)) => bind.clone(),
        None if asked => GpuBind::Closest,
        None => return Ok(None),
    };
    // `--gpu-bind` alone gives every rank one; a segment that says nothing where others
    // ask gets none.
    let per_rank: Vec<u32> =
        counts.iter().map(|c| c.unwrap_or(if asked { 0 } else { 1 })).collect();
    if let GpuBind::Map(_) = bind {
        if let Some(&many) = per_rank.iter().find(|&&n| n > 1) {
            return Err(OptionError::MapManyGpus(many).into());
        }
    }
    Ok(Some(Gpus { per_rank, bind, share: o.gpu_share }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn layout_of(line: &str, sockets: usize) -> Layout {
        let args: Vec<std::ffi::OsString> = line.split_whitespace().map(Into::into).collect();
        let crate::options::Request::Run(o) =
            crate::options::parse(&args, &[], std::path::Path::new("/")).unwrap()
        else {
            panic!("not a run: {line}")
        };
        layout(&o, |unit| {
            assert_eq!(unit, CpuUnit::Socket);
            Ok(sockets)
        })
        .unwrap()
    }

    fn binding(unit: CpuUnit, count: u32) -> Option<Binding> {
        Some(Binding { unit, count })
    }

    #[test]
    fn binding_follows_the_mapping_unless_given() {
        assert_eq!(layout_of("./a", 2).binding, None);
        assert_eq!(layout_of("--map-by numa ./a", 2).binding, binding(CpuUnit::Numa, 1));
        assert_eq!(
            layout_of("--map-by numa --bind-to core ./a", 2).binding,
            binding(CpuUnit::Core, 1)
        );
        assert_eq!(layout_of("--map-by numa --bind-to none ./a", 2).binding, None);
        assert_eq!(layout_of("--map-by socket:PE=4 ./a", 2).binding, binding(CpuUnit::Core, 4));
        let threads = layout_of("--map-by hwthread:PE=2 ./a", 2).binding;
        assert_eq!(threads, binding(CpuUnit::Hwthread, 2));
        let pe = layout_of("--map-by slot:PE=2 --bind-to hwthread ./a", 2);
        assert_eq!((pe.mapping, pe.binding), (None, binding(CpuUnit::Hwthread, 2)));
    }

    #[test]
    fn ranks_are_spread_only_where_nothing_was_said_of_binding() {
        for said in ["./a", "--map-by node ./a", "--map-by slot ./a", "--gpus-per-rank 1 ./a"] {
            let l = layout_of(said, 2);
            assert!(l.spread && l.binding.is_none(), "{said}");
        }
        for said in [
            "--bind-to none ./a",
            "--bind-to core ./a",
            "--map-by core ./a",
            "--map-by slot:PE=2 ./a",
            "--map-by ppr:1:socket ./a",
        ] {
            assert!(!layout_of(said, 2).spread, "{said}");
        }
    }

    #[test]
    fn ppr_of_a_unit_counts_this_machines_units() {
        let l = layout_of("--map-by ppr:3:socket ./a", 2);
        assert_eq!(l.ppn, Some(6));
        assert_eq!(l.binding, binding(CpuUnit::Socket, 1));
        assert_eq!(layout_of("--map-by ppr:3:node ./a", 2).ppn, Some(3));
        // --ppn said it already.
        assert_eq!(layout_of("--ppn 5 --map-by ppr:3:socket ./a", 2).ppn, Some(5));
    }

    #[test]
    fn gpus_per_segment_and_what_implies_them() {
        assert_eq!(layout_of("./a", 1).gpus, None);
        let gpus = |per_rank: &[u32], bind: GpuBind, share| {
            Some(Gpus { per_rank: per_rank.to_vec(), bind, share })
        };
        assert_eq!(
            layout_of("--gpu-bind closest ./a", 1).gpus,
            gpus(&[1], GpuBind::Closest, false)
        );
        assert_eq!(
            layout_of("-n 1 ./a : -n 2 --gpus-per-rank 2 --gpu-share ./b", 1).gpus,
            gpus(&[0, 2], GpuBind::Closest, true)
        );
        assert_eq!(layout_of("--gpus-per-rank 1 --gpu-bind none ./a", 1).gpus, None);
    }
}
