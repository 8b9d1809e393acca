//! NVTX ranges as NCCL 2.28.9 emits them (docs/PLUGINS.md, "NVTX"): one range per API call in the
//! domain "NCCL", named after the call (`ncclAllReduce`), collectives and sends/receives carrying
//! NCCL's payload (communicator hash, bytes, operation, root or peer) through the payload extension.
//!
//! The tool (nsys, or any NVTX v3 tool) attaches as it does to the header-only NVTX library: when
//! `NVTX_INJECTION64_PATH` names a library, it is opened and its `InitializeInjectionNvtx2` is
//! given our export-table getter, through which the tool fills our function slots; then, if it
//! exports `InitializeInjectionNvtxExtension`, the same for the payload extension's slots, after
//! which NCCL's payload schemas and its reduction-operation enum are registered. A slot the tool
//! leaves empty is a no-op. With no tool the whole cost of a call is one relaxed atomic load.
//!
//! The protocol is written here rather than compiled from NVIDIA's C headers: it is a few fixed
//! tables of function slots, and no header needs to be found at build time.

use std::collections::HashMap;
use std::ffi::{c_char, c_int, c_void, CString};
use std::sync::atomic::{AtomicU8, AtomicUsize, Ordering};
use std::sync::OnceLock;

use parking_lot::Mutex;

use super::{Kind, Library};
use crate::debug::Subsys;

crate::int_param!(
    /// `NCCL_NVTX_DISABLE=1`: no ranges even when a tool is attached, as NCCL.
    nvtx_disable, "NCCL_NVTX_DISABLE", 0
);

/// The variable through which a 64-bit NVTX tool names its injection library.
pub const INJECTION_VAR: &str = "NVTX_INJECTION64_PATH";

const TOOL: Kind =
    Kind { var: INJECTION_VAR, kind: "nvtx", default: "", label: "NVTX", subsys: Subsys::INIT, list: false };

// NVTX v3's callback modules (NvtxCallbackModule) and their slot counts (NVTX_CBID_*_SIZE).
const MODULES: [(u32, usize); 6] = [(1, 16), (2, 9), (3, 15), (4, 7), (5, 16), (6, 7)];
/// The index of the CORE2 module in MODULES.
const CORE2: usize = 4;
// Callback ids of the CORE2 module.
const CORE2_RANGE_PUSH_EX: usize = 4;
const CORE2_RANGE_POP: usize = 5;
const CORE2_REGISTER_STRING_A: usize = 10;
const CORE2_DOMAIN_CREATE_A: usize = 12;
// Export table ids.
const ETID_CALLBACKS: u32 = 1;
const ETID_VERSIONINFO: u32 = 3;
const NVTX_VERSION: u16 = 3;
const MESSAGE_TYPE_ASCII: i32 = 1;
const MESSAGE_TYPE_REGISTERED: i32 = 3;

// The payload extension (module 2, compatibility 0x0103) and its slots.
const PAYLOAD_MODULE: u16 = 2;
const PAYLOAD_COMPAT: u16 = 0x0103;
const PAYLOAD_SLOTS: usize = 63;
const SLOT_SCHEMA_REGISTER: usize = 0;
const SLOT_ENUM_REGISTER: usize = 1;
const PAYLOAD_TYPE_EXT: i32 = 0xDFBD0009_u32 as i32;
const SCHEMA_ID_STATIC_START: u64 = 1 << 24;
const ENTRY_INT: u64 = 5;
const ENTRY_UINT64: u64 = 18;
const ENTRY_SIZE: u64 = 22;
/// NCCL's static id of its `ncclRedOp_t` enum schema.
const REDOP_SCHEMA: u64 = SCHEMA_ID_STATIC_START + 24;

/// What a range carries besides its name: NCCL's payload of the call.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Payload {
    None,
    /// AllGather, AlltoAll.
    Bytes {
        comm: u64,
        bytes: usize,
    },
    /// AllReduce, ReduceScatter.
    BytesOp {
        comm: u64,
        bytes: usize,
        op: i32,
    },
    /// Broadcast, Gather, Scatter (the root); Send, Recv (the peer).
    BytesRank {
        comm: u64,
        bytes: usize,
        rank: i32,
    },
    /// Reduce.
    BytesRootOp {
        comm: u64,
        bytes: usize,
        root: i32,
        op: i32,
    },
}

