//! How proxies are arranged: ranks grouped into one node per host, and the nodes into a
//! tree rooted at rlaunch, so that no process starts more than `--tree-width` proxies.
//! Pure functions.

use rlaunch_protocol::ids::NodeId;
use std::collections::HashMap;

use rlaunch_protocol::control::{NodePlan, RankPlan};

/// Ranks grouped into nodes, one per distinct host name, in order of first rank.
pub(crate) struct Nodes {
    pub(crate) nodes: Vec<NodePlan>,
    /// Host name of each node, by node index.
    pub(crate) hosts: Vec<String>,
    /// Node index of each rank.
    pub(crate) rank_node: Vec<u32>,
}

/// Groups ranks (`rank_hosts[r]`, `rank_segments[r]`) into nodes; `fork` says which hosts get
/// their proxy by fork.
pub(crate) fn group_nodes(
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
                index: NodeId(nodes.len() as u32),
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
pub(crate) fn build_tree(mut nodes: Vec<NodePlan>, width: u32) -> Vec<NodePlan> {
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

/// Depth of the deepest proxy below the launcher.
pub(crate) fn depth(roots: &[NodePlan]) -> usize {
    roots.iter().map(|n| 1 + depth(&n.children)).max().unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node_plans(n: usize) -> Vec<NodePlan> {
        (0..n)
            .map(|i| NodePlan {
                index: NodeId(i as u32),
                host: format!("n{}", i + 1),
                fork: false,
                ranks: vec![RankPlan { rank: i as u32, segment: 0 }],
                children: Vec::new(),
            })
            .collect()
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
    fn tree_of_seven_with_width_two_is_three_deep() {
        let roots = build_tree(node_plans(7), 2);
        assert_eq!(roots.len(), 2);
        assert_eq!(depth(&roots), 3);
        let mut all: Vec<u32> = roots.iter().flat_map(|r| r.walk()).map(|n| n.index.0).collect();
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
