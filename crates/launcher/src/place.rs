//! Where ranks go: each segment's ranks on its hosts' slots, in blocks or round-robin, and
//! the `PMI_process_mapping` that tells MPI the result; and where spawned ranks go
//! ([`Universe`]). Pure.

use crate::hosts::Host;

/// The host (an index into `hosts`) of each of `n` ranks: hosts filled in order, each up to
/// its slots; past the total, around again.
fn place_block(hosts: &[Host], n: u32) -> Vec<usize> {
    let slots = hosts.iter().enumerate().flat_map(|(i, h)| (0..h.slots).map(move |_| i));
    slots.cycle().take(n as usize).collect()
}

/// The host of each of `n` ranks, one host after the other (`--map-by node`): rank r goes to
/// the r-th host with a free slot in a round, and rounds repeat past the total.
fn place_round_robin(hosts: &[Host], n: u32) -> Vec<usize> {
    let mut placed = Vec::with_capacity(n as usize);
    let deepest = hosts.iter().map(|h| h.slots).max().unwrap_or(0);
    // One round: the hosts' first slots, then their second slots, ...
    // No more of a round than there are ranks: slot counts may be huge.
    let round: Vec<usize> = (0..deepest)
        .flat_map(|depth| hosts.iter().enumerate().filter(move |(_, h)| h.slots > depth))
        .map(|(i, _)| i)
        .take(n as usize)
        .collect();
    while placed.len() < n as usize && !round.is_empty() {
        let missing = n as usize - placed.len();
        placed.extend(round.iter().take(missing));
    }
    placed
}

/// The host name of each rank of an MPMD job, ranks numbered across segments. `segments` are
/// (host list index, rank count); segments drawing on the same list continue where the
/// previous one stopped, as if they were one block of ranks (Hydra's numbering).
pub(crate) fn place_segments<'a>(
    lists: &'a [Vec<Host>],
    segments: &[(usize, u32)],
    by_node: bool,
) -> Vec<&'a str> {
    let mut sequences: Vec<_> = lists
        .iter()
        .enumerate()
        .map(|(i, hosts)| {
            let n: u32 = segments.iter().filter(|(l, _)| *l == i).map(|(_, n)| n).sum();
            let placed = if by_node { place_round_robin(hosts, n) } else { place_block(hosts, n) };
            placed.into_iter().map(move |h| hosts[h].name.as_str())
        })
        .collect();
    let mut out = Vec::new();
    for &(list, n) in segments {
        out.extend(sequences[list].by_ref().take(n as usize));
    }
    out
}

/// The hosts a run places spawned ranks on (MPI_Comm_spawn), with their slots, and where
/// the next placement starts when the spawn does not say: after the last slot taken, round
/// the job's hosts, as Hydra and mpirun place them.
#[derive(Debug, Clone)]
pub(crate) struct Universe {
    hosts: Vec<Host>,
    by_node: bool,
    /// Ranks placed on it so far without a host asked for: the launched job's, then spawned.
    placed: u32,
}

impl Universe {
    /// The hosts of every list, each once (its first slot count), `placed` ranks on them.
    pub(crate) fn new(lists: &[Vec<Host>], by_node: bool, placed: u32) -> Universe {
        // A hostfile may hold a hundred thousand hosts: each looked up once.
        let mut seen = std::collections::HashSet::new();
        let hosts = lists.iter().flatten().filter(|h| seen.insert(h.name.as_str())).cloned();
        Universe { hosts: hosts.collect(), by_node, placed }
    }

    /// The hosts of `n` more ranks, placed after the last slot taken (`by_node`: one host
    /// after the other; `None`: as the job was placed).
    pub(crate) fn next(&mut self, n: u32, by_node: Option<bool>) -> Vec<String> {
        let (from, upto) = (self.placed as usize, self.placed.saturating_add(n));
        let all = match by_node.unwrap_or(self.by_node) {
            true => place_round_robin(&self.hosts, upto),
            false => place_block(&self.hosts, upto),
        };
        self.placed = upto;
        all[from.min(all.len())..].iter().map(|&h| self.hosts[h].name.clone()).collect()
    }

    /// The hosts of `n` ranks on `chosen`, from its first slot (`by_node`: one host after
    /// the other), round again past its slots.
    pub(crate) fn on(chosen: &[Host], n: u32, by_node: bool) -> Vec<String> {
        let placed = if by_node { place_round_robin(chosen, n) } else { place_block(chosen, n) };
        placed.into_iter().map(|h| chosen[h].name.clone()).collect()
    }