#[repr(C)]
struct Bytes {
    comm: u64,
    bytes: usize,
}
#[repr(C)]
struct BytesInt {
    comm: u64,
    bytes: usize,
    v: i32,
}
#[repr(C)]
struct BytesIntInt {
    comm: u64,
    bytes: usize,
    a: i32,
    b: i32,
}

/// One payload entry: its name, entry type and offset.
type Field = (&'static str, u64, usize);

const COMM: Field = ("NCCL communicator ID", ENTRY_UINT64, 0);
const SIZE: Field = ("Message size [bytes]", ENTRY_SIZE, 8);
const OP: &str = "Reduction operation";

/// NCCL's schema of each call with a payload: its static id (`NVTX_SID_*`), entries (name, type,
/// offset) and size.
const SCHEMAS: [(&str, u64, &[Field], usize); 11] = [
    ("ncclAllGather", 4, &[COMM, SIZE], size_of::<Bytes>()),
    ("ncclAllReduce", 5, &[COMM, SIZE, (OP, REDOP_SCHEMA, 16)], size_of::<BytesInt>()),
    ("ncclBroadcast", 6, &[COMM, SIZE, ("Root", ENTRY_INT, 16)], size_of::<BytesInt>()),
    ("ncclReduceScatter", 7, &[COMM, SIZE, (OP, REDOP_SCHEMA, 16)], size_of::<BytesInt>()),
    ("ncclReduce", 8, &[COMM, SIZE, ("Root", ENTRY_INT, 16), (OP, REDOP_SCHEMA, 20)], size_of::<BytesIntInt>()),
    ("ncclSend", 9, &[COMM, SIZE, ("Peer rank", ENTRY_INT, 16)], size_of::<BytesInt>()),
    ("ncclRecv", 10, &[COMM, SIZE, ("Peer rank", ENTRY_INT, 16)], size_of::<BytesInt>()),
    ("ncclAlltoAll", 16, &[COMM, SIZE], size_of::<Bytes>()),
    ("ncclGather", 17, &[COMM, SIZE, ("Root", ENTRY_INT, 16)], size_of::<BytesInt>()),
    ("ncclScatter", 18, &[COMM, SIZE, ("Root", ENTRY_INT, 16)], size_of::<BytesInt>()),
    // ncclBcast is NCCL's Broadcast under its legacy name, with Broadcast's schema.
    ("ncclBcast", 6, &[COMM, SIZE, ("Root", ENTRY_INT, 16)], size_of::<BytesInt>()),
];

const FRESH: u8 = 0;
const OFF: u8 = 1;
const ON: u8 = 2;
/// Whether a tool is attached: read relaxed on every call, so that no tool costs one load.
static STATE: AtomicU8 = AtomicU8::new(FRESH);

/// The function slots the tool fills, per module, indexed by callback id (0 and the last unused).
static SLOTS: [[AtomicUsize; 17]; 6] = [const { [const { AtomicUsize::new(0) }; 17] }; 6];
/// The payload extension's slots (`intptr_t`; 0 fresh, 1 disabled, else a function).
static EXT_SLOTS: [AtomicUsize; PAYLOAD_SLOTS] = [const { AtomicUsize::new(0) }; PAYLOAD_SLOTS];

/// Per module, the table of slot addresses the tool writes through (NVTX's layout: one entry per
/// callback id, the first and one past the last NULL).
struct Tables([[*const AtomicUsize; 17]; 6]);
// SAFETY: the pointers are to statics, never changed after the table is built.
unsafe impl Sync for Tables {}
// SAFETY: as above.
unsafe impl Send for Tables {}

fn tables() -> &'static Tables {
    static T: OnceLock<Tables> = OnceLock::new();
    T.get_or_init(|| {
        let mut t = Tables([[std::ptr::null(); 17]; 6]);
        for (m, &(_, size)) in MODULES.iter().enumerate() {
            for (id, slot) in SLOTS[m].iter().enumerate().take(size).skip(1) {
                t.0[m][id] = slot;
            }
        }
        t
    })
}

#[repr(C)]
struct ExportCallbacks {
    struct_size: usize,
    get_module_function_table: unsafe extern "C" fn(u32, *mut *const *const AtomicUsize, *mut u32) -> c_int,
}

#[repr(C)]
struct ExportVersionInfo {
    struct_size: usize,
    version: u32,
    reserved0: u32,
    set_injection_nvtx_version: extern "C" fn(u32),
}

