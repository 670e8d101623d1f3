//! Qualcomm's QNN HTP library, opened at run time (no link-time dependency: a binary without
//! it still runs every other backend). The folder comes from `LLADA_QNN_LIB` or the caller
//! (`--qnn-lib`); on x86-64 `tools/qnn/fetch.sh` brings the simulator's libraries from PyPI's
//! pinned `onnxruntime-qnn` wheel, on a phone they come with Qualcomm's QAIRT SDK.

use std::ffi::{c_char, c_void, CStr};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::abi::{self, ApiVersion, BackendHandle, Interface, LogHandle};
use crate::{check, Error, Result};

/// The library's file name in the folder.
pub const HTP_LIBRARY: &str = "libQnnHtp.so";

/// What a machine without the library is told.
pub const HOW_TO_GET: &str = "set LLADA_QNN_LIB to a folder holding libQnnHtp.so and libQnnSystem.so: on x86-64, `tools/qnn/fetch.sh DIR` fetches the HTP simulator's from PyPI's onnxruntime-qnn 2.7.0 wheel; on a phone they come with Qualcomm's QAIRT SDK (lib/aarch64-android)";

/// The shared library that allocates memory the HTP can map (rpcmem), which registered
/// shared buffers (`memRegister` of ION or DMA-BUF memory) need.
pub const RPCMEM_LIBRARY: &str = "libcdsprpc.so";

/// How a graph's inputs and outputs bind on this machine, and why, in words: client buffers
/// (QNN copies each tensor in and out of the process's memory per run). Registered shared buffers need rpcmem
/// from the phone's FastRPC library; the x86-64 simulator has none (QNN.md). Where it is
/// present the runtime still uses client buffers: registering them is the next issue's work,
/// and the report says so rather than claim it.
pub fn io_binding() -> &'static str {
    // SAFETY: loading the vendor's FastRPC library runs its initialisers, which only set up
    // its own state; it is unloaded at once (`RTLD_NOLOAD` is not used: it may not be loaded).
    let rpcmem = unsafe { libloading::Library::new(RPCMEM_LIBRARY) }.is_ok();
    if rpcmem {
        "client buffers (libcdsprpc.so is present, but registered shared buffers are not used yet)"
    } else {
        "client buffers (no libcdsprpc.so here, so no registered shared buffers: the simulator has none)"
    }
}

/// The loaded HTP library and the provider of the interface the runtime declares.
pub struct QnnLibrary {
    pub dir: PathBuf,
    /// The provider, owned by the library (valid while `_library` is loaded).
    interface: *const Interface,
    pub provider_name: String,
    pub backend_id: u32,
    pub api_version: ApiVersion,
    pub build_id: String,
    _library: libloading::Library,
}

// SAFETY: the interface is an immutable table of function pointers and constants inside the
// loaded library; QNN's entry points may be called from any thread.
unsafe impl Send for QnnLibrary {}
unsafe impl Sync for QnnLibrary {}

impl QnnLibrary {
    /// Opens the library in `dir`, or in `LLADA_QNN_LIB` when `dir` is `None`.
    pub fn open(dir: Option<&Path>) -> Result<Arc<QnnLibrary>> {
        let dir = match dir {
            Some(d) => d.to_path_buf(),
            None => match std::env::var_os("LLADA_QNN_LIB").filter(|v| !v.is_empty()) {
                Some(d) => PathBuf::from(d),
                None => return Err(Error::Missing(format!("the QNN backend needs Qualcomm's HTP library: {HOW_TO_GET}"))),
            },
        };
        let path = dir.join(HTP_LIBRARY);
        if !path.is_file() {
            return Err(Error::Missing(format!("{}: no {HTP_LIBRARY} there; {HOW_TO_GET}", dir.display())));
        }
        // SAFETY: loading runs the library's initialisers; libQnnHtp's are Qualcomm's and
        // touch nothing of ours. Its symbols are looked up by name with the types declared in
        // `abi`, pinned to the 2.51 library by its tests.
        let library = with_stdout_discarded(|| unsafe { libloading::Library::new(&path) }).map_err(|e| Error::Missing(format!("{}: cannot be loaded: {e}", path.display())))?;
        let get_providers: libloading::Symbol<abi::GetProviders> =
            unsafe { library.get(b"QnnInterface_getProviders\0") }.map_err(|e| Error::Missing(format!("{}: not a QNN backend library: {e}", path.display())))?;
        let mut list: *const *const Interface = std::ptr::null();
        let mut count = 0u32;
        // SAFETY: both out-pointers are valid for writes; the library fills them with its own
        // static list.
        check("QnnInterface_getProviders", None, unsafe { get_providers(&mut list, &mut count) })?;
        let providers: Vec<*const Interface> = if list.is_null() { Vec::new() } else { (0..count as usize).map(|i| unsafe { *list.add(i) }).collect() };
        let mut seen = Vec::new();
        let chosen = providers.into_iter().filter(|p| !p.is_null()).find(|&p| {
            // SAFETY: the header fields (id, name, versions) precede the table in every
            // version of the interface; read in place, without a reference to the whole struct.
            let version = unsafe { std::ptr::addr_of!((*p).api_version).read() };
            seen.push(format!("{}.{}", version.core.major, version.core.minor));
            version.core.major == abi::CORE_MAJOR && version.core.minor >= abi::CORE_MINOR_MIN
        });
        let Some(interface) = chosen else {
            return Err(Error::Missing(format!(
                "{}: no provider of the QNN core API {}.{} or a later 2.x (it offers {}); use QAIRT 2.51 or later",
                path.display(),
                abi::CORE_MAJOR,
                abi::CORE_MINOR_MIN,
                if seen.is_empty() { "none".to_string() } else { seen.join(", ") }
            )));
        };
        // SAFETY: as above; the provider lives as long as the library, which we keep.
        let (backend_id, name, api_version) = unsafe { ((*interface).backend_id, (*interface).provider_name, (*interface).api_version) };
        let provider_name = if name.is_null() { String::new() } else { unsafe { CStr::from_ptr(name) }.to_string_lossy().into_owned() };
        let mut lib = QnnLibrary { dir, interface, provider_name, backend_id, api_version, build_id: String::new(), _library: library };
        lib.build_id = lib.query_build_id()?;
        Ok(Arc::new(lib))
    }

