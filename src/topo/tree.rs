//! Topology across hosts: which ranks share a host, and NCCL's double binary tree between hosts.
//!
//! Pure code, so it is tested in memory at sizes no test machine has (1,024 hosts × 8 GPUs).
//!
//! The Tree algorithm (all-reduce across hosts) runs two binary trees over the hosts at once, each
//! carrying half the data. In one tree a host is interior (it receives from two children and sends
//! up), in the other it is mostly a leaf, so the two halves load every host's links about equally;
//! the depth is ⌈log2(hosts + 1)⌉, the latency advantage over a ring's 2 × (hosts − 1) steps.
//! Inside a host the ranks form a chain; the first rank of the chain joins the trees.

use crate::abi::{fnTree, FN_TREE_ARITY};

/// Ranks grouped by host, in the order the hosts first appear among the ranks, each host's ranks
/// in rank order. `host_of[r]` is any per-host key (the host hash).
pub fn group_by_host<K: PartialEq + Copy>(host_of: &[K]) -> Vec<Vec<usize>> {
    let mut hosts: Vec<(K, Vec<usize>)> = Vec::new();
    for (r, &k) in host_of.iter().enumerate() {
        match hosts.iter_mut().find(|(h, _)| *h == k) {
            Some((_, v)) => v.push(r),
            None => hosts.push((k, vec![r])),
        }
    }
    hosts.into_iter().map(|(_, v)| v).collect()
}

/// One node of a binary tree over `n` positions: its parent and up to two children.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TreeNode {
    pub parent: Option<usize>,
    pub children: [Option<usize>; 2],
}

/// A balanced binary tree over positions 0..n (in-order: each subtree covers a contiguous range,
/// rooted at its middle), as a node per position.
fn balanced(n: usize) -> Vec<TreeNode> {
    let mut nodes = vec![TreeNode { parent: None, children: [None, None] }; n];
    // (range start, range end, parent): an explicit stack, no recursion depth to worry about.
    let mut todo = vec![(0usize, n, None::<usize>)];
    while let Some((lo, hi, parent)) = todo.pop() {
        if lo >= hi {
            continue;
        }
        let mid = lo + (hi - lo) / 2;
        nodes[mid].parent = parent;
        if let Some(p) = parent {
            let slot = usize::from(mid > p);
            nodes[p].children[slot] = Some(mid);
        }
        todo.push((lo, mid, Some(mid)));
        todo.push((mid + 1, hi, Some(mid)));
    }
    nodes
}

/// NCCL's double binary tree over `n` hosts: the first is [`balanced`]; the second is the same
/// shape over the hosts shifted by one (position i holds host i + 1 mod n), which turns the first
/// tree's leaves (every other host) into interior nodes. Entry `h` of each is host h's node, in
/// host numbers.
pub fn double_binary_tree(n: usize) -> [Vec<TreeNode>; 2] {
    let first = balanced(n);
    let host_at = |pos: usize| (pos + 1) % n;
    let mut second = vec![TreeNode { parent: None, children: [None, None] }; n];
    for (pos, node) in first.iter().enumerate() {
        second[host_at(pos)] =
            TreeNode { parent: node.parent.map(host_at), children: node.children.map(|c| c.map(host_at)) };
    }
    [first, second]
}

/// The tree a rank takes part in: inside its host a chain (ring order), whose head joins the tree
/// between hosts. Parent and children are ranks.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RankTree {
    pub up: Option<usize>,
    pub down: Vec<usize>,
}

/// What the tuner needs to know of a communicator's trees.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TreeShape {
    pub nhosts: usize,
    /// Hops from the root down to the deepest rank, in the deeper of the two trees.
    pub depth: usize,
    /// Most children of one rank in either tree: the busiest rank passes each byte this many
    /// times per phase.
    pub max_children: usize,
}

impl TreeShape {
    /// The trees of `nranks` ranks on one host: both are the host's chain.
    pub const fn chain(nranks: usize) -> TreeShape {
        TreeShape { nhosts: 1, depth: nranks.saturating_sub(1), max_children: if nranks > 1 { 1 } else { 0 } }
    }
}

