//! The Vulkan device: the loader (found at run time, so a binary without a Vulkan driver
//! still runs the host backend), one compute queue, host-visible memory and the error
//! mapping. Optional Khronos validation (`LLADA_VULKAN_VALIDATION=1`) counts every error the
//! layer reports, so a test can require none.

use std::ffi::{c_void, CStr};
use std::sync::atomic::{AtomicUsize, Ordering};

use ash::vk;

use crate::error::{Error, Result, Setting};

/// Errors the validation layer reported in this process.
static VALIDATION_ERRORS: AtomicUsize = AtomicUsize::new(0);

/// How many errors the Khronos validation layer has reported so far (0 unless a session ran
/// with `LLADA_VULKAN_VALIDATION=1`).
pub fn validation_errors() -> usize {
    VALIDATION_ERRORS.load(Ordering::SeqCst)
}

const VALIDATION_LAYER: &CStr = c"VK_LAYER_KHRONOS_validation";

/// A Vulkan call failed: `what` says which.
pub(super) fn vk_error(what: &str, e: vk::Result) -> Error {
    Error::Device(format!("vulkan: {what} failed: {e}"))
}

pub(super) struct Gpu {
    _entry: ash::Entry,
    instance: ash::Instance,
    pub device: ash::Device,
    pub queue: vk::Queue,
    pub family: u32,
    pub memory: vk::PhysicalDeviceMemoryProperties,
    pub limits: vk::PhysicalDeviceLimits,
    pub max_allocation: u64,
    /// Valid bits of the queue's timestamps (0: none).
    pub timestamp_bits: u32,
    pub name: String,
    pub is_cpu: bool,
    /// The device's packed int8 dot products are enabled (VK_KHR_shader_integer_dot_product),
    /// so the q8/q4 matmuls use them.
    pub int8_dot: bool,
    debug: Option<(ash::ext::debug_utils::Instance, vk::DebugUtilsMessengerEXT)>,
}

/// A logical device opened on the chosen physical one: its compute queue's family, and
/// whether integer dot products were enabled (where the device reports them, unless
/// `LLADA_VULKAN_INT8_DOT=0`).
struct OpenedDevice {
    device: ash::Device,
    physical: vk::PhysicalDevice,
    family: u32,
    int8_dot: bool,
}

unsafe extern "system" fn on_validation_message(
    severity: vk::DebugUtilsMessageSeverityFlagsEXT,
    _types: vk::DebugUtilsMessageTypeFlagsEXT,
    data: *const vk::DebugUtilsMessengerCallbackDataEXT<'_>,
    _user: *mut c_void,
) -> vk::Bool32 {
    // SAFETY: the layer passes a valid callback data pointer whose message, when not null, is
    // a NUL-terminated string, both valid for this call.
    let message = unsafe { data.as_ref().filter(|d| !d.p_message.is_null()).map(|d| CStr::from_ptr(d.p_message).to_string_lossy().into_owned()) };
    if severity.contains(vk::DebugUtilsMessageSeverityFlagsEXT::ERROR) {
        VALIDATION_ERRORS.fetch_add(1, Ordering::SeqCst);
        eprintln!("vulkan validation error: {}", message.unwrap_or_default());
    } else {
        eprintln!("vulkan validation warning: {}", message.unwrap_or_default());
    }
    vk::FALSE
}

/// Device preference: a real GPU before a CPU implementation such as lavapipe.
fn rank(t: vk::PhysicalDeviceType) -> u32 {
    match t {
        vk::PhysicalDeviceType::DISCRETE_GPU => 0,
        vk::PhysicalDeviceType::INTEGRATED_GPU => 1,
        vk::PhysicalDeviceType::VIRTUAL_GPU => 2,
        vk::PhysicalDeviceType::CPU => 3,
        _ => 4,
    }
}

