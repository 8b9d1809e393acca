//! Hosts of our own for the cross-host tests: each "host" is a network namespace with its own
//! loopback, its own interfaces and addresses, and (through a UTS namespace) its own host name.
//!
//! Every network is a bridge in a namespace of its own (never the root namespace), and each host
//! joins it through a veth pair: `<prefix>0` inside the host, `h<i>n<k>` on the bridge. Host `i`
//! of network `k` has 198.18.k.(i+1)/24 (198.18.0.0/15 is reserved for benchmarking) and
//! fd42:6e62:0:k::(i+1)/64 (a ULA), as the network asks. Nothing is routed out: no default
//! route, no link to the root namespace.
//!
//! Names are unique per process and per [`Hosts`] (`fnb<pid>x<n>h<i>`, `fnb<pid>x<n>br`), so
//! tests run in parallel. Dropping [`Hosts`] deletes every namespace (and with them the veths and
//! bridges), also when a test panics; namespaces left by a killed test run are deleted by the
//! next one. Processes started in a host are [`Procs`], killed when dropped.
//!
//! Making namespaces needs root and iproute2 (`ip`) and util-linux (`unshare`):
//! [`Hosts::new`] returns `None` after printing "SKIP: ..." on stderr where they are missing.
//! Any other failure (a root that may not make namespaces) fails the test.

use std::io::{BufRead, BufReader, Read};
use std::net::{Ipv4Addr, Ipv6Addr};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// One network every host joins: its interface in each host is `<prefix>0`.
#[derive(Clone, Copy, Debug)]
pub struct Net {
    pub prefix: &'static str,
    pub v4: bool,
    pub v6: bool,
}

impl Net {
    pub const fn v4(prefix: &'static str) -> Net {
        Net { prefix, v4: true, v6: false }
    }
    pub const fn v6(prefix: &'static str) -> Net {
        Net { prefix, v4: false, v6: true }
    }
}

pub struct Hosts {
    tag: String,
    nets: Vec<Net>,
    n: usize,
}

static NEXT: AtomicUsize = AtomicUsize::new(0);

/// Runs `ip args`, panicking with its stderr when it fails.
pub fn ip(args: &[&str]) {
    let out = Command::new("ip").args(args).output().unwrap_or_else(|e| panic!("cannot run ip: {e}"));
    assert!(out.status.success(), "ip {}: {}", args.join(" "), String::from_utf8_lossy(&out.stderr));
}

/// Why namespaces cannot be made here, if they cannot.
fn unavailable() -> Option<String> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return Some("not root: network namespaces need root".into());
    }
    for tool in ["ip", "unshare"] {
        if Command::new(tool).arg("-V").stdout(Stdio::null()).stderr(Stdio::null()).status().is_err() {
            return Some(format!("no `{tool}` on PATH (bash scripts/setup-deps.sh installs it)"));
        }
    }
    None
}

/// Deletes namespaces of ours whose process is gone (a run killed before its Drop).
fn delete_stale() {
    let Ok(out) = Command::new("ip").args(["netns", "list"]).output() else { return };
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        let name = line.split_whitespace().next().unwrap_or("");
        let Some(pid) = name.strip_prefix("fnb").and_then(|r| r.split('x').next()) else { continue };
        if pid.parse::<u32>().is_ok() && !std::path::Path::new(&format!("/proc/{pid}")).exists() {
            let _ = Command::new("ip").args(["netns", "del", name]).status();
        }
    }
}

impl Hosts {
    /// `n` hosts on `nets`, each host with its loopback up and one interface per network; `None`
    /// (after "SKIP: ..." on stderr) where namespaces cannot be made.
    pub fn new(test: &str, n: usize, nets: &[Net]) -> Option<Hosts> {
        if let Some(why) = unavailable() {
            eprintln!("SKIP: {test}: {why}");
            return None;
        }
        delete_stale();
        let tag = format!("fnb{}x{}", std::process::id(), NEXT.fetch_add(1, Ordering::Relaxed));
        let hosts = Hosts { tag, nets: nets.to_vec(), n };
        let br = hosts.bridge_ns();
        ip(&["netns", "add", &br]);
        for k in 0..nets.len() {
            let b = format!("br{k}");
            ip(&["-n", &br, "link", "add", &b, "type", "bridge"]);
            ip(&["-n", &br, "link", "set", &b, "up"]);
        }
        for i in 0..n {
            let h = hosts.ns(i);
            ip(&["netns", "add", &h]);
            ip(&["-n", &h, "link", "set", "lo", "up"]);
            for (k, net) in nets.iter().enumerate() {
                let (inner, port) = (hosts.iface(k), hosts.port(i, k));
                ip(&["link", "add", &inner, "netns", &h, "type", "veth", "peer", "name", &port, "netns", &br]);
                ip(&["-n", &br, "link", "set", &port, "master", &format!("br{k}"), "up"]);
                if net.v4 {
                    ip(&["-n", &h, "addr", "add", &format!("{}/24", hosts.v4(i, k)), "dev", &inner]);
                }
                if net.v6 {
                    // nodad: usable at once, not after duplicate address detection.
                    ip(&["-n", &h, "addr", "add", &format!("{}/64", hosts.v6(i, k)), "dev", &inner, "nodad"]);
                }
                ip(&["-n", &h, "link", "set", &inner, "up"]);
            }
        }
        Some(hosts)
    }

    pub fn len(&self) -> usize {
        self.n
    }

    /// The namespace of host `i`.
    pub fn ns(&self, i: usize) -> String {
        format!("{}h{i}", self.tag)
    }

    fn bridge_ns(&self) -> String {
        format!("{}br", self.tag)
    }