    pub(crate) fn table(&self) -> &abi::FunctionTable {
        // SAFETY: the chosen provider's core version is at least the one `abi` declares, so its
        // table has every slot of `FunctionTable`; it lives as long as `self`.
        unsafe { &(*self.interface).table }
    }

    fn query_build_id(&self) -> Result<String> {
        let f = self.table().backend_get_build_id.ok_or_else(|| Error::Other("QNN backendGetBuildId is missing from the library's table".into()))?;
        let mut id: *const c_char = std::ptr::null();
        // SAFETY: `id` is valid for a write; the library points it at a static string.
        check("backendGetBuildId", None, unsafe { f(&mut id) })?;
        Ok(if id.is_null() { String::new() } else { unsafe { CStr::from_ptr(id) }.to_string_lossy().into_owned() })
    }

    /// The backend's API version as its `backendGetApiVersion` reports it (the provider's
    /// header says the same; the two agreeing shows the table is read where it is).
    pub fn backend_api_version(&self) -> Result<ApiVersion> {
        let f = self.table().backend_get_api_version.ok_or_else(|| Error::Other("QNN backendGetApiVersion is missing from the library's table".into()))?;
        let mut v = ApiVersion { core: abi::Version { major: 0, minor: 0, patch: 0 }, backend: abi::Version { major: 0, minor: 0, patch: 0 } };
        // SAFETY: `v` is valid for a write of an `ApiVersion`.
        check("backendGetApiVersion", None, unsafe { f(&mut v) })?;
        Ok(v)
    }

    /// A backend instance with the library's log routed to the runtime's (stderr): errors, or
    /// more with `LLADA_QNN_LOG=warn|info|verbose` (its warnings run to thousands of lines per
    /// finalized graph, about tiling choices).
    pub fn backend(self: &Arc<Self>) -> Result<Arc<Backend>> {
        let t = self.table();
        let (log_create, backend_create) = match (t.log_create, t.backend_create) {
            (Some(l), Some(b)) => (l, b),
            _ => return Err(Error::Other("QNN logCreate or backendCreate is missing from the library's table".into())),
        };
        let mut log: LogHandle = std::ptr::null_mut();
        // SAFETY: `log` is valid for a write; the callback is a plain function that lives for
        // the whole process.
        check("logCreate", None, unsafe { log_create(Some(log_line), log_level(), &mut log) })?;
        let mut b = Backend { lib: self.clone(), log, backend: std::ptr::null_mut() };
        let mut backend: BackendHandle = std::ptr::null_mut();
        // SAFETY: no configs (a null list); `backend` is valid for a write.
        check("backendCreate", None, with_stdout_discarded(|| unsafe { backend_create(log, std::ptr::null(), &mut backend) }))?;
        b.backend = backend;
        Ok(Arc::new(b))
    }
}

/// The most detailed QNN log level to print: `LLADA_QNN_LOG`, else errors only.
fn log_level() -> u32 {
    match std::env::var("LLADA_QNN_LOG").as_deref() {
        Ok("warn") => abi::LOG_WARN,
        Ok("info") => abi::LOG_INFO,
        Ok("verbose") => abi::LOG_VERBOSE,
        _ => abi::LOG_ERROR,
    }
}

/// A QNN backend instance and its logger, freed together (after every device and context
/// made from it, which hold it).
pub struct Backend {
    pub(crate) lib: Arc<QnnLibrary>,
    pub(crate) log: LogHandle,
    pub(crate) backend: BackendHandle,
}

// SAFETY: QNN's handles may be used from any thread; the crate never uses one concurrently
// from two (a context's graphs run one at a time, behind `&mut`).
unsafe impl Send for Backend {}
unsafe impl Sync for Backend {}

