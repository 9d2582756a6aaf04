//! Where ranks go and how proxies are arranged: pure functions, no I/O.

use std::collections::HashMap;
use std::ffi::OsString;

use pmi_wire::control::{NodePlan, RankPlan};

use crate::hosts::Host;

/// The host (an index into `hosts`) of each of `n` ranks: hosts filled in order, each up to
/// its slots; past the total, around again.
pub fn place_block(hosts: &[Host], n: u32) -> Vec<usize> {
    let slots = hosts.iter().enumerate().flat_map(|(i, h)| (0..h.slots).map(move |_| i));
    slots.cycle().take(n as usize).collect()
}

/// The host of each of `n` ranks, one host after the other (`--map-by node`): rank r goes to
/// the r-th host with a free slot in a round, and rounds repeat past the total.
pub fn place_round_robin(hosts: &[Host], n: u32) -> Vec<usize> {
    let mut placed = Vec::with_capacity(n as usize);
    let deepest = hosts.iter().map(|h| h.slots).max().unwrap_or(0);
    // One round: the hosts' first slots, then their second slots, ...
    let round: Vec<usize> = (0..deepest)
        .flat_map(|depth| hosts.iter().enumerate().filter(move |(_, h)| h.slots > depth))
        .map(|(i, _)| i)
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
pub fn place_segments<'a>(
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

/// Ranks grouped into nodes, one per distinct host name, in order of first rank.
pub struct Nodes {
    pub nodes: Vec<NodePlan>,
    /// Host name of each node, by node index.
    pub hosts: Vec<String>,
    /// Node index of each rank.
    pub rank_node: Vec<u32>,
}

/// Groups ranks (`rank_hosts[r]`, `rank_segments[r]`) into nodes; `fork` says which hosts get
/// their proxy by fork.
pub fn group_nodes(
    rank_hosts: &[&str],
    rank_segments: impl IntoIterator<Item = u32>,
    fork: impl Fn(&str) -> bool,
) -> Nodes {
    let mut index_of: HashMap<&str, usize> = HashMap::new();
    let mut nodes: Vec<NodePlan> = Vec::new();
    let mut rank_node = Vec::with_capacity(rank_hosts.len());
    for (rank, (&host, segment)) in rank_hosts.iter().zip(rank_segments).enumerate() {
        let index = *index_of.entry(host).or_insert_with(|| {
            nodes.push(NodePlan {
                index: nodes.len() as u32,
                fork: fork(host),
                host: host.to_string(),
                ranks: Vec::new(),
                children: Vec::new(),
            });
            nodes.len() - 1
        });
        nodes[index].ranks.push(RankPlan { rank: rank as u32, segment });
        rank_node.push(index as u32);
    }
    let hosts = nodes.iter().map(|n| n.host.clone()).collect();
    Nodes { nodes, hosts, rank_node }
}

/// Arranges nodes in a `width`-ary tree rooted at the launcher, in breadth-first order: the
/// launcher starts the first `width`, each of those the next `width`, and so on. Width 0 is
/// flat. Nodes started by fork come first, so that a forked proxy's parent is always on the
/// launcher's machine.
pub fn build_tree(mut nodes: Vec<NodePlan>, width: u32) -> Vec<NodePlan> {
    nodes.sort_by_key(|n| !n.fork);
    let count = nodes.len();
    if width == 0 || count <= width as usize {
        return nodes;
    }
    let mut plans: Vec<Option<NodePlan>> = nodes.into_iter().map(Some).collect();
    let k = width as usize;
    // Heap positions: 0 is the launcher, node i sits at i + 1; position p's children are
    // p*k+1 ..= p*k+k. Attach bottom-up so each node is complete before it is moved.
    for pos in (1..=count).rev() {
        let first = pos * k + 1;
        if first > count {
            continue;
        }
        let kids: Vec<NodePlan> = (first..=(pos * k + k).min(count))
            .map(|c| plans[c - 1].take().expect("each node is attached once"))
            .collect();
        plans[pos - 1].as_mut().expect("parent not yet attached").children = kids;
    }
    (1..=k.min(count)).map(|p| plans[p - 1].take().expect("root child")).collect()
}

/// `PMI_process_mapping` for a placement (`rank_node[r]` = node id of rank r): one
/// `(s,n,p)` triple per stretch of consecutive nodes each holding `p` consecutive ranks.
/// `None` if the value would not fit what an MPICH client can receive.
pub fn process_mapping(rank_node: &[u32]) -> Option<String> {
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

/// Depth of the deepest proxy below the launcher.
pub fn depth(roots: &[NodePlan]) -> usize {
    roots.iter().map(|n| 1 + depth(&n.children)).max().unwrap_or(0)
}

/// The `rlaunch-proxy` installed next to this `rlaunch`.
pub fn proxy_exe() -> Result<OsString, String> {
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hosts::parse_host_list;

    fn node_plans(n: usize) -> Vec<NodePlan> {
        (0..n)
            .map(|i| NodePlan {
                index: i as u32,
                host: format!("n{}", i + 1),
                fork: false,
                ranks: vec![RankPlan { rank: i as u32, segment: 0 }],
                children: Vec::new(),
            })
            .collect()
    }

    #[test]
    fn block_placement_fills_then_wraps() {
        let hosts = parse_host_list("n1:2,n2:2").unwrap();
        assert_eq!(place_block(&hosts, 6), [0, 0, 1, 1, 0, 0]);
        assert_eq!(place_block(&hosts, 1), [0]);
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
    fn ranks_group_into_one_node_per_host_in_order_of_first_rank() {
        let grouped = group_nodes(&["b", "a", "b", "c"], [0, 0, 1, 1], |h| h == "a");
        assert_eq!(grouped.hosts, ["b", "a", "c"]);
        assert_eq!(grouped.rank_node, [0, 1, 0, 2]);
        let b = &grouped.nodes[0];
        assert_eq!(b.ranks, [RankPlan { rank: 0, segment: 0 }, RankPlan { rank: 2, segment: 1 }]);
        assert!(grouped.nodes[1].fork && !b.fork);
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

    #[test]
    fn round_robin_placement_deals_one_rank_per_host() {
        let hosts = parse_host_list("n1:2,n2:1").unwrap();
        assert_eq!(place_round_robin(&hosts, 5), [0, 1, 0, 0, 1]);
    }

    #[test]
    fn tree_of_seven_with_width_two_is_three_deep() {
        let roots = build_tree(node_plans(7), 2);
        assert_eq!(roots.len(), 2);
        assert_eq!(depth(&roots), 3);
        let mut all: Vec<u32> = roots.iter().flat_map(|r| r.walk()).map(|n| n.index).collect();
        all.sort();
        assert_eq!(all, (0..7).collect::<Vec<_>>());
        assert_eq!(depth(&build_tree(node_plans(7), 0)), 1);
        assert_eq!(depth(&build_tree(node_plans(1000), 32)), 2);
    }

    #[test]
    fn forked_nodes_hang_only_below_forked_nodes() {
        let mut nodes = node_plans(9);
        for i in [4, 7, 8] {
            nodes[i].fork = true;
        }
        let roots = build_tree(nodes, 2);
        fn check(n: &NodePlan, parent_forked: bool) {
            assert!(!n.fork || parent_forked, "forked node {} under a remote one", n.index);
            n.children.iter().for_each(|c| check(c, n.fork));
        }
        roots.iter().for_each(|r| check(r, true));
    }
}
