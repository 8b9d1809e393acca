//! CPU affinity, as NCCL sets it: a communicator's threads, and the host memory its setup first
//! touches, stay on the CPUs near its GPU.
//!
//! NCCL takes the CPUs of the GPU's NUMA node, keeps those the calling thread may run on
//! (`NCCL_IGNORE_CPU_AFFINITY=1`: all of them), logs the result, and runs the setup of a
//! communicator's connections with the calling thread bound to them, restoring its affinity at
//! the end: the threads started meanwhile inherit the set, and pinned host memory lands on the
//! GPU's node. `NCCL_PROXY_CPUSET` binds the proxy threads elsewhere. ferronickel does the same
//! ([`for_gpu`], [`Window`], [`proxy_cpus`]), reading the CPUs near a GPU, as NCCL does, as those
//! of the NUMA node sysfs gives its PCI device. On a host of one NUMA node every CPU is near, and
//! nothing changes; where the device has no node (`numa_node` -1, as in some virtual machines)
//! the GPU's affinity is empty and nothing is bound, as in NCCL.
//! A failure to read or set an affinity is logged and leaves the threads where they were: it
//! never fails a communicator (NCCL fails its init where `sched_setaffinity` refuses).

use std::fmt;
use std::path::{Path, PathBuf};

crate::int_param!(
    /// NCCL_IGNORE_CPU_AFFINITY=1: bind to every CPU near the GPU, whatever the caller's own
    /// affinity (NCCL's default 0 keeps only the CPUs the caller may use).
    ignore_cpu_affinity, "NCCL_IGNORE_CPU_AFFINITY", 0
);
crate::str_param!(
    /// NCCL_PROXY_CPUSET: CPUs for the NET proxy threads, comma-separated (`0,2,4`; ranges such
    /// as `8-11` too, which NCCL would read as their first CPU).
    proxy_cpuset, "NCCL_PROXY_CPUSET"
);

/// CPUs an affinity mask can name (glibc's `CPU_SETSIZE`).
const MAX_CPUS: usize = 1024;
const WORDS: usize = MAX_CPUS / 64;
const _: () = assert!(std::mem::size_of::<libc::cpu_set_t>() == WORDS * 8);

/// A set of CPUs, as `sched_setaffinity` takes it.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct CpuSet([u64; WORDS]);

impl CpuSet {
    fn empty() -> CpuSet {
        CpuSet([0; WORDS])
    }

    fn insert(&mut self, cpu: usize) {
        self.0[cpu / 64] |= 1 << (cpu % 64);
    }

    fn contains(&self, cpu: usize) -> bool {
        self.0[cpu / 64] & (1 << (cpu % 64)) != 0
    }

    pub fn count(&self) -> usize {
        self.0.iter().map(|w| w.count_ones() as usize).sum()
    }

    fn and(&self, other: &CpuSet) -> CpuSet {
        CpuSet(std::array::from_fn(|i| self.0[i] & other.0[i]))
    }

    /// A CPU list as sysfs writes it (`0-3,8,10-11`, a trailing newline allowed) and as
    /// `NCCL_PROXY_CPUSET` takes it (each CPU decimal or `0x` hex); `None` for anything else, a
    /// CPU past [`MAX_CPUS`], or no CPU at all.
    pub fn parse(list: &str) -> Option<CpuSet> {
        let cpu = |s: &str| crate::param::parse_i64(s).and_then(|v| usize::try_from(v).ok()).filter(|&c| c < MAX_CPUS);
        let mut set = CpuSet::empty();
        for part in list.trim().split(',').map(str::trim) {
            let (lo, hi) = match part.split_once('-') {
                Some((a, b)) => (cpu(a)?, cpu(b)?),
                None => (cpu(part)?, cpu(part)?),
            };
            if lo > hi {
                return None;
            }
            (lo..=hi).for_each(|c| set.insert(c));
        }
        (set.count() > 0).then_some(set)
    }

    /// The calling thread's affinity.
    fn of_this_thread() -> std::io::Result<CpuSet> {
        let mut set = CpuSet::empty();
        // SAFETY: the buffer is a whole `cpu_set_t` (same size, checked above, and u64 words as
        // glibc's) that lives across the call; pid 0 is the calling thread.
        let rc =
            unsafe { libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), set.0.as_mut_ptr().cast()) };
        if rc != 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(set)
    }

    /// Binds the calling thread to these CPUs.
    fn bind_this_thread(&self) -> std::io::Result<()> {
        // SAFETY: as in `of_this_thread`; the kernel only reads the mask.
        let rc = unsafe { libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), self.0.as_ptr().cast()) };
        if rc != 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(())
    }
}

