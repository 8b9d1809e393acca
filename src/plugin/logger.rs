//! The logger handed to every kind of plugin (net, tuner, profiler): their printf-style lines join
//! ours (`NCCL_DEBUG`, `NCCL_DEBUG_SUBSYS`), formatted on x86-64 and logged as given elsewhere.

use std::ffi::{c_char, c_int, c_ulong, c_void, CStr};

use super::abi::*;
use crate::debug::Level;

/// Writes a plugin's log line through our log, formatted by the C library's `vsnprintf`.
// `c_ulong` is 32 bits on some targets, so the casts to u64 are not always no-ops.
#[allow(clippy::unnecessary_cast)]
extern "C" fn log_va(
    level: ncclDebugLogLevel,
    flags: c_ulong,
    file: *const c_char,
    line: c_int,
    fmt: *const c_char,
    ap: *mut c_void,
) {
    let _ = std::panic::catch_unwind(|| {
        let lvl = match level {
            0 => return,
            1..=3 => {
                if level == 2 {
                    Level::Warn
                } else {
                    Level::Info
                }
            }
            4 => Level::Warn,
            _ => Level::Trace,
        };
        if fmt.is_null() || !crate::debug::enabled(lvl, flags as u64) {
            return;
        }
        let mut buf = [0 as c_char; 1024];
        // SAFETY: buf is writable for its length; fmt is the plugin's format string and ap the
        // va_list the trampoline built from the plugin's variadic call.
        let n = unsafe { vsnprintf(buf.as_mut_ptr(), buf.len(), fmt, ap) };
        if n < 0 {
            return;
        }
        // SAFETY: vsnprintf NUL-terminates within buf.
        let msg = unsafe { CStr::from_ptr(buf.as_ptr()) }.to_string_lossy();
        // SAFETY: a non-null `file` is the plugin's NUL-terminated `__FILE__`.
        let file = (!file.is_null()).then(|| unsafe { CStr::from_ptr(file) }.to_string_lossy());
        let at = file.as_deref().map(|f| (f, line.max(0) as u32));
        crate::debug::log(lvl, flags as u64, at, msg.trim_end());
    });
}

/// C functions declared for this module; kept out of nccl.h.
/// cbindgen:ignore
mod c {
    use std::ffi::{c_char, c_int, c_ulong, c_void};

    extern "C" {
        pub fn vsnprintf(buf: *mut c_char, n: usize, fmt: *const c_char, ap: *mut c_void) -> c_int;
        /// The trampoline below (x86-64 only).
        #[cfg(target_arch = "x86_64")]
        pub fn ferronickel_plugin_logger(
            level: super::ncclDebugLogLevel,
            flags: c_ulong,
            file: *const c_char,
            line: c_int,
            fmt: *const c_char,
            ...
        );
    }
}
use c::vsnprintf;

// The C logger is variadic, which stable Rust cannot define. On x86-64 this trampoline spills
// the argument registers into a System V `va_list` register save area (6 integer registers,
// then 8 vector registers), points the `va_list` at it and at the caller's stack arguments,
// and passes it as a sixth argument to `log_va`: exactly what a C variadic prologue does.
#[cfg(target_arch = "x86_64")]
std::arch::global_asm!(
    ".text",
    ".p2align 4",
    ".globl ferronickel_plugin_logger",
    ".hidden ferronickel_plugin_logger",
    ".type ferronickel_plugin_logger,@function",
    "ferronickel_plugin_logger:",
    "push rbp",
    "mov rbp, rsp",
    // 176 bytes of register save area + 24 of va_list, rounded to keep rsp 16-byte aligned.
    "sub rsp, 208",
    "mov [rsp], rdi",
    "mov [rsp+8], rsi",
    "mov [rsp+16], rdx",
    "mov [rsp+24], rcx",
    "mov [rsp+32], r8",
    "mov [rsp+40], r9",
    "movaps [rsp+48], xmm0",
    "movaps [rsp+64], xmm1",
    "movaps [rsp+80], xmm2",
    "movaps [rsp+96], xmm3",
    "movaps [rsp+112], xmm4",
    "movaps [rsp+128], xmm5",
    "movaps [rsp+144], xmm6",
    "movaps [rsp+160], xmm7",
    // va_list: gp_offset = 40 (five named integer arguments), fp_offset = 48 (none named),
    // overflow_arg_area = the caller's stack arguments, reg_save_area = rsp.
    "mov dword ptr [rsp+176], 40",
    "mov dword ptr [rsp+180], 48",
    "lea rax, [rbp+16]",
    "mov [rsp+184], rax",
    "mov [rsp+192], rsp",
    "lea r9, [rsp+176]",
    "call {log}",
    "leave",
    "ret",
    ".size ferronickel_plugin_logger, .-ferronickel_plugin_logger",
    log = sym log_va,
);

#[cfg(target_arch = "x86_64")]
pub fn logger() -> ncclDebugLogger_t {
    Some(c::ferronickel_plugin_logger)
}

/// Elsewhere the format string is logged as is, without its arguments.
#[cfg(not(target_arch = "x86_64"))]
pub fn logger() -> ncclDebugLogger_t {
    extern "C" fn plain(
        level: ncclDebugLogLevel,
        flags: c_ulong,
        file: *const c_char,
        line: c_int,
        fmt: *const c_char,
    ) {
        if !fmt.is_null() {
            // SAFETY: fmt is the plugin's NUL-terminated format string.
            let f = unsafe { CStr::from_ptr(fmt) }.to_string_lossy();
            let lvl = if level == 2 { Level::Warn } else { Level::Info };
            // SAFETY: a non-null `file` is the plugin's NUL-terminated `__FILE__`.
            let file = (!file.is_null()).then(|| unsafe { CStr::from_ptr(file) }.to_string_lossy());
            let at = file.as_deref().map(|f| (f, line.max(0) as u32));
            crate::debug::log(lvl, flags as u64, at, &format!("{f} (arguments not shown on this architecture)"));
        }
    }
    // SAFETY: the C calling convention passes the named arguments of a variadic call where a
    // non-variadic callee reads them on the 64-bit Linux ABIs; `plain` reads only those.
    unsafe {
        std::mem::transmute::<
            extern "C" fn(ncclDebugLogLevel, c_ulong, *const c_char, c_int, *const c_char),
            ncclDebugLogger_t,
        >(plain)
    }
}
