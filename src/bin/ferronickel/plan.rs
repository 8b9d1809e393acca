//! `ferronickel plan`: the ring, the channel counts and, per message size, the algorithm and
//! protocol the tuner would choose, for this machine or a described one. It runs the library's
//! own ring and tree builders (`nccl::topo`), transport selection (`nccl::transport::select`, with a
//! host's GPUs taken to reach each other; `NCCL_P2P_DISABLE` and the rest apply), connection plan
//! (`nccl::transport::conn_plan::ConnPlan`) and tuner (`nccl::tuner`, with the limits host-memory
//! connections bring, and an external tuner plugin as `NCCL_TUNER_PLUGIN` names it), so what it prints is what a communicator of that shape would do.
//!
//! A described machine has `--hosts` hosts of `--gpus-per-host` GPUs; ranks fill the hosts in
//! order (`nranks / hosts` each) and, within a host, go round-robin over its GPUs (local rank
//! `l` on GPU `l % gpus-per-host`), as `ncclCommInitAll` over a repeated device list does.

use crate::args::PlanArgs;
use crate::{CmdResult, Report};
use nccl::comm::CommConfig;
use nccl::plugin::tuner as tuner_plugin;
use nccl::task::{CollKind, CommShape, Link, NetLink};
use nccl::topo::tree::Trees;
use nccl::topo::{self, PeerInfo};
use nccl::transport::conn_plan::ConnPlan;
use nccl::transport::{self, net, Path, Settings};
use nccl::tuner::{self, Allowed};
use serde_json::json;
use std::fmt::Write;

/// The collectives planned, with nccl-tests' names.
const COLLS: [(CollKind, &str); 5] = [
    (CollKind::AllReduce, "all_reduce"),
    (CollKind::AllGather, "all_gather"),
    (CollKind::ReduceScatter, "reduce_scatter"),
    (CollKind::Broadcast, "broadcast"),
    (CollKind::Reduce, "reduce"),
];

/// Message sizes (nccl-tests' meaning: the whole buffer, or the gathered total): 16 B to 1 GiB
/// by factors of 4.
fn sizes() -> impl Iterator<Item = usize> {
    (0..14).map(|k| 16usize << (2 * k))
}

/// The machine a plan is for.
struct Machine {
    nranks: usize,
    hosts: usize,
    gpus_per_host: usize,
}

impl Machine {
    /// One `PeerInfo` per rank, as the bootstrap would gather them (host hash = host index,
    /// bus id = `host:gpu`).
    fn peers(&self) -> Vec<PeerInfo> {
        let per_host = self.nranks / self.hosts;
        // Fields the ring does not look at (such as a host name for messages) stay zeroed.
        let blank = PeerInfo::decode(&[0u8; PeerInfo::BYTES]).expect("a buffer of exactly BYTES decodes");
        (0..self.nranks)
            .map(|r| {
                let (host, gpu) = (r / per_host, (r % per_host) % self.gpus_per_host);
                let mut bus_id = [0u8; 16];
                let id = format!("{host:04}:{gpu:02x}");
                bus_id[..id.len()].copy_from_slice(id.as_bytes());
                let mut p = blank;
                (p.rank, p.host_hash, p.machine, p.pid, p.dev, p.bus_id) =
                    (r as u32, host as u64, host as u64, host as u32, gpu as i32, bus_id);
                p
            })
            .collect()
    }
}