    /// The host of this name, if the run has it.
    pub(crate) fn find(&self, name: &str) -> Option<&Host> {
        self.hosts.iter().find(|h| h.name == name)
    }

    /// A host the run did not have (a spawn's `add-host`), from now on one of its own.
    pub(crate) fn add(&mut self, host: Host) {
        if self.find(&host.name).is_none() {
            self.hosts.push(host);
        }
    }
}

/// `PMI_process_mapping` for a placement (`rank_node[r]` = node id of rank r): one
/// `(s,n,p)` triple per stretch of consecutive nodes each holding `p` consecutive ranks.
/// `None` if the value would not fit what an MPICH client can receive.
pub(crate) fn process_mapping(rank_node: &[u32]) -> Option<String> {
    // Runs of consecutive ranks on one node: (node, count).
    let mut runs: Vec<(u32, u32)> = Vec::new();
    for &node in rank_node {
        match runs.last_mut() {
            Some((n, count)) if *n == node => *count += 1,
            _ => runs.push((node, 1)),
        }
    }
    // Triples: consecutive runs on consecutive nodes with equal counts merge.
    let mut triples: Vec<(u32, u32, u32)> = Vec::new();
    for (node, count) in runs {
        match triples.last_mut() {
            Some((s, n, p)) if *p == count && *s + *n == node => *n += 1,
            _ => triples.push((node, 1, count)),
        }
    }
    let body: Vec<String> = triples.iter().map(|(s, n, p)| format!("({s},{n},{p})")).collect();
    let value = format!("(vector,{})", body.join(","));
    (value.len() < pmi_wire::pmi1::SERVED_VALUE_LIMIT).then_some(value)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hosts::parse_host_list;

    #[test]
    fn block_placement_fills_then_wraps() {
        let hosts = parse_host_list("n1:2,n2:2").unwrap();
        assert_eq!(place_block(&hosts, 6), [0, 0, 1, 1, 0, 0]);
        assert_eq!(place_block(&hosts, 1), [0]);
    }

    #[test]
    fn round_robin_placement_deals_one_rank_per_host() {
        let hosts = parse_host_list("n1:2,n2:1").unwrap();
        assert_eq!(place_round_robin(&hosts, 5), [0, 1, 0, 0, 1]);
    }

    #[test]
    fn segments_continue_on_a_shared_list() {
        let lists = [parse_host_list("a:2,b:2").unwrap(), parse_host_list("c").unwrap()];
        let hosts = place_segments(&lists, &[(0, 1), (1, 2), (0, 3)], false);
        assert_eq!(hosts, ["a", "c", "c", "a", "b", "b"]);
        let hosts = place_segments(&lists, &[(0, 1), (0, 3)], true);
        assert_eq!(hosts, ["a", "b", "a", "b"]);
    }

    #[test]
    fn spawned_ranks_go_after_the_last_slot_taken_round_the_hosts() {
        let lists = [parse_host_list("a:2,b:2").unwrap(), parse_host_list("b,c").unwrap()];
        let mut universe = Universe::new(&lists, false, 3);
        assert_eq!(universe.next(3, None), ["b", "c", "a"]);
        assert_eq!(universe.next(1, None), ["a"]);
        assert_eq!(universe.next(2, Some(true)), ["c", "a"]);
        let mut by_node = Universe::new(&lists[..1], true, 1);
        assert_eq!(by_node.next(4, None), ["b", "a", "b", "a"]);
        let chosen = parse_host_list("x:2,y").unwrap();
        assert_eq!(Universe::on(&chosen, 4, false), ["x", "x", "y", "x"]);
        assert_eq!(Universe::on(&chosen, 3, true), ["x", "y", "x"]);
        assert!(universe.find("x").is_none());
        universe.add(chosen[0].clone());
        assert_eq!(universe.find("x").map(|h| h.slots), Some(2));
    }

    #[test]
    fn process_mapping_compresses_runs() {
        assert_eq!(process_mapping(&[0, 0, 0, 0]).unwrap(), "(vector,(0,1,4))");
        assert_eq!(process_mapping(&[0, 0, 1, 1, 2, 2]).unwrap(), "(vector,(0,3,2))");
        assert_eq!(process_mapping(&[0, 0, 0, 1, 1]).unwrap(), "(vector,(0,1,3),(1,1,2))");
        assert_eq!(process_mapping(&[0, 0, 1, 1, 0]).unwrap(), "(vector,(0,2,2),(0,1,1))");
        let scattered: Vec<u32> = (0..400).map(|r| r % 2).collect();
        assert_eq!(process_mapping(&scattered), None);
    }
}
