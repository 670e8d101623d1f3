//! Our own declarations of the QNN C ABI, for the library version the runtime loads: QAIRT
//! 2.51 (core API 2.40, HTP API 5.51), as `../shared/docs/QNN.md` records it. Only what
//! lladac and the runtime call is typed; the rest of the function table is held as opaque
//! slots, so the layout matches the library's. The tests pin every size and offset the runtime relies on
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
pub type DeviceHandle = *mut c_void;
pub type ContextHandle = *mut c_void;
pub type GraphHandle = *mut c_void;

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

/// `Qnn_DataType_t` values the lowering uses.
pub const DATATYPE_INT_32: u32 = 0x032;
/// Signed fixed point in 8 bits: int8 weights, and int4 ones in its container (QNN.md).
pub const DATATYPE_SFIXED_POINT_8: u32 = 0x308;
pub const DATATYPE_UFIXED_POINT_16: u32 = 0x416;
pub const DATATYPE_UINT_32: u32 = 0x132;
pub const DATATYPE_FLOAT_16: u32 = 0x216;
pub const DATATYPE_FLOAT_32: u32 = 0x232;
pub const DATATYPE_BOOL_8: u32 = 0x508;

/// `Qnn_TensorType_t`. (`APP_READWRITE`, 2, is refused by the HTP: QNN.md.)
pub const TENSOR_TYPE_APP_WRITE: u32 = 0;
pub const TENSOR_TYPE_APP_READ: u32 = 1;
pub const TENSOR_TYPE_NATIVE: u32 = 3;
pub const TENSOR_TYPE_STATIC: u32 = 4;

/// `Qnn_TensorVersion_t`, `Qnn_OpConfigVersion_t`, `Qnn_ParamType_t`, memory types.
pub const TENSOR_VERSION_1: u32 = 1;
pub const OPCONFIG_VERSION_1: u32 = 1;
pub const PARAMTYPE_SCALAR: u32 = 0;
pub const PARAMTYPE_TENSOR: u32 = 1;
pub const TENSORMEMTYPE_RAW: u32 = 0;
/// `QNN_DEFINITION_UNDEFINED` and `QNN_QUANTIZATION_ENCODING_UNDEFINED`: a float tensor.
pub const UNDEFINED: u32 = 0x7FFF_FFFF;

/// `Qnn_ClientBuffer_t`: tensor data in the client's own memory.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct ClientBuffer {
    pub data: *mut c_void,
    pub data_size: u32,
}

/// `QNN_DEFINITION_DEFINED`: the tensor's quantization is given.
pub const DEFINITION_DEFINED: u32 = 1;
/// `Qnn_QuantizationEncoding_t`: one scale and offset per channel of an axis; the same with
/// a bit width below the data type's (int4 in an int8 container).
pub const ENCODING_SCALE_OFFSET: u32 = 0;
pub const ENCODING_AXIS_SCALE_OFFSET: u32 = 1;
pub const ENCODING_BW_AXIS_SCALE_OFFSET: u32 = 3;
/// Per-channel scales each refined per block of the other axis (LPBQ).
pub const ENCODING_BLOCKWISE_EXPANSION: u32 = 5;
/// `QNN_BLOCKWISE_EXPANSION_BITWIDTH_SCALE_STORAGE_8`: block scales stored one per byte.
pub const BLOCK_SCALE_STORAGE_8: u32 = 0;

/// `Qnn_BlockwiseExpansion_t`: a weight's value is `q * scale_offsets[c].scale *
/// block_scales[c * blocks + b]` for channel `c` of `axis` and block `b` of the other axis.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct BlockwiseExpansion {
    pub axis: i32,
    pub scale_offsets: *const ScaleOffset,
    pub blocks_per_axis: u32,
    /// Bits by which the stored block scales expand the channel scale's precision.
    pub block_scale_bitwidth: u32,
    pub storage: u32,
    pub block_scales: *const u8,
}

/// `Qnn_ScaleOffset_t`: a value is `(q + offset) * scale`.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ScaleOffset {
    pub scale: f32,
    pub offset: i32,
}

