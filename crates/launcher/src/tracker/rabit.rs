//! The rabit trackers as pure state machines: the classic one (dmlc-core, XGBoost up to 2.0,
//! [`Tracker`]) and XGBoost 2.1's ([`Ring`]). The classic one decides which
//! rank a worker is, its tree and ring neighbours, and whom it connects to and accepts from
//! as workers come up; the socket layer (`super`) reads and writes the bytes.
//!
//! The workers form a binary tree over the ranks and a ring 0 → 1 → ... → n-1 → 0, the same
//! tree and ring the reference trackers build over the same ranks ([`LinkMap`]). A worker's
//! rank is its rlaunch rank, which rlaunch gives it as `DMLC_TASK_ID`.
//!
//! ```text
//!   start(task) ──rank──► Start (rank, parent, n, tree neighbours, ring prev, next)
//!   links(good) ──► Links (peers to connect to: listening already; how many will connect)
//!   listening(port) ──► the worker waits for its peers; shutdown ──► done when all are
//! ```

use std::collections::{BTreeMap, BTreeSet};

/// The tree and ring over `n` ranks, as the reference trackers number them: a heap-shaped
/// binary tree walked depth first (the last child's walk reversed) gives the ring order, and
/// the ranks are renumbered so that the ring is 0, 1, ..., n-1.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LinkMap {
    /// Each rank's tree parent (-1 for rank 0).
    pub parent: Vec<i32>,
    /// Each rank's tree neighbours: its parent, then its children.
    pub tree: Vec<Vec<i32>>,
}

impl LinkMap {
    pub fn new(n: u32) -> LinkMap {
        let n = n as i64;
        // The heap's ids: node r's parent (r+1)/2-1, its children 2r+1 and 2r+2.
        let heap_parent = |r: i64| (r + 1) / 2 - 1;
        // The children in the order the reference trackers visit them: a Python set's,
        // which puts 2r+2 first when 2r+1 ends in binary 111 (both share 8 slots).
        let children = |r: i64| -> Vec<i64> {
            let mut cs: Vec<i64> = [2 * r + 1, 2 * r + 2].into_iter().filter(|&c| c < n).collect();
            if cs.len() == 2 && (2 * r + 1) & 7 == 7 {
                cs.swap(0, 1);
            }
            cs
        };
        // The walk (as deep as the tree: log2 n).
        let mut order = Vec::with_capacity(n as usize);
        fn walk(r: i64, children: &dyn Fn(i64) -> Vec<i64>, out: &mut Vec<i64>) {
            out.push(r);
            let cs = children(r);
            for (i, &c) in cs.iter().enumerate() {
                let mut sub = Vec::new();
                walk(c, children, &mut sub);
                if i + 1 == cs.len() {
                    sub.reverse();
                }
                out.extend(sub);
            }
        }
        if n > 0 {
            walk(0, &children, &mut order);
        }
        let mut new_id = vec![0i32; n as usize];
        for (i, &old) in order.iter().enumerate() {
            new_id[old as usize] = i as i32;
        }
        let mut parent = Vec::with_capacity(n as usize);
        let mut tree = Vec::with_capacity(n as usize);
        for &old in &order {
            let p = (old > 0).then(|| new_id[heap_parent(old) as usize]);
            parent.push(p.unwrap_or(-1));
            let mut neighbours: Vec<i32> = p.into_iter().collect();
            neighbours.extend(
                [2 * old + 1, 2 * old + 2]
                    .into_iter()
                    .filter(|&c| c < n)
                    .map(|c| new_id[c as usize]),
            );
            tree.push(neighbours);
        }
        LinkMap { parent, tree }
    }

    pub fn size(&self) -> u32 {
        self.parent.len() as u32
    }

    /// Rank `rank`'s ring neighbours, -1 where it is its own (a ring of one).
    pub fn ring(&self, rank: u32) -> (i32, i32) {
        let n = self.size();
        if n <= 1 {
            return (-1, -1);
        }
        (((rank + n - 1) % n) as i32, ((rank + 1) % n) as i32)
    }

    /// Every rank `rank` links to: tree and ring neighbours.
    fn links(&self, rank: u32) -> BTreeSet<u32> {
        let (prev, next) = self.ring(rank);
        let tree = self.tree[rank as usize].iter().copied();
        tree.chain([prev, next]).filter(|&r| r >= 0 && r as u32 != rank).map(|r| r as u32).collect()
    }
}

