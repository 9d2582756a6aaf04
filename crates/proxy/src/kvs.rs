//! One job's share of the key-value space on this node: the pairs made visible by completed
//! fences, the puts held for the next fence, the fence itself, and PMI-2 node attributes.
//! Pure: each call returns what to send, and to whom; the dispatcher sends it.
//!
//! ```text
//!  rank put ──────► held ──┐
//!  rank fence ────► waiting├─ FenceFold ──every rank and child in──► FenceIn up (Tree)
//!  child FenceIn ─────────►┘                         JobFenceIn to the root (Root: spawned)
//!                                                               or done here (ThisNode)
//!  FenceOut / done ──► visible += pairs, every waiting rank answered
//! ```

use std::collections::HashMap;

use crate::pmi::PmiAnswer;
use crate::ranks::Local;
use rlaunch_tree::fence::{FenceFold, Pair};

/// An answer for one local rank's PMI connection.
pub type Reply = (Local, PmiAnswer);

/// How far a job's fences reach.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FenceScope {
    /// The launched job: every node's ranks, so a fence folds up the tree to the root.
    Tree,
    /// A job spawned on this node alone: all its ranks are here, so its fences complete here.
    ThisNode,
    /// A job spawned over several nodes, none of them below another: each node's part goes
    /// straight to the root, which folds the job's nodes.
    Root,
}

/// What a rank's fence entry led to.
#[derive(Debug)]
pub enum FenceStep {
    /// Still waiting for other parties.
    Waiting,
    /// This node's part is complete: send it up (`FenceIn` for the tree, `JobFenceIn` for the
    /// root).
    GoUp { epoch: u64, pairs: Vec<Pair> },
    /// The fence is complete (a `ThisNode` job): these ranks are released.
    Done(Vec<Reply>),
}

pub struct Kvs {
    scope: FenceScope,
    /// This job's ranks on this node: each is a party of every fence.
    ranks: usize,
    /// Pairs made visible by completed fences: later gets are answered from here.
    visible: HashMap<String, String>,
    fold: FenceFold,
    /// Local ranks inside the current fence, with the tag their answer echoes.
    waiting: Vec<(Local, Option<String>)>,
    /// PMI-2 node attributes, and the ranks waiting for one to appear.
    node_attrs: HashMap<String, String>,
    attr_waiters: Vec<(Local, String, Option<String>)>,
    /// Local ranks that failed with the job going on without them (`--on-failure
    /// continue`): no fence counts them any more.
    departed: Vec<Local>,
}

impl Kvs {
    /// An empty space for a job with `ranks` ranks on this node; `preput` pairs are visible
    /// from the start (a spawned job's). The ranks are counted from the plan, not as they
    /// start: a child subtree's entry may come before this node's ranks are running (they
    /// wait for the node's PMIx server), and must not complete the fence without them.
    pub fn new(scope: FenceScope, ranks: usize, preput: impl IntoIterator<Item = Pair>) -> Kvs {
        // No process has failed yet: the key reads empty, as Hydra's does.
        let none_dead = (crate::pmi::DEAD_PROCESSES.to_string(), String::new());
        Kvs {
            scope,
            ranks,
            visible: [none_dead].into_iter().chain(preput).collect(),
            fold: FenceFold::default(),
            waiting: Vec::new(),
            node_attrs: HashMap::new(),
            attr_waiters: Vec::new(),
            departed: Vec::new(),
        }
    }

    /// A put, held until the next fence takes it along.
    pub fn put(&mut self, key: String, value: String) {
        self.fold.add([(key, value)]);
    }

    pub fn get(&self, key: &str) -> Option<String> {
        self.visible.get(key).cloned()
    }

    /// The fence in progress (counted from 0).
    pub fn epoch(&self) -> u64 {
        self.fold.epoch()
    }

    /// The fence in progress (counted from 0), and whether local rank `local` is in it.
    pub fn fence_of(&self, local: Local) -> (u64, bool) {
        (self.fold.epoch(), self.waiting.iter().any(|&(l, _)| l == local))
    }

    /// A local rank entered the fence. `children` is how many child subtrees take part.
    pub fn enter(&mut self, local: Local, tag: Option<String>, children: usize) -> FenceStep {
        self.waiting.push((local, tag));
        self.fold.arrive([]);
        self.step(children)
    }

    /// A child subtree entered the fence with the pairs put below it.
    pub fn child_entered(&mut self, pairs: Vec<Pair>, children: usize) -> FenceStep {
        self.fold.arrive(pairs);
        self.step(children)
    }

    /// Whether the fence can go on now that a party arrived.
    fn step(&mut self, children: usize) -> FenceStep {
        let children = match self.scope {
            FenceScope::Tree => children,
            FenceScope::ThisNode | FenceScope::Root => 0,
        };
        match self.fold.complete(self.ranks + children) {
            None => FenceStep::Waiting,
            Some((epoch, pairs)) => match self.scope {
                FenceScope::Tree | FenceScope::Root => FenceStep::GoUp { epoch, pairs },
                FenceScope::ThisNode => FenceStep::Done(self.complete(epoch, pairs)),
            },
        }
    }