/// `Qnn_QuantizeParams_t`: definition and encoding, then a 32-byte union of the encodings,
/// held as words: `Qnn_AxisScaleOffset_t {i32 axis; u32 count; ScaleOffset*}` or
/// `Qnn_BwAxisScaleOffset_t {u32 bitwidth; i32 axis; u32 count; f32* scales; i32* offsets}`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct QuantizeParams {
    pub definition: u32,
    pub encoding: u32,
    pub payload: [u64; 4],
}

impl QuantizeParams {
    pub const NONE: QuantizeParams = QuantizeParams { definition: UNDEFINED, encoding: UNDEFINED, payload: [0; 4] };

    /// Per-channel scales and offsets along `axis`; `scale_offsets` must outlive every use.
    pub fn axis(axis: i32, scale_offsets: &[ScaleOffset]) -> QuantizeParams {
        let first_word = (axis as u32 as u64) | ((scale_offsets.len() as u64) << 32);
        QuantizeParams { definition: DEFINITION_DEFINED, encoding: ENCODING_AXIS_SCALE_OFFSET, payload: [first_word, scale_offsets.as_ptr() as u64, 0, 0] }
    }

    /// One scale and offset for the whole tensor (a fixed-point activation).
    pub fn scale_offset(scale: f32, offset: i32) -> QuantizeParams {
        let first_word = (scale.to_bits() as u64) | ((offset as u32 as u64) << 32);
        QuantizeParams { definition: DEFINITION_DEFINED, encoding: ENCODING_SCALE_OFFSET, payload: [first_word, 0, 0, 0] }
    }

    /// Block-expanded per-channel scales; `expansion` and what it points at must outlive
    /// every use.
    pub fn blockwise(expansion: &BlockwiseExpansion) -> QuantizeParams {
        QuantizeParams { definition: DEFINITION_DEFINED, encoding: ENCODING_BLOCKWISE_EXPANSION, payload: [expansion as *const BlockwiseExpansion as u64, 0, 0, 0] }
    }

    /// Per-channel symmetric scales along `axis` for values of `bitwidth` bits (offsets
    /// null: zero); `scales` must outlive every use.
    pub fn bw_axis(bitwidth: u32, axis: i32, scales: &[f32]) -> QuantizeParams {
        let first_word = (bitwidth as u64) | ((axis as u32 as u64) << 32);
        QuantizeParams { definition: DEFINITION_DEFINED, encoding: ENCODING_BW_AXIS_SCALE_OFFSET, payload: [first_word, scales.len() as u64, scales.as_ptr() as u64, 0] }
    }
}

/// `Qnn_TensorV1_t`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct TensorV1 {
    pub id: u32,
    pub name: *const c_char,
    pub tensor_type: u32,
    pub data_format: u32,
    pub data_type: u32,
    pub quantize: QuantizeParams,
    pub rank: u32,
    pub dimensions: *mut u32,
    pub mem_type: u32,
    pub client_buf: ClientBuffer,
}

/// `Qnn_Tensor_t`: a version, then the union of `TensorV1` (used here) and the 136-byte
/// `TensorV2`, whose tail is held as padding.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct Tensor {
    pub version: u32,
    pub v1: TensorV1,
    pub _v2_tail: [u64; 3],
}

/// `Qnn_Scalar_t`: a data type and an 8-byte union, held as its bits.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct Scalar {
    pub data_type: u32,
    pub bits: u64,
}

/// `Qnn_Param_t`'s union: a scalar or a tensor.
#[repr(C)]
#[derive(Clone, Copy)]
pub union ParamValue {
    pub scalar: Scalar,
    pub tensor: Tensor,
}

/// `Qnn_Param_t`: a named scalar or tensor parameter of an op.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct Param {
    pub param_type: u32,
    pub name: *const c_char,
    pub value: ParamValue,
}

