//! Where each of a job's local ranks goes on its node: the object it is mapped to
//! (`--map-by`), the CPUs it is bound to (`--bind-to`, following the mapping when not given),
//! and the GPUs it gets (`--gpus-per-rank`, nearest first). A pure function of the machine
//! and the request, computed once per node and job.
//!
//! ```text
//!  mapping   by slot: local rank i takes bind objects [i*count, i*count+count)
//!            UNIT: object i mod n of UNIT (round-robin);  ppr:N:UNIT: object i / N
//!  binding   finer than (or as) the mapped object: the object's next `count` free ones
//!            coarser: the one that holds the mapped object, and the next `count-1`
//!  GPUs      the free GPUs whose local CPUs overlap the rank's most (ties: the runtime's
//!            numbering, `gpu::Visible`);
//!            an unbound rank counts as sitting on its share of the cores, in order
//! ```

use rlaunch_protocol::control::{Binding, CpuUnit, GpuBind, Mapping};

use crate::gpu::Visible;
use crate::machine::Machine;

/// What a job asks of a node.
#[derive(Debug, Clone, Copy)]
pub struct Request<'a> {
    /// `None`: by slot.
    pub mapping: Option<Mapping>,
    /// `None`: not bound (the launcher has already made a mapping's default binding explicit),
    /// unless `spread`.
    pub binding: Option<Binding>,
    /// With no mapping and no binding: if the ranks are no more than the cores, bind each to
    /// its share of them, local rank i of n to the i-th n-th of the cores in order (a core
    /// each when they are as many). What mpirun does for 2 ranks (a core each) without its
    /// pitfall: the ranks of a multithreaded program keep room for their threads, and two
    /// small jobs on one big machine each spread over all of it instead of piling on its
    /// first cores.
    pub spread: bool,
    pub gpus: Option<GpuAsk<'a>>,
}

/// The GPU part of a [`Request`].
#[derive(Debug, Clone, Copy)]
pub struct GpuAsk<'a> {
    /// GPUs each local rank asks for, by local rank.
    pub per_rank: &'a [u32],
    pub bind: &'a GpuBind,
    pub share: bool,
    pub visible: &'a Visible,
}

/// One local rank's place.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Place {
    /// The CPUs it is bound to (sorted); `None`: not bound.
    pub cpus: Option<Vec<u32>>,
    /// Indexes into [`Visible::gpus`], in the order chosen.
    pub gpus: Vec<usize>,
}

/// Every local rank's place, and what the user should hear about them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Placed {
    pub places: Vec<Place>,
    pub notices: Vec<String>,
}

/// The places of `count` local ranks; `Err` is a sentence saying why they do not fit.
pub fn place(machine: &Machine, request: &Request, count: usize) -> Result<Placed, String> {
    let mut notices = Vec::new();
    let spots = match request.mapping {
        None => by_slot(machine, request.binding, request.spread, count, &mut notices),
        Some(mapping) => by_object(machine, mapping, request.binding, count, &mut notices)?,
    };
    let gpus = match &request.gpus {
        Some(ask) => gpus(ask, &spots, count)?,
        None => vec![Vec::new(); count],
    };
    let places = spots
        .into_iter()
        .zip(gpus)
        .map(|(spot, gpus)| Place { cpus: spot.into_cpus(), gpus })
        .collect();
    Ok(Placed { places, notices })
}

/// Where a rank sits: bound to CPUs, or not bound but counted as near some.
enum Spot {
    Bound(Vec<u32>),
    Unbound { near: Vec<u32> },
}

impl Spot {
    /// The CPUs its GPUs should be near: those it is bound to, or those it counts as near.
    fn near(&self) -> &[u32] {
        match self {
            Spot::Bound(cpus) | Spot::Unbound { near: cpus } => cpus,
        }
    }

    fn into_cpus(self) -> Option<Vec<u32>> {
        match self {
            Spot::Bound(cpus) => Some(cpus),
            Spot::Unbound { .. } => None,
        }
    }
}

fn by_slot(
    machine: &Machine,
    binding: Option<Binding>,
    spread: bool,
    count: usize,
    notices: &mut Vec<String>,
) -> Vec<Spot> {
    let Some(binding) = binding else {
        // Each rank's share of the cores, in order: bound to it when spread and each has one
        // at least, else counted as sitting on it.
        let cores = machine.objects(CpuUnit::Core);
        let bound = spread && count <= cores.len();
        return (0..count)
            .map(|i| {
                // start < len, so the range holds at least one core.
                let start = i * cores.len() / count;
                let end = ((i + 1) * cores.len() / count).max(start + 1);
                let share = cores[start..end].concat();
                if bound {
                    Spot::Bound(share)
                } else {
                    Spot::Unbound { near: share }
                }
            })
            .collect();
    };
    let objects = machine.objects(binding.unit);
    let each = u64::from(binding.count.max(1));
    if count as u64 * each > objects.len() as u64 {
        notices.push(wraps(count, binding, objects.len()));
    }
    (0..count).map(|i| Spot::Bound(rank_cpus(&objects, binding.count, i))).collect()
}