static CALLBACKS: ExportCallbacks =
    ExportCallbacks { struct_size: size_of::<ExportCallbacks>(), get_module_function_table };
static VERSION_INFO: ExportVersionInfo = ExportVersionInfo {
    struct_size: size_of::<ExportVersionInfo>(),
    version: NVTX_VERSION as u32,
    reserved0: 0,
    set_injection_nvtx_version,
};

/// The tool asks for a module's table of slot addresses and its length.
unsafe extern "C" fn get_module_function_table(
    module: u32,
    out_table: *mut *const *const AtomicUsize,
    out_size: *mut u32,
) -> c_int {
    let Some(m) = MODULES.iter().position(|&(id, _)| id == module) else { return 0 };
    // SAFETY: the tool passes NULL or writable pointers, as NVTX's contract says.
    unsafe {
        if !out_size.is_null() {
            *out_size = MODULES[m].1 as u32;
        }
        if !out_table.is_null() {
            *out_table = tables().0[m].as_ptr();
        }
    }
    1
}

extern "C" fn set_injection_nvtx_version(_version: u32) {}

extern "C" fn get_export_table(id: u32) -> *const c_void {
    match id {
        ETID_CALLBACKS => (&raw const CALLBACKS).cast(),
        ETID_VERSIONINFO => (&raw const VERSION_INFO).cast(),
        _ => std::ptr::null(),
    }
}

#[repr(C)]
struct EventAttributes {
    version: u16,
    size: u16,
    category: u32,
    color_type: i32,
    color: u32,
    payload_type: i32,
    reserved0: i32,
    payload: u64,
    message_type: i32,
    message: *const c_void,
}

#[repr(C)]
struct PayloadData {
    schema_id: u64,
    size: usize,
    payload: *const c_void,
}

#[repr(C)]
struct SchemaEntry {
    flags: u64,
    type_: u64,
    name: *const c_char,
    description: *const c_char,
    array_or_union_detail: u64,
    offset: u64,
    semantics: *const c_void,
    reserved: *const c_void,
}

#[repr(C)]
struct SchemaAttr {
    field_mask: u64,
    name: *const c_char,
    type_: u64,
    flags: u64,
    entries: *const SchemaEntry,
    num_entries: usize,
    payload_static_size: usize,
    pack_align: usize,
    schema_id: u64,
    extension: *mut c_void,
}

#[repr(C)]
struct EnumEntry {
    name: *const c_char,
    value: u64,
    is_flag: i8,
}

#[repr(C)]
struct EnumAttr {
    field_mask: u64,
    name: *const c_char,
    entries: *const EnumEntry,
    num_entries: usize,
    size_of_enum: usize,
    schema_id: u64,
    extension: *mut c_void,
}

#[repr(C)]
struct ModuleSegment {
    segment_id: usize,
    slot_count: usize,
    function_slots: *const AtomicUsize,
}

#[repr(C)]
struct ModuleInfo {
    nvtx_ver: u16,
    struct_size: u16,
    module_id: u16,
    compat_id: u16,
    segments_count: usize,
    segments: *const ModuleSegment,
    get_export_function: *const c_void,
    ext_info: *const c_void,
}

/// Size and alignment of the C types the payload entry types 1..=27 name (the first entry holds
/// the array's length and its entries' size), as the payload extension hands them to the tool.
static TYPE_INFO: [[u16; 2]; 28] = [
    [28, 4],
    [1, 1],   // char
    [1, 1],   // unsigned char
    [2, 2],   // short
    [2, 2],   // unsigned short
    [4, 4],   // int
    [4, 4],   // unsigned int
    [8, 8],   // long
    [8, 8],   // unsigned long
    [8, 8],   // long long
    [8, 8],   // unsigned long long
    [1, 1],   // int8_t
    [1, 1],   // uint8_t
    [2, 2],   // int16_t
    [2, 2],   // uint16_t
    [4, 4],   // int32_t
    [4, 4],   // uint32_t
    [8, 8],   // int64_t
    [8, 8],   // uint64_t
    [4, 4],   // float
    [8, 8],   // double
    [16, 16], // long double
    [8, 8],   // size_t
    [8, 8],   // pointer
    [4, 4],   // wchar_t
    [0, 0],   // char8_t (not a type of C17)
    [2, 2],   // char16_t
    [4, 4],   // char32_t
];

