//! Our own declarations of the QNN C ABI, for the library version the runtime loads: QAIRT
//! 2.51 (core API 2.40, HTP API 5.51), as `../shared/docs/QNN.md` records it. Only what the
//! runtime calls is typed; the rest of the function table is held as opaque slots, so the
//! layout matches the library's. The tests pin every size and offset the runtime relies on
//! (x86-64 and AArch64 alike: LP64, 8-byte pointers).

use std::ffi::{c_char, c_void};

/// Every QNN call returns one: 0 is success; the low 16 bits are the error code
/// (`QnnCommon.h`: context 5xxx, graph 6xxx, tensor 7xxx, mem 8xxx, device 14xxx).
pub type ErrorHandle = u64;

/// The code part of an [`ErrorHandle`].
pub fn error_code(e: ErrorHandle) -> u64 {
    e & 0xffff
}

pub type BackendHandle = *mut c_void;
pub type LogHandle = *mut c_void;

/// `Qnn_Version_t`.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Version {
    pub major: u32,
    pub minor: u32,
    pub patch: u32,
}

/// `Qnn_ApiVersion_t`: the core API and the backend's own API.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ApiVersion {
    pub core: Version,
    pub backend: Version,
}

/// `QnnLog_Level_t`.
pub const LOG_ERROR: u32 = 1;
pub const LOG_WARN: u32 = 2;
pub const LOG_INFO: u32 = 3;
pub const LOG_VERBOSE: u32 = 4;

/// `QnnLog_Callback_t`: `void (*)(const char* fmt, QnnLog_Level_t, uint64_t timestamp,
/// va_list)`. The `va_list` is declared as a pointer: on x86-64 it is an array (passed as a
/// pointer to its first element), on AArch64 a 32-byte struct (passed by reference, being
/// larger than 16 bytes); either way the callee receives one pointer, which `vsnprintf` takes.
pub type LogCallback = unsafe extern "C" fn(fmt: *const c_char, level: u32, timestamp: u64, args: *mut c_void);

/// The interface's function table (`QNN_INTERFACE_VER_TYPE`) as the 2.51 library lays it out:
/// 64 slots, append-only across versions. Slots the runtime does not call are opaque.
#[repr(C)]
pub struct FunctionTable {
    pub property_has_capability: *const c_void,
    pub backend_create: Option<unsafe extern "C" fn(logger: LogHandle, config: *const *const c_void, backend: *mut BackendHandle) -> ErrorHandle>,
    pub backend_set_config: *const c_void,
    pub backend_get_api_version: Option<unsafe extern "C" fn(version: *mut ApiVersion) -> ErrorHandle>,
    pub backend_get_build_id: Option<unsafe extern "C" fn(id: *mut *const c_char) -> ErrorHandle>,
    /// registerOpPackage, getSupportedOperations, validateOpConfig.
    pub _backend_ops: [*const c_void; 3],
    pub backend_free: Option<unsafe extern "C" fn(backend: BackendHandle) -> ErrorHandle>,
    /// context create, setConfig, getBinarySize, getBinary, createFromBinary, free; graph
    /// create, createSubgraph, setConfig, addNode, finalize, retrieve, execute, executeAsync;
    /// tensor createContextTensor, createGraphTensor.
    pub _context_graph_tensor: [*const c_void; 16],
    pub log_create: Option<unsafe extern "C" fn(callback: Option<LogCallback>, max_level: u32, logger: *mut LogHandle) -> ErrorHandle>,
    pub log_set_log_level: *const c_void,
    pub log_free: Option<unsafe extern "C" fn(logger: LogHandle) -> ErrorHandle>,
    /// 7 profile entries, mem register and deregister, 7 device entries, then the later
    /// additions.
    pub _rest: [*const c_void; 36],
}

/// `QnnInterface_t`: one provider of the interface.
#[repr(C)]
pub struct Interface {
    pub backend_id: u32,
    pub provider_name: *const c_char,
    pub api_version: ApiVersion,
    pub table: FunctionTable,
}

/// `QnnInterface_getProviders(const QnnInterface_t*** list, uint32_t* count)`.
pub type GetProviders = unsafe extern "C" fn(list: *mut *const *const Interface, count: *mut u32) -> ErrorHandle;

/// The core API these declarations follow (2.51's, 2.40): a provider of 2.x with x at least
/// this has every slot of [`FunctionTable`], the table being append-only.
pub const CORE_MAJOR: u32 = 2;
pub const CORE_MINOR_MIN: u32 = 40;

/// The HTP backend's id (`QNN_BACKEND_ID_HTP`).
pub const BACKEND_ID_HTP: u32 = 6;

#[cfg(test)]
mod tests {
    use super::*;
    use std::mem::{offset_of, size_of};

    /// QNN.md: `QnnInterface_t` is 552 bytes, its function table at byte 40 (after the id,
    /// the provider's name and the two API versions); the table's order is append-only.
    #[test]
    fn layouts_match_the_2_51_library() {
        assert_eq!(size_of::<Version>(), 12);
        assert_eq!(size_of::<ApiVersion>(), 24);
        assert_eq!(offset_of!(Interface, provider_name), 8);
        assert_eq!(offset_of!(Interface, api_version), 16);
        assert_eq!(offset_of!(Interface, table), 40);
        assert_eq!(size_of::<Interface>(), 552);
        assert_eq!(size_of::<FunctionTable>(), 64 * 8);
        let slot = |offset: usize| offset / 8;
        assert_eq!(slot(offset_of!(FunctionTable, backend_create)), 1);
        assert_eq!(slot(offset_of!(FunctionTable, backend_get_api_version)), 3);
        assert_eq!(slot(offset_of!(FunctionTable, backend_get_build_id)), 4);
        assert_eq!(slot(offset_of!(FunctionTable, backend_free)), 8);
        assert_eq!(slot(offset_of!(FunctionTable, log_create)), 25);
        assert_eq!(slot(offset_of!(FunctionTable, log_free)), 27);
        // An `Option` of a function pointer is one pointer (null for none), as C's is.
        assert_eq!(size_of::<Option<LogCallback>>(), 8);
    }

    #[test]
    fn an_error_handles_code_is_its_low_16_bits() {
        assert_eq!(error_code(0), 0);
        assert_eq!(error_code(0x1_0000_1389), 5001);
    }
}
