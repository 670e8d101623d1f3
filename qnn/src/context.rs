//! Devices, contexts and the execution of their graphs. A context is the unit QNN serializes:
//! `lladac` builds one ([`crate::build`]) and writes its binary into the artifact; `llada-rt`
//! recreates it from that binary at session open, retrieves its graphs by name and executes
//! them over client buffers (the simulator has no registered shared buffers: QNN.md).

use std::ffi::{c_void, CString};
use std::sync::Arc;

use crate::abi::{self, ContextHandle, DeviceHandle, GraphHandle, Tensor};
use crate::library::{with_stdout_on_stderr, Backend};
use crate::{check, Error, Result};

/// An HTP device, configured for one Snapdragon SoC (`socModel`, e.g. 57 for SM8650): graphs
/// are prepared for that chip.
pub struct Device {
    pub(crate) backend: Arc<Backend>,
    pub(crate) device: DeviceHandle,
    pub soc: u32,
}

// SAFETY: as `Backend`'s: QNN handles may move between threads.
unsafe impl Send for Device {}
unsafe impl Sync for Device {}

impl Device {
    pub fn new(backend: &Arc<Backend>, soc: u32) -> Result<Arc<Device>> {
        let t = backend.lib.table();
        let create = t.device_create.ok_or_else(|| Error::Other("QNN deviceCreate is missing from the library's table".into()))?;
        let htp = abi::HtpDeviceSocConfig { option: abi::HTP_DEVICE_CONFIG_OPTION_SOC, soc_model: soc as u64, _tail: [0; 3] };
        let config = abi::DeviceConfig { option: abi::DEVICE_CONFIG_OPTION_CUSTOM, custom: &htp as *const _ as *const c_void };
        let list: [*const abi::DeviceConfig; 2] = [&config, std::ptr::null()];
        let mut device: DeviceHandle = std::ptr::null_mut();
        // SAFETY: a null-terminated list of one config that outlives the call; `device` is
        // valid for a write.
        check("deviceCreate", None, unsafe { create(backend.log, list.as_ptr(), &mut device) })?;
        Ok(Arc::new(Device { backend: backend.clone(), device, soc }))
    }
}

impl Drop for Device {
    fn drop(&mut self) {
        if let (false, Some(free)) = (self.device.is_null(), self.backend.lib.table().device_free) {
            // SAFETY: created by this library, freed once, after every context made on it
            // (each holds an `Arc` of this device).
            unsafe { free(self.device) };
        }
    }
}

/// How a phone's HTP creates a context (QNN.md, "Residency, load cost and speed on a phone"):
/// with its I/O memory estimated (QNN may then place it in another process domain), and in a
/// group of contexts sharing one spill-fill buffer of the given bytes (started by `None`, joined
/// with the group's first context). QNN's x86-64 simulator has neither (QNN.md): the runtime
/// asks for them on Android only.
#[derive(Default)]
pub struct LoadOptions<'a> {
    pub io_mem_estimation: bool,
    pub spill_fill_group: Option<(Option<&'a Context>, u64)>,
}

/// One QNN context: its graphs, and (once finalized) a binary a phone can load.
pub struct Context {
    pub(crate) device: Arc<Device>,
    pub(crate) context: ContextHandle,
}

// SAFETY: as `Backend`'s.
unsafe impl Send for Context {}

impl Context {
    /// An empty context to build graphs in. With `shared_weights`, its graphs share the
    /// static tensors they hold alike (one copy of a weight for every row bucket): a phone's
    /// HTP loads such a binary, QNN's x86-64 simulator cannot (QNN.md).
    pub fn create(device: &Arc<Device>, shared_weights: bool) -> Result<Context> {
        let t = device.backend.lib.table();
        let create = t.context_create.ok_or_else(|| Error::Other("QNN contextCreate is missing from the library's table".into()))?;
        let mut context: ContextHandle = std::ptr::null_mut();
        let htp = abi::HtpContextConfig { option: abi::HTP_CONTEXT_CONFIG_OPTION_WEIGHT_SHARING, value: [1, 0] };
        let config = abi::ContextConfig { option: abi::CONTEXT_CONFIG_OPTION_CUSTOM, custom: &htp as *const _ as *const c_void, _tail: [0; 2] };
        let list: [*const abi::ContextConfig; 2] = [&config, std::ptr::null()];
        let configs = if shared_weights { list.as_ptr() as *const *const c_void } else { std::ptr::null() };
        // SAFETY: `configs` is null or a null-terminated list whose entries (and the HTP config
        // they point to) live on this frame for the call; `context` is valid for a write.
        check("contextCreate", None, unsafe { create(device.backend.backend, device.device, configs, &mut context) })?;
        Ok(Context { device: device.clone(), context })
    }

