//! `libQnnSystem.so`: what a context binary says of itself (`QnnSystemContext_getBinaryInfo`):
//! the SoC it was prepared for and each graph's inputs and outputs. The runtime checks a
//! binary against the artifact's record with it before creating the context, since the
//! simulator runs a binary prepared for any SoC (QNN.md: `deviceGetInfo` says v68 on x86).

use std::ffi::{c_char, c_void, CStr};
use std::mem::size_of;
use std::path::Path;

use crate::abi::{ErrorHandle, Tensor, Version};
use crate::{check, Error, Result};

pub const SYSTEM_LIBRARY: &str = "libQnnSystem.so";

type SystemHandle = *mut c_void;

/// `QnnSystemInterface_t`'s function table (system API 1.x; the four entries we know).
#[repr(C)]
struct SystemTable {
    create: Option<unsafe extern "C" fn(handle: *mut SystemHandle) -> ErrorHandle>,
    get_binary_info: Option<unsafe extern "C" fn(handle: SystemHandle, binary: *mut c_void, size: u64, info: *mut *const BinaryInfo, info_size: *mut u64) -> ErrorHandle>,
    _get_metadata: *const c_void,
    free: Option<unsafe extern "C" fn(handle: SystemHandle) -> ErrorHandle>,
}

/// `QnnSystemInterface_t`: id, provider name, system API version, then the table.
#[repr(C)]
struct SystemInterface {
    backend_id: u32,
    provider_name: *const c_char,
    version: Version,
    table: SystemTable,
}

type GetSystemProviders = unsafe extern "C" fn(list: *mut *const *const SystemInterface, count: *mut u32) -> ErrorHandle;

/// `QnnSystemContext_BinaryInfo_t`: a version and the union of V1..V3; only V3's fields
/// the runtime reads are named (their offsets are the same in V1 and V2 up to `graphs`).
#[repr(C)]
pub struct BinaryInfo {
    version: u32,
    /// The union starts at 8 (it holds pointers).
    _union_align: u32,
    backend_id: u32,
    build_id: *const c_char,
    core_api: Version,
    backend_api: Version,
    soc_version: *const c_char,
    context_blob_version: Version,
    context_blob_size: u64,
    num_context_tensors: u32,
    context_tensors: *const Tensor,
    num_graphs: u32,
    graphs: *const GraphInfo,
    platform_info: *const c_void,
    metadata_size: u32,
    metadata: *const c_void,
    soc_model: u32,
}

/// `QnnSystemContext_GraphInfo_t`: a version, then V1..V3, whose first five fields agree; V3
/// then points at the HTP's graph blob info (its size at byte 64, the pointer at 72).
#[repr(C)]
struct GraphInfo {
    version: u32,
    name: *const c_char,
    num_inputs: u32,
    inputs: *const Tensor,
    num_outputs: u32,
    outputs: *const Tensor,
    _v2_v3: [u64; 2],
    blob_info_size: u32,
    blob_info: *const GraphBlobInfo,
    _tail: u64,
}

/// `QnnHtpSystemContext_GraphBlobInfo_t` version 1: the spill-fill buffer the graph needs
/// (then its VTCM size and more, unread).
#[repr(C)]
struct GraphBlobInfo {
    version: u32,
    spill_fill_bytes: u64,
}

/// One graph input or output as the binary records it.
#[derive(Debug, Clone, PartialEq)]
pub struct TensorDesc {
    pub id: u32,
    pub name: String,
    pub data_type: u32,
    pub dims: Vec<u32>,
}

#[derive(Debug, Clone)]
pub struct GraphDesc {
    pub name: String,
    pub inputs: Vec<TensorDesc>,
    pub outputs: Vec<TensorDesc>,
    /// The spill-fill buffer the HTP needs for it (V3 infos with the HTP's blob info).
    pub spill_fill_bytes: Option<u64>,
}

/// What a context binary says of itself.
#[derive(Debug, Clone)]
pub struct BinaryDesc {
    /// QNN's `socModel` (V3 infos only).
    pub soc_model: Option<u32>,
    pub graphs: Vec<GraphDesc>,
}