pub fn run(args: PlanArgs) -> CmdResult {
    let nranks = args.nranks;
    let hosts = args.hosts.unwrap_or(1);
    if !nranks.is_multiple_of(hosts) {
        return Err(format!("--nranks {nranks} does not divide evenly over --hosts {hosts}"));
    }
    let gpus_per_host = match args.gpus_per_host {
        Some(g) => g,
        None => match crate::gpu::probe() {
            Ok(gpus) => gpus.len(),
            // A described machine of several hosts: one rank per GPU is the only even reading.
            Err(_) if args.hosts.is_some() => nranks / hosts,
            Err(e) => {
                return Err(format!("no GPU here ({e}); describe the machine with --gpus-per-host G (or --hosts H)"))
            }
        },
    };
    if nranks > 1 << 16 {
        return Err(format!("--nranks {nranks} is more than this command plans (65536)"));
    }
    let m = Machine { nranks, hosts, gpus_per_host };
    let peers = m.peers();
    // Each pair's transport as init picks it (GPUs of one host taken to reach each other at SYS).
    let settings = Settings::from_env();
    let link = |a: &PeerInfo, b: &PeerInfo| Some(if a.same_gpu(b) { Path::Loc } else { Path::Sys });
    let kinds: transport::Kinds =
        peers.iter().map(|a| peers.iter().map(|b| transport::select(a, b, &settings, link(a, b))).collect()).collect();
    let host_fifos = transport::host_fifos(&kinds);
    let allowed = tuner::restrictions().map_err(|e| e.to_string())?.intersect(&Allowed::for_connections(
        nranks,
        host_fifos,
        !host_fifos,
    ));
    let allowed = &allowed;

    let mut on_gpu = std::collections::HashMap::new();
    for p in &peers {
        *on_gpu.entry((p.host_hash, p.bus_id)).or_insert(0usize) += 1;
    }
    let per_gpu = on_gpu.values().copied().max().unwrap_or(1);
    let mut nchannels = topo::channel_count(per_gpu, topo::min_nchannels(), topo::max_nchannels());
    let on_net = transport::net_pairs(&kinds);
    // A net plugin (NCCL_NET_PLUGIN, or libnccl-net.so) is loaded as init loads it: its reported
    // properties price NET and size its channels (docs/NET.md).
    let net_props = match on_net && net::plugin_library().is_some() {
        true => net::init(&net::NetConfig::default())
            .and_then(|n| net::plugin_properties(&*n))
            .map_err(|e| format!("the net plugin: {e}"))?,
        false => None,
    };
    let net_link = net_props.as_ref().map(|p| NetLink::new(p.speed_mbps, p.latency_us, p.max_comms));
    if on_net {
        nchannels =
            tuner::net_channels(net_link.as_ref(), nchannels, net::conn::MAX_CHANNELS, topo::least_channels(None));
    }
    let order = topo::ring_order(&peers);
    let host_of: Vec<u64> = peers.iter().map(|p| p.host_hash).collect();
    let trees = Trees::new(&order, &host_of);
    let net_peer_channels = CommConfig::from_env().net_peer_channels;
    let conns = ConnPlan::from_env(nchannels, order.clone(), &trees, net_peer_channels);
    let tree = trees.shape();
    let link = Link::slowest(transport::net_pairs(&kinds), host_fifos);
    // An external tuner plugin (NCCL_TUNER_PLUGIN) is consulted as a communicator would.
    let mut info = tuner_plugin::CommInfo {
        comm_id: 0,
        nranks,
        nnodes: hosts,
        min_ranks_per_node: nranks / hosts,
        max_ranks_per_node: nranks / hosts,
        constants: tuner::plugin_constants(),
    };
    let plugin = tuner_plugin::Session::start(&mut info, nccl::transport::net::plugin_library);
    let plugin_note = match (&plugin, &tuner_plugin::found(nccl::transport::net::plugin_library).plugin) {
        (Some(_), Some(lib)) => format!("{} (v{}) from {}", lib.name(), lib.version(), lib.path()),
        (None, Some(lib)) => format!("{} (v{}): init failed, the built-in tuner decides", lib.name(), lib.version()),
        (_, None) => format!("none ({})", tuner_plugin::found(nccl::transport::net::plugin_library).notes.join("; ")),
    };
    let shape = CommShape {
        rank: 0,
        nranks,
        nchannels,
        min_channels: topo::least_channels(None).min(nchannels),
        all_pairs_channels: conns.all_pairs_channels(),
        slot_bytes: conns.slot_bytes(),
        tree,
        hosts: Some(trees.host_places().into()),
        link,
        net: net_link,
        tuner: plugin,
    };
    // Each tree's root: the rank without a parent.
    let roots: Vec<usize> =
        (0..2).map(|w| (0..nranks).find(|&r| trees.rank_tree(w, r).up.is_none()).expect("a tree has a root")).collect();

    let mut text = String::new();
    let ranks_per_host = nranks / hosts;
    writeln!(
        text,
        "{nranks} ranks on {hosts} host(s) of {gpus_per_host} GPU(s): {ranks_per_host} rank(s) per host, up to {per_gpu} per GPU"
    )
    .unwrap();
    let mut notes = Vec::new();
    // The threads of each GPU's NET proxy, on this machine's CPUs shared by a host's ranks.
    let proxy_threads = on_net.then(|| {
        let net_peers = kinds[0].iter().filter(|&&k| k == transport::Kind::Net).count();
        net::proxy::Threads::choose(net_props.is_none(), None, ranks_per_host, net_peers)
    });
    if let Some(threads) = proxy_threads {
        notes.push(format!(
            "ranks span hosts: peers on other hosts connect over NET, at most {} channels, through each GPU's proxy: \
             {threads} (FERRONICKEL_NET_PROXY_THREADS, FERRONICKEL_NET_PROXY_SEND_THREADS; unset, by this machine's \
             CPUs over a host's {ranks_per_host} rank(s))",
            net::conn::MAX_CHANNELS
        ));
    }
    let (net_hop_us, net_gbps) = tuner::net_hop_and_gbps(net_link.as_ref());
    let net_json = on_net.then(|| {
        json!({
            "net": net_props.as_ref().map_or(net::socket::NAME, |p| p.name.as_str()),
            "speed_mbps": net_link.map(|l| l.speed_mbps),
            "latency_us": net_link.map(|l| l.latency_us),
            "max_comms": net_link.map(|l| l.max_comms),
            "channels": nchannels,
            "hop_us": net_hop_us,
            "gbps": net_gbps,
            "proxy_threads": proxy_threads.map(|t| t.to_string()),
        })
    });
    if ranks_per_host < gpus_per_host {
        notes.push(format!("only {ranks_per_host} of each host's {gpus_per_host} GPUs have a rank"));
    }
    for n in &notes {
        writeln!(text, "note: {n}").unwrap();
    }
    writeln!(text, "ring (every channel): {}", order.iter().map(|r| r.to_string()).collect::<Vec<_>>().join(" -> "))
        .unwrap();
    writeln!(
        text,
        "channels: {nchannels} ring channels (one CTA each); {} per send/recv peer off the ring; one-shot all-reduce may use {}",
        conns.p2p_channels, shape.all_pairs_channels
    )
    .unwrap();
    if on_net {
        let cap = conns
            .net_peer_channels
            .map(|n| {
                format!(
                    "; a send/recv with a peer on another host splits over at most {n} (NCCL_NCHANNELS_PER_NET_PEER)"
                )
            })
            .unwrap_or_default();
        writeln!(text, "send/recv peers on other hosts off the ring and the trees: {} channel(s) each, connected when first used{cap}", conns.runtime_channels()).unwrap();
    }
    let p2p_ll = nccl::plan::kernels::p2p_ll_limit(&shape);
    let two_steps = nccl::tuner::two_message_steps(&shape);
    let steps = two_steps
        .map(|(above, upto)| {
            format!("; a Simple part of more than {above} B and at most {upto} B to another host runs in two steps through the net plugin")
        })
        .unwrap_or_default();
    writeln!(
        text,
        "send/recv: LL while a part carries at most {} B, Simple above (NCCL_P2P_LL_THRESHOLD; unset: 16K, 2K across hosts over NET){steps}",
        p2p_ll
    )
    .unwrap();
    writeln!(text, "FIFO: {} B per connection (NCCL_BUFFSIZE)", conns.fifo_bytes).unwrap();
    writeln!(text, "tuner plugin: {plugin_note}").unwrap();
    if on_net {
        let source = match (&net_props, net_link) {
            (Some(p), Some(l)) => format!(
                "net plugin device {:?}: speed {} Mbps, latency {} us, maxComms {}",
                p.name, l.speed_mbps, l.latency_us, l.max_comms
            ),
            _ => "the built-in Socket net's measured constants".to_string(),
        };
        writeln!(
            text,
            "NET link ({source}): {nchannels} channels, a Simple hop {net_hop_us:.1} us, up to {net_gbps:.2} GB/s"
        )
        .unwrap();
    }
    if tree.nhosts > 1 {
        writeln!(
            text,
            "trees (all-reduce; channel c runs tree c % 2): a double binary tree between {} hosts, each host's ranks a chain in ring order; roots {} and {}, depth {}, up to {} children per rank",
            tree.nhosts, roots[0], roots[1], tree.depth, tree.max_children
        )
        .unwrap();
    } else {
        writeln!(
            text,
            "trees: one host, so both are the ring order as a chain (Tree runs only when NCCL_ALGO forces it)"
        )
        .unwrap();
    }

    // A direct broadcast's route from rank 0, where the table below says Direct for it.
    let direct_bcast = tuner::direct(CollKind::Broadcast, 8, &shape, allowed).then(|| {
        (0..nranks)
            .map(|rank| nccl::plan::kernels::direct_broadcast_links(&CommShape { rank, ..shape.clone() }, 0).to)
            .collect::<Vec<_>>()
    });
    if let Some(to) = &direct_bcast {
        let sends: Vec<String> = to
            .iter()
            .enumerate()
            .filter(|(_, t)| !t.is_empty())
            .map(|(r, t)| format!("{r} -> {}", t.iter().map(|p| p.to_string()).collect::<Vec<_>>().join(", ")))
            .collect();
        writeln!(
            text,
            "direct broadcast from rank 0 (where the table says Direct), each rank's sends in order: {}",
            sends.join("; ")
        )
        .unwrap();
    }

    writeln!(text, "\nPer message size (float): the tuner's algorithm/protocol, channels and modelled kernel time:")
        .unwrap();
    write!(text, "{:>10}", "size").unwrap();
    for (_, name) in COLLS {
        write!(text, "  {name:>26}").unwrap();
    }
    writeln!(text).unwrap();
    let mut rows = Vec::new();
    for size in sizes() {
        write!(text, "{:>10}", human(size)).unwrap();
        let mut choices = serde_json::Map::new();
        for (kind, name) in COLLS {
            let count = match kind {
                CollKind::AllGather | CollKind::ReduceScatter => (size / 4).div_ceil(nranks),
                _ => size / 4,
            }
            .max(1);
            let c = tuner::choose(kind, count, 4, &shape, allowed);
            let us = tuner::coll_us(kind, count, 4, &shape, allowed);
            let algo = tuner::algo_name(c.algo);
            let proto = tuner::PROTOS[c.proto as usize];
            write!(text, "  {:>26}", format!("{algo}/{proto} {}ch {us:.1}us", c.nchannels)).unwrap();
            choices.insert(
                name.into(),
                json!({ "algorithm": algo, "protocol": proto, "channels": c.nchannels, "modelled_us": us }),
            );
        }
        writeln!(text).unwrap();
        rows.push(json!({ "bytes": size, "choices": choices }));
    }
    writeln!(
        text,
        "\n(With one process driving every rank in one group, broadcast between two ranks, all-gather and\n\
         send/recv may run on the copy engines instead from about 64 MB: see README, Status.)"
    )
    .unwrap();
    let json = json!({
        "nranks": nranks,
        "hosts": hosts,
        "gpus_per_host": gpus_per_host,
        "max_ranks_per_gpu": per_gpu,
        "notes": notes,
        "rings": [order],
        "trees": roots.iter().map(|&root| json!({ "root": root, "depth": tree.depth })).collect::<Vec<_>>(),
        "tree_hosts": tree.nhosts,
        "tree_max_children": tree.max_children,
        "ring_channels": nchannels,
        "p2p_channels_per_peer": conns.p2p_channels,
        "p2p_ll_bytes_per_part": p2p_ll,
        "p2p_two_steps_bytes_per_part": two_steps.map(|(above, upto)| [above, upto]),
        "net_peer_channels": conns.runtime_channels(),
        "oneshot_channels": shape.all_pairs_channels,
        "fifo_bytes": conns.fifo_bytes,
        "direct_broadcast_sends_from_root_0": direct_bcast,
        "tuner_plugin": plugin_note,
        "net_link": net_json,
        "sizes": rows,
    });
    Ok(Report { text, json, failed: None })
}

/// `8`, `4K`, `16M`, `1G`.
pub fn human(bytes: usize) -> String {
    match bytes {
        b if b >= 1 << 30 && b % (1 << 30) == 0 => format!("{}G", b >> 30),
        b if b >= 1 << 20 && b % (1 << 20) == 0 => format!("{}M", b >> 20),
        b if b >= 1 << 10 && b % (1 << 10) == 0 => format!("{}K", b >> 10),
        b => b.to_string(),
    }
}
