//! The compute pipelines: one per shader (the matmul one per weight format, the attention one
//! sized for the plan's KV capacity and the artifact's widest head), all with one descriptor set layout (four storage
//! buffers, see `shaders/common.glsl`) and one push-constant block. The SPIR-V is built from
//! `shaders/*.comp` by `shaders/build.sh` and checked in; a test rebuilds it and compares.

use std::sync::Arc;

use ash::vk;
use llada_ir::DType;

use super::gpu::{vk_error, Gpu};
use crate::error::{Error, Result, Setting};

/// Bytes of push constants every pipeline may use.
pub(super) const PUSH_BYTES: u32 = 64;

/// A built shader: its name, the source it is built from, the macro defined for it (those two
/// read by the test that rebuilds it).
#[cfg_attr(not(test), allow(dead_code))]
pub(super) struct Shader {
    pub name: &'static str,
    pub source: &'static str,
    pub define: Option<&'static str>,
    pub spv: &'static [u8],
}

const fn shader(name: &'static str, source: &'static str, define: Option<&'static str>, spv: &'static [u8]) -> Shader {
    Shader { name, source, define, spv }
}

pub(super) const SHADERS: [Shader; 8] = [
    shader("rms_norm", "rms_norm.comp", None, include_bytes!("shaders/rms_norm.spv")),
    shader("quantize", "quantize.comp", None, include_bytes!("shaders/quantize.spv")),
    shader("matmul", "matmul.comp", None, include_bytes!("shaders/matmul.spv")),
    // The q8/q4 matmuls with the device's integer dot products (same sums, exact).
    shader("matmul_dot", "matmul.comp", Some("INT8_DOT"), include_bytes!("shaders/matmul_dot.spv")),
    shader("rope", "rope.comp", None, include_bytes!("shaders/rope.spv")),
    shader("store_kv", "store_kv.comp", None, include_bytes!("shaders/store_kv.spv")),
    shader("attention", "attention.comp", None, include_bytes!("shaders/attention.spv")),
    shader("elementwise", "elementwise.comp", None, include_bytes!("shaders/elementwise.spv")),
];

/// `matmul.comp`'s FORMAT for a weight format.
pub(super) fn matmul_format(format: DType, bf16_activations: bool) -> Option<u32> {
    Some(match format {
        DType::PanelF32 => 0,
        DType::PanelF16 => 1,
        DType::PanelBf16 if bf16_activations => 3,
        DType::PanelBf16 => 2,
        DType::PanelQ8 => 4,
        DType::PanelQ4 { .. } => 5,
        _ => return None,
    })
}

pub(super) struct Pipelines {
    gpu: Arc<Gpu>,
    pub set_layout: vk::DescriptorSetLayout,
    pub layout: vk::PipelineLayout,
    pub rms_norm: vk::Pipeline,
    pub quantize: vk::Pipeline,
    /// By `matmul_format`.
    pub matmul: [vk::Pipeline; 6],
    pub rope: vk::Pipeline,
    pub store_kv: vk::Pipeline,
    pub attention: vk::Pipeline,
    pub elementwise: vk::Pipeline,
}

impl Pipelines {
    /// Every pipeline, the attention one holding scores for `max_keys` positions and a query
    /// of `head_dim` (the widest an attention op of the artifact has, a multiple of 4).
    pub fn new(gpu: Arc<Gpu>, max_keys: u32, head_dim: u32) -> Result<Pipelines> {
        // attention.comp's workgroup memory: scores, the query, 64 partial sums and a total.
        let shared = (max_keys as u64 + head_dim as u64 + 64 + 1) * 4;
        if shared > gpu.limits.max_compute_shared_memory_size as u64 {
            return Err(Error::setting(
                Setting::Backend,
                format!("vulkan: attention over {max_keys} cached positions with heads of {head_dim} needs {shared} bytes of workgroup memory but {} has {}; compile with a smaller --max-len", gpu.name, gpu.limits.max_compute_shared_memory_size),
            ));
        }
        let d = &gpu.device;
        let bindings: Vec<_> = (0..4).map(|b| vk::DescriptorSetLayoutBinding::default().binding(b).descriptor_type(vk::DescriptorType::STORAGE_BUFFER).descriptor_count(1).stage_flags(vk::ShaderStageFlags::COMPUTE)).collect();
        // SAFETY (this block and the ones below): valid create infos that live across each
        // call, on a live device; what is created is destroyed in `drop`.
        let set_layout = unsafe { d.create_descriptor_set_layout(&vk::DescriptorSetLayoutCreateInfo::default().bindings(&bindings), None) }.map_err(|e| vk_error("creating the descriptor set layout", e))?;
        let ranges = [vk::PushConstantRange { stage_flags: vk::ShaderStageFlags::COMPUTE, offset: 0, size: PUSH_BYTES }];
        let layouts = [set_layout];
        let layout = unsafe { d.create_pipeline_layout(&vk::PipelineLayoutCreateInfo::default().set_layouts(&layouts).push_constant_ranges(&ranges), None) }.map_err(|e| vk_error("creating the pipeline layout", e))?;
        let mut p = Pipelines {
            gpu: gpu.clone(),
            set_layout,
            layout,
            rms_norm: vk::Pipeline::null(),
            quantize: vk::Pipeline::null(),
            matmul: [vk::Pipeline::null(); 6],
            rope: vk::Pipeline::null(),
            store_kv: vk::Pipeline::null(),
            attention: vk::Pipeline::null(),
            elementwise: vk::Pipeline::null(),
        };
        p.rms_norm = p.pipeline("rms_norm", &[])?;
        p.quantize = p.pipeline("quantize", &[])?;
        for f in 0..6u32 {
            let integer = f >= 4;
            p.matmul[f as usize] = p.pipeline(if integer && gpu.int8_dot { "matmul_dot" } else { "matmul" }, &[f])?;
        }
        p.rope = p.pipeline("rope", &[])?;
        p.store_kv = p.pipeline("store_kv", &[])?;
        p.attention = p.pipeline("attention", &[max_keys, head_dim])?;
        p.elementwise = p.pipeline("elementwise", &[])?;
        Ok(p)
    }