/// Ranges, as sysfs and NCCL's log write them: `0-3,8,10-11`.
impl fmt::Display for CpuSet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut first = true;
        let mut cpu = 0;
        while cpu < MAX_CPUS {
            if !self.contains(cpu) {
                cpu += 1;
                continue;
            }
            let start = cpu;
            while cpu + 1 < MAX_CPUS && self.contains(cpu + 1) {
                cpu += 1;
            }
            let sep = if first { "" } else { "," };
            match cpu == start {
                true => write!(f, "{sep}{start}")?,
                false => write!(f, "{sep}{start}-{cpu}")?,
            }
            first = false;
            cpu += 1;
        }
        Ok(())
    }
}

impl fmt::Debug for CpuSet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "CpuSet({self})")
    }
}

/// The sysfs directory of the PCI device at `bus_id` as CUDA spells it (`0000:1B:00.0`) under the
/// sysfs root `sys`: `/sys/bus/pci/devices/0000:1b:00.0`, in lower case.
pub fn pci_dir(sys: &Path, bus_id: &str) -> PathBuf {
    sys.join("bus/pci/devices").join(bus_id.to_ascii_lowercase())
}

/// The CPUs near the GPU at PCI address `bus_id`: those of the NUMA node its device's
/// `numa_node` names, under the sysfs root `sys` (`/sys` but in tests); `None` where sysfs does
/// not say or names no node (-1). NCCL reads the same node's CPUs; the device's own
/// `local_cpulist` would name every CPU where the node is -1, and bind a caller that
/// `NCCL_IGNORE_CPU_AFFINITY` lets go to all of them, where NCCL binds nothing.
pub fn near_gpu(sys: &Path, bus_id: &str) -> Option<CpuSet> {
    let node: u32 = std::fs::read_to_string(pci_dir(sys, bus_id).join("numa_node")).ok()?.trim().parse().ok()?;
    let cpus = sys.join(format!("devices/system/node/node{node}/cpulist"));
    CpuSet::parse(&std::fs::read_to_string(cpus).ok()?)
}

/// NCCL's rule: the CPUs near the GPU that the caller may use (all of them with `ignore`);
/// `None`, and no binding, where either is unknown or they share no CPU.
fn choose(caller: Option<&CpuSet>, gpu: Option<&CpuSet>, ignore: bool) -> Option<CpuSet> {
    let gpu = gpu?;
    let set = if ignore { *gpu } else { gpu.and(caller?) };
    (set.count() > 0).then_some(set)
}

/// The CPUs a communicator on device `dev` (PCI address `bus_id`) binds its setup and threads
/// to, logged as NCCL logs its choice.
pub fn for_gpu(dev: i32, bus_id: &str) -> Option<CpuSet> {
    let caller = CpuSet::of_this_thread()
        .map_err(|e| crate::nccl_info!(crate::debug::Subsys::INIT, "sched_getaffinity failed ({e}): not binding"))
        .ok();
    let gpu = near_gpu(Path::new("/sys"), bus_id);
    let ignore = ignore_cpu_affinity() != 0;
    let chosen = choose(caller.as_ref(), gpu.as_ref(), ignore);
    let show = |s: Option<&CpuSet>| s.map(CpuSet::to_string).unwrap_or_default();
    // NCCL's line, which leaves the caller's set out where it was ignored.
    let callers = if ignore { String::new() } else { format!(" ; CPU affinity = {}", show(caller.as_ref())) };
    crate::nccl_info!(
        crate::debug::Subsys::INIT,
        "ncclTopoGetCpuAffinity: Affinity for GPU {dev} is {}. (GPU affinity = {}{callers}).",
        chosen.as_ref().map_or_else(|| "empty, ignoring".to_string(), |s| s.to_string()),
        show(gpu.as_ref())
    );
    chosen
}

/// The NET proxy threads' CPUs: `NCCL_PROXY_CPUSET` where it is set (and names CPUs), else the
/// communicator's.
pub fn proxy_cpus(comm: Option<&CpuSet>) -> Option<CpuSet> {
    proxy_cpus_from(proxy_cpuset(), comm)
}

fn proxy_cpus_from(setting: Option<&str>, comm: Option<&CpuSet>) -> Option<CpuSet> {
    match setting {
        Some(s) => CpuSet::parse(s).or_else(|| {
            crate::nccl_warn!("NCCL_PROXY_CPUSET={s:?} names no CPUs (a list such as 0,2,4 or 8-11): ignoring it");
            comm.copied()
        }),
        None => comm.copied(),
    }
}

