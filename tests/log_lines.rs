//! The log as NCCL 2.28 writes it, end to end through the C API: the version line at the first
//! communicator's init, and a WARN after an empty line with its timestamp and source place. On
//! a machine without a CUDA driver (CI) the init fails with a WARN; with one, it succeeds and only
//! the version line is checked.

use nccl::api::init;
use nccl::types::ncclResult_t::*;
use nccl::types::*;

#[test]
fn the_log_starts_with_the_version_and_warns_as_nccl_does() {
    let path = std::env::temp_dir().join(format!("fn-log-lines-{}.log", std::process::id()));
    // SAFETY: this file's only test, so no other thread of this process reads the environment.
    unsafe {
        std::env::set_var("NCCL_DEBUG", "WARN");
        std::env::set_var("NCCL_DEBUG_FILE", &path);
        std::env::set_var("NCCL_DEBUG_TIMESTAMP_FORMAT", "<%Y_%3f>_");
    }
    nccl::debug::reset();
    let mut id = ncclUniqueId { internal: [0; 128] };
    let mut comm: ncclComm_t = std::ptr::null_mut();
    // SAFETY: valid out-pointers; a one-rank communicator needs no peer.
    let code = unsafe {
        assert_eq!(init::ncclGetUniqueId(&mut id), ncclSuccess);
        init::ncclCommInitRank(&mut comm, 1, id, 0)
    };
    let log = std::fs::read_to_string(&path).unwrap();
    let _ = std::fs::remove_file(&path);
    let lines: Vec<&str> = log.lines().collect();
    // Bare, and first: NCCL_DEBUG=WARN shows the version line without host, pid or level.
    assert!(lines[0].starts_with("NCCL version 2.28.9+cuda") && lines[0].contains("(ferronickel "), "{log}");
    if code == ncclSuccess {
        // SAFETY: the communicator init returned.
        assert_eq!(unsafe { init::ncclCommDestroy(comm) }, ncclSuccess);
        return;
    }
    // The failed init's WARN: an empty line, then `<YEAR MMM> host:pid:tid [dev] file:line NCCL WARN ...`.
    let at = lines.iter().position(|l| l.contains(" NCCL WARN ")).expect("a WARN line");
    assert_eq!(lines[at - 1], "", "{log}");
    let warn = lines[at];
    assert!(warn.starts_with("<2") && warn.as_bytes()[5] == b' ' && warn.as_bytes()[9] == b'>', "{warn}");
    let before = &warn[..warn.find(" NCCL WARN ").unwrap()];
    let place = before.rsplit(' ').next().unwrap();
    let (file, line) = place.split_once(':').expect("file:line before NCCL WARN");
    assert!(file.ends_with(".rs") && line.parse::<u32>().is_ok(), "{warn}");
}
