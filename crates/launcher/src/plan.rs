//! Where ranks go and how proxies are arranged: pure functions, no I/O.

use pmi_wire::control::NodePlan;

use crate::hosts::Host;

/// Ranks per host: hosts filled in order, each up to its slots; past the total, around
/// again. Hosts that get no rank are left out.
pub fn place_block(hosts: &[Host], n: u32) -> Vec<(String, Vec<u32>)> {
    let mut placed: Vec<Vec<u32>> = vec![Vec::new(); hosts.len()];
    let mut rank = 0;
    'outer: loop {
        for (i, h) in hosts.iter().enumerate() {
            for _ in 0..h.slots {
                if rank == n {
                    break 'outer;
                }
                placed[i].push(rank);
                rank += 1;
            }
        }
        if hosts.is_empty() {
            break;
        }
    }
    hosts
        .iter()
        .zip(placed)
        .filter(|(_, r)| !r.is_empty())
        .map(|(h, r)| (h.name.clone(), r))
        .collect()
}

/// Ranks per host, one host after the other (`--map-by node`): rank r goes to the r-th host
/// with a free slot in a round, and rounds repeat past the total.
pub fn place_round_robin(hosts: &[Host], n: u32) -> Vec<(String, Vec<u32>)> {
    let mut placed: Vec<Vec<u32>> = vec![Vec::new(); hosts.len()];
    let mut rank = 0;
    'outer: while !hosts.is_empty() {
        let mut used = vec![0u32; hosts.len()];
        let mut progressed = true;
        while progressed {
            progressed = false;
            for (i, h) in hosts.iter().enumerate() {
                if rank == n {
                    break 'outer;
                }
                if used[i] < h.slots {
                    used[i] += 1;
                    placed[i].push(rank);
                    rank += 1;
                    progressed = true;
                }
            }
        }
    }
    hosts
        .iter()
        .zip(placed)
        .filter(|(_, r)| !r.is_empty())
        .map(|(h, r)| (h.name.clone(), r))
        .collect()
}

/// The host of each rank of an MPMD job, ranks numbered across segments. `segments` are
/// (host list index, rank count); segments drawing on the same list continue where the
/// previous one stopped, as if they were one block of ranks (Hydra's numbering).
pub fn place_segments(
    lists: &[Vec<Host>],
    segments: &[(usize, u32)],
    by_node: bool,
) -> Vec<String> {
    let mut sequences: Vec<std::vec::IntoIter<String>> = lists
        .iter()
        .enumerate()
        .map(|(i, hosts)| {
            let n: u32 = segments.iter().filter(|(l, _)| *l == i).map(|(_, n)| n).sum();
            let placed = if by_node { place_round_robin(hosts, n) } else { place_block(hosts, n) };
            let mut sequence = vec![String::new(); n as usize];
            for (host, ranks) in placed {
                for r in ranks {
                    sequence[r as usize].clone_from(&host);
                }
            }
            sequence.into_iter()
        })
        .collect();
    segments
        .iter()
        .flat_map(|&(list, n)| {
            (0..n).map(|_| sequences[list].next().expect("sized to fit")).collect::<Vec<_>>()
        })
        .collect()
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hosts::parse_host_list;
    use pmi_wire::control::RankPlan;

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
    fn host_lists_parse_and_merge() {
        let hosts = parse_host_list("a,b:2,a:3").unwrap();
        assert_eq!(
            hosts,
            vec![Host { name: "a".into(), slots: 4 }, Host { name: "b".into(), slots: 2 }]
        );
        assert!(parse_host_list("a:x").unwrap_err().contains("bad slot count 'x'"));
        assert!(parse_host_list("a,,b").is_err());
    }

    #[test]
    fn block_placement_fills_then_wraps() {
        let hosts = parse_host_list("n1:2,n2:2").unwrap();
        assert_eq!(
            place_block(&hosts, 6),
            vec![("n1".into(), vec![0, 1, 4, 5]), ("n2".into(), vec![2, 3])]
        );
        assert_eq!(place_block(&hosts, 1), vec![("n1".into(), vec![0])]);
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
        assert_eq!(
            place_round_robin(&hosts, 5),
            vec![("n1".into(), vec![0, 2, 3]), ("n2".into(), vec![1, 4])]
        );
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