/// Binds the calling thread (a thread of ours, at its start) to `set`; a refusal is logged.
pub fn bind_this_thread(set: &CpuSet, what: &str) {
    if let Err(e) = set.bind_this_thread() {
        crate::nccl_info!(crate::debug::Subsys::INIT, "{what}: cannot bind to CPUs {set} ({e}); left unbound");
    }
}

/// The calling thread bound to a set for a while (NCCL's init window): its affinity comes back
/// when this drops, on every path out.
pub struct Window {
    saved: Option<CpuSet>,
    /// [`outside_window`] before this window, given back when it drops.
    outer: Option<CpuSet>,
}

thread_local! {
    /// The affinity this thread had before its current window (`None` outside one).
    static OUTSIDE: std::cell::Cell<Option<CpuSet>> = const { std::cell::Cell::new(None) };
}

/// How many CPUs a thread started now may run on: those of `set` where it binds itself there,
/// else the calling thread's, which it inherits; `None` where they cannot be read.
pub fn cpus_of_new_thread(set: Option<&CpuSet>) -> Option<usize> {
    match set {
        Some(s) => Some(s.count()),
        None => CpuSet::of_this_thread().ok().map(|s| s.count()),
    }
}

/// The machine's online CPUs, however this process is bound; `None` where they cannot be read.
pub fn online_cpus() -> Option<usize> {
    // SAFETY: sysconf reads a system value and touches no memory of ours.
    let n = unsafe { libc::sysconf(libc::_SC_NPROCESSORS_ONLN) };
    usize::try_from(n).ok().filter(|&n| n > 0)
}

/// The affinity the calling thread goes back to when its window closes, where it is in one: for
/// threads it starts that serve every communicator of the process (the Socket net's helpers), not
/// one GPU's.
pub fn outside_window() -> Option<CpuSet> {
    OUTSIDE.try_with(|o| o.get()).ok().flatten()
}

impl Window {
    /// Binds the calling thread to `set` (nothing for `None`) until the window drops.
    pub fn enter(set: Option<&CpuSet>) -> Window {
        let unbound = Window { saved: None, outer: None };
        let Some(set) = set else { return unbound };
        let saved = match CpuSet::of_this_thread() {
            Ok(s) => s,
            Err(e) => {
                crate::nccl_info!(crate::debug::Subsys::INIT, "sched_getaffinity failed ({e}): not binding");
                return unbound;
            }
        };
        if saved == *set {
            return unbound;
        }
        if let Err(e) = set.bind_this_thread() {
            crate::nccl_info!(crate::debug::Subsys::INIT, "cannot bind to CPUs {set} ({e}); left unbound");
            return unbound;
        }
        let outer = outside_window();
        let _ = OUTSIDE.try_with(|o| o.set(Some(outer.unwrap_or(saved))));
        Window { saved: Some(saved), outer }
    }
}