/// `Qnn_OpConfigV1_t` inside `Qnn_OpConfig_t`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct OpConfig {
    pub version: u32,
    pub name: *const c_char,
    pub package_name: *const c_char,
    pub type_name: *const c_char,
    pub num_params: u32,
    pub params: *mut Param,
    pub num_inputs: u32,
    pub inputs: *mut Tensor,
    pub num_outputs: u32,
    pub outputs: *mut Tensor,
}

/// `QnnDevice_Config_t` with `QNN_DEVICE_CONFIG_OPTION_CUSTOM` (0): a pointer to the
/// backend's own device config.
#[repr(C)]
pub struct DeviceConfig {
    pub option: u32,
    pub custom: *const c_void,
}
pub const DEVICE_CONFIG_OPTION_CUSTOM: u32 = 0;

/// `QnnHtpDevice_CustomConfig_t` with `QNN_HTP_DEVICE_CONFIG_OPTION_SOC` (0). Pitfall
/// (QNN.md): in the 2.51 library its union holds pointers, so `socModel` sits at byte 8, not
/// at 4 as 2.30's headers imply. The tail pads the union to the largest member we know of.
#[repr(C)]
pub struct HtpDeviceSocConfig {
    pub option: u32,
    pub soc_model: u64,
    pub _tail: [u64; 3],
}
pub const HTP_DEVICE_CONFIG_OPTION_SOC: u32 = 0;

/// `QnnContext_Config_t` with `QNN_CONTEXT_CONFIG_OPTION_CUSTOM` (0): a pointer to the
/// backend's own context config at byte 8. The tail pads the union to the largest member we
/// know of (zeroed: only the pointer is read for this option).
#[repr(C)]
pub struct ContextConfig {
    pub option: u32,
    pub custom: *const c_void,
    pub _tail: [u64; 2],
}
pub const CONTEXT_CONFIG_OPTION_CUSTOM: u32 = 0;

/// `QnnHtpContext_CustomConfig_t`: the option, then a union at byte 8 whose largest member is
/// a 16-byte group registration (a handle and a size); `weightSharingEnabled` is its first
/// byte.
#[repr(C)]
pub struct HtpContextConfig {
    pub option: u32,
    pub value: [u64; 2],
}
/// `QNN_HTP_CONTEXT_CONFIG_OPTION_WEIGHT_SHARING_ENABLED` (QNN.md: graphs built in the context
/// share the static tensors they hold alike).
pub const HTP_CONTEXT_CONFIG_OPTION_WEIGHT_SHARING: u32 = 1;
/// `QNN_HTP_CONTEXT_CONFIG_OPTION_REGISTER_MULTI_CONTEXTS`: the context joins a group of
/// contexts sharing one spill-fill buffer; the union holds `{firstGroupHandle (0 to start a
/// group), maxSpillFillBuffer: u64}`.
pub const HTP_CONTEXT_CONFIG_OPTION_REGISTER_MULTI_CONTEXTS: u32 = 2;
/// `QNN_HTP_CONTEXT_CONFIG_OPTION_IO_MEM_ESTIMATION`: QNN estimates the context's I/O memory
/// when it is created, so that it can place the context in another process domain where one
/// is available (its first byte: a `bool`).
pub const HTP_CONTEXT_CONFIG_OPTION_IO_MEM_ESTIMATION: u32 = 6;

/// `QnnGraph_Config_t`: an option and a union at byte 8 (here the custom config's pointer).
#[repr(C)]
pub struct GraphConfig {
    pub option: u32,
    pub custom: *const c_void,
}
pub const GRAPH_CONFIG_OPTION_CUSTOM: u32 = 0;