impl Backend {
    pub fn library(&self) -> &QnnLibrary {
        &self.lib
    }
}

impl Drop for Backend {
    fn drop(&mut self) {
        let t = self.lib.table();
        // SAFETY: each handle was created by this library and is freed once, backend first.
        unsafe {
            if let (false, Some(free)) = (self.backend.is_null(), t.backend_free) {
                free(self.backend);
            }
            if let (false, Some(free)) = (self.log.is_null(), t.log_free) {
                free(self.log);
            }
        }
    }
}

/// Runs `f` with the process's stdout pointed at its stderr. libQnnHtp prints a line of its
/// own (" # LIBNATIVE: ...") through C's stdout, which would land in the middle of a
/// command's output (`--json`); its buffered C stdio is flushed before stdout is restored.
pub(crate) fn with_stdout_on_stderr<T>(f: impl FnOnce() -> T) -> T {
    with_stdout_to(2, f)
}

/// Runs `f` with the process's stdout discarded: libQnnHtp's greeting on loading
/// (" # LIBNATIVE: No alternate configuration ...") says nothing a user can act on, and
/// would make a one-line error two.
pub(crate) fn with_stdout_discarded<T>(f: impl FnOnce() -> T) -> T {
    // SAFETY: opens /dev/null read-write; closed below.
    let null = unsafe { libc::open(c"/dev/null".as_ptr(), libc::O_WRONLY) };
    if null < 0 {
        return with_stdout_on_stderr(f);
    }
    let result = with_stdout_to(null, f);
    // SAFETY: our own descriptor, closed once.
    unsafe { libc::close(null) };
    result
}

fn with_stdout_to<T>(fd: i32, f: impl FnOnce() -> T) -> T {
    use std::io::Write;
    let _ = std::io::stdout().flush();
    // SAFETY: dup, dup2, fflush and close on the process's own standard descriptors (and
    // `fd`, open for the call), which stay open; stdout is restored before returning
    // (briefly, another thread's print to stdout would go to `fd` instead, nothing worse).
    unsafe {
        let saved = libc::dup(1);
        if saved < 0 || libc::dup2(fd, 1) < 0 {
            if saved >= 0 {
                libc::close(saved);
            }
            return f();
        }
        let result = f();
        libc::fflush(std::ptr::null_mut());
        libc::dup2(saved, 1);
        libc::close(saved);
        result
    }
}

unsafe extern "C" {
    /// C's `vsnprintf`, with the `va_list` as the one pointer the callback receives.
    fn vsnprintf(buf: *mut c_char, size: usize, fmt: *const c_char, args: *mut c_void) -> i32;
}

/// QNN's log, one line each on stderr, as the runtime's other warnings. QNN.md: "unexpected
/// GraphHtpSettings option 66" is printed always and is harmless; it is dropped.
unsafe extern "C" fn log_line(fmt: *const c_char, level: u32, _timestamp: u64, args: *mut c_void) {
    if fmt.is_null() {
        return;
    }
    let mut buf = [0 as c_char; 1024];
    // SAFETY: `buf` holds `buf.len()` bytes and vsnprintf writes at most that, NUL included;
    // `fmt` and `args` are what the library passed for this one call.
    let n = unsafe { vsnprintf(buf.as_mut_ptr(), buf.len(), fmt, args) };
    if n < 0 {
        return;
    }
    let line = unsafe { CStr::from_ptr(buf.as_ptr()) }.to_string_lossy();
    let line = line.trim_end();
    if line.contains("GraphHtpSettings option 66") {
        return;
    }
    let kind = if level <= abi::LOG_ERROR { "error" } else { "warning" };
    eprintln!("qnn {kind}: {line}");
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Needs the library: `tools/qnn/fetch.sh DIR` and `LLADA_QNN_LIB=DIR` (CI runs it so).
    #[test]
    #[ignore]
    fn the_pinned_library_loads_and_answers_through_the_declared_table() {
        let lib = QnnLibrary::open(None).expect("LLADA_QNN_LIB names the fetched library");
        assert_eq!(lib.backend_id, abi::BACKEND_ID_HTP, "{}", lib.provider_name);
        assert!(lib.build_id.starts_with("v2.51"), "build {}", lib.build_id);
        // Two slots of the table agree with the provider's header: the table is read in place.
        assert_eq!(lib.backend_api_version().unwrap(), lib.api_version);
        assert_eq!((lib.api_version.core.major, lib.api_version.core.minor), (2, 40));
        drop(lib.backend().expect("a backend instance"));
    }

    #[test]
    fn a_missing_library_says_how_to_get_it() {
        let dir = std::env::temp_dir();
        let e = QnnLibrary::open(Some(&dir)).err().expect("no QNN library in the temporary folder").to_string();
        assert!(e.contains("libQnnHtp.so") && e.contains("tools/qnn/fetch.sh"), "{e}");
    }
}
