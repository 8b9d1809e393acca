use super::*;
use crate::topo::tree::TreeShape;

fn shape(nranks: usize, nchannels: usize, all_pairs_channels: usize) -> CommShape {
    CommShape::one_host(nranks, nchannels, all_pairs_channels)
}
const TWO: CommShape = CommShape::one_host(2, 64, 64);
/// 128 hosts of 8 ranks, 16 channels, 4 of them connecting every pair.
const CLUSTER: CommShape = CommShape {
    rank: 0,
    nranks: 1024,
    nchannels: 16,
    min_channels: 0,
    all_pairs_channels: 4,
    slot_bytes: 512 << 10,
    tree: TreeShape { nhosts: 128, depth: 7 + 7, max_children: 3 },
    hosts: None,
    link: Link::P2p,
    net: None,
    tuner: None,
};

/// The symmetric kernels run all-reduce, all-gather and reduce-scatter only when forced, on
/// few channels for small sizes; the tuner leaves symmetric buffers to the ordinary kernels.
#[test]
fn symmetric_kernels_follow_size_and_settings() {
    let (k, a) = (CollKind::AllReduce, Allowed::ALL);
    assert_eq!(symmetric(k, 2, 4, &TWO, &a), None);
    assert_eq!(symmetric(CollKind::AllGather, 2, 4, &TWO, &a), None);
    let always = Allowed { symmetric: Symmetric::Always, ..a };
    assert_eq!(symmetric(k, 2, 4, &TWO, &always), Some(1));
    assert_eq!(symmetric(k, (1 << 20) / 4, 4, &TWO, &always), Some(16));
    // All-gather and reduce-scatter count the gathered or scattered total.
    assert_eq!(symmetric(CollKind::AllGather, 64 << 10, 1, &TWO, &always), Some(2));
    assert_eq!(symmetric(CollKind::ReduceScatter, 64 << 10, 1, &TWO, &always), Some(2));
    assert_eq!(symmetric(CollKind::Reduce, 2, 4, &TWO, &always), None);
    assert_eq!(symmetric(CollKind::Broadcast, 2, 4, &TWO, &always), None);
    assert_eq!(symmetric(k, 2, 4, &shape(1, 64, 64), &always), None);
    // Never one channel more than the communicator has.
    assert_eq!(symmetric(k, 1 << 20, 1, &shape(2, 4, 4), &always), Some(4));
    assert_eq!(symmetric(k, 1 << 30, 4, &TWO, &always), Some(16));
    let never = Allowed { symmetric: Symmetric::Never, ..a };
    assert_eq!(symmetric(k, 2, 4, &TWO, &never), None);
    // The stricter setting wins; forcing wins over the tuner.
    assert_eq!(always.intersect(&never).symmetric, Symmetric::Never);
    assert_eq!(a.intersect(&always).symmetric, Symmetric::Always);
    assert_eq!(Allowed::for_connections(4, true, false).intersect(&a).symmetric, Symmetric::Tuned);
    // FERRONICKEL_SYMMETRIC's values; inclusion lists of NCCL_ALGO / NCCL_PROTO turn it off.
    assert_eq!(Symmetric::from_setting(0), Symmetric::Never);
    assert_eq!(Symmetric::from_setting(1), Symmetric::Always);
    assert_eq!(Symmetric::from_setting(-1), Symmetric::Tuned);
    assert_eq!(parse_restrictions(Some("Ring"), None).unwrap().symmetric, Symmetric::Never);
    assert_eq!(parse_restrictions(None, Some("LL")).unwrap().symmetric, Symmetric::Never);
    assert_eq!(parse_restrictions(Some("^Tree"), Some("^LL")).unwrap().symmetric, Symmetric::Tuned);
}

#[test]
fn nccl_syntax() {
    assert_eq!(allowed("LL,simple", &PROTOS, "NCCL_PROTO").unwrap(), ["LL", "Simple"]);
    assert_eq!(allowed("^LL", &PROTOS, "NCCL_PROTO").unwrap(), ["LL128", "Simple"]);
    assert_eq!(allowed(" ring ", &ALGOS, "NCCL_ALGO").unwrap(), ["Ring"]);
    assert!(allowed("Ring,Bogus", &ALGOS, "NCCL_ALGO").unwrap_err().to_string().contains("\"Bogus\""));
}

#[test]
fn restrictions_follow_the_settings() {
    assert_eq!(parse_restrictions(None, None).unwrap(), Allowed::ALL);
    let a = parse_restrictions(Some("Ring"), Some("LL128")).unwrap();
    let ring_only = Allowed {
        ring: [true; 5],
        tree: false,
        oneshot: false,
        direct: [false; 5],
        copy_engine: false,
        symmetric: Symmetric::Never,
        ..Allowed::ALL
    };
    assert_eq!(a, Allowed { protos: [false, true, false], algo_env: Some("Ring"), ..ring_only });
    let a = parse_restrictions(Some("^Tree"), Some("^LL")).unwrap();
    let want = Allowed { protos: [false, true, true], tree: false, algo_env: Some("^Tree"), ..Allowed::ALL };
    assert_eq!(a, want);
    assert!(!parse_restrictions(None, Some("Simple")).unwrap().copy_engine);
    // Tree alone: all-reduce runs it, the other collectives have nothing left and fail when called.
    let a = parse_restrictions(Some("tree"), None).unwrap();
    assert_eq!((a.ring, a.tree, a.oneshot, a.copy_engine), ([false; 5], true, false, false));
    assert!(a.check(CollKind::AllReduce, 4).is_ok());
    let e = a.check(CollKind::AllGather, 4).unwrap_err();
    assert!(matches!(e, Error::InvalidUsage(_)));
    assert!(e.to_string().contains("no algorithm available for AllGather: NCCL_ALGO=tree"), "{e}");
    assert!(a.check(CollKind::AllGather, 1).is_ok(), "one rank runs no algorithm");
    let e = parse_restrictions(Some("^Ring,Tree"), None).unwrap().check(CollKind::AllReduce, 2).unwrap_err();
    assert!(e.to_string().contains("(Ring and Tree)"), "{e}");
    let e = parse_restrictions(None, Some("^LL,LL128,Simple")).unwrap_err();
    assert!(e.to_string().contains("allows nothing"), "{e}");
    assert!(parse_restrictions(None, Some("LL256")).is_err());
    assert!(parse_restrictions(Some("Ring,Bogus"), None).is_err());
}