    /// The pipeline of shader `name` with specialisation constants 0, 1, ... set to
    /// `constants`.
    fn pipeline(&self, name: &str, constants: &[u32]) -> Result<vk::Pipeline> {
        let d = &self.gpu.device;
        let spv = SHADERS.iter().find(|s| s.name == name).expect("a known shader").spv;
        let words = ash::util::read_spv(&mut std::io::Cursor::new(spv)).map_err(|e| Error::Internal(format!("shader {name}: bad SPIR-V: {e}")))?;
        // SAFETY: valid SPIR-V built from this crate's shaders; the module is destroyed below.
        let module = unsafe { d.create_shader_module(&vk::ShaderModuleCreateInfo::default().code(&words), None) }.map_err(|e| vk_error(&format!("loading shader {name}"), e))?;
        let data: Vec<u8> = constants.iter().flat_map(|c| c.to_le_bytes()).collect();
        let entries: Vec<_> = (0..constants.len() as u32).map(|i| vk::SpecializationMapEntry { constant_id: i, offset: 4 * i, size: 4 }).collect();
        let spec = vk::SpecializationInfo::default().map_entries(&entries).data(&data);
        let mut stage = vk::PipelineShaderStageCreateInfo::default().stage(vk::ShaderStageFlags::COMPUTE).module(module).name(c"main");
        if !constants.is_empty() {
            stage = stage.specialization_info(&spec);
        }
        let info = [vk::ComputePipelineCreateInfo::default().stage(stage).layout(self.layout)];
        // SAFETY: the create info, its stage and specialisation data live across the call.
        let made = unsafe { d.create_compute_pipelines(vk::PipelineCache::null(), &info, None) };
        // SAFETY: a pipeline no longer needs its module once created.
        unsafe { d.destroy_shader_module(module, None) };
        made.map(|p| p[0]).map_err(|(_, e)| vk_error(&format!("building the {name} pipeline"), e))
    }
}

impl Drop for Pipelines {
    fn drop(&mut self) {
        let d = &self.gpu.device;
        // SAFETY: no command buffer using them is pending (every submit was waited for);
        // destroying a null handle is a no-op.
        unsafe {
            for p in [self.rms_norm, self.quantize, self.rope, self.store_kv, self.attention, self.elementwise].into_iter().chain(self.matmul) {
                d.destroy_pipeline(p, None);
            }
            d.destroy_pipeline_layout(self.layout, None);
            d.destroy_descriptor_set_layout(self.set_layout, None);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::SHADERS;

    #[test]
    #[ignore = "needs glslangValidator (Debian: glslang-tools): .ci/run installs it and runs this with --ignored"]
    fn shaders_are_built_from_their_sources() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("src/executor/vulkan/shaders");
        let out = tempfile::tempdir().unwrap();
        let mut sources: Vec<String> = std::fs::read_dir(&dir).unwrap().filter_map(|e| e.unwrap().file_name().into_string().ok()).filter(|n| n.ends_with(".comp")).collect();
        sources.sort();
        let mut listed: Vec<String> = SHADERS.iter().map(|s| s.source.to_string()).collect();
        listed.sort();
        listed.dedup();
        assert_eq!(sources, listed, "every shader source is built in, and only those");
        for s in SHADERS {
            let built = out.path().join(format!("{}.spv", s.name));
            let mut glslang = std::process::Command::new("glslangValidator");
            glslang.args(["-V", "--target-env", "vulkan1.1"]);
            if let Some(d) = s.define {
                glslang.arg(format!("-D{d}"));
            }
            let status = glslang.arg("-o").arg(&built).arg(dir.join(s.source)).stdout(std::process::Stdio::null()).status().expect("glslangValidator runs");
            assert!(status.success(), "{} does not compile", s.source);
            assert!(std::fs::read(&built).unwrap() == s.spv, "{}.spv is not built from {}: run src/executor/vulkan/shaders/build.sh", s.name, s.source);
        }
    }
}