/// An attached tool: its domain and the names registered in it.
struct Tool {
    lib: Library,
    domain: *mut c_void,
    /// Whether NCCL's payload schemas were registered (the tool has the payload extension).
    payloads: bool,
    /// Each call's message: (message type, registered handle or C string).
    names: Mutex<HashMap<&'static str, (i32, usize)>>,
}

// SAFETY: the domain handle is the tool's, usable from any thread (NVTX's contract).
unsafe impl Send for Tool {}
// SAFETY: as above; `names` is locked.
unsafe impl Sync for Tool {}

fn slot(module: usize, id: usize) -> usize {
    SLOTS[module][id].load(Ordering::Acquire)
}

fn tool() -> Option<&'static Tool> {
    static T: OnceLock<Option<Tool>> = OnceLock::new();
    let t = T.get_or_init(|| {
        let t = attach();
        STATE.store(if t.is_some() { ON } else { OFF }, Ordering::Release);
        t
    });
    t.as_ref()
}

/// Loads the tool `NVTX_INJECTION64_PATH` names, as NVTX's own initialization does.
fn attach() -> Option<Tool> {
    let path = std::env::var(INJECTION_VAR).ok().filter(|p| !p.is_empty())?;
    if nvtx_disable() != 0 {
        crate::nccl_info!(Subsys::INIT, "NVTX: NCCL_NVTX_DISABLE is set: no ranges for the tool {path}");
        return None;
    }
    let mut lib = match Library::open(&TOOL, &path) {
        Ok(Some(lib)) => lib,
        Ok(None) => {
            crate::nccl_warn!("NVTX: {INJECTION_VAR}={path}: no such library; no ranges");
            return None;
        }
        Err(e) => {
            crate::nccl_warn!("NVTX: {e}; no ranges");
            return None;
        }
    };
    let init = lib.symbol("InitializeInjectionNvtx2");
    if init.is_null() {
        crate::nccl_warn!("NVTX: {} exports no InitializeInjectionNvtx2; no ranges", lib.path());
        return None;
    }
    tables();
    type InitFn = unsafe extern "C" fn(extern "C" fn(u32) -> *const c_void) -> c_int;
    // SAFETY: InitializeInjectionNvtx2 has this signature in NVTX v3; the getter and the tables it
    // hands out are statics.
    let ok = unsafe { std::mem::transmute::<*mut c_void, InitFn>(init)(get_export_table) };
    if ok == 0 {
        crate::nccl_warn!("NVTX: InitializeInjectionNvtx2 of {} failed; no ranges", lib.path());
        return None;
    }
    let domain = match slot(CORE2, CORE2_DOMAIN_CREATE_A) {
        0 => std::ptr::null_mut(),
        f => {
            type CreateFn = unsafe extern "C" fn(*const c_char) -> *mut c_void;
            // SAFETY: the tool filled the slot with nvtxDomainCreateA; the name is static.
            unsafe { std::mem::transmute::<usize, CreateFn>(f)(c"NCCL".as_ptr()) }
        }
    };
    let payloads = payload_extension(&lib, domain);
    // The tool's functions are in our slots from now on.
    lib.keep();
    crate::nccl_info!(
        Subsys::INIT,
        "NVTX: tool {} attached (domain NCCL{})",
        lib.path(),
        if payloads { ", payloads" } else { ", no payload extension: names only" }
    );
    Some(Tool { lib, domain, payloads, names: Mutex::new(HashMap::new()) })
}