#[test]
fn per_collective_algorithms() {
    // NCCL's form: all-reduce on the tree, every other collective unrestricted.
    let a = parse_restrictions(Some("allreduce:tree"), None).unwrap();
    assert_eq!((a.ring, a.tree, a.oneshot, a.copy_engine), ([false, true, true, true, true], true, false, false));
    for kind in KINDS {
        assert!(a.check(kind, 8).is_ok());
    }
    // Entries separated by ';', later ones override, a bare list applies to every collective.
    let a = parse_restrictions(Some("ring ; AllReduce:^Ring ; SendRecv:Ring"), None).unwrap();
    assert_eq!((a.ring, a.tree, a.oneshot, a.copy_engine), ([false, true, true, true, true], true, true, false));
    let a = parse_restrictions(Some("AllGather:^Ring"), None).unwrap();
    assert!(a.check(CollKind::AllGather, 2).is_err() && a.check(CollKind::AllReduce, 2).is_ok());
    assert!(a.copy_engine && a.oneshot);
    let e = parse_restrictions(Some("allgathr:ring"), None).unwrap_err();
    assert!(e.to_string().contains("unknown collective \"allgathr\""), "{e}");
    assert!(parse_restrictions(Some("allreduce:tree,pat2"), None).is_err());
}

#[test]
fn tree_across_hosts_ring_on_one() {
    let algo = |shape: &CommShape, count: usize, allowed: &Allowed| {
        let c = choose(CollKind::AllReduce, count, 4, shape, allowed);
        (c.algo, c.nchannels)
    };
    let ring_tree = parse_restrictions(Some("Ring,Tree"), None).unwrap();
    let tree = parse_restrictions(Some("Tree"), None).unwrap();
    // One host: the trees are a chain, never better than the ring, so only forcing runs them,
    // on every ring channel.
    let eight = shape(8, 8, 4);
    for count in [1, 1 << 10, 1 << 20, 1 << 28] {
        assert_eq!(algo(&eight, count, &ring_tree).0, FN_ALGO_RING);
        assert_eq!(algo(&eight, count, &tree), (FN_ALGO_TREE, 8));
        assert_ne!(choose(CollKind::AllReduce, count, 4, &eight, &Allowed::ALL).algo, FN_ALGO_TREE);
    }
    // 128 hosts: the ring's 2046 hops lose to the tree's 28 for small and medium sizes; the
    // tree runs on the channels that connect every pair. Large sizes go back to the ring,
    // whose bytes through each rank are fewer.
    assert_eq!(algo(&CLUSTER, 1 << 10, &Allowed::ALL), (FN_ALGO_TREE, 4));
    assert_eq!(algo(&CLUSTER, 1 << 20, &ring_tree), (FN_ALGO_TREE, 4));
    assert_eq!(algo(&CLUSTER, 1 << 30, &ring_tree).0, FN_ALGO_RING);
    // Other collectives never run the tree.
    assert_eq!(choose(CollKind::AllGather, 1 << 10, 4, &CLUSTER, &Allowed::ALL).algo, FN_ALGO_RING);
    // Forced protocols hold for the tree too.
    for proto in [FN_PROTO_LL, FN_PROTO_LL128, FN_PROTO_SIMPLE] {
        let mut only = tree;
        only.protos = [false; 3];
        only.protos[proto as usize] = true;
        let c = choose(CollKind::AllReduce, 1 << 20, 4, &CLUSTER, &only);
        assert_eq!((c.algo, c.proto), (FN_ALGO_TREE, proto));
    }
    assert_eq!(algo_name(FN_ALGO_TREE), "Tree");
}

#[test]
fn forced_protocols_are_obeyed() {
    for proto in [FN_PROTO_LL, FN_PROTO_LL128, FN_PROTO_SIMPLE] {
        for oneshot in [false, true] {
            let mut only = Allowed { protos: [false; 3], oneshot, copy_engine: false, ..Allowed::ALL };
            only.protos[proto as usize] = true;
            for kind in [CollKind::AllReduce, CollKind::AllGather, CollKind::Broadcast] {
                for count in [1, 1000, 1 << 20, 1 << 28] {
                    let c = choose(kind, count, 4, &TWO, &only);
                    // Between GPUs of one host, a channel for each 2 KiB up to every channel.
                    let channels = (coll_bytes(kind, count, 4, 2) / 2048).clamp(1, 64);
                    assert_eq!((c.proto, c.nchannels), (proto, channels), "{kind:?} of {count}");
                    assert!(c.algo == FN_ALGO_RING || oneshot && kind == CollKind::AllReduce);
                }
            }
        }
    }
}

