//! Building a graph in a context, op by op, then finalizing it for the device's SoC. Every
//! name, shape and static datum handed to QNN lives in the builder until the graph is
//! finalized (QNN reads them during the calls; holding them longer costs only memory).

use std::ffi::{c_void, CString};

use crate::abi::{self, GraphHandle, Param, ParamValue, Scalar, Tensor};
use crate::context::Context;
use crate::{check, Error, Result};

/// A tensor of the graph being built (an index into the builder's tensors).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TensorRef(usize);

/// What an op's output is: an intermediate, or a graph output the caller reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Out {
    Native,
    AppRead,
}

/// The tensor an op produces: its name, element type and shape, who reads it, and its static
/// fixed-point encoding (`QuantizeParams::NONE`: a float).
#[derive(Debug, Clone, Copy)]
pub struct Output<'a> {
    pub name: &'a str,
    pub data_type: u32,
    pub dims: &'a [u32],
    pub out: Out,
    pub quantize: abi::QuantizeParams,
}

impl<'a> Output<'a> {
    /// An output without an encoding.
    pub fn new(name: &'a str, data_type: u32, dims: &'a [u32], out: Out) -> Output<'a> {
        Output { name, data_type, dims, out, quantize: abi::QuantizeParams::NONE }
    }

    /// The same output, fixed point with the static encoding `quantize`.
    pub fn quantized(self, quantize: abi::QuantizeParams) -> Output<'a> {
        Output { quantize, ..self }
    }
}