/// Offers the tool the payload extension and registers NCCL's schemas in `domain`; whether the
/// tool took it.
fn payload_extension(lib: &Library, domain: *mut c_void) -> bool {
    let init = lib.symbol("InitializeInjectionNvtxExtension");
    if init.is_null() {
        return false;
    }
    let segment = ModuleSegment { segment_id: 0, slot_count: PAYLOAD_SLOTS, function_slots: EXT_SLOTS.as_ptr() };
    let mut info = ModuleInfo {
        nvtx_ver: NVTX_VERSION,
        struct_size: size_of::<ModuleInfo>() as u16,
        module_id: PAYLOAD_MODULE,
        compat_id: PAYLOAD_COMPAT,
        segments_count: 1,
        segments: &segment,
        get_export_function: std::ptr::null(),
        ext_info: TYPE_INFO.as_ptr().cast(),
    };
    type InitFn = unsafe extern "C" fn(*mut ModuleInfo) -> c_int;
    // SAFETY: InitializeInjectionNvtxExtension has this signature; the module info and segment
    // live for the call and the slots are static.
    let ok = unsafe { std::mem::transmute::<*mut c_void, InitFn>(init)(&mut info) };
    let fnptr = |i: usize| match EXT_SLOTS[i].load(Ordering::Acquire) {
        0 | 1 => None,
        f => Some(f),
    };
    let (Some(schema_fn), Some(enum_fn)) = (fnptr(SLOT_SCHEMA_REGISTER), fnptr(SLOT_ENUM_REGISTER)) else {
        return false;
    };
    if ok == 0 {
        return false;
    }
    type EnumFn = unsafe extern "C" fn(*mut c_void, *const EnumAttr) -> u64;
    type SchemaFn = unsafe extern "C" fn(*mut c_void, *const SchemaAttr) -> u64;
    let ops: Vec<EnumEntry> = [c"Sum", c"Product", c"Max", c"Min", c"Avg"]
        .iter()
        .enumerate()
        .map(|(v, n)| EnumEntry { name: n.as_ptr(), value: v as u64, is_flag: 0 })
        .collect();
    let e = EnumAttr {
        // ENTRIES | NUM_ENTRIES | SIZE | SCHEMA_ID
        field_mask: (1 << 2) | (1 << 3) | (1 << 4) | (1 << 5),
        name: std::ptr::null(),
        entries: ops.as_ptr(),
        num_entries: ops.len(),
        size_of_enum: size_of::<i32>(),
        schema_id: REDOP_SCHEMA,
        extension: std::ptr::null_mut(),
    };
    // SAFETY: the tool filled the slot with nvtxPayloadEnumRegister; the attributes live for the call.
    unsafe { std::mem::transmute::<usize, EnumFn>(enum_fn)(domain, &e) };
    for &(_, sid, fields, size) in &SCHEMAS {
        let names: Vec<CString> = fields.iter().map(|f| CString::new(f.0).expect("no NUL")).collect();
        let entries: Vec<SchemaEntry> = fields
            .iter()
            .zip(&names)
            .map(|(&(_, ty, off), n)| SchemaEntry {
                flags: 0,
                type_: ty,
                name: n.as_ptr(),
                description: std::ptr::null(),
                array_or_union_detail: 0,
                offset: off as u64,
                semantics: std::ptr::null(),
                reserved: std::ptr::null(),
            })
            .collect();
        let attr = SchemaAttr {
            // TYPE | ENTRIES | NUM_ENTRIES | STATIC_SIZE | SCHEMA_ID
            field_mask: (1 << 2) | (1 << 4) | (1 << 5) | (1 << 6) | (1 << 8),
            name: std::ptr::null(),
            type_: 1, // static
            flags: 0,
            entries: entries.as_ptr(),
            num_entries: entries.len(),
            payload_static_size: size,
            pack_align: 0,
            schema_id: SCHEMA_ID_STATIC_START + sid,
            extension: std::ptr::null_mut(),
        };
        // SAFETY: the tool filled the slot with nvtxPayloadSchemaRegister; the attributes and
        // the strings they point to live for the call (a tool copies what it keeps).
        unsafe { std::mem::transmute::<usize, SchemaFn>(schema_fn)(domain, &attr) };
    }
    true
}

/// The attached tool's library, for `ferronickel info`; `None` when no tool is attached.
pub fn attached() -> Option<&'static str> {
    tool().map(|t| t.lib.path())
}