    /// The context a binary serialized (its graphs finalized, ready to retrieve and run).
    pub fn from_binary(device: &Arc<Device>, binary: &[u8]) -> Result<Context> {
        Self::from_binary_with(device, binary, &LoadOptions::default())
    }

    /// [`from_binary`](Self::from_binary) with a phone's residency options (QnnHtpContext.h).
    pub fn from_binary_with(device: &Arc<Device>, binary: &[u8], opts: &LoadOptions) -> Result<Context> {
        let t = device.backend.lib.table();
        let create = t.context_create_from_binary.ok_or_else(|| Error::Other("QNN contextCreateFromBinary is missing from the library's table".into()))?;
        let mut context: ContextHandle = std::ptr::null_mut();
        let mut htp: Vec<abi::HtpContextConfig> = Vec::new();
        if opts.io_mem_estimation {
            htp.push(abi::HtpContextConfig { option: abi::HTP_CONTEXT_CONFIG_OPTION_IO_MEM_ESTIMATION, value: [1, 0] });
        }
        if let Some((first, spill_fill)) = opts.spill_fill_group {
            let first = first.map_or(0, |c| c.context as u64);
            htp.push(abi::HtpContextConfig { option: abi::HTP_CONTEXT_CONFIG_OPTION_REGISTER_MULTI_CONTEXTS, value: [first, spill_fill] });
        }
        let configs: Vec<abi::ContextConfig> = htp.iter().map(|h| abi::ContextConfig { option: abi::CONTEXT_CONFIG_OPTION_CUSTOM, custom: h as *const _ as *const c_void, _tail: [0; 2] }).collect();
        let mut list: Vec<*const abi::ContextConfig> = configs.iter().map(|c| c as *const _).collect();
        list.push(std::ptr::null());
        let list = if configs.is_empty() { std::ptr::null() } else { list.as_ptr() as *const *const c_void };
        // SAFETY: `binary` is readable for its length during the call (QNN copies what it
        // keeps); `list` is null or a null-terminated list whose entries (and the HTP configs
        // they point at) live on this frame; `context` is valid for a write.
        let e = with_stdout_on_stderr(|| unsafe {
            create(device.backend.backend, device.device, list, binary.as_ptr() as *const c_void, binary.len() as u64, &mut context, std::ptr::null_mut())
        });
        check("contextCreateFromBinary", None, e)?;
        Ok(Context { device: device.clone(), context })
    }

    pub fn device(&self) -> &Arc<Device> {
        &self.device
    }

    pub(crate) fn table(&self) -> &abi::FunctionTable {
        self.device.backend.lib.table()
    }

    /// The serialized context: every finalized graph, prepared for the device's SoC.
    pub fn binary(&self) -> Result<Vec<u8>> {
        let t = self.table();
        let (size_of, get) = match (t.context_get_binary_size, t.context_get_binary) {
            (Some(s), Some(g)) => (s, g),
            _ => return Err(Error::Other("QNN contextGetBinarySize or contextGetBinary is missing from the library's table".into())),
        };
        let mut size = 0u64;
        // SAFETY: `size` is valid for a write.
        check("contextGetBinarySize", None, unsafe { size_of(self.context, &mut size) })?;
        let mut buf = vec![0u8; size as usize];
        let mut written = 0u64;
        // SAFETY: `buf` is writable for `size` bytes; `written` is valid for a write.
        check("contextGetBinary", None, unsafe { get(self.context, buf.as_mut_ptr() as *mut c_void, size, &mut written) })?;
        buf.truncate(written.min(size) as usize);
        Ok(buf)
    }

    /// A finalized graph of this context, by name.
    pub fn graph(&self, name: &str) -> Result<Graph> {
        let retrieve = self.table().graph_retrieve.ok_or_else(|| Error::Other("QNN graphRetrieve is missing from the library's table".into()))?;
        let c = CString::new(name).map_err(|_| Error::Other(format!("graph name '{name}' holds a NUL byte")))?;
        let mut graph: GraphHandle = std::ptr::null_mut();
        // SAFETY: `c` is a NUL-terminated string alive for the call; `graph` valid for a write.
        check("graphRetrieve", Some(name), unsafe { retrieve(self.context, c.as_ptr(), &mut graph) })?;
        Ok(Graph { name: name.to_string(), graph })
    }