impl Gpu {
    /// Loads the Vulkan loader and opens the preferred device with a compute queue
    /// (`LLADA_VULKAN_DEVICE=<index>` picks another, in the loader's order).
    pub fn open() -> Result<Gpu> {
        let unavailable = |why: String| Error::setting(Setting::Backend, format!("vulkan: {why}; install a Vulkan driver (Debian: `apt-get install mesa-vulkan-drivers`) or use --backend host"));
        // SAFETY: loading the system's Vulkan loader runs its initialisers; it is the library
        // every Vulkan application loads this way.
        let entry = unsafe { ash::Entry::load() }.map_err(|e| unavailable(format!("no Vulkan loader could be loaded ({e})")))?;
        let validation = std::env::var_os("LLADA_VULKAN_VALIDATION").is_some_and(|v| v == "1");
        let mut layers = Vec::new();
        let mut extensions = Vec::new();
        if validation {
            // SAFETY: a plain query of the loader.
            let available = unsafe { entry.enumerate_instance_layer_properties() }.map_err(|e| vk_error("listing instance layers", e))?;
            if !available.iter().any(|l| l.layer_name_as_c_str().is_ok_and(|n| n == VALIDATION_LAYER)) {
                return Err(Error::setting(Setting::Backend, "vulkan: LLADA_VULKAN_VALIDATION=1 but the Khronos validation layer is not installed (Debian: `apt-get install vulkan-validationlayers`)".to_string()));
            }
            layers.push(VALIDATION_LAYER.as_ptr());
            extensions.push(ash::ext::debug_utils::NAME.as_ptr());
        }
        let app = vk::ApplicationInfo::default().application_name(c"llada-rt").api_version(vk::API_VERSION_1_1);
        let info = vk::InstanceCreateInfo::default().application_info(&app).enabled_layer_names(&layers).enabled_extension_names(&extensions);
        // SAFETY: the create info and the strings it points to live across the call.
        let instance = unsafe { entry.create_instance(&info, None) }.map_err(|e| unavailable(format!("creating an instance failed ({e})")))?;
        let debug = if validation {
            let utils = ash::ext::debug_utils::Instance::new(&entry, &instance);
            let info = vk::DebugUtilsMessengerCreateInfoEXT::default()
                .message_severity(vk::DebugUtilsMessageSeverityFlagsEXT::ERROR | vk::DebugUtilsMessageSeverityFlagsEXT::WARNING)
                .message_type(vk::DebugUtilsMessageTypeFlagsEXT::GENERAL | vk::DebugUtilsMessageTypeFlagsEXT::VALIDATION | vk::DebugUtilsMessageTypeFlagsEXT::PERFORMANCE)
                .pfn_user_callback(Some(on_validation_message));
            // SAFETY: the instance was created with the debug utils extension enabled.
            let messenger = unsafe { utils.create_debug_utils_messenger(&info, None) }.map_err(|e| vk_error("creating the validation messenger", e))?;
            Some((utils, messenger))
        } else {
            None
        };
        match Gpu::with_device(&instance) {
            Ok(opened) => Ok(Gpu::describe(entry, instance, opened, debug)),
            Err(e) => {
                // SAFETY: nothing created from the instance is alive but the messenger.
                unsafe {
                    if let Some((utils, m)) = &debug {
                        utils.destroy_debug_utils_messenger(*m, None);
                    }
                    instance.destroy_instance(None);
                }
                Err(e)
            }
        }
    }