/// An op parameter.
pub enum ParamSpec {
    U32(&'static str, u32),
    I32(&'static str, i32),
    F32(&'static str, f32),
    Bool(&'static str, bool),
    /// A static uint32 tensor parameter (axes, perm).
    U32s(&'static str, Vec<u32>),
    /// A static int32 tensor parameter `[rows, cols]` (StridedSlice's ranges).
    I32s(&'static str, Vec<u32>, Vec<i32>),
    /// A static uint32 tensor parameter of the given shape (Conv2d's pad_amount).
    U32Grid(&'static str, Vec<u32>, Vec<u32>),
}

struct Built {
    tensor: Tensor,
    dims: Vec<u32>,
}

pub struct GraphBuilder<'c> {
    context: &'c Context,
    pub name: String,
    graph: GraphHandle,
    names: Vec<CString>,
    tensors: Vec<Built>,
    /// Static data and quantization scales, kept until finalize.
    data: Vec<Vec<u8>>,
    scale_offsets: Vec<Vec<abi::ScaleOffset>>,
    scales: Vec<Vec<f32>>,
    block_scales: Vec<Vec<u8>>,
    expansions: Vec<Box<abi::BlockwiseExpansion>>,
    ops: usize,
}

impl<'c> GraphBuilder<'c> {
    pub fn new(context: &'c Context, name: &str) -> Result<GraphBuilder<'c>> {
        Self::with_optimization(context, name, None)
    }

    /// A graph prepared at HTP optimization `level` (1 to 3; `None`: the library's default).
    pub fn with_optimization(context: &'c Context, name: &str, level: Option<u32>) -> Result<GraphBuilder<'c>> {
        let create = context.table().graph_create.ok_or_else(|| Error::Other("QNN graphCreate is missing from the library's table".into()))?;
        let c = cstring(name)?;
        let mut graph: GraphHandle = std::ptr::null_mut();
        let htp = abi::HtpGraphConfig { option: abi::HTP_GRAPH_CONFIG_OPTION_OPTIMIZATION, _pad: 0, value: [abi::HTP_GRAPH_OPTIMIZATION_TYPE_FINALIZE_OPTIMIZATION_FLAG, (level.unwrap_or(0) as f32).to_bits()], _tail: [0; 3] };
        let config = abi::GraphConfig { option: abi::GRAPH_CONFIG_OPTION_CUSTOM, custom: &htp as *const abi::HtpGraphConfig as *const std::ffi::c_void };
        let list: [*const abi::GraphConfig; 2] = [&config, std::ptr::null()];
        let configs = if level.is_some() { list.as_ptr() as *const *const std::ffi::c_void } else { std::ptr::null() };
        // SAFETY: `c` is NUL-terminated and alive for the call; `configs` is null or a
        // null-terminated list whose entries (and the HTP config they point at) live on this
        // frame; `graph` is valid for a write.
        check("graphCreate", Some(name), unsafe { create(context.context, c.as_ptr(), configs, &mut graph) })?;
        Ok(GraphBuilder { context, name: name.to_string(), graph, names: vec![c], tensors: Vec::new(), data: Vec::new(), scale_offsets: Vec::new(), scales: Vec::new(), block_scales: Vec::new(), expansions: Vec::new(), ops: 0 })
    }

    /// QNN's id of a tensor (what execution names it by).
    pub fn id(&self, t: TensorRef) -> u32 {
        self.tensors[t.0].tensor.v1.id
    }

    pub fn dims(&self, t: TensorRef) -> &[u32] {
        &self.tensors[t.0].dims
    }

    fn create(&mut self, name: &str, tensor_type: u32, data_type: u32, dims: &[u32], data: Option<Vec<u8>>) -> Result<TensorRef> {
        self.create_quantized(name, tensor_type, data_type, dims, data, abi::QuantizeParams::NONE)
    }

    fn create_quantized(&mut self, name: &str, tensor_type: u32, data_type: u32, dims: &[u32], data: Option<Vec<u8>>, quantize: abi::QuantizeParams) -> Result<TensorRef> {
        let create = self.context.table().tensor_create_graph_tensor.ok_or_else(|| Error::Other("QNN tensorCreateGraphTensor is missing from the library's table".into()))?;
        let c = cstring(name)?;
        let mut dims = dims.to_vec();
        let (ptr, size) = match data {
            Some(mut d) => {
                let p = d.as_mut_ptr() as *mut c_void;
                let n = d.len();
                self.data.push(d);
                (p, n)
            }
            None => (std::ptr::null_mut(), 0),
        };
        if size > u32::MAX as usize {
            return Err(Error::Other(format!("QNN tensor '{name}' of graph '{}': {size} bytes exceed a tensor's 32-bit size", self.name)));
        }
        let mut tensor = Tensor {
            version: abi::TENSOR_VERSION_1,
            v1: abi::TensorV1 {
                id: 0,
                name: c.as_ptr(),
                tensor_type,
                data_format: 0,
                data_type,
                quantize,
                rank: dims.len() as u32,
                dimensions: dims.as_mut_ptr(),
                mem_type: abi::TENSORMEMTYPE_RAW,
                client_buf: abi::ClientBuffer { data: ptr, data_size: size as u32 },
            },
            _v2_tail: [0; 3],
        };
        // SAFETY: the name, dimensions and data point at memory the builder keeps until
        // finalize (a `Vec`'s heap buffer does not move when the `Vec` does); QNN writes the id.
        check("tensorCreateGraphTensor", Some(&self.name), unsafe { create(self.graph, &mut tensor) })?;
        self.names.push(c);
        self.tensors.push(Built { tensor, dims });
        Ok(TensorRef(self.tensors.len() - 1))
    }

    /// A graph input the caller writes before each execution.
    pub fn input(&mut self, name: &str, data_type: u32, dims: &[u32]) -> Result<TensorRef> {
        self.create(name, abi::TENSOR_TYPE_APP_WRITE, data_type, dims, None)
    }

    /// A static fp16 tensor (weights), from f16 bits.
    pub fn static_f16(&mut self, name: &str, dims: &[u32], bits: &[u16]) -> Result<TensorRef> {
        self.static_bytes(name, abi::DATATYPE_FLOAT_16, dims, bits.iter().flat_map(|b| b.to_le_bytes()).collect())
    }

    pub fn static_bytes(&mut self, name: &str, data_type: u32, dims: &[u32], bytes: Vec<u8>) -> Result<TensorRef> {
        let n: u64 = dims.iter().map(|&d| d as u64).product::<u64>() * crate::IoBuffer::element_bytes(data_type).unwrap_or(1) as u64;
        if n != bytes.len() as u64 {
            return Err(Error::Other(format!("QNN static tensor '{name}': {} bytes for shape {dims:?}", bytes.len())));
        }
        self.create(name, abi::TENSOR_TYPE_STATIC, data_type, dims, Some(bytes))
    }

    /// A static signed weight of `bits` (8, or 4 in an int8 container) with one symmetric
    /// scale per channel of axis 0 (`scales.len() == dims[0]`): `(q) * scale`.
    pub fn static_per_channel(&mut self, name: &str, dims: &[u32], values: Vec<i8>, scales: Vec<f32>, bits: u32) -> Result<TensorRef> {
        self.static_per_channel_on(name, dims, 0, values, scales, bits)
    }

    /// [`static_per_channel`](Self::static_per_channel) with the channels along `axis` (a 1x1
    /// convolution's HWIO weight has them on axis 3).
    pub fn static_per_channel_on(&mut self, name: &str, dims: &[u32], axis: usize, values: Vec<i8>, scales: Vec<f32>, bits: u32) -> Result<TensorRef> {
        let n: u64 = dims.iter().map(|&d| d as u64).product();
        if n != values.len() as u64 || dims.get(axis).map(|&d| d as usize) != Some(scales.len()) || !(bits == 8 || bits == 4) {
            return Err(Error::Other(format!("QNN static tensor '{name}': {} values, {} scales, {bits} bits for shape {dims:?}", values.len(), scales.len())));
        }
        // The encoding points at the scales: kept until finalize, like the data (a `Vec`'s
        // heap buffer does not move when the `Vec` does).
        let quantize = if bits == 8 {
            self.scale_offsets.push(scales.iter().map(|&scale| abi::ScaleOffset { scale, offset: 0 }).collect());
            abi::QuantizeParams::axis(axis as i32, self.scale_offsets.last().expect("just pushed"))
        } else {
            self.scales.push(scales);
            abi::QuantizeParams::bw_axis(4, axis as i32, self.scales.last().expect("just pushed"))
        };
        let bytes = values.into_iter().map(|v| v as u8).collect();
        self.create_quantized(name, abi::TENSOR_TYPE_STATIC, abi::DATATYPE_SFIXED_POINT_8, dims, Some(bytes), quantize)
    }

    /// A static 1x1-convolution weight `[1, 1, k, n]` (HWIO) of signed 4-bit `values` (in an
    /// int8 container, HWIO order) with per-block scales (LPBQ): block `b` of the `k` inputs
    /// of output channel `c` is scaled by `channel_scales[c] * block_scales[c * blocks + b]`.
    pub fn static_lpbq(&mut self, name: &str, k: u32, n: u32, values: Vec<i8>, channel_scales: Vec<f32>, block_scales: Vec<u8>) -> Result<TensorRef> {
        let blocks = block_scales.len() / n.max(1) as usize;
        if values.len() != (k * n) as usize || channel_scales.len() != n as usize || blocks == 0 || block_scales.len() != blocks * n as usize || k as usize % blocks != 0 {
            return Err(Error::Other(format!("QNN static tensor '{name}': {} values, {} channel scales, {} block scales for a {k}x{n} weight", values.len(), channel_scales.len(), block_scales.len())));
        }
        self.scale_offsets.push(channel_scales.iter().map(|&scale| abi::ScaleOffset { scale, offset: 0 }).collect());
        self.block_scales.push(block_scales);
        // The expansion and what it points at stay in the builder until finalize (boxed and
        // heap buffers do not move when their owners do).
        self.expansions.push(Box::new(abi::BlockwiseExpansion {
            axis: 3,
            scale_offsets: self.scale_offsets.last().expect("just pushed").as_ptr(),
            blocks_per_axis: blocks as u32,
            // 4-bit block scales stored in bytes (ExecuTorch's LPBQ: 8 - 4).
            block_scale_bitwidth: 4,
            storage: abi::BLOCK_SCALE_STORAGE_8,
            block_scales: self.block_scales.last().expect("just pushed").as_ptr(),
        }));
        let quantize = abi::QuantizeParams::blockwise(self.expansions.last().expect("just pushed"));
        let bytes = values.into_iter().map(|v| v as u8).collect();
        self.create_quantized(name, abi::TENSOR_TYPE_STATIC, abi::DATATYPE_SFIXED_POINT_8, &[1, 1, k, n], Some(bytes), quantize)
    }

    /// Adds op `op_type` (QNN's name: "FullyConnected", "RmsNorm"...) reading `inputs`, with
    /// `params`, producing one tensor, `output`.
    pub fn op(&mut self, op_type: &str, inputs: &[TensorRef], params: Vec<ParamSpec>, output: Output) -> Result<TensorRef> {
        let add = self.context.table().graph_add_node.ok_or_else(|| Error::Other("QNN graphAddNode is missing from the library's table".into()))?;
        let Output { name: out_name, data_type, dims, out, quantize } = output;
        let tensor_type = match out {
            Out::Native => abi::TENSOR_TYPE_NATIVE,
            Out::AppRead => abi::TENSOR_TYPE_APP_READ,
        };
        let output = self.create_quantized(out_name, tensor_type, data_type, dims, None, quantize)?;
        // Tensor parameters are graph tensors created before the node (else 6001: QNN.md).
        let mut built: Vec<Param> = Vec::with_capacity(params.len());
        for p in params {
            let scalar = |data_type: u32, bits: u64| (abi::PARAMTYPE_SCALAR, ParamValue { scalar: Scalar { data_type, bits } });
            let (name, (param_type, value)) = match p {
                ParamSpec::U32(n, v) => (n, scalar(abi::DATATYPE_UINT_32, v as u64)),
                ParamSpec::I32(n, v) => (n, scalar(abi::DATATYPE_INT_32, v as u32 as u64)),
                ParamSpec::F32(n, v) => (n, scalar(abi::DATATYPE_FLOAT_32, v.to_bits() as u64)),
                ParamSpec::Bool(n, v) => (n, scalar(abi::DATATYPE_BOOL_8, v as u64)),
                ParamSpec::U32s(n, v) => {
                    let t = self.static_bytes(&format!("{out_name}.{n}"), abi::DATATYPE_UINT_32, &[v.len() as u32], v.iter().flat_map(|x| x.to_le_bytes()).collect())?;
                    (n, (abi::PARAMTYPE_TENSOR, ParamValue { tensor: self.tensors[t.0].tensor }))
                }
                ParamSpec::U32Grid(n, dims, v) => {
                    let t = self.static_bytes(&format!("{out_name}.{n}"), abi::DATATYPE_UINT_32, &dims, v.iter().flat_map(|x| x.to_le_bytes()).collect())?;
                    (n, (abi::PARAMTYPE_TENSOR, ParamValue { tensor: self.tensors[t.0].tensor }))
                }
                ParamSpec::I32s(n, dims, v) => {
                    let t = self.static_bytes(&format!("{out_name}.{n}"), abi::DATATYPE_INT_32, &dims, v.iter().flat_map(|x| x.to_le_bytes()).collect())?;
                    (n, (abi::PARAMTYPE_TENSOR, ParamValue { tensor: self.tensors[t.0].tensor }))
                }
            };
            let name = cstring(name)?;
            built.push(Param { param_type, name: name.as_ptr(), value });
            self.names.push(name);
        }
        let mut ins: Vec<Tensor> = inputs.iter().map(|t| self.tensors[t.0].tensor).collect();
        let mut outs = vec![self.tensors[output.0].tensor];
        let node = cstring(&format!("{out_name}.op"))?;
        let config = abi::OpConfig {
            version: abi::OPCONFIG_VERSION_1,
            name: node.as_ptr(),
            package_name: c"qti.aisw".as_ptr(),
            type_name: cstring(op_type)?.into_raw(),
            num_params: built.len() as u32,
            params: built.as_mut_ptr(),
            num_inputs: ins.len() as u32,
            inputs: ins.as_mut_ptr(),
            num_outputs: 1,
            outputs: outs.as_mut_ptr(),
        };
        // SAFETY: every pointer in `config` (names, params, tensors and theirs) is alive for the
        // call; the tensors were created in this graph.
        let e = unsafe { add(self.graph, config) };
        // Reclaim the type name `into_raw` lent to the call.
        // SAFETY: the pointer came from `CString::into_raw` just above and is freed once.
        drop(unsafe { CString::from_raw(config.type_name as *mut std::ffi::c_char) });
        self.names.push(node);
        self.ops += 1;
        check("graphAddNode", Some(&self.name), e).map_err(|err| match err {
            Error::Call { code, graph, .. } => Error::Other(format!("QNN graphAddNode of {op_type} '{out_name}' (graph '{}') failed with error {code}", graph.unwrap_or_default())),
            other => other,
        })?;
        Ok(output)
    }

    /// Finalizes the graph: QNN prepares it for the device's SoC.
    pub fn finalize(self) -> Result<usize> {
        self.finalize_with(None)
    }

    /// Finalizes the graph, recording into `profile` (where the library models the SoC, its
    /// performance estimate: [`crate::Profile::estimate`]).
    pub fn finalize_with(self, profile: Option<&crate::Profile>) -> Result<usize> {
        let finalize = self.context.table().graph_finalize.ok_or_else(|| Error::Other("QNN graphFinalize is missing from the library's table".into()))?;
        // The op trace's schematic, which QNN writes into the working directory: removed
        // unless a file of that name was there before.
        let schematic = profile.filter(|p| p.optrace).map(|_| std::path::PathBuf::from(format!("{}_schematic.bin", self.name))).filter(|p| !p.exists());
        let profile = profile.map_or(std::ptr::null_mut(), |p| p.handle);
        // SAFETY: the graph belongs to this context; the profile is null or live; no signal.
        let e = crate::library::with_stdout_on_stderr(|| unsafe { finalize(self.graph, profile, std::ptr::null_mut()) });
        if let Some(p) = schematic {
            let _ = std::fs::remove_file(p);
        }
        check("graphFinalize", Some(&self.name), e)?;
        Ok(self.ops)
    }
}

fn cstring(s: &str) -> Result<CString> {
    CString::new(s).map_err(|_| Error::Other(format!("QNN name '{s}' holds a NUL byte")))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Context, Device, IoBuffer, QnnLibrary};

    /// The simulator computed zeros for one test's graph while another test finalized graphs
    /// on other threads (seen 1 run in 4): these tests take turns.
    static SIMULATOR: std::sync::Mutex<()> = std::sync::Mutex::new(());

    /// The simulator's turn, held for the test, and the fetched library (`LLADA_QNN_LIB`).
    fn library() -> (std::sync::MutexGuard<'static, ()>, std::sync::Arc<QnnLibrary>) {
        let turn = SIMULATOR.lock().unwrap_or_else(|e| e.into_inner());
        (turn, QnnLibrary::open(None).expect("LLADA_QNN_LIB names the fetched library"))
    }

    fn f16(x: f32) -> u16 {
        // Round to nearest even through f32 bits: enough for the small test values here.
        let b = x.to_bits();
        let sign = ((b >> 16) & 0x8000) as u16;
        let exp = ((b >> 23) & 0xff) as i32 - 127 + 15;
        if x == 0.0 {
            return sign;
        }
        let mant = b & 0x7f_ffff;
        let half = (mant >> 13) as u16;
        let round = (mant >> 12) & 1 != 0 && ((mant & 0xfff) != 0 || half & 1 != 0);
        (sign | ((exp as u16) << 10) | half) + round as u16
    }

    /// The fp16 `data` of tensor `id` (`name`, `dims`), bound for an execution.
    fn f16_buffer(id: u32, name: &std::ffi::CStr, dims: Vec<u32>, data: &mut [u16]) -> IoBuffer {
        IoBuffer { id, name: name.into(), data_type: abi::DATATYPE_FLOAT_16, dims, data: data.as_mut_ptr().cast(), bytes: data.len() * 2 }
    }

    fn f32_of(h: u16) -> f32 {
        let sign = if h & 0x8000 != 0 { -1.0 } else { 1.0 };
        let exp = ((h >> 10) & 0x1f) as i32;
        let mant = (h & 0x3ff) as f32;
        if exp == 0 {
            return sign * mant * 2f32.powi(-24);
        }
        sign * (1.0 + mant / 1024.0) * 2f32.powi(exp - 15)
    }

    /// Needs the library (`LLADA_QNN_LIB`; CI fetches it). One FullyConnected over a static
    /// fp16 weight, built for SM8650, serialized, reloaded from its binary in a fresh context,
    /// retrieved by name and executed by the ids the builder recorded: the round trip the
    /// artifact relies on.
    #[test]
    #[ignore]
    fn a_graph_built_serialized_and_reloaded_computes_its_product() {
        let (_turn, lib) = library();
        let backend = lib.backend().unwrap();
        let device = Device::new(&backend, 57).unwrap();
        let (rows, k, n) = (4u32, 8u32, 3u32);
        let w: Vec<f32> = (0..n * k).map(|i| ((i % 7) as f32 - 3.0) / 4.0).collect();
        let x: Vec<f32> = (0..rows * k).map(|i| ((i % 5) as f32 - 2.0) / 2.0).collect();
        let (binary, x_id, y_id) = {
            let ctx = Context::create(&device, false).unwrap();
            let mut g = GraphBuilder::new(&ctx, "fc").unwrap();
            let xi = g.input("x", abi::DATATYPE_FLOAT_16, &[rows, k]).unwrap();
            let wt = g.static_f16("w", &[n, k], &w.iter().map(|&v| f16(v)).collect::<Vec<_>>()).unwrap();
            let y = g.op("FullyConnected", &[xi, wt], vec![], Output::new("y", abi::DATATYPE_FLOAT_16, &[rows, n], Out::AppRead)).unwrap();
            let ids = (g.id(xi), g.id(y));
            assert_eq!(g.finalize().unwrap(), 1);
            (ctx.binary().unwrap(), ids.0, ids.1)
        };
        assert!(!binary.is_empty());
        // The binary says what it was built for, and its graph's I/O as the builder recorded it.
        let desc = crate::system::describe(&lib.dir, &binary).unwrap();
        assert_eq!(desc.soc_model, Some(57));
        assert_eq!(desc.graphs.len(), 1);
        assert_eq!((desc.graphs[0].inputs[0].id, desc.graphs[0].inputs[0].dims.as_slice()), (x_id, &[rows, k][..]));
        assert_eq!((desc.graphs[0].outputs[0].id, desc.graphs[0].outputs[0].name.as_str()), (y_id, "y"));
        let mut ctx = Context::from_binary(&device, &binary).unwrap();
        let graph = ctx.graph("fc").unwrap();
        let mut xs: Vec<u16> = x.iter().map(|&v| f16(v)).collect();
        let mut ys = vec![0u16; (rows * n) as usize];
        let mut ins = [f16_buffer(x_id, c"x", vec![rows, k], &mut xs)];
        let mut outs = [f16_buffer(y_id, c"y", vec![rows, n], &mut ys)];
        ctx.execute(&graph, &mut ins, &mut outs).unwrap();
        for r in 0..rows as usize {
            for c in 0..n as usize {
                let want: f32 = (0..k as usize).map(|i| x[r * k as usize + i] * w[c * k as usize + i]).sum();
                let got = f32_of(ys[r * n as usize + c]);
                assert!((got - want).abs() <= 1e-2 * want.abs().max(1.0), "y[{r}][{c}] = {got}, want {want}");
            }
        }
        // A graph the binary does not hold is one error naming the call and the graph.
        let e = ctx.graph("nope").err().unwrap().to_string();
        assert!(e.contains("graphRetrieve") && e.contains("'nope'"), "{e}");
    }

    /// Needs the library. Three row buckets of one layer over the same 256x256 weight: with
    /// weight sharing the context holds the weight once (a much smaller binary), and the
    /// simulator refuses to reload such a binary (QNN.md), which the runtime must say.
    #[test]
    #[ignore]
    fn weight_shared_contexts_hold_a_weight_once() {
        let (_turn, lib) = library();
        let backend = lib.backend().unwrap();
        let device = Device::new(&backend, 69).unwrap();
        let (k, n) = (256u32, 256u32);
        let w: Vec<u16> = (0..n * k).map(|i| f16(((i * 37 % 101) as f32 - 50.0) / 64.0)).collect();
        let build = |shared: bool| {
            let ctx = Context::create(&device, shared).unwrap();
            for rows in [16u32, 32, 64] {
                let mut g = GraphBuilder::new(&ctx, &format!("fc{rows}")).unwrap();
                let xi = g.input("x", abi::DATATYPE_FLOAT_16, &[rows, k]).unwrap();
                let wt = g.static_f16("w", &[n, k], &w).unwrap();
                g.op("FullyConnected", &[xi, wt], vec![], Output::new("y", abi::DATATYPE_FLOAT_16, &[rows, n], Out::AppRead)).unwrap();
                g.finalize().unwrap();
            }
            ctx.binary().unwrap()
        };
        let (unshared, shared) = (build(false), build(true));
        let weight = (2 * n * k) as usize;
        assert!(unshared.len() > 3 * weight, "{} bytes unshared", unshared.len());
        assert!(shared.len() < 2 * weight, "{} bytes shared", shared.len());
        if cfg!(target_arch = "x86_64") {
            assert!(Context::from_binary(&device, &shared).is_err(), "the simulator reloaded a weight-shared binary");
        }
    }

    /// Needs the library. A 1x1 Conv2d over an LPBQ weight (int4, per-block scales) with
    /// 16-bit activations, inside an fp16 graph: Quantize in, Dequantize out (QNN.md: LPBQ needs
    /// fixed-point activations; FullyConnected with it is unreliable).
    #[test]
    #[ignore]
    fn an_lpbq_convolution_between_fp16_ops_computes_its_product() {
        let (_turn, lib) = library();
        let backend = lib.backend().unwrap();
        let device = Device::new(&backend, 57).unwrap();
        let (rows, k, n, block) = (8u32, 128u32, 64u32, 64u32);
        let blocks = k / block;
        // Weights: int4 values in HWIO order ([k][n]), channel scales, 4-bit block scales.
        let q: Vec<i8> = (0..k * n).map(|i| ((i * 7 % 15) as i8) - 7).collect();
        let channel: Vec<f32> = (0..n).map(|c| 0.01 + c as f32 * 1e-4).collect();
        let bscale: Vec<u8> = (0..n * blocks).map(|i| (i % 16) as u8 + 1).collect();
        let w = |kk: u32, c: u32| q[(kk * n + c) as usize] as f32 * channel[c as usize] * bscale[(c * blocks + kk / block) as usize] as f32;
        let x: Vec<f32> = (0..rows * k).map(|i| ((i % 9) as f32 - 4.0) / 4.0).collect();
        let want: Vec<f32> = (0..rows * n).map(|i| (0..k).map(|kk| x[(i / n * k + kk) as usize] * w(kk, i % n)).sum()).collect();
        let range = |v: &[f32]| v.iter().fold(0f32, |m, &a| m.max(a.abs()));
        let u16_encoding = |max: f32| abi::QuantizeParams::scale_offset(2.0 * max / 65535.0, -32768);
        let ctx = Context::create(&device, false).unwrap();
        let mut g = GraphBuilder::new(&ctx, "lpbq").unwrap();
        let xi = g.input("x", abi::DATATYPE_FLOAT_16, &[rows, k]).unwrap();
        let x4 = g.op("Reshape", &[xi], vec![], Output::new("x4", abi::DATATYPE_FLOAT_16, &[1, 1, rows, k], Out::Native)).unwrap();
        let xq = g.op("Quantize", &[x4], vec![], Output::new("xq", abi::DATATYPE_UFIXED_POINT_16, &[1, 1, rows, k], Out::Native).quantized(u16_encoding(range(&x)))).unwrap();
        let wt = g.static_lpbq("w", k, n, q.clone(), channel.clone(), bscale.clone()).unwrap();
        let params = vec![ParamSpec::U32s("stride", vec![1, 1]), ParamSpec::U32Grid("pad_amount", vec![2, 2], vec![0; 4])];
        let yq = g.op("Conv2d", &[xq, wt], params, Output::new("yq", abi::DATATYPE_UFIXED_POINT_16, &[1, 1, rows, n], Out::Native).quantized(u16_encoding(range(&want)))).unwrap();
        let y4 = g.op("Dequantize", &[yq], vec![], Output::new("y4", abi::DATATYPE_FLOAT_16, &[1, 1, rows, n], Out::Native)).unwrap();
        let y = g.op("Reshape", &[y4], vec![], Output::new("y", abi::DATATYPE_FLOAT_16, &[rows, n], Out::AppRead)).unwrap();
        let (x_id, y_id) = (g.id(xi), g.id(y));
        g.finalize().unwrap();
        let mut xs: Vec<u16> = x.iter().map(|&v| f16(v)).collect();
        let mut ys = vec![0u16; (rows * n) as usize];
        let mut ins = [f16_buffer(x_id, c"x", vec![rows, k], &mut xs)];
        let mut outs = [f16_buffer(y_id, c"y", vec![rows, n], &mut ys)];
        let mut ctx = ctx;
        let graph = ctx.graph("lpbq").unwrap();
        ctx.execute(&graph, &mut ins, &mut outs).unwrap();
        let scale = range(&want);
        let worst = ys.iter().zip(&want).map(|(&g, &w)| (f32_of(g) - w).abs()).fold(0f32, f32::max);
        assert!(worst <= 2e-3 * scale, "worst error {worst} of range {scale}");
    }

    /// Needs the library. QNN's performance model at finalize: an estimate for SoC 72 (a v81
    /// HTP it models), none for SM8650 (57), which it does not.
    #[test]
    #[ignore]
    fn finalize_reports_the_htps_estimate_where_the_library_models_the_soc() {
        let (_turn, lib) = library();
        let backend = lib.backend().unwrap();
        let estimate = |soc: u32, rows: u32| {
            let device = Device::new(&backend, soc).unwrap();
            let ctx = Context::create(&device, false).unwrap();
            let profile = crate::Profile::new(&device).unwrap();
            let (k, n) = (1024u32, 1024u32);
            let w = vec![f16(0.01); (n * k) as usize];
            let mut g = GraphBuilder::new(&ctx, "fc").unwrap();
            let xi = g.input("x", abi::DATATYPE_FLOAT_16, &[rows, k]).unwrap();
            let wt = g.static_f16("w", &[n, k], &w).unwrap();
            g.op("FullyConnected", &[xi, wt], vec![], Output::new("y", abi::DATATYPE_FLOAT_16, &[rows, n], Out::AppRead)).unwrap();
            g.finalize_with(Some(&profile)).unwrap();
            let events = profile.events().unwrap();
            eprintln!("soc {soc}, {rows} rows: {events:#?}");
            crate::Profile::estimate(&events)
        };
        let a = estimate(72, 64).expect("SoC 72 has an estimate");
        assert!(a.micros > 0 && a.cycles > a.micros, "{a:?}");
        // Deterministic, and more rows cost no less.
        assert_eq!(estimate(72, 64), Some(a));
        assert!(estimate(72, 512).unwrap().micros >= a.micros);
        assert_eq!(estimate(57, 64), None);
    }
}