#[test]
fn protocol_follows_size() {
    let pick = |count| {
        let c = choose(CollKind::AllReduce, count, 4, &TWO, &Allowed::ALL);
        (c.algo, c.proto)
    };
    // Measured best on 2x H200: one-shot LL to 64 KB, one-shot LL128 to 1 MB, one-shot Simple
    // to 8 MB, the Simple ring from 16 MB.
    assert_eq!(pick(2), (FN_ALGO_ONESHOT, FN_PROTO_LL));
    assert_eq!(pick(16 << 10), (FN_ALGO_ONESHOT, FN_PROTO_LL));
    assert_eq!(pick(128 << 10), (FN_ALGO_ONESHOT, FN_PROTO_LL128));
    assert_eq!(pick(1 << 20), (FN_ALGO_ONESHOT, FN_PROTO_SIMPLE));
    assert_eq!(pick(4 << 20), (FN_ALGO_RING, FN_PROTO_SIMPLE));
    assert_eq!(pick(1 << 28), (FN_ALGO_RING, FN_PROTO_SIMPLE));
    let ag = |count| choose(CollKind::AllGather, count, 4, &TWO, &Allowed::ALL).proto;
    assert_eq!((ag(2), ag(1 << 28)), (FN_PROTO_LL, FN_PROTO_SIMPLE));
    // With more ranks, a part bigger than one LL slot cannot go one-shot.
    let four = shape(4, 16, 16);
    assert_eq!(choose(CollKind::AllReduce, 2, 4, &four, &Allowed::ALL).algo, FN_ALGO_ONESHOT);
    let ring_only = choose(CollKind::AllReduce, 16 * LL_SLOT_BYTES / 4 + 64, 4, &four, &Allowed::ALL);
    assert_eq!(ring_only.algo, FN_ALGO_RING);
    // Without channels joining every pair, no one-shot either.
    let sparse = shape(4, 16, 0);
    assert_eq!(choose(CollKind::AllReduce, 2, 4, &sparse, &Allowed::ALL).algo, FN_ALGO_RING);
    // One rank: the local copy.
    let one = shape(1, 64, 0);
    assert_eq!(choose(CollKind::AllReduce, 2, 4, &one, &Allowed::ALL).proto, FN_PROTO_SIMPLE);
}

/// Over host memory (NET, SHM) LL up to a few KB, Simple above, and once Simple, Simple at every
/// larger size.
fn ll_then_simple(kind: CollKind, shape: &CommShape, allowed: &Allowed) -> usize {
    let mut switch = None;
    for count in (0..28).map(|b| 1usize << b) {
        let c = choose(kind, count, 1, shape, allowed);
        match (c.proto, switch) {
            (FN_PROTO_LL, None) => {}
            (FN_PROTO_SIMPLE, None) => switch = Some(count),
            (FN_PROTO_SIMPLE, Some(_)) => {}
            _ => panic!("{kind:?} of {count} B: {c:?} after Simple from {switch:?}"),
        }
    }
    switch.expect("Simple for large messages")
}

#[test]
fn net_communicators_use_ll_for_small_messages_and_few_channels() {
    let net = |n| CommShape { link: Link::Net, ..shape(n, 8, 4) };
    let shm4 = Allowed::for_connections(4, true, false);
    for (n, allowed) in [(2, Allowed::for_connections(2, true, false)), (4, shm4)] {
        let small = choose(CollKind::AllReduce, 2, 4, &net(n), &allowed);
        assert_eq!((small.proto, small.nchannels), (FN_PROTO_LL, 1), "n={n}");
        // LL up to a few KB (measured: up to 4-8 KB with two ranks, 8-16 KB with four).
        for kind in [CollKind::AllGather, CollKind::Broadcast, CollKind::AllReduce] {
            let switch = ll_then_simple(kind, &net(n), &allowed);
            assert!((2 << 10..=32 << 10).contains(&switch), "n={n} {kind:?}: Simple from {switch} B");
        }
        let large = choose(CollKind::AllReduce, 64 << 20, 4, &net(n), &allowed);
        assert_eq!(large.proto, FN_PROTO_SIMPLE, "n={n}");
        assert!(large.nchannels >= 4, "n={n}: {large:?}");
        // Channels only grow with size.
        let mut last = 0;
        for count in (0..28).map(|b| 1usize << b) {
            let c = choose(CollKind::AllReduce, count, 1, &net(n), &allowed);
            assert!(c.nchannels >= last && c.nchannels <= 8, "n={n} count={count}: {c:?}");
            last = c.nchannels;
        }
    }
    // NCCL_PROTO=LL is still obeyed over NET.
    let ll = parse_restrictions(None, Some("LL")).unwrap();
    assert_eq!(choose(CollKind::AllGather, 1 << 20, 1, &net(4), &ll).proto, FN_PROTO_LL);
    // Over P2P the cost model has no per-channel cost: a channel for each 2 KiB, up to every one.
    assert_eq!(choose(CollKind::AllReduce, 2, 4, &shape(4, 8, 4), &shm4).nchannels, 1);
    assert_eq!(choose(CollKind::AllReduce, 8 << 10, 4, &shape(4, 8, 4), &shm4).nchannels, 8);
}