    /// The fence `epoch` completed with `pairs` (job-wide): they become visible and every
    /// waiting rank is released.
    pub fn complete(&mut self, epoch: u64, pairs: Vec<Pair>) -> Vec<Reply> {
        if !self.fold.finish(epoch) {
            tracing::warn!(
                epoch,
                expected = self.fold.epoch() - 1,
                "fence completion for another epoch"
            );
        }
        for (k, v) in pairs {
            // MPICH never puts a key twice; if a program does, the first value stays (Hydra).
            self.visible.entry(k).or_insert(v);
        }
        std::mem::take(&mut self.waiting)
            .into_iter()
            .map(|(local, tag)| (local, PmiAnswer::Fence { tag }))
            .collect()
    }

    /// A value every rank sees from now on, set by rlaunch rather than put by a rank (it
    /// replaces the last one): `PMI_dead_processes`.
    pub fn set_visible(&mut self, key: &str, value: String) {
        self.visible.insert(key.to_string(), value);
    }

    /// Local rank `local` failed and the job goes on without it: no fence waits for it from
    /// now on, and if it was in the fence under way, it leaves it. Returns where that fence
    /// stands: it may be complete without the rank. Said twice, the same.
    pub fn depart(&mut self, local: Local, children: usize) -> FenceStep {
        if !self.departed.contains(&local) {
            self.departed.push(local);
            self.ranks = self.ranks.saturating_sub(1);
            if let Some(at) = self.waiting.iter().position(|&(l, _)| l == local) {
                self.waiting.remove(at);
                self.fold.leave();
            }
        }
        self.step(children)
    }

    /// The child subtrees to wait for are now `children` (one was lost, the job going on):
    /// where the fence under way stands.
    pub fn recount(&mut self, children: usize) -> FenceStep {
        self.step(children)
    }

    /// After a fence completed, with ranks departed: a node that has no party left to wait
    /// for (every rank here failed, no child) is in the next fence at once.
    pub fn go_on(&mut self, children: usize) -> FenceStep {
        match self.departed.is_empty() {
            true => FenceStep::Waiting,
            false => self.step(children),
        }
    }

    /// A node attribute is set: the ranks waiting for it get its value.
    pub fn put_node_attr(&mut self, key: String, value: String) -> Vec<Reply> {
        let mut replies = Vec::new();
        self.attr_waiters.retain(|(local, k, tag)| {
            if *k != key {
                return true;
            }
            let answer = PmiAnswer::GetNodeAttr { value: Some(value.clone()), tag: tag.clone() };
            replies.push((*local, answer));
            false
        });
        self.node_attrs.insert(key, value);
        replies
    }