impl Drop for Window {
    fn drop(&mut self) {
        if let Some(saved) = self.saved.take() {
            let _ = OUTSIDE.try_with(|o| o.set(self.outer));
            if let Err(e) = saved.bind_this_thread() {
                crate::nccl_warn!("cannot restore this thread's CPU affinity to {saved} ({e})");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set(cpus: &[usize]) -> CpuSet {
        let mut s = CpuSet::empty();
        cpus.iter().for_each(|&c| s.insert(c));
        s
    }

    #[test]
    fn lists_parse_as_sysfs_and_nccl_write_them() {
        let s = CpuSet::parse("0-3,8,10-11\n").unwrap();
        assert_eq!(s, set(&[0, 1, 2, 3, 8, 10, 11]));
        assert_eq!(s.to_string(), "0-3,8,10-11");
        assert_eq!(CpuSet::parse("1,3,0x5").unwrap(), set(&[1, 3, 5]));
        assert_eq!(CpuSet::parse(" 1023 ").unwrap().to_string(), "1023");
        assert_eq!(CpuSet::parse("0-1023").unwrap().count(), 1024);
        for bad in ["", "\n", "a", "3-1", "1,,2", "1024", "-1", "0-1024", "2-", "1;2"] {
            assert_eq!(CpuSet::parse(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn nccls_rule_keeps_the_callers_cpus_near_the_gpu() {
        let (caller, gpu) = (set(&[0, 1, 2, 3]), set(&[2, 3, 4, 5]));
        assert_eq!(choose(Some(&caller), Some(&gpu), false), Some(set(&[2, 3])));
        assert_eq!(choose(Some(&caller), Some(&gpu), true), Some(gpu));
        // Nothing in common, or nothing known: no binding.
        assert_eq!(choose(Some(&set(&[0, 1])), Some(&set(&[4, 5])), false), None);
        assert_eq!(choose(Some(&caller), None, false), None);
        assert_eq!(choose(None, Some(&gpu), false), None);
        assert_eq!(choose(None, Some(&gpu), true), Some(gpu));
    }

    #[test]
    fn the_proxy_cpuset_overrides_the_communicators_unless_it_names_nothing() {
        let comm = set(&[2, 3]);
        assert_eq!(proxy_cpus_from(Some("5,7"), Some(&comm)), Some(set(&[5, 7])));
        assert_eq!(proxy_cpus_from(Some("5,7"), None), Some(set(&[5, 7])));
        assert_eq!(proxy_cpus_from(Some("x"), Some(&comm)), Some(comm));
        assert_eq!(proxy_cpus_from(None, Some(&comm)), Some(comm));
        assert_eq!(proxy_cpus_from(None, None), None);
    }

    #[test]
    fn the_cpus_near_a_gpu_are_those_of_its_numa_node() {
        let sys = std::env::temp_dir().join(format!("fn-affinity-sys-{}", std::process::id()));
        let dev = sys.join("bus/pci/devices/0000:1b:00.0");
        let node1 = sys.join("devices/system/node/node1");
        std::fs::create_dir_all(&dev).unwrap();
        std::fs::create_dir_all(&node1).unwrap();
        std::fs::write(node1.join("cpulist"), "8-15,72-79\n").unwrap();
        // The device's own list, which names every CPU where it has no node, is not read.
        std::fs::write(dev.join("local_cpulist"), "0-127\n").unwrap();
        std::fs::write(dev.join("numa_node"), "1\n").unwrap();
        // The driver writes the address in capitals; sysfs names it in lower case.
        assert_eq!(near_gpu(&sys, "0000:1B:00.0").unwrap().to_string(), "8-15,72-79");
        assert_eq!(near_gpu(&sys, "0000:2A:00.0"), None);
        // No node (a virtual machine's devices), a node sysfs does not list, garbage: NCCL's
        // empty affinity, so nothing is bound.
        for node in ["-1\n", "3\n", "x"] {
            std::fs::write(dev.join("numa_node"), node).unwrap();
            assert_eq!(near_gpu(&sys, "0000:1B:00.0"), None, "numa_node {node:?}");
        }
        std::fs::write(dev.join("numa_node"), "1").unwrap();
        std::fs::write(node1.join("cpulist"), "garbage").unwrap();
        assert_eq!(near_gpu(&sys, "0000:1B:00.0"), None);
        std::fs::remove_dir_all(&sys).unwrap();
    }

    #[test]
    fn a_new_thread_runs_on_its_set_or_else_where_its_starter_may() {
        assert_eq!(cpus_of_new_thread(Some(&set(&[1, 5]))), Some(2));
        let mine = CpuSet::of_this_thread().unwrap().count();
        assert_eq!(cpus_of_new_thread(None), Some(mine));
    }

    /// In a thread of its own, so that the test harness's thread keeps its affinity.
    #[test]
    fn a_window_binds_the_thread_and_gives_its_affinity_back() {
        std::thread::spawn(|| {
            let before = CpuSet::of_this_thread().unwrap();
            // Binding to one CPU changes nothing where the thread may use only one.
            if before.count() < 2 {
                eprintln!("skipped: this thread may run on one CPU only");
                return;
            }
            let first = (0..MAX_CPUS).find(|&c| before.contains(c)).unwrap();
            assert_eq!(outside_window(), None);
            {
                let _w = Window::enter(Some(&set(&[first])));
                assert_eq!(CpuSet::of_this_thread().unwrap(), set(&[first]));
                // What the process's shared threads are started on meanwhile.
                assert_eq!(outside_window(), Some(before));
                // A thread started inside the window inherits it, as NCCL's proxy threads do.
                let child = std::thread::spawn(|| CpuSet::of_this_thread().unwrap()).join().unwrap();
                assert_eq!(child, set(&[first]));
            }
            assert_eq!(CpuSet::of_this_thread().unwrap(), before);
            assert_eq!(outside_window(), None);
            // No set, or one the kernel refuses (no CPU of it may run this thread): unchanged.
            drop(Window::enter(None));
            drop(Window::enter(Some(&set(&[MAX_CPUS - 1]))));
            assert_eq!(CpuSet::of_this_thread().unwrap(), before);
        })
        .join()
        .unwrap();
    }
}