/// `QnnHtpGraph_CustomConfig_t`: an option and a union at byte 8 (it holds 64-bit members);
/// `optimizationOption` is `{type: u32, floatValue: f32}` there, `vtcmSizeInMB` a `u32`.
#[repr(C)]
pub struct HtpGraphConfig {
    pub option: u32,
    pub _pad: u32,
    pub value: [u32; 2],
    pub _tail: [u64; 3],
}
/// `QNN_HTP_GRAPH_CONFIG_OPTION_OPTIMIZATION` with `..._TYPE_FINALIZE_OPTIMIZATION_FLAG` (3):
/// the level the graph is prepared at (1 fast, 3 most optimized; ExecuTorch prepares its
/// offline graphs at 3).
pub const HTP_GRAPH_CONFIG_OPTION_OPTIMIZATION: u32 = 1;
pub const HTP_GRAPH_OPTIMIZATION_TYPE_FINALIZE_OPTIMIZATION_FLAG: u32 = 3;
/// `QNN_HTP_GRAPH_CONFIG_OPTION_VTCM_SIZE`: VTCM in MB the graph may use (0: all of it).
pub const HTP_GRAPH_CONFIG_OPTION_VTCM_SIZE: u32 = 3;

/// `Qnn_ProfileHandle_t`.
pub type ProfileHandle = *mut c_void;
/// `QNN_PROFILE_LEVEL_BASIC`: enough for the HTP's performance estimates at finalize (QNN.md).
pub const PROFILE_LEVEL_BASIC: u32 = 1;

/// `QNN_PROFILE_LEVEL_DETAILED`: per-node events besides the graph's.
pub const PROFILE_LEVEL_DETAILED: u32 = 2;

/// `QnnProfile_EventData_t`: the event's type (the HTP's are in `QnnHtpProfile.h`), the
/// value's unit, the value and a name.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct EventData {
    pub event_type: u32,
    pub unit: u32,
    pub value: u64,
    pub identifier: *const c_char,
}

/// `QnnProfile_Config_t`: an option and a union at byte 8 (a pointer, a `u64` event count or
/// the optrace flag's byte).
#[repr(C)]
pub struct ProfileConfig {
    pub option: u32,
    pub value: u64,
}
/// `QNN_PROFILE_CONFIG_OPTION_ENABLE_OPTRACE`: per-op trace data at the detailed level.
pub const PROFILE_CONFIG_OPTION_ENABLE_OPTRACE: u32 = 2;

