//! Where ranks go and how proxies are arranged: pure functions, no I/O.

use pmi_wire::control::{NodePlan, RankPlan};

/// A host and how many ranks it takes before placement wraps around.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Host {
    pub name: String,
    pub slots: u32,
}

/// Parses `a,b:2,c`. A host named twice gets the sum of its slots.
pub fn parse_host_list(list: &str) -> Result<Vec<Host>, String> {
    let mut hosts: Vec<Host> = Vec::new();
    for item in list.split(',').map(str::trim) {
        if item.is_empty() {
            return Err(format!("--hosts {list}: empty host name"));
        }
        let (name, slots) = match item.rsplit_once(':') {
            Some((name, n)) => {
                let slots = n.parse::<u32>().ok().filter(|&s| s > 0).ok_or_else(|| {
                    format!("--hosts {list}: bad slot count '{n}' for host {name}")
                })?;
                (name, slots)
            }
            None => (item, 1),
        };
        if name.is_empty() {
            return Err(format!("--hosts {list}: empty host name"));
        }
        merge(&mut hosts, name, slots);
    }
    Ok(hosts)
}

fn merge(hosts: &mut Vec<Host>, name: &str, slots: u32) {
    match hosts.iter_mut().find(|h| h.name == name) {
        Some(h) => h.slots += slots,
        None => hosts.push(Host { name: name.to_string(), slots }),
    }
}

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

/// Arranges nodes in a `width`-ary tree rooted at the launcher, in breadth-first order: the
/// launcher starts nodes 0..width, node i starts the next `width`, and so on. Width 0 is flat.
pub fn build_tree(nodes: Vec<(String, Vec<RankPlan>)>, width: u32) -> Vec<NodePlan> {
    let count = nodes.len();
    let mut plans: Vec<Option<NodePlan>> = nodes
        .into_iter()
        .enumerate()
        .map(|(i, (host, ranks))| {
            Some(NodePlan { index: i as u32, host, ranks, children: Vec::new() })
        })
        .collect();
    if width == 0 || count <= width as usize {
        return plans.into_iter().flatten().collect();
    }
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

/// Names that mean this machine.
pub fn is_local(name: &str, own: &str) -> bool {
    name == "localhost"
        || name == own
        || own.split('.').next() == Some(name)
        || name.starts_with("127.")
        || name == "::1"
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node_plans(n: usize) -> Vec<(String, Vec<RankPlan>)> {
        (0..n)
            .map(|i| (format!("n{}", i + 1), vec![RankPlan { rank: i as u32, segment: 0 }]))
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
    fn process_mapping_compresses_runs() {
        assert_eq!(process_mapping(&[0, 0, 0, 0]).unwrap(), "(vector,(0,1,4))");
        assert_eq!(process_mapping(&[0, 0, 1, 1, 2, 2]).unwrap(), "(vector,(0,3,2))");
        assert_eq!(process_mapping(&[0, 0, 0, 1, 1]).unwrap(), "(vector,(0,1,3),(1,1,2))");
        assert_eq!(process_mapping(&[0, 0, 1, 1, 0]).unwrap(), "(vector,(0,2,2),(0,1,1))");
        let scattered: Vec<u32> = (0..400).map(|r| r % 2).collect();
        assert_eq!(process_mapping(&scattered), None);
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
}