fn by_object(
    machine: &Machine,
    mapping: Mapping,
    binding: Option<Binding>,
    count: usize,
    notices: &mut Vec<String>,
) -> Result<Vec<Spot>, String> {
    let objects = machine.objects(mapping.unit);
    let n = objects.len();
    if let Some(per) = mapping.per {
        let fits = per as usize * n;
        if count > fits {
            return Err(format!(
                "ppr:{per}:{} places at most {fits} ranks here ({}), not {count}",
                unit_word(mapping.unit),
                plural(n as u64, unit_name(mapping.unit))
            ));
        }
    }
    let object_of = |i: usize| match mapping.per {
        Some(per) => i / per as usize,
        None => i % n,
    };
    let Some(binding) = binding else {
        return Ok((0..count)
            .map(|i| Spot::Unbound { near: objects[object_of(i)].clone() })
            .collect());
    };
    let units = machine.objects(binding.unit);
    let take = (binding.count.max(1) as usize).min(units.len());
    // Per mapped object: the binding units inside it (when it holds whole ones), and how
    // many its ranks have taken.
    let inside: Vec<Option<Vec<usize>>> = objects
        .iter()
        .map(|object| {
            let touching: Vec<usize> =
                (0..units.len()).filter(|&u| units[u].iter().any(|c| object.contains(c))).collect();
            let whole = touching.iter().all(|&u| units[u].iter().all(|c| object.contains(c)));
            whole.then_some(touching)
        })
        .collect();
    // Objects smaller than a rank's binding (`--map-by core:PE=2`): as Open MPI, rank i takes
    // the binding's units from the i-th rank's share on, `take` a rank, in order.
    let too_small = |w: &Option<Vec<usize>>| matches!(w, Some(w) if w.len() < take);
    if take > 1 && inside.iter().any(too_small) {
        return Ok(by_slot(machine, Some(binding), false, count, notices));
    }
    // The binding unit is the object itself: ranks that share one (`ppr:2:numa`) share it by
    // design; only round-robin past the last object oversubscribes.
    let same = binding.unit == mapping.unit;
    let mut taken = vec![0usize; n];
    let mut wrapped = same && mapping.per.is_none() && count > n;
    let mut spots = Vec::with_capacity(count);
    for i in 0..count {
        let at = object_of(i);
        let chosen: Vec<usize> = match &inside[at] {
            Some(within) => {
                let first = taken[at];
                taken[at] += take;
                wrapped |= !same && taken[at] > within.len();
                (first..first + take.min(within.len())).map(|k| within[k % within.len()]).collect()
            }
            None => {
                // Coarser than the object: the unit that holds it, and the ones after.
                let first = objects[at][0];
                let holder = units.iter().position(|u| u.contains(&first)).unwrap_or(0);
                (holder..holder + take).map(|k| k % units.len()).collect()
            }
        };
        let mut cpus: Vec<u32> = chosen.iter().flat_map(|&u| units[u].iter().copied()).collect();
        cpus.sort_unstable();
        cpus.dedup();
        spots.push(Spot::Bound(cpus));
    }
    if wrapped {
        notices.push(format!(
            "{} x {} by {} but not that many in each: bindings wrap around",
            plural(count as u64, ("rank", "ranks")),
            plural(u64::from(binding.count.max(1)), unit_name(binding.unit)),
            unit_word(mapping.unit),
        ));
    }
    Ok(spots)
}

/// The CPUs of local rank `local`: `count` objects from its position on, wrapping around.
pub fn rank_cpus(objects: &[Vec<u32>], count: u32, local: usize) -> Vec<u32> {
    let n = objects.len();
    if n == 0 {
        return Vec::new();
    }
    // A count past the number of objects takes them all; reduce first so nothing overflows.
    let count = (count.max(1) as usize).min(n);
    let start = ((local % n) * count) % n;
    let mut cpus: Vec<u32> = (0..count).flat_map(|j| &objects[(start + j) % n]).copied().collect();
    cpus.sort_unstable();
    cpus
}