/// A communicator's two trees: every rank's place in each, found in constant time.
pub struct Trees {
    /// Each host's ranks in ring order: its chain, whose first rank joins the trees between hosts.
    hosts: Vec<Vec<usize>>,
    /// By rank: its host and its position in that host's chain.
    place: Vec<(usize, usize)>,
    between: [Vec<TreeNode>; 2],
}

impl Trees {
    /// The trees over ranks in ring order `order`, rank r living on host `host_of[r]`. The ring
    /// visits each host's ranks one after the other (`topo::ring_order`), so every chain link joins
    /// ring neighbours, which are connected on every ring channel.
    pub fn new<K: PartialEq + Copy>(order: &[usize], host_of: &[K]) -> Trees {
        let keys: Vec<K> = order.iter().map(|&r| host_of[r]).collect();
        let hosts: Vec<Vec<usize>> =
            group_by_host(&keys).into_iter().map(|ix| ix.into_iter().map(|i| order[i]).collect()).collect();
        let mut place = vec![(0, 0); host_of.len()];
        for (h, chain) in hosts.iter().enumerate() {
            for (i, &r) in chain.iter().enumerate() {
                place[r] = (h, i);
            }
        }
        let between = double_binary_tree(hosts.len());
        Trees { hosts, place, between }
    }

    /// Rank `rank`'s place in tree `which` (0 or 1).
    pub fn rank_tree(&self, which: usize, rank: usize) -> RankTree {
        let (h, i) = self.place[rank];
        let chain = &self.hosts[h];
        let node = &self.between[which][h];
        let mut down: Vec<usize> = chain.get(i + 1).copied().into_iter().collect();
        let up = if i > 0 {
            Some(chain[i - 1])
        } else {
            down.extend(node.children.iter().flatten().map(|&c| self.hosts[c][0]));
            node.parent.map(|p| self.hosts[p][0])
        };
        RankTree { up, down }
    }

    /// What channel `channel` runs on rank `rank`, for the kernels: tree `channel % 2`, so any
    /// number of channels splits the data evenly between the two trees.
    pub fn dev_tree(&self, channel: usize, rank: usize) -> fnTree {
        let t = self.rank_tree(channel % 2, rank);
        let mut down = [-1; FN_TREE_ARITY as usize];
        for (slot, &d) in down.iter_mut().zip(&t.down) {
            *slot = d as i32;
        }
        fnTree { up: t.up.map_or(-1, |u| u as i32), down }
    }

    /// The trees' edges between hosts, each `(a, b)` with a < b: one host's first rank and its
    /// parent host's, in either tree. The other edges are chain links between ring neighbours.
    pub fn host_edges(&self) -> Vec<(usize, usize)> {
        let mut edges: Vec<(usize, usize)> = self
            .between
            .iter()
            .flat_map(|tree| {
                tree.iter().enumerate().filter_map(|(h, node)| {
                    let (a, b) = (self.hosts[h][0], self.hosts[node.parent?][0]);
                    Some((a.min(b), a.max(b)))
                })
            })
            .collect();
        edges.sort_unstable();
        edges.dedup();
        edges
    }

    /// Each rank's host, as an index into the hosts in ring order, and its position in that
    /// host's chain.
    pub fn host_places(&self) -> Vec<(u32, u32)> {
        self.place.iter().map(|&(h, i)| (h as u32, i as u32)).collect()
    }