/// A broadcast or reduce along a chain over NET forwards a step only once it has all of it: where
/// one channel would carry the part as a single step, more channels (smaller steps) are picked; the
/// rings whose hops overlap, two ranks (one hop) and sizes whose parts span several steps keep
/// the channels the model picks without it.
#[test]
fn a_chains_store_and_forward_spreads_mid_size_broadcasts_over_channels() {
    let two_by_two =
        CommShape { link: Link::Net, tree: TreeShape { nhosts: 2, depth: 2, max_children: 2 }, ..shape(4, 4, 4) };
    // The ring listed: a broadcast or reduce this size would otherwise run direct (one hop).
    let listed = parse_restrictions(Some("ring"), None).unwrap();
    let allowed = Allowed::for_connections(4, true, false).intersect(&listed);
    let behind = |kind, count| {
        let (hops, wire) = ring_shape(kind, 4.0, count as f64);
        price(
            &two_by_two,
            FN_PROTO_SIMPLE,
            hops,
            wire,
            1.0,
            chain_behind(kind, FN_PROTO_SIMPLE, hops, &two_by_two),
            1,
            4,
        )
    };
    let without = |kind, count| {
        let (hops, wire) = ring_shape(kind, 4.0, count as f64);
        price(&two_by_two, FN_PROTO_SIMPLE, hops, wire, 1.0, 0.0, 1, 4)
    };
    for kind in [CollKind::Broadcast, CollKind::Reduce] {
        let c = choose(kind, 128 << 10, 1, &two_by_two, &allowed);
        assert_eq!((c.algo, c.proto), (FN_ALGO_RING, FN_PROTO_SIMPLE), "{kind:?}");
        assert_eq!(without(kind, 128 << 10).1, 1, "{kind:?}: the model alone keeps one channel");
        assert!(c.nchannels >= 2, "{kind:?} of 128 KiB: {c:?}");
        // The time compared across protocols is the model's at the channels picked.
        assert_eq!(behind(kind, 128 << 10).0, {
            let (hops, wire) = ring_shape(kind, 4.0, (128 << 10) as f64);
            price(&two_by_two, FN_PROTO_SIMPLE, hops, wire, 1.0, 0.0, c.nchannels, c.nchannels).0
        });
        // Parts of several slots pipeline: the same channels as without.
        assert_eq!(behind(kind, 64 << 20).1, without(kind, 64 << 20).1, "{kind:?}");
    }
    for kind in [CollKind::AllGather, CollKind::ReduceScatter, CollKind::AllReduce] {
        assert_eq!(chain_behind(kind, FN_PROTO_SIMPLE, 3.0, &two_by_two), 0.0, "{kind:?}");
    }
    let two_hosts = CommShape { link: Link::Net, ..shape(2, 4, 4) };
    assert_eq!(chain_behind(CollKind::Broadcast, FN_PROTO_SIMPLE, 1.0, &two_hosts), 0.0);
    assert_eq!(chain_behind(CollKind::Broadcast, FN_PROTO_LL, 3.0, &two_by_two), 0.0);
    assert_eq!(chain_behind(CollKind::Broadcast, FN_PROTO_SIMPLE, 3.0, &shape(4, 4, 4)), 0.0, "P2P");
}

#[test]
fn a_net_plugins_properties_price_net_and_size_its_channels() {
    let fast = NetLink::new(100_000, 5.0, 65536);
    let slow = NetLink::new(10_000, 0.0, 1024);
    // The built-in Socket net, its measured constants: 8.2 GB/s in all at 2.3 a channel.
    assert_eq!(net_channels(None, 64, 8, 0), 4);
    assert_eq!(net_channels(None, 3, 8, 0), 3);
    assert_eq!(net_hop_and_gbps(None), (36.0, 8.2));
    // A plugin's NIC gets NCCL's two channels whatever its speed; the speed prices the link.
    assert_eq!(net_channels(Some(&fast), 64, 8, 0), 2);
    assert_eq!(net_channels(Some(&slow), 64, 8, 0), 2);
    assert_eq!(net_channels(Some(&NetLink::new(400_000, 0.0, 65536)), 64, 8, 0), 2);
    assert_eq!(net_hop_and_gbps(Some(&fast)), (41.0, 12.5));
    assert_eq!(net_hop_and_gbps(Some(&slow)), (36.0, 1.25));
    // Bounded by maxComms and the budget.
    assert_eq!(net_channels(Some(&NetLink::new(10_000, 0.0, 1)), 64, 8, 0), 1);
    assert_eq!(net_channels(Some(&fast), 1, 8, 0), 1);
    // NCCL_MIN_NCHANNELS (or minCTAs) raises them within the budget and maxComms, as NCCL copies
    // its rings up to it.
    assert_eq!(net_channels(Some(&slow), 64, 8, 4), 4);
    assert_eq!(net_channels(None, 64, 8, 6), 6);
    assert_eq!(net_channels(None, 64, 8, 1), 4);
    assert_eq!(net_channels(Some(&slow), 3, 8, 4), 3);
    assert_eq!(net_channels(Some(&NetLink::new(10_000, 0.0, 2)), 64, 8, 4), 2);
    assert_eq!(net_channels(None, 64, 8, 16), 8);
    // Untrusted reports are bounded: no speed is NCCL's 10 Gbps, no connections is one.
    assert_eq!(NetLink::new(-1, f32::NAN, -5), NetLink { speed_mbps: 10_000, latency_us: 0.0, max_comms: 1 });
    assert_eq!(fast.weakest(slow), NetLink { speed_mbps: 10_000, latency_us: 5.0, max_comms: 1024 });

    let allowed = Allowed::for_connections(2, true, false);
    let on = |net: Option<NetLink>, nch| CommShape { link: Link::Net, net, ..shape(2, nch, nch) };
    let large = |net, nch| choose(CollKind::AllReduce, 64 << 20, 4, &on(net, nch), &allowed);
    let us = |net, nch, count| coll_us(CollKind::AllReduce, count, 4, &on(net, nch), &allowed);
    // Large messages: the fast link is used on more channels than Socket's 4 and costs less;
    // the slow one stays on one channel and costs more.
    assert_eq!(large(None, 8).nchannels, 4);
    assert_eq!(large(Some(fast), 6).nchannels, 6);
    assert_eq!(large(Some(slow), 2).nchannels, 1);
    assert!(us(Some(fast), 6, 16 << 20) < us(None, 8, 16 << 20));
    assert!(us(Some(slow), 1, 16 << 20) > us(None, 8, 16 << 20));
    // Small messages pay the plugin's latency on top of the proxies'.
    assert!((us(Some(fast), 6, 2) - us(None, 8, 2) - 5.0).abs() < 1e-9);
}

