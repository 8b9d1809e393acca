//! Topology across hosts: which ranks share a host, and NCCL's double binary tree between hosts.
//!
//! Pure code, so it is tested in memory at sizes no test machine has (1,024 hosts × 8 GPUs).
//!
//! The Tree algorithm (all-reduce across hosts) runs two binary trees over the hosts at once, each
//! carrying half the data. In one tree a host is interior (it receives from two children and sends
//! up), in the other it is mostly a leaf, so the two halves load every host's links about equally;
//! the depth is ⌈log2(hosts + 1)⌉, the latency advantage over a ring's 2 × (hosts − 1) steps.
//! Inside a host the ranks form a chain; the first rank of the chain joins the trees.

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

/// The tree a rank takes part in: inside its host a chain (rank order), whose head joins the tree
/// between hosts. Parent and children are ranks.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RankTree {
    pub up: Option<usize>,
    pub down: Vec<usize>,
}

/// Rank `rank`'s place in one of the two trees (`which` 0 or 1), given the ranks of each host
/// ([`group_by_host`]).
pub fn rank_tree(hosts: &[Vec<usize>], tree: &[TreeNode], rank: usize) -> RankTree {
    let h = hosts.iter().position(|v| v.contains(&rank)).expect("rank is on some host");
    let chain = &hosts[h];
    let i = chain.iter().position(|&r| r == rank).expect("rank is on its host");
    let mut down = Vec::new();
    if let Some(&next) = chain.get(i + 1) {
        down.push(next);
    }
    let up = if i > 0 {
        Some(chain[i - 1])
    } else {
        down.extend(tree[h].children.iter().flatten().map(|&c| hosts[c][0]));
        tree[h].parent.map(|p| hosts[p][0])
    };
    RankTree { up, down }
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

    #[test]
    fn rank_trees_at_1024_hosts_of_8_gpus() {
        let (nh, g) = (1024, 8);
        let host_of: Vec<u64> = (0..nh * g).map(|r| (r / g) as u64 * 0x9e37).collect();
        let hosts = group_by_host(&host_of);
        assert_eq!(hosts.len(), nh);
        for tree in double_binary_tree(nh) {
            let all: Vec<RankTree> = (0..nh * g).map(|r| rank_tree(&hosts, &tree, r)).collect();
            // Up and down agree: r lists d as a child exactly when d names r as its parent.
            let mut children = 0;
            for (r, t) in all.iter().enumerate() {
                for &d in &t.down {
                    assert_eq!(all[d].up, Some(r));
                    children += 1;
                }
                assert!(t.down.len() <= 3, "a chain link and two tree children at most");
            }
            assert_eq!(children, nh * g - 1, "one spanning tree over every rank");
            // Inside a host, a chain in rank order; only chain heads link hosts.
            assert_eq!(all[8 * 5 + 3].up, Some(8 * 5 + 2));
            assert!(all.iter().enumerate().all(|(r, t)| r % g == 0 || t.up == Some(r - 1)));
        }
    }
}