    pub fn shape(&self) -> TreeShape {
        let mut depth = 0;
        let mut max_children = 0;
        for tree in &self.between {
            for (h, chain) in self.hosts.iter().enumerate() {
                let (mut hops, mut at) = (0, h);
                while let Some(p) = tree[at].parent {
                    (hops, at) = (hops + 1, p);
                }
                depth = depth.max(hops + chain.len() - 1);
                let head = usize::from(chain.len() > 1) + tree[h].children.iter().flatten().count();
                max_children = max_children.max(head).max(usize::from(chain.len() > 2));
            }
        }
        TreeShape { nhosts: self.hosts.len(), depth, max_children }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Checks that `tree` is one spanning tree over n nodes and returns its depth.
    fn check_tree(tree: &[TreeNode]) -> usize {
        let n = tree.len();
        let roots: Vec<usize> = (0..n).filter(|&i| tree[i].parent.is_none()).collect();
        assert_eq!(roots.len(), 1, "one root");
        for (i, node) in tree.iter().enumerate() {
            for c in node.children.iter().flatten() {
                assert_eq!(tree[*c].parent, Some(i), "child {c} of {i} points back");
            }
            if let Some(p) = node.parent {
                assert!(tree[p].children.contains(&Some(i)), "{i} is a child of its parent {p}");
            }
        }
        // Every node reaches the root, and the depth is logarithmic.
        let mut depth = 0;
        for i in 0..n {
            let (mut d, mut at) = (0, i);
            while let Some(p) = tree[at].parent {
                at = p;
                d += 1;
                assert!(d <= n, "a cycle");
            }
            assert_eq!(at, roots[0]);
            depth = depth.max(d);
        }
        depth
    }

    #[test]
    fn trees_span_every_host_with_log_depth() {
        for n in (1..=70).chain([127, 128, 129, 1000, 1024]) {
            let [a, b] = double_binary_tree(n);
            let bound = (usize::BITS - n.leading_zeros()) as usize; // ⌈log2(n + 1)⌉
            assert!(check_tree(&a) < bound.max(1), "n={n}");
            assert!(check_tree(&b) < bound.max(1), "n={n}");
            if n >= 3 {
                // Few hosts are leaves in both trees, so both halves of the data keep every host busy.
                let leaf = |t: &Vec<TreeNode>, h: usize| t[h].children == [None, None];
                let both = (0..n).filter(|&h| leaf(&a, h) && leaf(&b, h)).count();
                assert!(both <= n / 4 + 1, "n={n}: {both} hosts are leaves in both trees");
            }
        }
    }

    #[test]
    fn hosts_keep_first_appearance_order() {
        assert_eq!(group_by_host(&[7, 3, 7, 3, 9]), vec![vec![0, 2], vec![1, 3], vec![4]]);
        assert!(group_by_host::<u64>(&[]).is_empty());
    }

    /// Every rank's trees: up and down agree, one spanning tree over every rank, and the shape
    /// matches what the ranks' trees say.
    fn check_rank_trees(trees: &Trees, n: usize) -> Vec<[RankTree; 2]> {
        let all: Vec<[RankTree; 2]> = (0..n).map(|r| [trees.rank_tree(0, r), trees.rank_tree(1, r)]).collect();
        let shape = trees.shape();
        for which in 0..2 {
            let mut children = 0;
            for (r, t) in all.iter().enumerate() {
                for &d in &t[which].down {
                    assert_eq!(all[d][which].up, Some(r), "{d} names {r} as its parent");
                    children += 1;
                }
                assert!(t[which].down.len() <= FN_TREE_ARITY as usize);
                assert!(t[which].down.len() <= shape.max_children);
                // The depth bounds every rank's path to the root.
                let (mut hops, mut at) = (0, r);
                while let Some(p) = all[at][which].up {
                    (hops, at) = (hops + 1, p);
                    assert!(hops <= shape.depth, "rank {r} is deeper than {}", shape.depth);
                }
            }
            assert_eq!(children, n - 1, "one spanning tree over every rank");
        }
        all
    }

    #[test]
    fn rank_trees_at_1024_hosts_of_8_gpus() {
        let (nh, g) = (1024, 8);
        let host_of: Vec<u64> = (0..nh * g).map(|r| (r / g) as u64 * 0x9e37).collect();
        let order: Vec<usize> = (0..nh * g).collect();
        let trees = Trees::new(&order, &host_of);
        let all = check_rank_trees(&trees, nh * g);
        // Inside a host, a chain in ring order; only chain heads link hosts.
        for which in 0..2 {
            assert_eq!(all[8 * 5 + 3][which].up, Some(8 * 5 + 2));
            assert!(all.iter().enumerate().all(|(r, t)| r % g == 0 || t[which].up == Some(r - 1)));
        }
        let shape = trees.shape();
        assert_eq!(shape.nhosts, nh);
        // ⌈log2(1025)⌉ - 1 = 10 hops between hosts at most, then 7 down a chain.
        assert!(shape.depth < 10 + g, "{shape:?}");
        assert_eq!(shape.max_children, 3, "a chain link and two hosts below");
        // Each host's head is interior (two hosts below it) in at most one of the two trees.
        for h in 0..nh {
            let both = (0..2).filter(|&w| all[h * g][w].down.len() == 3).count();
            assert!(both <= 1, "host {h} is interior in both trees");
        }
    }

    #[test]
    fn one_host_is_a_chain_in_ring_order() {
        // Ring order 2, 0, 3, 1 on one host: both trees are that chain, rooted at rank 2.
        let order = [2, 0, 3, 1];
        let trees = Trees::new(&order, &[7u64; 4]);
        let all = check_rank_trees(&trees, 4);
        for t in [&all[2], &all[0], &all[1]] {
            assert_eq!(t[0], t[1], "one host: both trees are the chain");
        }
        assert_eq!(all[2][0], RankTree { up: None, down: vec![0] });
        assert_eq!(all[0][0], RankTree { up: Some(2), down: vec![3] });
        assert_eq!(all[1][0], RankTree { up: Some(3), down: vec![] });
        assert_eq!(trees.shape(), TreeShape::chain(4));
        assert_eq!(Trees::new(&[0], &[1u64]).shape(), TreeShape::chain(1));
        // Device form: channel c runs tree c % 2, unused children are -1.
        let t = trees.dev_tree(3, 2);
        assert_eq!((t.up, t.down), (-1, [0, -1, -1]));
    }

    #[test]
    fn hosts_follow_the_ring_order() {
        // Ranks 0..6 on hosts A B A B C C, ring order grouping hosts: A: 0 2, B: 1 3, C: 4 5.
        let host_of = [10u64, 11, 10, 11, 12, 12];
        let order = [0, 2, 1, 3, 4, 5];
        let trees = Trees::new(&order, &host_of);
        let all = check_rank_trees(&trees, 6);
        let shape = trees.shape();
        assert_eq!(shape.nhosts, 3);
        // Inside a host, the second rank hangs below the first.
        for (rank, head) in [(2, 0), (3, 1), (5, 4)] {
            assert!(all[rank].iter().all(|t| t.up == Some(head)), "rank {rank} hangs below {head}");
        }
        // Three hosts: tree 0 rooted at host B (the middle), tree 1 at host C.
        assert_eq!(all[1][0].up, None);
        assert_eq!(all[4][1].up, None);
        assert_eq!(shape.depth, 2);
        for (r, trees_of_r) in all.iter().enumerate() {
            for (which, t) in trees_of_r.iter().enumerate() {
                let dt = trees.dev_tree(which, r);
                assert_eq!(dt.up, t.up.map_or(-1, |u| u as i32));
                let used: Vec<usize> = dt.down.iter().filter(|&&d| d >= 0).map(|&d| d as usize).collect();
                assert_eq!(used, t.down);
                assert!(dt.down.iter().skip(used.len()).all(|&d| d == -1));
            }
        }
    }

    /// The schedule of kernels/collectives.cuh's allReduceTree, run on FIFOs of FN_NSTEPS slots for
    /// trees with several children per rank (the GPU checks on one host only see chains): every
    /// rank finishes (no deadlock), every connection's sends and receives match, and every rank
    /// ends with each chunk reduced over every rank's input exactly once. Values are bit sets of
    /// the ranks whose input they contain, so counting an input twice shows as an overlap.
    fn simulate_tree_all_reduce(trees: &Trees, n: usize, which: usize, chunks: usize) {
        use std::collections::{HashMap, VecDeque};
        #[derive(Clone, Copy)]
        enum Acc {
            Input,
            Partial,
        }
        // One step: receive from a peer (reduced with `Acc`, or kept as the result), send to a peer.
        type Step = (usize, Option<usize>, Option<usize>, Option<Acc>);
        let all: Vec<RankTree> = (0..n).map(|r| trees.rank_tree(which, r)).collect();
        let mut steps: Vec<VecDeque<Step>> = vec![VecDeque::new(); n];
        for (r, t) in all.iter().enumerate() {
            let q = &mut steps[r];
            for c in 0..chunks {
                if t.down.is_empty() {
                    q.push_back((c, None, t.up, Some(Acc::Input)));
                }
                for (j, &d) in t.down.iter().enumerate() {
                    let acc = if j == 0 { Acc::Input } else { Acc::Partial };
                    let to = if j + 1 == t.down.len() { t.up } else { None };
                    q.push_back((c, Some(d), to, Some(acc)));
                }
            }
            for c in 0..chunks {
                let mut rest = &t.down[..];
                if let Some(u) = t.up {
                    q.push_back((c, Some(u), t.down.first().copied(), None));
                    rest = t.down.get(1..).unwrap_or(&[]);
                }
                for &d in rest {
                    q.push_back((c, None, Some(d), None));
                }
            }
        }
        let nsteps = crate::abi::FN_NSTEPS as usize;
        let mut fifo: HashMap<(usize, usize), VecDeque<(usize, u128)>> = HashMap::new();
        let mut buf = vec![vec![0u128; chunks]; n];
        let mut done = 0;
        while done < n {
            let mut progressed = false;
            done = 0;
            for r in 0..n {
                let Some(&(c, from, to, acc)) = steps[r].front() else {
                    done += 1;
                    continue;
                };
                let ready = from.is_none_or(|f| fifo.get(&(f, r)).is_some_and(|q| !q.is_empty()))
                    && to.is_none_or(|t| fifo.get(&(r, t)).is_none_or(|q| q.len() < nsteps));
                if !ready {
                    continue;
                }
                steps[r].pop_front();
                progressed = true;
                let got = from.map(|f| fifo.get_mut(&(f, r)).unwrap().pop_front().unwrap());
                if let Some((gc, _)) = got {
                    assert_eq!(gc, c, "rank {r} received chunk {gc} in place of {c}");
                }
                let value = match (got, acc) {
                    (Some((_, v)), Some(a)) => {
                        let mine = match a {
                            Acc::Input => 1u128 << r,
                            Acc::Partial => buf[r][c],
                        };
                        assert_eq!(v & mine, 0, "rank {r} chunk {c}: an input counted twice");
                        v | mine
                    }
                    (Some((_, v)), None) => v,
                    (None, Some(_)) => 1u128 << r,
                    (None, None) => buf[r][c],
                };
                buf[r][c] = value;
                if let Some(t) = to {
                    fifo.entry((r, t)).or_default().push_back((c, value));
                }
            }
            assert!(progressed || done == n, "deadlock: {} ranks left", n - done);
        }
        assert!(fifo.values().all(VecDeque::is_empty), "a step sent and never received");
        let full = if n == 128 { u128::MAX } else { (1u128 << n) - 1 };
        assert!(buf.iter().all(|b| b.iter().all(|&v| v == full)), "every rank holds every input, once");
    }

    #[test]
    fn tree_schedule_completes_with_several_children() {
        for (hosts, per_host) in [(1, 6), (2, 2), (4, 1), (5, 3), (7, 2), (16, 8), (100, 1)] {
            let n = hosts * per_host;
            let host_of: Vec<usize> = (0..n).map(|r| r % hosts).collect();
            let order = {
                let mut o: Vec<usize> = (0..n).collect();
                o.sort_by_key(|&r| (host_of[r], std::cmp::Reverse(r)));
                o
            };
            let trees = Trees::new(&order, &host_of);
            for which in 0..2 {
                simulate_tree_all_reduce(&trees, n, which, 3 * crate::abi::FN_NSTEPS as usize);
            }
        }
    }
}
