//! The Vulkan backend: the plan on a GPU. The window is one host-visible device allocation
//! laid out at the plan's offsets (unified memory, as phones have: the staging thread reads
//! rotating weights from the artifact straight into their slots, and the host reads logits
//! where the device wrote them). Each graph is recorded once per session into a few command
//! buffers (`record`); a pass writes its inputs, then submits them in order, waiting for the
//! swap schedule's copies before and releasing slots after, as the host executor does between
//! ops. Shaders compute in f32 with integer dot products for q8/q4 (`shaders/`). The
//! embedding, DiffusionGemma's self-conditioning input (whose table is the embedding) and a
//! mixture-of-experts model's routers and experts run on the CPU between command buffers, on
//! the window the device shares (the host executor's MoE code).


#[cfg(all(feature = "vulkan", not(target_env = "musl")))]
mod executor;
#[cfg(all(feature = "vulkan", not(target_env = "musl")))]
mod gpu;
#[cfg(all(feature = "vulkan", not(target_env = "musl")))]
mod pipelines;
#[cfg(all(feature = "vulkan", not(target_env = "musl")))]
mod record;

#[cfg(all(feature = "vulkan", not(target_env = "musl")))]
pub use executor::VulkanExecutor;
#[cfg(all(feature = "vulkan", not(target_env = "musl")))]
pub use gpu::validation_errors;

use super::Backend;

pub const BACKEND: Backend = Backend {
    name: "vulkan",
    about: "a Vulkan 1.1 compute device (a phone's or desktop's GPU, or lavapipe on a CPU), found at run time (LLADA_VULKAN_DEVICE=<index> picks one)",
    #[cfg(all(feature = "vulkan", not(target_env = "musl")))]
    constructor: Ok(|model, threads, features| {
        let (e, w) = VulkanExecutor::new(model, threads, features)?;
        Ok((Box::new(e), w))
    }),
    #[cfg(not(all(feature = "vulkan", not(target_env = "musl"))))]
    constructor: Err("vulkan: this build of llada-rt has no Vulkan backend (a static musl binary cannot load a Vulkan driver, or the `vulkan` feature is off); build for aarch64-linux-android with the NDK, or use --backend host"),
};