    /// The chosen device with one compute queue (see [`OpenedDevice`]).
    fn with_device(instance: &ash::Instance) -> Result<OpenedDevice> {
        // SAFETY: plain queries of a live instance.
        let mut devices = unsafe { instance.enumerate_physical_devices() }.map_err(|e| vk_error("listing devices", e))?;
        let chosen = std::env::var("LLADA_VULKAN_DEVICE").ok().map(|v| v.parse::<usize>().map_err(|_| Error::setting(Setting::Backend, format!("vulkan: LLADA_VULKAN_DEVICE={v} is not a device index"))));
        // SAFETY: plain queries of a live instance.
        let version = |d: vk::PhysicalDevice| unsafe { instance.get_physical_device_properties(d) }.api_version;
        let physical = match chosen {
            Some(i) => {
                let i = i?;
                *devices.get(i).ok_or_else(|| Error::setting(Setting::Backend, format!("vulkan: LLADA_VULKAN_DEVICE={i} but there are {} devices", devices.len())))?
            }
            None => {
                // SAFETY: as above.
                devices.sort_by_key(|&d| (version(d) < vk::API_VERSION_1_1, rank(unsafe { instance.get_physical_device_properties(d) }.device_type)));
                *devices.first().ok_or_else(|| Error::setting(Setting::Backend, "vulkan: the loader found no Vulkan device; install a driver (Debian: `apt-get install mesa-vulkan-drivers`) or use --backend host".to_string()))?
            }
        };
        let v = version(physical);
        if v < vk::API_VERSION_1_1 {
            return Err(Error::setting(Setting::Backend, format!("vulkan: the device's driver implements Vulkan {}.{}; this backend needs 1.1", vk::api_version_major(v), vk::api_version_minor(v))));
        }
        // SAFETY: as above.
        let families = unsafe { instance.get_physical_device_queue_family_properties(physical) };
        let family = families.iter().position(|f| f.queue_flags.contains(vk::QueueFlags::COMPUTE)).ok_or_else(|| Error::setting(Setting::Backend, "vulkan: the device has no compute queue".to_string()))? as u32;
        let dot_name = ash::khr::shader_integer_dot_product::NAME;
        // SAFETY: plain queries; the chained struct outlives the call.
        let listed = unsafe { instance.enumerate_device_extension_properties(physical) }.map_err(|e| vk_error("listing device extensions", e))?.iter().any(|e| e.extension_name_as_c_str() == Ok(dot_name));
        let mut dot = vk::PhysicalDeviceShaderIntegerDotProductFeatures::default();
        unsafe { instance.get_physical_device_features2(physical, &mut vk::PhysicalDeviceFeatures2::default().push_next(&mut dot)) };
        let int8_dot = listed && dot.shader_integer_dot_product == vk::TRUE && std::env::var("LLADA_VULKAN_INT8_DOT").map_or(true, |v| v != "0");
        let priorities = [1.0f32];
        let queues = [vk::DeviceQueueCreateInfo::default().queue_family_index(family).queue_priorities(&priorities)];
        let extensions = if int8_dot { vec![dot_name.as_ptr()] } else { Vec::new() };
        let mut enable_dot = vk::PhysicalDeviceShaderIntegerDotProductFeatures::default().shader_integer_dot_product(true);
        let mut info = vk::DeviceCreateInfo::default().queue_create_infos(&queues).enabled_extension_names(&extensions);
        if int8_dot {
            info = info.push_next(&mut enable_dot);
        }
        // SAFETY: the create info and what it points to live across the call; the queue
        // family exists, and the extension and feature are enabled only where listed.
        let device = unsafe { instance.create_device(physical, &info, None) }.map_err(|e| vk_error("creating the device", e))?;
        Ok(OpenedDevice { device, physical, family, int8_dot })
    }

    /// The `Gpu` of a device opened on `instance`: its queue, memory, limits and name.
    fn describe(entry: ash::Entry, instance: ash::Instance, opened: OpenedDevice, debug: Option<(ash::ext::debug_utils::Instance, vk::DebugUtilsMessengerEXT)>) -> Gpu {
        let OpenedDevice { device, physical, family, int8_dot } = opened;
        let mut maintenance3 = vk::PhysicalDeviceMaintenance3Properties::default();
        let mut properties = vk::PhysicalDeviceProperties2::default().push_next(&mut maintenance3);
        // SAFETY: plain queries of live objects; the chained struct outlives the call.
        let (memory, families, queue) = unsafe {
            instance.get_physical_device_properties2(physical, &mut properties);
            (instance.get_physical_device_memory_properties(physical), instance.get_physical_device_queue_family_properties(physical), device.get_device_queue(family, 0))
        };
        let p = properties.properties;
        let name = p.device_name_as_c_str().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        Gpu {
            _entry: entry,
            instance,
            device,
            queue,
            family,
            memory,
            limits: p.limits,
            max_allocation: maintenance3.max_memory_allocation_size,
            timestamp_bits: if p.limits.timestamp_compute_and_graphics == vk::TRUE { families[family as usize].timestamp_valid_bits } else { 0 },
            name,
            is_cpu: p.device_type == vk::PhysicalDeviceType::CPU,
            int8_dot,
            debug,
        }
    }