/// An open range: popped when dropped.
#[must_use]
pub struct Range(Option<&'static Tool>);

/// Pushes the range `name` (an API call's name) with the payload `payload` gives; `payload` runs
/// only when a tool is attached.
pub fn push(name: &'static str, payload: impl FnOnce() -> Payload) -> Range {
    if STATE.load(Ordering::Relaxed) == OFF {
        return Range(None);
    }
    let Some(t) = tool() else { return Range(None) };
    let f = slot(CORE2, CORE2_RANGE_PUSH_EX);
    if f == 0 {
        return Range(None);
    }
    let (message_type, message) = t.message(name);
    let mut attr = EventAttributes {
        version: NVTX_VERSION,
        size: size_of::<EventAttributes>() as u16,
        category: 0,
        color_type: 0,
        color: 0,
        payload_type: 0,
        reserved0: 0,
        payload: 0,
        message_type,
        message: message as *const c_void,
    };
    let p = if t.payloads { payload() } else { Payload::None };
    let sid = SCHEMAS.iter().find(|s| s.0 == name).map(|s| SCHEMA_ID_STATIC_START + s.1);
    let (b, bi, bii);
    let data = match (p, sid) {
        (Payload::Bytes { comm, bytes }, Some(id)) => {
            b = Bytes { comm, bytes };
            Some(PayloadData { schema_id: id, size: size_of::<Bytes>(), payload: (&raw const b).cast() })
        }
        (Payload::BytesOp { comm, bytes, op: v } | Payload::BytesRank { comm, bytes, rank: v }, Some(id)) => {
            bi = BytesInt { comm, bytes, v };
            Some(PayloadData { schema_id: id, size: size_of::<BytesInt>(), payload: (&raw const bi).cast() })
        }
        (Payload::BytesRootOp { comm, bytes, root, op }, Some(id)) => {
            bii = BytesIntInt { comm, bytes, a: root, b: op };
            Some(PayloadData { schema_id: id, size: size_of::<BytesIntInt>(), payload: (&raw const bii).cast() })
        }
        _ => None,
    };
    if let Some(d) = &data {
        attr.payload_type = PAYLOAD_TYPE_EXT;
        attr.payload = d as *const PayloadData as u64;
        attr.reserved0 = 1;
    }
    type PushFn = unsafe extern "C" fn(*mut c_void, *const EventAttributes) -> c_int;
    // SAFETY: the tool filled the slot with nvtxDomainRangePushEx; the attributes and the payload
    // they point to live for the call.
    unsafe { std::mem::transmute::<usize, PushFn>(f)(t.domain, &attr) };
    Range(Some(t))
}

impl Tool {
    /// The message of the range `name`: a string registered in the domain once, or the name as a
    /// C string when the tool registers none.
    fn message(&self, name: &'static str) -> (i32, usize) {
        *self.names.lock().entry(name).or_insert_with(|| {
            let c: &'static std::ffi::CStr = Box::leak(CString::new(name).expect("no NUL").into_boxed_c_str());
            match slot(CORE2, CORE2_REGISTER_STRING_A) {
                0 => (MESSAGE_TYPE_ASCII, c.as_ptr() as usize),
                f => {
                    type RegisterFn = unsafe extern "C" fn(*mut c_void, *const c_char) -> *mut c_void;
                    // SAFETY: the tool filled the slot with nvtxDomainRegisterStringA; the string
                    // lives for the process.
                    let h = unsafe { std::mem::transmute::<usize, RegisterFn>(f)(self.domain, c.as_ptr()) };
                    (MESSAGE_TYPE_REGISTERED, h as usize)
                }
            }
        })
    }
}

impl Drop for Range {
    fn drop(&mut self) {
        let Some(t) = self.0 else { return };
        let f = slot(CORE2, CORE2_RANGE_POP);
        if f != 0 {
            type PopFn = unsafe extern "C" fn(*mut c_void) -> c_int;
            // SAFETY: the tool filled the slot with nvtxDomainRangePop.
            unsafe { std::mem::transmute::<usize, PopFn>(f)(t.domain) };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layouts_are_nvtx_v3s() {
        assert_eq!(size_of::<EventAttributes>(), 48);
        assert_eq!(std::mem::offset_of!(EventAttributes, payload), 24);
        assert_eq!(std::mem::offset_of!(EventAttributes, message), 40);
        assert_eq!(size_of::<SchemaEntry>(), 64);
        assert_eq!(size_of::<SchemaAttr>(), 80);
        assert_eq!(size_of::<EnumAttr>(), 56);
        assert_eq!(size_of::<ModuleInfo>(), 40);
        assert_eq!(size_of::<PayloadData>(), 24);
        assert_eq!(std::mem::offset_of!(BytesIntInt, b), 20);
        assert_eq!(size_of::<BytesInt>(), 24);
    }

    #[test]
    fn every_payload_schema_matches_its_struct() {
        for (name, _, fields, size) in SCHEMAS {
            let last = fields.last().expect("entries");
            let width = if last.1 == ENTRY_UINT64 || last.1 == ENTRY_SIZE { 8 } else { 4 };
            assert!(last.2 + width <= size, "{name}");
        }
    }
}