/// Through a plugin a broadcast or reduce between two ranks of 1 MiB and more, or of more than one
/// message's step and at most two, runs on two channels where two are connected, though the slow
/// link prices one as enough; with more ranks, and the all-reduce, the all-gather and the
/// reduce-scatter, one.
#[test]
fn through_a_plugin_one_way_pairs_take_two_channels() {
    let slow = NetLink::new(10_000, 0.0, 1024);
    for (nranks, nch, two) in [(2, 2, 2), (2, 1, 1), (4, 2, 1)] {
        let allowed = Allowed::for_connections(nranks, true, false);
        let on = CommShape { link: Link::Net, net: Some(slow), ..shape(nranks, nch, nch) };
        let pick = |kind, bytes: usize| choose(kind, bytes / 4, 4, &on, &allowed);
        for kind in [CollKind::Broadcast, CollKind::Reduce] {
            assert_eq!(pick(kind, 1 << 20).nchannels, two, "{kind:?} of 1 MiB, {nranks} ranks, {nch} connected");
            assert_eq!(pick(kind, 64 << 20).nchannels, two, "{kind:?} of 64 MiB");
            assert_eq!(pick(kind, (1 << 20) - 64).nchannels, 1, "{kind:?} under 1 MiB");
            if nranks > 2 {
                continue; // a longer chain's model weighs channels against the hops behind the first
            }
            // Each channel's step crosses as one message where one channel's would take two.
            assert_eq!(pick(kind, 128 << 10).nchannels, two, "{kind:?} of 128 KiB, {nch} connected");
            assert_eq!(pick(kind, (64 << 10) + 64).nchannels, two, "{kind:?} just over 64 KiB");
            assert_eq!(pick(kind, 64 << 10).nchannels, 1, "{kind:?} of 64 KiB, one message");
            assert_eq!(pick(kind, (128 << 10) + 64).nchannels, 1, "{kind:?} over 128 KiB");
            let c = pick(kind, 128 << 10);
            assert_eq!((c.algo, c.proto), (FN_ALGO_RING, FN_PROTO_SIMPLE), "{kind:?} of 128 KiB");
        }
        for kind in [CollKind::AllReduce, CollKind::AllGather, CollKind::ReduceScatter] {
            assert_eq!(pick(kind, 64 << 20).nchannels, 1, "{kind:?}");
        }
    }
}

/// Channels the user asks for (NCCL_MIN_NCHANNELS, minCTAs) carry ring and tree collectives over
/// host memory as in NCCL: all of them once each carries NCCL's per-channel threshold (Simple
/// 32 KiB), fewer below, one for the smallest; without a request the cost model's count stands
/// (one channel through a plugin reporting 10 Gbps).
#[test]
fn asked_channels_carry_collectives_but_small_ones() {
    let slow = NetLink::new(10_000, 0.0, 1024);
    let allowed = Allowed::for_connections(4, true, false);
    let on = |min_channels| CommShape {
        link: Link::Net,
        net: Some(slow),
        min_channels,
        tree: TreeShape { nhosts: 4, depth: 2, max_children: 2 },
        ..shape(4, 4, 4)
    };
    for kind in [CollKind::AllReduce, CollKind::AllGather, CollKind::ReduceScatter] {
        let pick = |min, bytes: usize| choose(kind, bytes / 4, 4, &on(min), &allowed);
        assert_eq!(pick(0, 64 << 20).nchannels, 1, "{kind:?}: the model's count");
        assert_eq!(pick(4, 64 << 20).nchannels, 4, "{kind:?}: as asked");
        assert_eq!(pick(4, 16 << 20).nchannels, 4, "{kind:?}: as asked");
        assert_eq!(pick(2, 64 << 20).nchannels, 2, "{kind:?}: as asked");
    }
    // NCCL's threshold: a Simple ring channel per 32 KiB, an LL ring channel per 4 KiB a rank.
    let shape4 = on(4);
    assert_eq!(asked_channels(&shape4, FN_ALGO_RING, FN_PROTO_SIMPLE, (3 * (32 << 10)) as f64), 3);
    assert_eq!(asked_channels(&shape4, FN_ALGO_RING, FN_PROTO_SIMPLE, (64 << 20) as f64), 4);
    assert_eq!(asked_channels(&shape4, FN_ALGO_RING, FN_PROTO_SIMPLE, 100.0), 1);
    assert_eq!(asked_channels(&shape4, FN_ALGO_RING, FN_PROTO_LL, (32 << 10) as f64), 2);
    assert_eq!(asked_channels(&shape4, FN_ALGO_TREE, FN_PROTO_LL, (32 << 10) as f64), 4);
    assert_eq!(asked_channels(&on(0), FN_ALGO_RING, FN_PROTO_SIMPLE, (64 << 20) as f64), 1);
    // Over P2P every channel runs anyway.
    let p2p = CommShape { min_channels: 2, ..shape(4, 8, 4) };
    assert_eq!(choose(CollKind::AllReduce, 16 << 20, 4, &p2p, &Allowed::ALL).nchannels, 8);
}