    /// Runs `graph` once: `inputs` are read, `outputs` written, each a client buffer whose
    /// shape and type the graph was built with.
    pub fn execute(&mut self, graph: &Graph, inputs: &mut [IoBuffer], outputs: &mut [IoBuffer]) -> Result<()> {
        let execute = self.table().graph_execute.ok_or_else(|| Error::Other("QNN graphExecute is missing from the library's table".into()))?;
        for b in inputs.iter().chain(outputs.iter()) {
            b.check()?;
        }
        let ins: Vec<Tensor> = inputs.iter_mut().map(|b| b.tensor(abi::TENSOR_TYPE_APP_WRITE)).collect();
        let mut outs: Vec<Tensor> = outputs.iter_mut().map(|b| b.tensor(abi::TENSOR_TYPE_APP_READ)).collect();
        // SAFETY: every tensor points at a buffer of `bytes` bytes (checked against its shape
        // above) that the caller lends for the call: inputs readable, outputs writable; the
        // names and dimensions live in the `IoBuffer`s, which outlive the call.
        let e = unsafe { execute(graph.graph, ins.as_ptr(), ins.len() as u32, outs.as_mut_ptr(), outs.len() as u32, std::ptr::null_mut(), std::ptr::null_mut()) };
        check("graphExecute", Some(&graph.name), e)
    }
}

impl Drop for Context {
    fn drop(&mut self) {
        if let (false, Some(free)) = (self.context.is_null(), self.table().context_free) {
            // SAFETY: created by this library and freed once; its graphs are not used after.
            unsafe { free(self.context, std::ptr::null_mut()) };
        }
    }
}

/// A graph of a context, retrieved or built there.
pub struct Graph {
    pub name: String,
    pub(crate) graph: GraphHandle,
}

// SAFETY: a handle; it is executed only through its context's `&mut`.
unsafe impl Send for Graph {}

/// One graph input or output over the caller's memory: QNN's tensor id and name (as the
/// graph's builder recorded them), its type and shape, and the buffer.
pub struct IoBuffer {
    pub id: u32,
    pub name: CString,
    pub data_type: u32,
    pub dims: Vec<u32>,
    pub data: *mut c_void,
    pub bytes: usize,
}

impl IoBuffer {
    /// Bytes of one element of `data_type` (the types the lowering uses).
    pub fn element_bytes(data_type: u32) -> Option<usize> {
        match data_type {
            abi::DATATYPE_FLOAT_16 | abi::DATATYPE_UFIXED_POINT_16 => Some(2),
            abi::DATATYPE_FLOAT_32 | abi::DATATYPE_INT_32 | abi::DATATYPE_UINT_32 => Some(4),
            abi::DATATYPE_BOOL_8 => Some(1),
            _ => None,
        }
    }

    fn check(&self) -> Result<()> {
        let name = self.name.to_string_lossy();
        let need = Self::element_bytes(self.data_type).and_then(|e| self.dims.iter().try_fold(e, |n, &d| n.checked_mul(d as usize)));
        match need {
            Some(n) if n == self.bytes && n <= u32::MAX as usize && !self.data.is_null() => Ok(()),
            _ => Err(Error::Other(format!("QNN tensor '{name}': a buffer of {} bytes does not hold shape {:?} of type {:#x}", self.bytes, self.dims, self.data_type))),
        }
    }

    fn tensor(&mut self, tensor_type: u32) -> Tensor {
        Tensor {
            version: abi::TENSOR_VERSION_1,
            v1: abi::TensorV1 {
                id: self.id,
                name: self.name.as_ptr(),
                tensor_type,
                data_format: 0,
                data_type: self.data_type,
                quantize: abi::QuantizeParams::NONE,
                rank: self.dims.len() as u32,
                dimensions: self.dims.as_mut_ptr(),
                mem_type: abi::TENSORMEMTYPE_RAW,
                client_buf: abi::ClientBuffer { data: self.data, data_size: self.bytes as u32 },
            },
            _v2_tail: [0; 3],
        }
    }
}