/// `QnnProfile_ExtendedEventData_t` (version 1): type, unit, a 24-byte union (a `Qnn_Scalar_t`
/// value, or an opaque object `{data, len}` with a file name), a timestamp and a name.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct ExtendedEventData {
    pub version: u32,
    pub _pad: u32,
    pub event_type: u32,
    pub unit: u32,
    pub value: [u64; 3],
    pub timestamp: u64,
    pub identifier: *const c_char,
}
/// `QNN_PROFILE_EVENTUNIT_OBJECT`: the extended event's union holds an opaque object.
pub const PROFILE_EVENTUNIT_OBJECT: u32 = 5;

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
    pub context_create: Option<unsafe extern "C" fn(backend: BackendHandle, device: DeviceHandle, config: *const *const c_void, context: *mut ContextHandle) -> ErrorHandle>,
    pub context_set_config: *const c_void,
    pub context_get_binary_size: Option<unsafe extern "C" fn(context: ContextHandle, size: *mut u64) -> ErrorHandle>,
    pub context_get_binary: Option<unsafe extern "C" fn(context: ContextHandle, buffer: *mut c_void, size: u64, written: *mut u64) -> ErrorHandle>,
    pub context_create_from_binary: Option<unsafe extern "C" fn(backend: BackendHandle, device: DeviceHandle, config: *const *const c_void, binary: *const c_void, size: u64, context: *mut ContextHandle, profile: *mut c_void) -> ErrorHandle>,
    pub context_free: Option<unsafe extern "C" fn(context: ContextHandle, profile: *mut c_void) -> ErrorHandle>,
    pub graph_create: Option<unsafe extern "C" fn(context: ContextHandle, name: *const c_char, config: *const *const c_void, graph: *mut GraphHandle) -> ErrorHandle>,
    pub graph_create_subgraph: *const c_void,
    pub graph_set_config: *const c_void,
    pub graph_add_node: Option<unsafe extern "C" fn(graph: GraphHandle, op: OpConfig) -> ErrorHandle>,
    pub graph_finalize: Option<unsafe extern "C" fn(graph: GraphHandle, profile: *mut c_void, signal: *mut c_void) -> ErrorHandle>,
    pub graph_retrieve: Option<unsafe extern "C" fn(context: ContextHandle, name: *const c_char, graph: *mut GraphHandle) -> ErrorHandle>,
    pub graph_execute: Option<unsafe extern "C" fn(graph: GraphHandle, inputs: *const Tensor, num_inputs: u32, outputs: *mut Tensor, num_outputs: u32, profile: *mut c_void, signal: *mut c_void) -> ErrorHandle>,
    pub graph_execute_async: *const c_void,
    pub tensor_create_context_tensor: *const c_void,
    pub tensor_create_graph_tensor: Option<unsafe extern "C" fn(graph: GraphHandle, tensor: *mut Tensor) -> ErrorHandle>,
    pub log_create: Option<unsafe extern "C" fn(callback: Option<LogCallback>, max_level: u32, logger: *mut LogHandle) -> ErrorHandle>,
    pub log_set_log_level: *const c_void,
    pub log_free: Option<unsafe extern "C" fn(logger: LogHandle) -> ErrorHandle>,
    pub profile_create: Option<unsafe extern "C" fn(backend: BackendHandle, level: u32, profile: *mut ProfileHandle) -> ErrorHandle>,
    pub profile_set_config: Option<unsafe extern "C" fn(profile: ProfileHandle, config: *const *const ProfileConfig) -> ErrorHandle>,
    pub profile_get_events: Option<unsafe extern "C" fn(profile: ProfileHandle, events: *mut *const u64, count: *mut u32) -> ErrorHandle>,
    pub profile_get_sub_events: Option<unsafe extern "C" fn(event: u64, events: *mut *const u64, count: *mut u32) -> ErrorHandle>,
    pub profile_get_event_data: Option<unsafe extern "C" fn(event: u64, data: *mut EventData) -> ErrorHandle>,
    pub profile_get_extended_event_data: Option<unsafe extern "C" fn(event: u64, data: *mut ExtendedEventData) -> ErrorHandle>,
    pub profile_free: Option<unsafe extern "C" fn(profile: ProfileHandle) -> ErrorHandle>,
    /// mem register and deregister, device getPlatformInfo, freePlatformInfo,
    /// getInfrastructure.
    pub _mem_platform: [*const c_void; 5],
    pub device_create: Option<unsafe extern "C" fn(logger: LogHandle, config: *const *const DeviceConfig, device: *mut DeviceHandle) -> ErrorHandle>,
    pub device_set_config: *const c_void,
    pub device_get_info: *const c_void,
    pub device_free: Option<unsafe extern "C" fn(device: DeviceHandle) -> ErrorHandle>,
    /// Signal, error, execution environment and later additions.
    pub _rest: [*const c_void; 20],
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
        assert_eq!(slot(offset_of!(FunctionTable, context_create)), 9);
        assert_eq!(slot(offset_of!(FunctionTable, context_get_binary_size)), 11);
        assert_eq!(slot(offset_of!(FunctionTable, context_create_from_binary)), 13);
        assert_eq!(slot(offset_of!(FunctionTable, context_free)), 14);
        assert_eq!(slot(offset_of!(FunctionTable, graph_create)), 15);
        assert_eq!(slot(offset_of!(FunctionTable, graph_add_node)), 18);
        assert_eq!(slot(offset_of!(FunctionTable, graph_finalize)), 19);
        assert_eq!(slot(offset_of!(FunctionTable, graph_retrieve)), 20);
        assert_eq!(slot(offset_of!(FunctionTable, graph_execute)), 21);
        assert_eq!(slot(offset_of!(FunctionTable, tensor_create_graph_tensor)), 24);
        assert_eq!(slot(offset_of!(FunctionTable, device_create)), 40);
        assert_eq!(slot(offset_of!(FunctionTable, device_free)), 43);
        // An `Option` of a function pointer is one pointer (null for none), as C's is.
        assert_eq!(size_of::<Option<LogCallback>>(), 8);
    }

    /// QNN.md: `Qnn_Tensor_t` 144 bytes (the v1/v2 union at 8); `TensorV1` 112 with its fields
    /// at id 0, name 8, type 16, dataFormat 20, dataType 24, quantizeParams 32 (40 bytes),
    /// rank 72, dimensions 80, memType 88, clientBuf 96; `Qnn_Param_t` 160 (name 8, union 16);
    /// `Qnn_OpConfig_t` 80; the HTP device config's `socModel` at byte 8.
    #[test]
    fn tensor_param_and_op_layouts_match_the_2_51_library() {
        assert_eq!(size_of::<Tensor>(), 144);
        assert_eq!(offset_of!(Tensor, v1), 8);
        assert_eq!(size_of::<TensorV1>(), 112);
        assert_eq!(size_of::<QuantizeParams>(), 40);
        assert_eq!(size_of::<ScaleOffset>(), 8);
        assert_eq!(offset_of!(QuantizeParams, payload), 8);
        // QNN.md: `Qnn_BlockwiseExpansion_t` 40 (axis, scale-offsets, blocks, bitwidth, storage, scales).
        assert_eq!(size_of::<BlockwiseExpansion>(), 40);
        let fields = [offset_of!(BlockwiseExpansion, scale_offsets), offset_of!(BlockwiseExpansion, blocks_per_axis), offset_of!(BlockwiseExpansion, block_scale_bitwidth), offset_of!(BlockwiseExpansion, storage), offset_of!(BlockwiseExpansion, block_scales)];
        assert_eq!(fields, [8, 16, 20, 24, 32]);
        let fields = [
            offset_of!(TensorV1, id),
            offset_of!(TensorV1, name),
            offset_of!(TensorV1, tensor_type),
            offset_of!(TensorV1, data_format),
            offset_of!(TensorV1, data_type),
            offset_of!(TensorV1, quantize),
            offset_of!(TensorV1, rank),
            offset_of!(TensorV1, dimensions),
            offset_of!(TensorV1, mem_type),
            offset_of!(TensorV1, client_buf),
        ];
        assert_eq!(fields, [0, 8, 16, 20, 24, 32, 72, 80, 88, 96]);
        assert_eq!(size_of::<ClientBuffer>(), 16);
        assert_eq!(size_of::<Scalar>(), 16);
        assert_eq!(size_of::<Param>(), 160);
        assert_eq!((offset_of!(Param, name), offset_of!(Param, value)), (8, 16));
        assert_eq!(size_of::<OpConfig>(), 80);
        assert_eq!(offset_of!(OpConfig, name), 8);
        assert_eq!(offset_of!(OpConfig, outputs), 72);
        assert_eq!(size_of::<DeviceConfig>(), 16);
        assert_eq!((size_of::<GraphConfig>(), offset_of!(GraphConfig, custom)), (16, 8));
        assert_eq!((offset_of!(HtpGraphConfig, value), size_of::<HtpGraphConfig>()), (8, 40));
        assert_eq!(offset_of!(HtpDeviceSocConfig, soc_model), 8);
        assert_eq!((size_of::<ContextConfig>(), offset_of!(ContextConfig, custom)), (32, 8));
        assert_eq!((size_of::<HtpContextConfig>(), offset_of!(HtpContextConfig, value)), (24, 8));
        assert_eq!((size_of::<EventData>(), offset_of!(EventData, unit), offset_of!(EventData, value), offset_of!(EventData, identifier)), (24, 4, 8, 16));
        assert_eq!((size_of::<ProfileConfig>(), offset_of!(ProfileConfig, value)), (16, 8));
        assert_eq!((offset_of!(ExtendedEventData, event_type), offset_of!(ExtendedEventData, value), offset_of!(ExtendedEventData, timestamp), offset_of!(ExtendedEventData, identifier), size_of::<ExtendedEventData>()), (8, 16, 40, 48, 56));
    }

    #[test]
    fn an_error_handles_code_is_its_low_16_bits() {
        assert_eq!(error_code(0), 0);
        assert_eq!(error_code(0x1_0000_1389), 5001);
    }
}