/// What a starting worker is told first.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Start {
    pub rank: u32,
    pub parent: i32,
    pub world: u32,
    pub tree: Vec<i32>,
    pub prev: i32,
    pub next: i32,
}

/// A worker listening for the peers that will connect to it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Listening {
    pub host: String,
    pub port: i32,
    /// Peers still to connect to it.
    pub waiting: u32,
}

/// Whom a worker connects to now, and how many connect to it later.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Links {
    /// (host, port, rank) of each peer listening already.
    pub connect: Vec<(String, i32, u32)>,
    pub accept: u32,
}

/// The tracker of one job of `n` workers.
#[derive(Debug)]
pub struct Tracker {
    map: LinkMap,
    listening: BTreeMap<u32, Listening>,
    started: BTreeSet<u32>,
    shut: BTreeSet<u32>,
}

impl Tracker {
    pub fn new(n: u32) -> Tracker {
        Tracker {
            map: LinkMap::new(n),
            listening: BTreeMap::new(),
            started: BTreeSet::new(),
            shut: BTreeSet::new(),
        }
    }

    /// The rank of a worker that says `start` (or `recover`) with `rank` (-1: none yet),
    /// `world` (-1: unknown) and `task`: its own rank if it has one, else its task id,
    /// which rlaunch sets to its rank.
    pub fn start(&mut self, rank: i32, world: i32, task: &str) -> Result<Start, String> {
        let n = self.map.size();
        if world >= 0 && world as u32 != n {
            return Err(format!("it says the job has {world} workers, not {n}"));
        }
        let rank = match rank {
            r if r >= 0 => r as u32,
            _ => task.parse::<u32>().map_err(|_| {
                format!("its task id {} is no rank (DMLC_TASK_ID)", crate::quote::cut(task))
            })?,
        };
        if rank >= n {
            return Err(format!("rank {rank} is beyond the job's {n} workers"));
        }
        self.started.insert(rank);
        let (prev, next) = self.map.ring(rank);
        Ok(Start {
            rank,
            parent: self.map.parent[rank as usize],
            world: n,
            tree: self.map.tree[rank as usize].clone(),
            prev,
            next,
        })
    }

    /// Worker `rank` has links to `good` already: the peers to connect to are those of the
    /// others listening now, and the rest will connect to it.
    pub fn links(&self, rank: u32, good: &[i32]) -> Result<Links, String> {
        let all = self.map.links(rank);
        let mut missing = all.clone();
        for &g in good {
            if g < 0 || !missing.remove(&(g as u32)) && !all.contains(&(g as u32)) {
                return Err(format!("it has a link to {g}, which is none of its neighbours"));
            }
        }
        let connect: Vec<(String, i32, u32)> = missing
            .iter()
            .filter_map(|r| self.listening.get(r).map(|l| (l.host.clone(), l.port, *r)))
            .collect();
        let accept = (missing.len() - connect.len()) as u32;
        Ok(Links { connect, accept })
    }

    /// Worker `rank`, at `host`, connected to `links.connect` and listens on `port` for the
    /// `links.accept` others.
    pub fn listening(&mut self, rank: u32, host: String, port: i32, links: &Links) {
        for (_, _, peer) in &links.connect {
            if let Some(l) = self.listening.get_mut(peer) {
                l.waiting = l.waiting.saturating_sub(1);
                if l.waiting == 0 {
                    self.listening.remove(peer);
                }
            }
        }
        self.listening.remove(&rank);
        if links.accept > 0 {
            self.listening.insert(rank, Listening { host, port, waiting: links.accept });
        }
    }

    /// Every worker has started.
    pub fn all_started(&self) -> bool {
        self.started.len() as u32 == self.map.size()
    }

    /// Worker `rank` is done; true once every worker is.
    pub fn shutdown(&mut self, rank: i32) -> Result<bool, String> {
        let n = self.map.size();
        if rank < 0 || rank as u32 >= n {
            return Err(format!("it shuts down as rank {rank}, of {n} workers"));
        }
        self.shut.insert(rank as u32);
        Ok(self.shut.len() as u32 == n)
    }
}

/// The tracker of XGBoost from 2.1 for a job of `n` workers: it only tells each worker, once
/// all have started, where its ring successor listens (the workers build the rest), and
/// counts them out.
#[derive(Debug)]
pub struct Ring {
    n: u32,
    /// Each started worker's host and listening port, by rank.
    started: BTreeMap<u32, (String, i32)>,
    shut: BTreeSet<u32>,
}

/// Where a worker's ring successor listens.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Successor {
    pub host: String,
    pub port: i32,
    pub rank: u32,
}