    /// A buffer of `bytes` for storage and copies in one host-visible, host-coherent
    /// allocation (device-local too where the device has such memory, as phones' unified
    /// memory is), mapped: (buffer, memory, mapping).
    pub fn mapped_buffer(&self, bytes: u64, what: &str) -> Result<(vk::Buffer, vk::DeviceMemory, *mut u8)> {
        if bytes > self.max_allocation {
            return Err(Error::setting(
                Setting::Backend,
                format!("vulkan: the {what} needs one allocation of {bytes} bytes but {} allows at most {}; compile the artifact with a smaller --window (or a GPU --target)", self.name, self.max_allocation),
            ));
        }
        let info = vk::BufferCreateInfo::default()
            .size(bytes)
            .usage(vk::BufferUsageFlags::STORAGE_BUFFER | vk::BufferUsageFlags::TRANSFER_SRC | vk::BufferUsageFlags::TRANSFER_DST)
            .sharing_mode(vk::SharingMode::EXCLUSIVE);
        let d = &self.device;
        // SAFETY: valid create info; the buffer is destroyed on every failure path below.
        let buffer = unsafe { d.create_buffer(&info, None) }.map_err(|e| vk_error(&format!("creating the {what} buffer ({bytes} bytes)"), e))?;
        let fail = |e: Error| {
            // SAFETY: the buffer is unused.
            unsafe { d.destroy_buffer(buffer, None) };
            e
        };
        // SAFETY: a live buffer.
        let needs = unsafe { d.get_buffer_memory_requirements(buffer) };
        let wanted = vk::MemoryPropertyFlags::HOST_VISIBLE | vk::MemoryPropertyFlags::HOST_COHERENT;
        let types = &self.memory.memory_types[..self.memory.memory_type_count as usize];
        // Host-visible, coherent types whose heap can hold it, device-local ones first (a
        // discrete GPU's small device-local BAR heap is skipped by its size, or by failing).
        let heap_holds = |t: &vk::MemoryType| self.memory.memory_heaps[t.heap_index as usize].size >= needs.size;
        let mut candidates: Vec<u32> = (0..types.len()).filter(|&i| needs.memory_type_bits & (1 << i) != 0 && types[i].property_flags.contains(wanted) && heap_holds(&types[i])).map(|i| i as u32).collect();
        candidates.sort_by_key(|&i| !types[i as usize].property_flags.contains(vk::MemoryPropertyFlags::DEVICE_LOCAL));
        if candidates.is_empty() {
            return Err(fail(Error::setting(
                Setting::Backend,
                format!("vulkan: {} has no host-visible, coherent memory that holds the {what} ({} bytes); this backend needs unified memory (phones, integrated GPUs)", self.name, needs.size),
            )));
        }
        let mut last = vk::Result::ERROR_OUT_OF_DEVICE_MEMORY;
        let mut memory = None;
        for &index in &candidates {
            let alloc = vk::MemoryAllocateInfo::default().allocation_size(needs.size).memory_type_index(index);
            // SAFETY: valid allocate info.
            match unsafe { d.allocate_memory(&alloc, None) } {
                Ok(m) => {
                    memory = Some(m);
                    break;
                }
                Err(e) => last = e,
            }
        }
        let memory = memory.ok_or_else(|| fail(vk_error(&format!("allocating {} bytes for the {what}", needs.size), last)))?;
        // SAFETY: the memory is fresh, large enough for the buffer and of a type it accepts;
        // it is host-visible, so mapping it whole is allowed.
        let mapped = unsafe { d.bind_buffer_memory(buffer, memory, 0).and_then(|()| d.map_memory(memory, 0, vk::WHOLE_SIZE, vk::MemoryMapFlags::empty())) };
        match mapped {
            Ok(ptr) => Ok((buffer, memory, ptr as *mut u8)),
            Err(e) => {
                // SAFETY: both are unused.
                unsafe { d.free_memory(memory, None) };
                Err(fail(vk_error(&format!("mapping the {what}"), e)))
            }
        }
    }

    /// Frees what [`mapped_buffer`](Self::mapped_buffer) made, once the device no longer
    /// uses it.
    pub fn free_buffer(&self, buffer: vk::Buffer, memory: vk::DeviceMemory) {
        if memory == vk::DeviceMemory::null() {
            return;
        }
        // SAFETY: the caller's work on the device is complete (every submit waited for).
        unsafe {
            self.device.destroy_buffer(buffer, None);
            self.device.unmap_memory(memory);
            self.device.free_memory(memory, None);
        }
    }
}

impl Drop for Gpu {
    fn drop(&mut self) {
        // SAFETY: every object made from the device is gone (they hold the `Arc<Gpu>` this is
        // the last of), so the device, then the messenger and the instance, can go.
        unsafe {
            let _ = self.device.device_wait_idle();
            self.device.destroy_device(None);
            if let Some((utils, m)) = &self.debug {
                utils.destroy_debug_utils_messenger(*m, None);
            }
            self.instance.destroy_instance(None);
        }
    }
}