/// Through a plugin LL runs where it wins, whatever speed the plugin reports: its steps move at the
/// proxies' pace (NET_COST's), bounded by the link only where the link carries less of its lines.
/// Measured through the test plugin (10 Gbps) on one H200, two hosts, each protocol forced:
/// LL beat Simple by 2-4 us up to 8 KB in broadcast, reduce, all-gather and reduce-scatter, and
/// was level at 16 KB (docs/NET.md, "What a net plugin's properties change").
#[test]
fn through_a_plugin_ll_runs_up_to_some_kb() {
    let allowed = Allowed::for_connections(2, true, false);
    for link in [NetLink::new(10_000, 0.0, 1024), NetLink::new(100_000, 5.0, 65536)] {
        let on = CommShape { link: Link::Net, net: Some(link), ..shape(2, 2, 2) };
        for kind in [CollKind::Broadcast, CollKind::Reduce, CollKind::AllGather, CollKind::ReduceScatter] {
            let switch = ll_then_simple(kind, &on, &allowed);
            assert!((8 << 10..=32 << 10).contains(&switch), "{link:?} {kind:?}: Simple from {switch} B");
        }
    }
}

#[test]
fn shm_communicators_use_ll_for_small_messages_and_few_channels() {
    let shm = |n| CommShape { link: Link::Shm, ..shape(n, 32, 4) };
    for n in [2, 4] {
        let allowed = Allowed::for_connections(n, true, false);
        // LL on one channel for small messages; Simple, on the channels that carry the bytes
        // faster, from some KB (measured: 16-32 KB).
        let small = choose(CollKind::AllReduce, 2, 4, &shm(n), &allowed);
        assert_eq!((small.proto, small.nchannels), (FN_PROTO_LL, 1), "n={n}");
        let large = choose(CollKind::AllReduce, 64 << 20, 4, &shm(n), &allowed);
        assert_eq!(large.proto, FN_PROTO_SIMPLE, "n={n}");
        assert!((3..=32).contains(&large.nchannels), "n={n}: {large:?}");
        for kind in [CollKind::AllGather, CollKind::Broadcast, CollKind::AllReduce] {
            let switch = ll_then_simple(kind, &shm(n), &allowed);
            assert!((4 << 10..=128 << 10).contains(&switch), "n={n} {kind:?}: Simple from {switch} B");
        }
    }
    // Forcing a protocol still runs it, on the channels that suit it.
    let ll = parse_restrictions(None, Some("LL")).unwrap();
    let c = choose(CollKind::AllReduce, 2, 4, &shm(4), &ll.intersect(&Allowed::for_connections(4, true, false)));
    assert_eq!((c.proto, c.nchannels), (FN_PROTO_LL, 1));
    // A NET pair anywhere makes NET the link that prices the communicator.
    assert_eq!(Link::slowest(true, true), Link::Net);
    assert_eq!(Link::slowest(false, true), Link::Shm);
    assert_eq!(Link::slowest(false, false), Link::P2p);
}

#[test]
fn host_memory_fifos_limit_the_choice() {
    let four = shape(4, 16, 16);
    let shm4 = Allowed::for_connections(4, true, false);
    assert_eq!(shm4, Allowed { oneshot: false, copy_engine: false, ..Allowed::ALL });
    assert_eq!(Allowed::for_connections(4, false, true), Allowed::ALL);
    // Two ranks keep the one-shot (it runs over the ring primitives, which publish tails).
    let shm2 = Allowed::for_connections(2, true, false);
    assert!(shm2.oneshot && !shm2.copy_engine);
    assert_eq!(choose(CollKind::AllReduce, 2, 4, &TWO, &shm2).algo, FN_ALGO_ONESHOT);
    // With more ranks: the ring, at every size, whatever NCCL_PROTO allows.
    for proto in [None, Some("LL"), Some("^Simple")] {
        let user = parse_restrictions(None, proto).unwrap();
        let both = user.intersect(&shm4);
        assert_eq!(both.protos, user.protos);
        assert!(!both.oneshot && !both.copy_engine);
        for count in [1, 64, 4096, 1 << 20, 1 << 28] {
            let c = choose(CollKind::AllReduce, count, 4, &four, &both);
            assert_eq!(c.algo, FN_ALGO_RING, "count={count} proto={proto:?}");
            assert!(both.protos[c.proto as usize]);
        }
    }
    // The intersection keeps only what both allow.
    let user = parse_restrictions(Some("Ring"), Some("LL128")).unwrap();
    assert_eq!(user.intersect(&Allowed::ALL), user);
    assert_eq!(Allowed::ALL.intersect(&shm4), shm4);
}

#[test]
fn part_bytes_matches_the_kernels_partition() {
    assert_eq!(part_bytes(1, 4, 64), 16);
    assert_eq!(part_bytes(4096 * 64, 4, 64), 16384);
    assert_eq!(part_bytes(4096 * 64 + 1, 4, 64), 16400);
    assert_eq!(part_bytes(7, 8, 2), 32);
}

/// `n` hosts of one rank each over NET, seen from rank 0.
fn one_rank_hosts(n: usize) -> CommShape {
    CommShape { link: Link::Net, tree: TreeShape { nhosts: n, depth: 2, max_children: 2 }, ..shape(n, 4, 4) }
}

/// Four ranks over NET as two hosts of two ranks each, seen from rank 0.
fn two_hosts_of_two() -> CommShape {
    CommShape { tree: TreeShape { nhosts: 2, depth: 2, max_children: 1 }, ..one_rank_hosts(4) }
}