/// Reads `binary`'s description with the system library in `dir`.
pub fn describe(dir: &Path, binary: &[u8]) -> Result<BinaryDesc> {
    let path = dir.join(SYSTEM_LIBRARY);
    // SAFETY: as for libQnnHtp (`library.rs`): Qualcomm's initialisers, our declared types.
    let lib = unsafe { libloading::Library::new(&path) }.map_err(|e| Error::Missing(format!("{}: cannot be loaded: {e}", path.display())))?;
    let get: libloading::Symbol<GetSystemProviders> = unsafe { lib.get(b"QnnSystemInterface_getProviders\0") }.map_err(|e| Error::Missing(format!("{}: not QNN's system library: {e}", path.display())))?;
    let mut list: *const *const SystemInterface = std::ptr::null();
    let mut count = 0u32;
    // SAFETY: both out-pointers are valid for writes.
    check("QnnSystemInterface_getProviders", None, unsafe { get(&mut list, &mut count) })?;
    if list.is_null() || count == 0 {
        return Err(Error::Missing(format!("{}: offers no system interface", path.display())));
    }
    // SAFETY: the library's static list of `count` providers; the first one's major version
    // is checked before its table is used.
    let iface = unsafe { &**list };
    if iface.version.major != 1 {
        return Err(Error::Missing(format!("{}: system API {}.{}, not the 1.x these declarations follow", path.display(), iface.version.major, iface.version.minor)));
    }
    let (create, info, free) = match (iface.table.create, iface.table.get_binary_info, iface.table.free) {
        (Some(c), Some(i), Some(f)) => (c, i, f),
        _ => return Err(Error::Other("QNN systemContext entries are missing from the system library's table".into())),
    };
    let mut handle: SystemHandle = std::ptr::null_mut();
    // SAFETY: `handle` is valid for a write.
    check("systemContextCreate", None, unsafe { create(&mut handle) })?;
    // The call takes a mutable pointer: it gets a copy, not the read-only mapping.
    let mut copy = binary.to_vec();
    let mut out: *const BinaryInfo = std::ptr::null();
    let mut size = 0u64;
    // SAFETY: `copy` is writable for its length; the info lives in `handle` until it is freed.
    let e = unsafe { info(handle, copy.as_mut_ptr().cast(), copy.len() as u64, &mut out, &mut size) };
    let result = check("systemContextGetBinaryInfo", None, e).and_then(|()| {
        if out.is_null() {
            return Err(Error::Other("QNN systemContextGetBinaryInfo returned no info".into()));
        }
        // SAFETY: a non-null info the library filled, valid until `free` below; arrays are
        // read within the counts it gives.
        Ok(unsafe { read_info(&*out) })
    });
    // SAFETY: created above, freed once.
    unsafe { free(handle) };
    drop(lib);
    result
}

unsafe fn c_string(p: *const c_char) -> String {
    if p.is_null() { String::new() } else { unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned() }
}

unsafe fn tensors(p: *const Tensor, n: u32) -> Vec<TensorDesc> {
    (0..n as usize)
        .map(|i| {
            // SAFETY (caller's): `p` holds `n` tensors; V1 and V2 share these leading fields.
            let t = unsafe { &(*p.add(i)).v1 };
            let dims = if t.dimensions.is_null() { Vec::new() } else { unsafe { std::slice::from_raw_parts(t.dimensions, t.rank as usize) }.to_vec() };
            TensorDesc { id: t.id, name: unsafe { c_string(t.name) }, data_type: t.data_type, dims }
        })
        .collect()
}

unsafe fn read_info(info: &BinaryInfo) -> BinaryDesc {
    let graphs = (0..info.num_graphs as usize)
        .filter(|_| !info.graphs.is_null())
        .map(|i| {
            // SAFETY (caller's): `graphs` holds `num_graphs` infos.
            let g = unsafe { &*info.graphs.add(i) };
            // SAFETY (caller's): a V3 info's blob pointer, where non-null and as large as the
            // version-1 fields read, points at the library's blob info.
            let blob = (g.version >= 3 && !g.blob_info.is_null() && g.blob_info_size as usize >= size_of::<GraphBlobInfo>()).then(|| unsafe { &*g.blob_info });
            let spill_fill_bytes = blob.filter(|b| b.version == 1).map(|b| b.spill_fill_bytes);
            GraphDesc { name: unsafe { c_string(g.name) }, inputs: unsafe { tensors(g.inputs, g.num_inputs) }, outputs: unsafe { tensors(g.outputs, g.num_outputs) }, spill_fill_bytes }
        })
        .collect();
    BinaryDesc { soc_model: (info.version >= 3).then_some(info.soc_model), graphs }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::mem::{offset_of, size_of};

    /// QNN.md: `QnnSystemContext_BinaryInfo_t` is 144 bytes; V3's `socModel` is its last field.
    #[test]
    fn layouts_match_the_2_51_system_library() {
        assert_eq!(size_of::<BinaryInfo>(), 144);
        assert_eq!(offset_of!(BinaryInfo, backend_id), 8);
        assert_eq!(offset_of!(BinaryInfo, context_blob_size), 8 + 64);
        assert_eq!(offset_of!(BinaryInfo, graphs), 8 + 96);
        assert_eq!(offset_of!(BinaryInfo, soc_model), 8 + 128);
        assert_eq!(size_of::<GraphInfo>(), 88);
        assert_eq!(offset_of!(GraphInfo, outputs), 40);
        assert_eq!((offset_of!(GraphInfo, blob_info_size), offset_of!(GraphInfo, blob_info)), (64, 72));
        assert_eq!((offset_of!(GraphBlobInfo, spill_fill_bytes), size_of::<GraphBlobInfo>()), (8, 16));
        assert_eq!(offset_of!(SystemInterface, table), 32);
    }
}