    /// The interface of network `k` inside every host.
    pub fn iface(&self, k: usize) -> String {
        format!("{}0", self.nets[k].prefix)
    }

    /// Host `i`'s port on network `k`'s bridge (the far end of its veth).
    fn port(&self, i: usize, k: usize) -> String {
        format!("h{i}n{k}")
    }

    pub fn v4(&self, i: usize, k: usize) -> Ipv4Addr {
        Ipv4Addr::new(198, 18, k as u8, i as u8 + 1)
    }

    pub fn v6(&self, i: usize, k: usize) -> Ipv6Addr {
        Ipv6Addr::new(0xfd42, 0x6e62, 0, k as u16, 0, 0, 0, i as u16 + 1)
    }

    /// `program args` in host `i` under host name `hostname` (its own UTS namespace), with this
    /// process's environment.
    pub fn command(&self, i: usize, hostname: &str, program: &str, args: &[&str]) -> Command {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", &self.ns(i), "unshare", "-u", "sh", "-c"])
            .arg("echo \"$0\" > /proc/sys/kernel/hostname && exec \"$@\"")
            .arg(hostname)
            .arg(program)
            .args(args);
        c
    }

    /// Takes host `i`'s port on network `k` down (`up`: false) or up: a cable pulled or put back.
    pub fn set_link(&self, i: usize, k: usize, up: bool) {
        ip(&["-n", &self.bridge_ns(), "link", "set", &self.port(i, k), if up { "up" } else { "down" }]);
    }

    /// Removes host `i`'s veth on network `k` (both ends): the host's network vanishes.
    pub fn unplug(&self, i: usize, k: usize) {
        ip(&["-n", &self.bridge_ns(), "link", "del", &self.port(i, k)]);
    }
}

impl Drop for Hosts {
    fn drop(&mut self) {
        // A namespace outlives its name while a process is in it: Procs are dropped first.
        for ns in (0..self.n).map(|i| self.ns(i)).chain([self.bridge_ns()]) {
            if let Err(e) = Command::new("ip").args(["netns", "del", &ns]).status() {
                eprintln!("cannot delete network namespace {ns}: {e}");
            }
        }
    }
}

/// Processes started in hosts, their stdout and stderr gathered as they come: killed and reaped
/// when dropped (a panicking test leaves none behind).
#[derive(Default)]
pub struct Procs(Vec<(Child, Arc<Mutex<String>>)>);

impl Procs {
    /// Starts `cmd` with its output piped into a buffer; returns its index.
    pub fn spawn(&mut self, mut cmd: Command) -> usize {
        let mut child = cmd.stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().expect("spawn a process in a host");
        let out = Arc::new(Mutex::new(String::new()));
        let pipes: [Box<dyn Read + Send>; 2] =
            [Box::new(child.stdout.take().unwrap()), Box::new(child.stderr.take().unwrap())];
        for pipe in pipes {
            let out = out.clone();
            std::thread::spawn(move || {
                for line in BufReader::new(pipe).lines().map_while(std::result::Result::ok) {
                    let mut o = out.lock().unwrap();
                    o.push_str(&line);
                    o.push('\n');
                }
            });
        }
        self.0.push((child, out));
        self.0.len() - 1
    }

    pub fn pid(&self, i: usize) -> u32 {
        self.0[i].0.id()
    }

    /// What process `i` has written so far.
    pub fn output(&self, i: usize) -> String {
        self.0[i].1.lock().unwrap().clone()
    }

    fn all_output(&self) -> String {
        (0..self.0.len()).map(|i| format!("--- process {i}:\n{}", self.output(i))).collect()
    }

    /// Waits until process `i` has written `needle`; panics after `within`.
    pub fn wait_for(&self, i: usize, needle: &str, within: Duration) {
        let deadline = Instant::now() + within;
        while !self.output(i).contains(needle) {
            assert!(
                Instant::now() < deadline,
                "process {i} did not say {needle:?} within {within:?}:\n{}",
                self.all_output()
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Waits for every process to end within `within`; panics (and the drop kills them)
    /// otherwise. Returns each one's exit status and output (stdout and stderr).
    pub fn wait(&mut self, within: Duration) -> Vec<(ExitStatus, String)> {
        let deadline = Instant::now() + within;
        let mut status = vec![None; self.0.len()];
        while status.iter().any(Option::is_none) {
            for ((c, _), s) in self.0.iter_mut().zip(status.iter_mut()) {
                if s.is_none() {
                    *s = c.try_wait().expect("try_wait");
                }
            }
            let running: Vec<usize> = (0..status.len()).filter(|&r| status[r].is_none()).collect();
            assert!(
                Instant::now() < deadline,
                "processes {running:?} still running after {within:?}: a hang. Output:\n{}",
                self.all_output()
            );
            std::thread::sleep(Duration::from_millis(10));
        }
        // The readers finish once the pipes close (a grandchild could hold them: bounded wait).
        std::thread::sleep(Duration::from_millis(50));
        status.into_iter().enumerate().map(|(i, s)| (s.unwrap(), self.output(i))).collect()
    }

    /// Like [`Procs::wait`], and every process must have succeeded and said `ok_line`.
    pub fn expect_ok(&mut self, within: Duration, ok_line: &str) -> Vec<String> {
        let done = self.wait(within);
        for (i, (st, out)) in done.iter().enumerate() {
            assert!(st.success() && out.contains(ok_line), "process {i} failed ({st}):\n{}", self.all_output());
        }
        done.into_iter().map(|(_, o)| o).collect()
    }
}

impl Drop for Procs {
    fn drop(&mut self) {
        for (c, _) in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}