/// `runs` (whether an algorithm NCCL has no name for runs) holds across four hosts of one rank each
/// over NET, across two hosts of two ranks, and with NCCL_ALGO excluding others; not over SHM, not
/// on one host whose ranks talk over NET, not where NCCL_ALGO lists the algorithms to use.
fn only_across_net_hosts_and_unlisted(runs: impl Fn(&CommShape, &Allowed) -> bool) {
    let hosts = one_rank_hosts(4);
    assert!(runs(&hosts, &Allowed::ALL));
    assert!(runs(&two_hosts_of_two(), &Allowed::ALL));
    assert!(!runs(&CommShape { link: Link::Shm, ..hosts.clone() }, &Allowed::ALL));
    let one_host = CommShape { tree: TreeShape::chain(4), ..hosts.clone() };
    assert!(!runs(&one_host, &Allowed::ALL));
    assert!(!runs(&hosts, &parse_restrictions(Some("ring,tree"), None).unwrap()));
    assert!(runs(&hosts, &parse_restrictions(Some("^tree"), None).unwrap()));
}

/// A broadcast or reduce runs direct only across hosts over NET, from three ranks on, up to the
/// root's byte budget, and not where NCCL_ALGO lists the algorithms to use; both then pick the
/// direct algorithm on one channel, in the protocol the root's bytes move fastest in.
#[test]
fn direct_only_across_hosts_and_small_enough() {
    let all = &Allowed::ALL;
    assert!(direct(CollKind::Broadcast, 8, &one_rank_hosts(4), all));
    assert!(direct(CollKind::Broadcast, 1 << 20, &one_rank_hosts(4), all));
    assert!(!direct(CollKind::Broadcast, 2 << 20, &one_rank_hosts(4), all), "the root would send 6 MiB");
    assert!(direct(CollKind::Broadcast, DIRECT_ROOT_BYTES / 7, &one_rank_hosts(8), all));
    assert!(!direct(CollKind::Broadcast, 8, &one_rank_hosts(2), all), "two ranks: one hop either way");
    assert!(!direct(CollKind::Broadcast, 8, &one_rank_hosts(9), all));
    assert!(!direct(CollKind::Broadcast, 0, &one_rank_hosts(4), all));
    only_across_net_hosts_and_unlisted(|shape, allowed| direct(CollKind::Reduce, 8, shape, allowed));
    let listed = parse_restrictions(Some("ring"), None).unwrap();
    assert!(!direct(CollKind::Broadcast, 8, &one_rank_hosts(4), &all.intersect(&listed)));
    assert!(direct(CollKind::Reduce, 256 << 10, &one_rank_hosts(4), all));
    assert!(!direct(CollKind::Reduce, 512 << 10, &one_rank_hosts(4), all), "the root would take in 1.5 MiB");
    assert!(!direct(CollKind::AllReduce, 8, &one_rank_hosts(4), all));
    let c = choose(CollKind::Reduce, 2, 4, &one_rank_hosts(4), all);
    assert_eq!((c.algo, c.nchannels), (FN_ALGO_DIRECT, 1));
    // A small broadcast in LL (one collective work), a larger one in Simple (the root's sends).
    let c = choose(CollKind::Broadcast, 8, 1, &one_rank_hosts(4), all);
    assert_eq!((c.algo, c.proto, c.nchannels), (FN_ALGO_DIRECT, FN_PROTO_LL, 1));
    assert_eq!(choose(CollKind::Broadcast, 64 << 10, 1, &one_rank_hosts(4), all).proto, FN_PROTO_SIMPLE);
    let ll128 = parse_restrictions(None, Some("LL128")).unwrap();
    let c = choose(CollKind::Broadcast, 8, 1, &one_rank_hosts(4), &all.intersect(&ll128));
    assert_eq!((c.algo, c.proto), (FN_ALGO_DIRECT, FN_PROTO_LL128), "every protocol runs direct");
    assert_ne!(choose(CollKind::Reduce, 2, 4, &one_rank_hosts(4), &listed).algo, FN_ALGO_DIRECT);
    let bcast_listed = parse_restrictions(Some("broadcast:ring"), None).unwrap();
    assert!(!direct(CollKind::Broadcast, 8, &one_rank_hosts(4), &bcast_listed));
    assert!(direct(CollKind::Reduce, 8, &one_rank_hosts(4), &bcast_listed), "only broadcast was listed");
}

