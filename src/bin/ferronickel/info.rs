//! `ferronickel info`: versions, GPUs and their links, P2P access, the interfaces the bootstrap
//! would use and why, the network transport, and every setting in effect with its source.
//! Without a GPU it says so and prints the rest.

use crate::gpu::{self, Gpu};
use crate::{CmdResult, Report};
use nccl::env;
use nccl::param::{self, Source};
use nccl::socket::iface;
use serde_json::{json, Value};
use std::fmt::Write;

pub fn run() -> CmdResult {
    let mut text = String::new();
    let mut version = 0;
    // SAFETY: a valid out-pointer to an int.
    unsafe { nccl::api::version::ncclGetVersion(&mut version) };
    let nccl_version = format!("{}.{}.{}", version / 10000, version / 100 % 100, version % 100);
    writeln!(text, "ferronickel {} (NCCL API {nccl_version}, code {version})", env!("CARGO_PKG_VERSION")).unwrap();

    let probe = gpu::probe();
    let driver = probe.as_ref().ok().and_then(|_| gpu::driver_version());
    let gpus: &[Gpu] = probe.as_deref().unwrap_or(&[]);
    let gpu_json = gpu_section(&mut text, &probe, driver, gpus);
    let net_json = interfaces_section(&mut text);
    let network_json = network_section(&mut text);
    let plugins_json = plugins_section(&mut text);
    let settings_json = settings_section(&mut text);

    let json = json!({
        "ferronickel_version": env!("CARGO_PKG_VERSION"),
        "nccl_version": nccl_version,
        "nccl_version_code": version,
        "cuda_driver_version": driver.map(gpu::version_text),
        "gpu": gpu_json,
        "bootstrap": net_json,
        "network": network_json,
        "plugins": plugins_json,
        "settings": settings_json,
    });
    Ok(Report { text, json, failed: None })
}

/// The tuner and profiler plugins (`NCCL_TUNER_PLUGIN`, `NCCL_PROFILER_PLUGIN`): which library
/// each found and loaded, or why none (the net plugins are listed under the network); and whether
/// an NVTX tool is attached (`NVTX_INJECTION64_PATH`).
fn plugins_section(text: &mut String) -> Value {
    use nccl::plugin::{nvtx, profiler, tuner};
    writeln!(text, "\nPlugins (tuner, profiler, NVTX tool; net plugins are listed above):").unwrap();
    let t = tuner::found(nccl::transport::net::plugin_library);
    let p = profiler::found();
    let mut section = |kind: &str, used: Option<(&str, u32, &str)>, notes: &[String]| {
        match used {
            Some((name, v, path)) => writeln!(text, "  {kind} plugin: {name} (v{v}) from {path}").unwrap(),
            None => writeln!(text, "  {kind} plugin: none").unwrap(),
        }
        for n in notes {
            writeln!(text, "    {n}").unwrap();
        }
        json!({
            "loaded": used.map(|(name, v, path)| json!({ "name": name, "version": v, "path": path })),
            "tried": notes,
        })
    };
    let tuner_json = section("tuner", t.plugin.as_ref().map(|l| (l.name(), l.version(), l.path())), &t.notes);
    let profiler_json = section("profiler", p.plugin.as_ref().map(|l| (l.name(), l.version(), l.path())), &p.notes);
    let nvtx_tool = nvtx::attached();
    match nvtx_tool {
        Some(path) => writeln!(text, "  NVTX tool: {path} (ranges in the domain NCCL)").unwrap(),
        None => writeln!(text, "  NVTX tool: none attached ({} unset or unusable)", nvtx::INJECTION_VAR).unwrap(),
    }
    json!({ "tuner": tuner_json, "profiler": profiler_json, "nvtx_tool": nvtx_tool })
}

/// The networks between hosts: the net plugins found (`NCCL_NET_PLUGIN`, else `libnccl-net.so`)
/// and the interfaces the built-in Socket net would use: what the NET transport picks from, for
/// ranks on other hosts.
fn network_section(text: &mut String) -> Value {
    writeln!(text, "\nNetwork between hosts (the NET transport uses the first of these that initialises):").unwrap();
    let plugins: Vec<Value> = nccl::transport::net::plugins_found()
        .into_iter()
        .map(|(candidate, found)| {
            match &found {
                Ok(what) => writeln!(text, "  net plugin {candidate}: {what}").unwrap(),
                Err(why) => writeln!(text, "  net plugin {candidate}: unusable: {why}").unwrap(),
            }
            json!({ "candidate": candidate, "loaded": found.as_ref().ok(), "error": found.as_ref().err() })
        })
        .collect();
    if plugins.is_empty() {
        let env = param::get("NCCL_NET_PLUGIN");
        writeln!(
            text,
            "  net plugins: none found (NCCL_NET_PLUGIN={})",
            env.as_deref().unwrap_or("unset: libnccl-net.so")
        )
        .unwrap();
    }
    let socket = match nccl::transport::net::socket_interfaces() {
        Ok(ifs) => {
            let list: Vec<String> = ifs.iter().map(|(name, ip)| format!("{name} ({ip})")).collect();
            writeln!(text, "  built-in Socket net: {}", list.join(", ")).unwrap();
            json!({ "interfaces": ifs.iter().map(|(n, ip)| json!({ "name": n, "address": ip.to_string() })).collect::<Vec<_>>() })
        }
        Err(e) => {
            writeln!(text, "  built-in Socket net: unusable: {e}").unwrap();
            json!({ "error": e.to_string() })
        }
    };
    json!({ "used_by_communicators": false, "plugins": plugins, "socket": socket })
}