/// Each rank's GPUs: by `map:`, or the nearest free ones in local-rank order.
fn gpus(ask: &GpuAsk, spots: &[Spot], count: usize) -> Result<Vec<Vec<usize>>, String> {
    let have = ask.visible.gpus.len();
    let want: Vec<u32> = (0..count).map(|i| ask.per_rank.get(i).copied().unwrap_or(0)).collect();
    let total: u64 = want.iter().map(|&w| u64::from(w)).sum();
    if total > 0 && have == 0 {
        return Err(format!("{} for GPUs but there is none here", ranks_ask(count)));
    }
    if have == 0 {
        return Ok(vec![Vec::new(); count]);
    }
    let most = want.iter().copied().max().unwrap_or(0) as usize;
    // A map is the user's own sharing: only its entries are checked.
    let mapped = matches!(ask.bind, GpuBind::Map(_));
    // A rank's own count never exceeds the total: the total alone decides.
    if !ask.share && !mapped && total > have as u64 {
        return Err(format!(
            "{} for {} but there are {} here (--gpu-share lets ranks share them)",
            ranks_ask(count),
            plural(total, ("GPU", "GPUs")),
            have
        ));
    }
    if ask.share && most > have {
        return Err(format!("a rank asks for {most} GPUs but there are {have} here"));
    }
    // Shared GPUs are shared evenly: each takes at most `cap` ranks, and only as many GPUs
    // reach `cap` as the count needs (10 ranks on 8 GPUs: two GPUs take two).
    let cap = if ask.share { total.div_ceil(have as u64).max(1) as u32 } else { 1 };
    let mut full_left = total.saturating_sub(have as u64 * u64::from(cap - 1));
    let mut users = vec![0u32; have];
    let mut out = Vec::with_capacity(count);
    for (i, &w) in want.iter().enumerate() {
        let mut mine: Vec<usize> = Vec::new();
        if let GpuBind::Map(list) = ask.bind {
            if w > 0 && !list.is_empty() {
                let g = list[i % list.len()] as usize;
                if g >= have {
                    return Err(format!("--gpu-bind map names GPU {g} but there are {have} here"));
                }
                mine.push(g);
            }
        } else {
            for _ in 0..w {
                let best = (0..have)
                    .filter(|g| {
                        let fills = users[*g] + 1 == cap;
                        !mine.contains(g) && users[*g] < cap && (!fills || full_left > 0)
                    })
                    .min_by_key(|&g| {
                        let near = match &ask.visible.gpus[g].gpu {
                            Some(gpu) => overlap(&gpu.cpus, spots[i].near()),
                            None => 0,
                        };
                        (std::cmp::Reverse(near), users[g], g)
                    })
                    .or_else(|| (0..have).find(|g| !mine.contains(g)))
                    .expect("a rank asks for no more GPUs than there are");
                if users[best] + 1 == cap {
                    full_left = full_left.saturating_sub(1);
                }
                mine.push(best);
            }
        }
        mine.iter().for_each(|&g| users[g] += 1);
        out.push(mine);
    }
    Ok(out)
}

/// How many of `a` (sorted) are in `b` (sorted).
fn overlap(a: &[u32], b: &[u32]) -> usize {
    let (mut i, mut j, mut n) = (0, 0, 0);
    while i < a.len() && j < b.len() {
        match a[i].cmp(&b[j]) {
            std::cmp::Ordering::Less => i += 1,
            std::cmp::Ordering::Greater => j += 1,
            std::cmp::Ordering::Equal => {
                n += 1;
                i += 1;
                j += 1;
            }
        }
    }
    n
}

fn wraps(count: usize, binding: Binding, here: usize) -> String {
    let ranks = plural(count as u64, ("rank", "ranks"));
    let each = plural(u64::from(binding.count.max(1)), unit_name(binding.unit));
    let here = plural(here as u64, unit_name(binding.unit));
    format!("{ranks} x {each} but only {here} here: bindings wrap around")
}

/// `1 rank asks`, `9 ranks ask`.
fn ranks_ask(count: usize) -> String {
    if count == 1 {
        "1 rank asks".to_string()
    } else {
        format!("{count} ranks ask")
    }
}

/// The unit as `--map-by` spells it.
pub fn unit_word(unit: CpuUnit) -> &'static str {
    match unit {
        CpuUnit::Hwthread => "hwthread",
        CpuUnit::Core => "core",
        CpuUnit::L3 => "l3cache",
        CpuUnit::Numa => "numa",
        CpuUnit::Socket => "socket",
    }
}

pub fn unit_name(unit: CpuUnit) -> (&'static str, &'static str) {
    match unit {
        CpuUnit::Hwthread => ("hwthread", "hwthreads"),
        CpuUnit::Core => ("core", "cores"),
        CpuUnit::L3 => ("L3 cache", "L3 caches"),
        CpuUnit::Numa => ("NUMA node", "NUMA nodes"),
        CpuUnit::Socket => ("socket", "sockets"),
    }
}

pub fn plural(n: u64, (one, many): (&str, &str)) -> String {
    format!("{n} {}", if n == 1 { one } else { many })
}

#[cfg(test)]
mod tests;