    /// A rank asks for a node attribute: the answer now, or, with `wait`, once it is set.
    pub fn get_node_attr(
        &mut self,
        local: Local,
        key: String,
        wait: bool,
        tag: Option<String>,
    ) -> Option<PmiAnswer> {
        match self.node_attrs.get(&key) {
            Some(v) => Some(PmiAnswer::GetNodeAttr { value: Some(v.clone()), tag }),
            None if wait => {
                self.attr_waiters.push((local, key, tag));
                None
            }
            None => Some(PmiAnswer::GetNodeAttr { value: None, tag }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pair(k: &str, v: &str) -> Pair {
        (k.to_string(), v.to_string())
    }

    fn fence_tags(replies: &[Reply]) -> Vec<(Local, Option<String>)> {
        replies
            .iter()
            .map(|(local, a)| match a {
                PmiAnswer::Fence { tag } => (*local, tag.clone()),
                other => panic!("not a fence answer: {other:?}"),
            })
            .collect()
    }

    #[test]
    fn a_tree_fence_goes_up_once_ranks_and_children_are_in() {
        let mut kvs = Kvs::new(FenceScope::Tree, 2, []);
        kvs.put("a".into(), "1".into());
        assert!(matches!(kvs.enter(0, Some("t0".into()), 1), FenceStep::Waiting));
        assert!(matches!(kvs.child_entered(vec![pair("b", "2")], 1), FenceStep::Waiting));
        let FenceStep::GoUp { epoch, pairs } = kvs.enter(1, None, 1) else { panic!("not up") };
        assert_eq!((epoch, pairs), (0, vec![pair("a", "1"), pair("b", "2")]));
        assert_eq!(kvs.get("a"), None, "not visible before the fence completes");
        let released = kvs.complete(0, vec![pair("a", "1"), pair("b", "2"), pair("c", "3")]);
        assert_eq!(fence_tags(&released), [(0, Some("t0".into())), (1, None)]);
        assert_eq!(kvs.get("c").as_deref(), Some("3"));
    }

    /// Found by the chaos runner: a node whose ranks waited for its PMIx server let its
    /// children's entries complete the first fence without its own ranks' puts.
    #[test]
    fn children_entering_before_the_ranks_start_do_not_complete_the_fence() {
        let mut kvs = Kvs::new(FenceScope::Tree, 2, []);
        assert!(matches!(kvs.child_entered(vec![pair("b", "2")], 2), FenceStep::Waiting));
        assert!(matches!(kvs.child_entered(vec![pair("c", "3")], 2), FenceStep::Waiting));
        kvs.put("a0".into(), "1".into());
        assert!(matches!(kvs.enter(0, None, 2), FenceStep::Waiting));
        kvs.put("a1".into(), "1".into());
        let FenceStep::GoUp { pairs, .. } = kvs.enter(1, None, 2) else { panic!("not up") };
        assert_eq!(pairs.len(), 4, "{pairs:?}");
    }

    #[test]
    fn a_spawned_job_fences_on_this_node_alone() {
        let mut kvs = Kvs::new(FenceScope::ThisNode, 1, [pair("PARENT_ROOT_PORT_NAME", "p")]);
        assert_eq!(kvs.get("PARENT_ROOT_PORT_NAME").as_deref(), Some("p"));
        kvs.put("k".into(), "v".into());
        let FenceStep::Done(released) = kvs.enter(0, None, 5) else { panic!("not done") };
        assert_eq!(fence_tags(&released), [(0, None)]);
        assert_eq!(kvs.get("k").as_deref(), Some("v"));
    }

    #[test]
    fn a_spawned_job_over_several_nodes_goes_to_the_root_without_the_children() {
        let mut kvs = Kvs::new(FenceScope::Root, 2, [pair("PARENT_ROOT_PORT_NAME", "p")]);
        kvs.put("k0".into(), "v".into());
        assert!(matches!(kvs.enter(0, None, 3), FenceStep::Waiting));
        let FenceStep::GoUp { epoch, pairs } = kvs.enter(1, None, 3) else { panic!("not up") };
        assert_eq!((epoch, pairs), (0, vec![pair("k0", "v")]));
        let released = kvs.complete(0, vec![pair("k0", "v"), pair("k9", "w")]);
        assert_eq!(fence_tags(&released), [(0, None), (1, None)]);
        assert_eq!(kvs.get("k9").as_deref(), Some("w"));
    }

    #[test]
    fn a_departed_rank_is_no_party_even_if_it_had_entered() {
        let mut kvs = Kvs::new(FenceScope::Tree, 3, []);
        assert!(matches!(kvs.enter(0, None, 0), FenceStep::Waiting));
        // Rank 0 entered and failed: it leaves the fence; ranks 1 and 2 complete it.
        assert!(matches!(kvs.depart(0, 0), FenceStep::Waiting));
        assert!(matches!(kvs.depart(0, 0), FenceStep::Waiting), "said twice, the same");
        assert!(matches!(kvs.enter(1, None, 0), FenceStep::Waiting));
        let step = kvs.enter(2, None, 0);
        assert!(matches!(step, FenceStep::GoUp { epoch: 0, .. }), "{step:?}");
        let released = fence_tags(&kvs.complete(0, vec![]));
        assert_eq!(released, [(1, None), (2, None)]);
        // Every rank here gone, no child: in each next fence at once.
        kvs.depart(1, 0);
        assert!(matches!(kvs.depart(2, 0), FenceStep::GoUp { epoch: 1, .. }));
        kvs.complete(1, vec![]);
        assert!(matches!(kvs.go_on(0), FenceStep::GoUp { epoch: 2, .. }));
        kvs.set_visible("PMI_dead_processes", "0-2".into());
        assert_eq!(kvs.get("PMI_dead_processes").as_deref(), Some("0-2"));
    }

    #[test]
    fn the_first_value_of_a_key_put_twice_stays() {
        let mut kvs = Kvs::new(FenceScope::Tree, 1, []);
        kvs.complete(0, vec![pair("k", "first"), pair("k", "second")]);
        assert_eq!(kvs.get("k").as_deref(), Some("first"));
    }

    #[test]
    fn node_attributes_answer_at_once_or_when_set() {
        let mut kvs = Kvs::new(FenceScope::Tree, 1, []);
        let none = kvs.get_node_attr(0, "x".into(), false, None);
        assert!(matches!(none, Some(PmiAnswer::GetNodeAttr { value: None, .. })));
        assert!(kvs.get_node_attr(1, "x".into(), true, Some("t".into())).is_none());
        assert!(kvs.get_node_attr(2, "y".into(), true, None).is_none());
        let replies = kvs.put_node_attr("x".into(), "42".into());
        assert_eq!(replies.len(), 1);
        let (local, PmiAnswer::GetNodeAttr { value, tag }) = &replies[0] else { panic!() };
        assert_eq!((*local, value.as_deref(), tag.as_deref()), (1, Some("42"), Some("t")));
        let now = kvs.get_node_attr(3, "x".into(), true, None);
        assert!(matches!(now, Some(PmiAnswer::GetNodeAttr { value: Some(v), .. }) if v == "42"));
    }
}