fn gpu_section(text: &mut String, probe: &Result<Vec<Gpu>, String>, driver: Option<i32>, gpus: &[Gpu]) -> Value {
    let no_gpu = match probe {
        Err(why) => Some(why.clone()),
        Ok(_) => None,
    };
    match (&no_gpu, driver) {
        (Some(why), _) => writeln!(text, "\nNo GPU: {why}").unwrap(),
        (None, Some(v)) => writeln!(text, "CUDA driver {}", gpu::version_text(v)).unwrap(),
        (None, None) => writeln!(text, "CUDA driver version unknown").unwrap(),
    }
    if gpus.is_empty() {
        return json!({ "available": false, "reason": no_gpu, "devices": [], "links": [], "p2p_access": [] });
    }
    writeln!(text, "\nGPUs:").unwrap();
    for g in gpus {
        writeln!(
            text,
            "  {}  {:<28} bus {}  NUMA {}  CPUs {}  {:.1} GiB  sm_{}{}",
            g.ordinal,
            g.name,
            g.bus_id,
            g.numa_node.map_or("-".into(), |n| n.to_string()),
            g.near_cpus.as_deref().unwrap_or("-"),
            g.memory_bytes as f64 / (1u64 << 30) as f64,
            g.compute_capability.0,
            g.compute_capability.1
        )
        .unwrap();
    }
    let nvml = crate::nvml::Nvml::load();
    let mut links = Vec::new();
    if gpus.len() > 1 {
        match &nvml {
            Ok(_) => writeln!(text, "\nLinks (NVLink from NVML, PCIe path from sysfs):").unwrap(),
            Err(why) => writeln!(text, "\nLinks (NVML unavailable: {why}; PCIe path from sysfs):").unwrap(),
        }
        for (i, a) in gpus.iter().enumerate() {
            for b in &gpus[i + 1..] {
                let l = gpu::link(nvml.as_ref().ok(), a, b);
                writeln!(text, "  GPU{} <-> GPU{}: {}", a.ordinal, b.ordinal, l.summary()).unwrap();
                let mut j = l.json();
                j["a"] = json!(a.ordinal);
                j["b"] = json!(b.ordinal);
                links.push(j);
            }
        }
    }
    let p2p = gpu::p2p_matrix(gpus);
    writeln!(text, "\nP2P access (row reads/writes column):").unwrap();
    writeln!(text, "       {}", gpus.iter().map(|g| format!("GPU{:<3}", g.ordinal)).collect::<String>()).unwrap();
    for (g, row) in gpus.iter().zip(&p2p) {
        let cells: String = row.iter().map(|&ok| format!("{:<6}", if ok { "yes" } else { "no" })).collect();
        writeln!(text, "  GPU{:<3}{cells}", g.ordinal).unwrap();
    }
    json!({
        "available": true,
        "devices": gpus.iter().map(Gpu::json).collect::<Vec<_>>(),
        "nvml": nvml.as_ref().err().map_or(json!("loaded"), |e| json!(e)),
        "links": links,
        "p2p_access": p2p,
    })
}

fn interfaces_section(text: &mut String) -> Value {
    let all = iface::interfaces();
    let spec = env::socket_ifname();
    let (chosen, why) = match iface::IfRule::from_env() {
        Ok(rule) => (rule.select(&all), rule.describe()),
        Err(e) => (Vec::new(), e.to_string()),
    };
    let first = chosen.first().map(|(n, ip)| format!("{n} ({ip})"));
    writeln!(text, "\nBootstrap interfaces ({why}):").unwrap();
    for (name, ip) in &all {
        let mark = if chosen.iter().any(|(n, i)| n == name && i == ip) { "*" } else { " " };
        writeln!(text, "  {mark} {name:<12} {ip}").unwrap();
    }
    match &first {
        Some(f) => writeln!(text, "  listeners bind {f}").unwrap(),
        None => match iface::local_ip() {
            Ok(ip) => writeln!(text, "  nothing matches: listeners fall back to {ip}").unwrap(),
            Err(e) => writeln!(text, "  nothing matches: init fails ({e})").unwrap(),
        },
    }
    json!({
        "socket_ifname": spec,
        "rule": why,
        "interfaces": all.iter().map(|(n, ip)| json!({
            "name": n,
            "address": ip.to_string(),
            "selected": chosen.iter().any(|(cn, ci)| cn == n && ci == ip),
        })).collect::<Vec<_>>(),
        "bind": chosen.first().map(|(_, ip)| ip.to_string()).unwrap_or_else(|| "127.0.0.1".into()),
    })
}

fn settings_section(text: &mut String) -> Value {
    let settings = param::settings();
    let source = |s: &Source| match s {
        Source::Environment => "environment".to_string(),
        Source::ConfFile(p) => format!("conf file {p}"),
    };
    writeln!(text, "\nSettings in effect (NCCL_*, FERRONICKEL_*):").unwrap();
    if settings.is_empty() {
        writeln!(text, "  none").unwrap();
    }
    for (name, value, src) in &settings {
        writeln!(text, "  {name}={value}  ({})", source(src)).unwrap();
    }
    settings
        .iter()
        .map(|(name, value, src)| {
            let (kind, file) = match src {
                Source::Environment => ("environment", None),
                Source::ConfFile(p) => ("conf file", Some(p)),
            };
            json!({ "name": name, "value": value, "source": kind, "file": file })
        })
        .collect()
}