/// Recursive doubling runs all-reduces, all-gathers and reduce-scatters across a power of two of
/// hosts of one rank each, from four, up to its byte caps (a reduce-scatter's input also the scratch),
/// on one channel; not where NCCL_ALGO lists the algorithms to use.
#[test]
fn recursive_doubling_across_a_power_of_two_of_hosts() {
    let all = &Allowed::ALL;
    for n in [4, 8, 16] {
        assert!(recursive_doubling(CollKind::AllReduce, 8, &one_rank_hosts(n), all), "{n} hosts");
        assert!(recursive_doubling(CollKind::AllGather, 8 * n, &one_rank_hosts(n), all), "{n} hosts");
    }
    for n in [2, 3, 6] {
        assert!(!recursive_doubling(CollKind::AllReduce, 8, &one_rank_hosts(n), all), "{n} hosts");
    }
    assert!(recursive_doubling(CollKind::AllReduce, RECDBL_MAX_ALLREDUCE, &one_rank_hosts(4), all));
    assert!(!recursive_doubling(CollKind::AllReduce, RECDBL_MAX_ALLREDUCE + 1, &one_rank_hosts(4), all));
    assert!(recursive_doubling(CollKind::AllGather, RECDBL_MAX_ALLGATHER, &one_rank_hosts(4), all));
    assert!(!recursive_doubling(CollKind::AllGather, RECDBL_MAX_ALLGATHER + 4, &one_rank_hosts(4), all));
    assert!(recursive_doubling(CollKind::ReduceScatter, 8 * 4, &one_rank_hosts(4), all));
    let rs_cap = |n: usize| RECDBL_MAX_REDUCESCATTER_PER_RANK * n;
    assert!(recursive_doubling(CollKind::ReduceScatter, rs_cap(8), &one_rank_hosts(8), all));
    assert!(!recursive_doubling(CollKind::ReduceScatter, rs_cap(8) + 8, &one_rank_hosts(8), all));
    // However many hosts, no more than the scratch holds.
    assert!(recursive_doubling(CollKind::ReduceScatter, FN_RECDBL_SCRATCH as usize, &one_rank_hosts(1 << 10), all));
    assert!(!recursive_doubling(
        CollKind::ReduceScatter,
        FN_RECDBL_SCRATCH as usize + 1024,
        &one_rank_hosts(1 << 10),
        all
    ));
    for kind in [CollKind::Broadcast, CollKind::Reduce] {
        assert!(!recursive_doubling(kind, 8, &one_rank_hosts(4), all), "{kind:?}");
    }
    assert!(!recursive_doubling(CollKind::AllReduce, 0, &one_rank_hosts(4), all));
    only_across_net_hosts_and_unlisted(|shape, allowed| recursive_doubling(CollKind::AllReduce, 8, shape, allowed));
    let listed = parse_restrictions(Some("ring,tree"), None).unwrap();
    // The tuner picks it on one channel, LL for a few bytes; the ring when NCCL_ALGO lists it.
    for kind in [CollKind::AllReduce, CollKind::AllGather, CollKind::ReduceScatter] {
        let c = choose(kind, 2, 4, &one_rank_hosts(8), all);
        assert_eq!((c.algo, c.proto, c.nchannels), (FN_ALGO_RECDBL, FN_PROTO_LL, 1), "{kind:?}");
        assert_ne!(choose(kind, 2, 4, &one_rank_hosts(8), &listed).algo, FN_ALGO_RECDBL, "{kind:?}");
        let simple = parse_restrictions(None, Some("Simple")).unwrap();
        assert_eq!(choose(kind, 2, 4, &one_rank_hosts(8), &simple).proto, FN_PROTO_SIMPLE, "{kind:?}");
    }
    assert_ne!(choose(CollKind::AllReduce, 1 << 20, 4, &one_rank_hosts(4), all).algo, FN_ALGO_RECDBL);
}

/// Two hosts of two ranks: the small all-reduce, all-gather, reduce-scatter and reduce take one
/// hop over NET (recursive doubling, or the root's own connections) where the ring takes two, and
/// the large ones keep the ring.
#[test]
fn two_hosts_of_two_ranks_run_small_collectives_in_one_hop_over_net() {
    let (all, mixed) = (&Allowed::ALL, &two_hosts_of_two());
    for kind in [CollKind::AllReduce, CollKind::AllGather, CollKind::ReduceScatter] {
        let c = choose(kind, 2, 4, mixed, all);
        assert_eq!((c.algo, c.proto, c.nchannels), (FN_ALGO_RECDBL, FN_PROTO_LL, 1), "{kind:?}");
        assert_eq!(choose(kind, 16 << 20, 4, mixed, all).algo, FN_ALGO_RING, "{kind:?}");
    }
    // The all-reduce's and all-gather's caps are lower where hosts hold several ranks.
    for kind in [CollKind::AllReduce, CollKind::AllGather] {
        assert!(recursive_doubling(kind, RECDBL_MAX_SHARED_HOSTS, mixed, all), "{kind:?}");
        assert!(!recursive_doubling(kind, RECDBL_MAX_SHARED_HOSTS + 4, mixed, all), "{kind:?}");
    }
    // A reduce goes direct across hosts of up to two ranks; a broadcast from three hosts on (over
    // two its ring crosses NET once too).
    let c = choose(CollKind::Reduce, 2, 4, mixed, all);
    assert_eq!((c.algo, c.proto, c.nchannels), (FN_ALGO_DIRECT, FN_PROTO_LL, 1));
    assert_eq!(choose(CollKind::Reduce, 16 << 20, 4, mixed, all).algo, FN_ALGO_RING);
    assert_eq!(choose(CollKind::Broadcast, 2, 4, mixed, all).algo, FN_ALGO_RING);
    let four_of_two = CommShape { nranks: 8, tree: TreeShape { nhosts: 4, ..mixed.tree }, ..mixed.clone() };
    assert!(direct(CollKind::Reduce, 8, &four_of_two, all));
    let c = choose(CollKind::Broadcast, 2, 4, &four_of_two, all);
    assert_eq!((c.algo, c.proto, c.nchannels), (FN_ALGO_DIRECT, FN_PROTO_LL, 1));
    assert!(direct(CollKind::Broadcast, DIRECT_ROOT_BYTES / 7, &four_of_two, all));
    assert!(!direct(CollKind::Broadcast, DIRECT_ROOT_BYTES / 7 + 1, &four_of_two, all));
    let three_of_two = CommShape { nranks: 6, tree: TreeShape { nhosts: 3, ..mixed.tree }, ..mixed.clone() };
    assert!(direct(CollKind::Broadcast, 8, &three_of_two, all));
    let two_of_four = CommShape { nranks: 8, ..mixed.clone() };
    assert!(!direct(CollKind::Reduce, 8, &two_of_four, all));
    assert!(!direct(CollKind::Broadcast, 8, &two_of_four, all));
    assert!(recursive_doubling(CollKind::AllReduce, 8, &two_of_four, all));
    // Three ranks, not a power of two: direct, but no recursive doubling.
    let three = CommShape { nranks: 3, ..mixed.clone() };
    assert!(direct(CollKind::Reduce, 8, &three, all));
    assert!(!recursive_doubling(CollKind::AllReduce, 8, &three, all));
}