impl Ring {
    pub fn new(n: u32) -> Ring {
        Ring { n, started: BTreeMap::new(), shut: BTreeSet::new() }
    }

    pub fn size(&self) -> u32 {
        self.n
    }

    /// A worker with task id `task` (its rank, from `DMLC_TASK_ID`) at `host` listens on
    /// `port`: its rank.
    pub fn start(&mut self, task: &str, host: String, port: i32) -> Result<u32, String> {
        let rank = task.parse::<u32>().map_err(|_| {
            format!("its task id {} is no rank (pass dmlc_task_id)", crate::quote::cut(task))
        })?;
        if rank >= self.n {
            return Err(format!("rank {rank} is beyond the job's {} workers", self.n));
        }
        if port <= 0 {
            return Err(format!("it listens on port {port}"));
        }
        if self.started.insert(rank, (host, port)).is_some() {
            return Err(format!("rank {rank} started twice"));
        }
        Ok(rank)
    }

    pub fn all_started(&self) -> bool {
        self.started.len() as u32 == self.n
    }

    /// Once every worker has started: each one's successor, by rank.
    pub fn successors(&self) -> Option<Vec<(u32, Successor)>> {
        if !self.all_started() {
            return None;
        }
        let next = |r: u32| (r + 1) % self.n;
        let of = |r: u32| {
            let (host, port) = self.started[&next(r)].clone();
            Successor { host, port, rank: next(r) }
        };
        Some((0..self.n).map(|r| (r, of(r))).collect())
    }

    /// Worker `rank` is done; true once every worker is.
    pub fn shutdown(&mut self, rank: i32) -> Result<bool, String> {
        if rank < 0 || rank as u32 >= self.n {
            return Err(format!("it shuts down as rank {rank}, of {} workers", self.n));
        }
        self.shut.insert(rank as u32);
        Ok(self.shut.len() as u32 == self.n)
    }
}

/// Which ranks have started with the tracker, and which ended without having: once one
/// worker has started, a rank that ended before it did (with code 0: a failing end fails the
/// job anyway) leaves that worker, and every other that starts, waiting for ever.
#[derive(Debug)]
pub struct Turnout {
    n: u32,
    started: BTreeSet<u32>,
    ended_unstarted: BTreeSet<u32>,
}

impl Turnout {
    pub fn new(n: u32) -> Turnout {
        Turnout { n, started: BTreeSet::new(), ended_unstarted: BTreeSet::new() }
    }

    /// Worker `rank` started (either protocol). Returns a rank that never will, if any.
    pub fn started(&mut self, rank: u32) -> Option<u32> {
        self.started.insert(rank);
        self.stranded()
    }

    /// Rank `rank` of the job exited with code 0. Returns a rank that never will start, if
    /// any.
    pub fn ended(&mut self, rank: u32) -> Option<u32> {
        if rank < self.n && !self.started.contains(&rank) {
            self.ended_unstarted.insert(rank);
        }
        self.stranded()
    }

    /// While some workers have started and others not: how many have, and the ranks that
    /// have not (the hang report's line for the tracker's rendezvous).
    pub fn waiting(&self) -> Option<(u32, Vec<u32>)> {
        let started = self.started.len() as u32;
        let missing = (0..self.n).filter(|r| !self.started.contains(r)).collect();
        (started > 0 && started < self.n).then_some((started, missing))
    }

    /// The first rank gone before starting, while some worker waits for every one.
    fn stranded(&self) -> Option<u32> {
        let waiting = !self.started.is_empty() && (self.started.len() as u32) < self.n;
        waiting.then(|| self.ended_unstarted.first().copied()).flatten()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_rank_gone_before_starting_strands_the_workers_that_did() {
        // Ranks that never use the tracker (no worker started) strand no one.
        let mut idle = Turnout::new(3);
        assert_eq!((idle.ended(0), idle.ended(1), idle.ended(2)), (None, None, None));
        // Rank 2 ends first; rank 0 then starts and would wait for it.
        let mut late = Turnout::new(3);
        assert_eq!(late.ended(2), None);
        assert_eq!(late.started(0), Some(2));
        // Rank 0 started, rank 1 ends without: at once.
        let mut early = Turnout::new(3);
        assert_eq!(early.started(0), None);
        assert_eq!(early.ended(1), Some(1));
        // The hang report's view: who has started and who not, only while some wait.
        let mut part = Turnout::new(3);
        assert_eq!(part.waiting(), None);
        part.started(2);
        assert_eq!(part.waiting(), Some((1, vec![0, 1])));
        // Every worker started: ends are the usual ones, and beyond the job's ranks ignored.
        let mut whole = Turnout::new(2);
        assert_eq!((whole.started(0), whole.started(1)), (None, None));
        assert_eq!((whole.ended(0), whole.ended(1), whole.ended(7)), (None, None, None));
    }

    /// The new rank of each heap id in the reference trackers' ring order, and each rank's
    /// parent, for n = 1..10, 16, 17, 24, 64 (generated with Debian's XGBoost 1.7.4 tracker).
    fn reference(n: u32) -> Option<(&'static str, &'static str)> {
        Some(match n {
            1 => ("0", "-1"),
            2 => ("0,1", "-1,0"),
            3 => ("0,1,2", "-1,0,0"),
            4 => ("0,1,3,2", "-1,0,1,0"),
            5 => ("0,1,3,4,2", "-1,0,1,1,0"),
            6 => ("0,1,3,4,5,2", "-1,0,1,1,5,0"),
            7 => ("0,1,3,4,6,5,2", "-1,0,1,1,6,6,0"),
            8 => ("0,1,3,7,4,6,5,2", "-1,0,1,2,1,7,7,0"),
            9 => ("0,1,3,8,7,4,6,5,2", "-1,0,1,2,2,1,8,8,0"),
            10 => ("0,1,3,8,7,9,4,6,5,2", "-1,0,1,2,2,6,1,9,9,0"),
            16 => ("0,1,3,8,15,7,10,9,4,6,13,14,12,11,5,2", "-1,0,1,2,5,2,8,8,1,15,9,9,14,14,15,0"),
            17 => (
                "0,1,3,8,15,16,7,10,9,4,6,13,14,12,11,5,2",
                "-1,0,1,2,6,6,2,9,9,1,16,10,10,15,15,16,0",
            ),
            24 => (
                "0,1,3,8,17,18,15,16,7,10,21,22,20,19,9,4,6,13,14,12,23,11,5,2",
                "-1,0,1,2,3,3,8,8,2,15,9,9,14,14,15,1,23,16,16,22,21,22,23,0",
            ),
            64 => (
                "0,1,3,8,17,35,36,38,37,18,15,32,63,31,34,33,16,7,10,21,43,44,46,45,22,20,41,42,\
                 39,40,19,9,4,6,13,27,56,55,58,57,28,30,61,62,60,59,29,14,12,25,51,52,54,53,26,23,\
                 48,47,50,49,24,11,5,2",
                "-1,0,1,2,3,4,4,9,9,3,17,10,13,10,16,16,17,2,32,18,19,19,24,24,18,31,25,25,30,30,\
                 31,32,1,63,33,34,35,35,40,40,34,47,41,41,46,46,47,33,62,48,49,49,54,54,48,61,55,\
                 55,60,60,61,62,63,0",
            ),
            _ => return None,
        })
    }

    fn ints(text: &str) -> Vec<i32> {
        text.split(',').map(|v| v.trim().parse().unwrap()).collect()
    }

    #[test]
    fn the_link_map_is_the_reference_trackers_for_every_size_they_were_run_at() {
        for n in (1..=10).chain([16, 17, 24, 64]) {
            let (order, parent) = reference(n).unwrap();
            let map = LinkMap::new(n);
            assert_eq!(map.parent, ints(parent), "n = {n}");
            // The ring order visits the heap ids in `order`: the heap's root-to-leaf edges are
            // the tree's, renumbered.
            let order = ints(order);
            for (rank, &heap) in order.iter().enumerate() {
                let heap_parent = (heap + 1) / 2 - 1;
                let want = order.iter().position(|&h| h == heap_parent).map_or(-1, |p| p as i32);
                assert_eq!(map.parent[rank], want, "n = {n}, rank {rank}");
            }
        }
    }

    #[test]
    fn trees_and_rings_are_consistent_for_one_to_sixty_four_workers() {
        for n in 1..=64u32 {
            let map = LinkMap::new(n);
            assert_eq!(map.parent[0], -1);
            for r in 0..n {
                let p = map.parent[r as usize];
                if r > 0 {
                    assert!(map.tree[p as usize].contains(&(r as i32)), "n {n}: {p} -> {r}");
                    assert_eq!(map.tree[r as usize][0], p, "n {n}: parent first");
                }
                // Every tree link is known to both ends; at most a parent and two children.
                for &m in &map.tree[r as usize] {
                    assert!(map.tree[m as usize].contains(&(r as i32)), "n {n}: {r} ~ {m}");
                }
                assert!(map.tree[r as usize].len() <= 3);
                let (prev, next) = map.ring(r);
                if n > 1 {
                    assert_eq!(map.ring(next as u32).0, r as i32, "n {n}: ring at {r}");
                    assert_eq!(prev, ((r + n - 1) % n) as i32);
                }
            }
            let edges: usize = map.tree.iter().map(Vec::len).sum();
            assert_eq!(edges, 2 * (n as usize - 1), "n {n}: a tree");
        }
    }

    #[test]
    fn workers_connect_to_the_listening_and_accept_the_rest() {
        let mut t = Tracker::new(3);
        // Rank 1 first: nobody listens yet, its neighbours (0 by tree and ring, 2 by ring)
        // will connect to it.
        let s1 = t.start(-1, -1, "1").unwrap();
        assert_eq!((s1.rank, s1.parent, s1.world, s1.prev, s1.next), (1, 0, 3, 0, 2));
        let l1 = t.links(1, &[]).unwrap();
        assert_eq!(l1, Links { connect: vec![], accept: 2 });
        t.listening(1, "10.0.0.2".into(), 9001, &l1);
        let s0 = t.start(-1, -1, "0").unwrap();
        assert_eq!((s0.parent, s0.tree.clone()), (-1, vec![1, 2]));
        let l0 = t.links(0, &[]).unwrap();
        assert_eq!(l0, Links { connect: vec![("10.0.0.2".into(), 9001, 1)], accept: 1 });
        t.listening(0, "10.0.0.1".into(), 9000, &l0);
        let s2 = t.start(-1, -1, "2").unwrap();
        assert_eq!((s2.prev, s2.next), (1, 0));
        let l2 = t.links(2, &[]).unwrap();
        let want = vec![("10.0.0.1".into(), 9000, 0), ("10.0.0.2".into(), 9001, 1)];
        assert_eq!(l2, Links { connect: want, accept: 0 });
        t.listening(2, "10.0.0.3".into(), 9002, &l2);
        assert!(t.all_started() && t.listening.is_empty());
        // A retry after a failed connection reports the links it has.
        assert_eq!(t.links(2, &[0, 1]).unwrap(), Links { connect: vec![], accept: 0 });
        assert!(t.links(2, &[7]).is_err());
        assert_eq!(t.shutdown(0), Ok(false));
        assert_eq!(t.shutdown(1), Ok(false));
        assert_eq!(t.shutdown(2), Ok(true));
        assert!(t.shutdown(3).is_err());
    }

    #[test]
    fn the_ring_tells_each_worker_its_successor_once_all_started() {
        let mut ring = Ring::new(3);
        assert_eq!(ring.start("2", "10.0.0.3".into(), 7002), Ok(2));
        assert_eq!(ring.start("0", "10.0.0.1".into(), 7000), Ok(0));
        assert_eq!(ring.successors(), None);
        assert_eq!(ring.start("0", "10.0.0.1".into(), 7000).unwrap_err(), "rank 0 started twice");
        assert_eq!(
            ring.start("x", "h".into(), 1).unwrap_err(),
            "its task id x is no rank (pass dmlc_task_id)"
        );
        assert_eq!(ring.start("1", "h".into(), 0).unwrap_err(), "it listens on port 0");
        assert_eq!(ring.start("1", "10.0.0.2".into(), 7001), Ok(1));
        let next = ring.successors().unwrap();
        let ranks: Vec<(u32, u32, i32)> = next.iter().map(|(r, s)| (*r, s.rank, s.port)).collect();
        assert_eq!(ranks, [(0, 1, 7001), (1, 2, 7002), (2, 0, 7000)]);
        assert_eq!(ring.shutdown(1), Ok(false));
        assert_eq!(ring.shutdown(0), Ok(false));
        assert_eq!(ring.shutdown(2), Ok(true));
    }

    #[test]
    fn a_worker_not_of_the_job_is_refused() {
        let mut t = Tracker::new(2);
        assert_eq!(t.start(-1, 4, "0").unwrap_err(), "it says the job has 4 workers, not 2");
        assert_eq!(
            t.start(-1, -1, "NULL").unwrap_err(),
            "its task id NULL is no rank (DMLC_TASK_ID)"
        );
        assert_eq!(t.start(5, -1, "x").unwrap_err(), "rank 5 is beyond the job's 2 workers");
        assert_eq!(t.start(1, 2, "x").unwrap().rank, 1);
    }
}
