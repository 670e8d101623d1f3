//! QNN's profiling, for what the compiler reads from it: the HTP's own performance model
//! ("hextimate", QNN.md), which estimates a graph's cycles and microseconds when it is
//! finalized with profiling on, for the SoC ids it models (not SM8650 or SM8750: 72 models a
//! v81 HTP, 77 a v73). Deterministic, unlike the simulator's execute times.

use std::ffi::CStr;
use std::sync::Arc;

use crate::abi::{self, ProfileHandle};
use crate::{check, Device, Error, Result};

/// A profile handle of the device's backend: at the basic level (the graph's estimate) or the
/// detailed one (also each node's).
pub struct Profile {
    device: Arc<Device>,
    pub(crate) handle: ProfileHandle,
    /// With the op trace on, finalize also writes `<graph>_schematic.bin` into the working
    /// directory (for Qualcomm's viewer), which the builder removes.
    pub(crate) optrace: bool,
}

/// One profile event and its sub-events.
#[derive(Debug, Clone, PartialEq)]
pub struct Event {
    pub event_type: u32,
    pub value: u64,
    pub unit: u32,
    pub identifier: String,
    /// An extended event's opaque object (an op trace), where it has one.
    pub object: Option<Vec<u8>>,
    pub sub: Vec<Event>,
}

/// `QNN_HTP_PROFILE_EVENTTYPE_GRAPH_FINALIZE_PERF_ESTIMATE`: the heading whose sub-events are
/// the estimate.
pub const PERF_ESTIMATE: u32 = 2004;
/// Its simulated execution cycles (point estimate).
pub const PERF_ESTIMATE_CYCLES: u32 = 2006;
/// Its microseconds (point estimate; QNN.md: 2019-2021 are point, lower, upper).
pub const PERF_ESTIMATE_MICROS: u32 = 2019;

/// The estimate of one finalized graph, where the library's model covers the SoC.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Estimate {
    pub cycles: u64,
    pub micros: u64,
}

impl Profile {
    pub fn new(device: &Arc<Device>) -> Result<Profile> {
        Self::at_level(device, abi::PROFILE_LEVEL_BASIC, false)
    }

    /// A profile at the detailed level, with the op trace where `optrace`.
    pub fn detailed(device: &Arc<Device>, optrace: bool) -> Result<Profile> {
        Self::at_level(device, abi::PROFILE_LEVEL_DETAILED, optrace)
    }

    fn at_level(device: &Arc<Device>, level: u32, optrace: bool) -> Result<Profile> {
        let t = device.backend.lib.table();
        let create = t.profile_create.ok_or_else(|| Error::Other("QNN profileCreate is missing from the library's table".into()))?;
        let mut handle: ProfileHandle = std::ptr::null_mut();
        // SAFETY: the backend handle is live while `device` is; `handle` is valid for a write.
        check("profileCreate", None, unsafe { create(device.backend.backend, level, &mut handle) })?;
        let profile = Profile { device: device.clone(), handle, optrace };
        if optrace {
            let set = t.profile_set_config.ok_or_else(|| Error::Other("QNN profileSetConfig is missing from the library's table".into()))?;
            let config = abi::ProfileConfig { option: abi::PROFILE_CONFIG_OPTION_ENABLE_OPTRACE, value: 1 };
            let list = [&config as *const abi::ProfileConfig, std::ptr::null()];
            // SAFETY: the handle is live; the list is NULL-terminated and alive for the call.
            check("profileSetConfig", None, unsafe { set(profile.handle, list.as_ptr()) })?;
        }
        Ok(profile)
    }

    /// Every event recorded so far, each with its sub-events (recursively).
    pub fn events(&self) -> Result<Vec<Event>> {
        let t = self.device.backend.lib.table();
        let (get, sub, data) = match (t.profile_get_events, t.profile_get_sub_events, t.profile_get_event_data) {
            (Some(a), Some(b), Some(c)) => (a, b, c),
            _ => return Err(Error::Other("QNN's profile functions are missing from the library's table".into())),
        };
        let extended = t.profile_get_extended_event_data;
        let text = |p: *const std::ffi::c_char| {
            // SAFETY: a non-null identifier is a NUL-terminated string the profile owns.
            if p.is_null() { String::new() } else { unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned() }
        };
        let read = |id: u64| -> Result<Event> {
            let mut d = abi::EventData { event_type: 0, unit: 0, value: 0, identifier: std::ptr::null() };
            // SAFETY: `id` came from the library for this live profile; `d` is valid for a write.
            let plain = unsafe { data(id, &mut d) };
            if plain == 0 && d.unit != abi::PROFILE_EVENTUNIT_OBJECT {
                return Ok(Event { event_type: d.event_type, value: d.value, unit: d.unit, identifier: text(d.identifier), object: None, sub: Vec::new() });
            }
            // An event only the extended form describes (an op trace's object).
            let Some(ext) = extended else {
                check("profileGetEventData", None, plain)?;
                return Ok(Event { event_type: d.event_type, value: d.value, unit: d.unit, identifier: text(d.identifier), object: None, sub: Vec::new() });
            };
            let mut x = abi::ExtendedEventData { version: 1, _pad: 0, event_type: 0, unit: 0, value: [0; 3], timestamp: 0, identifier: std::ptr::null() };
            // SAFETY: as above, for the extended form.
            check("profileGetExtendedEventData", None, unsafe { ext(id, &mut x) })?;
            let object = (x.unit == abi::PROFILE_EVENTUNIT_OBJECT && x.value[0] != 0).then(|| {
                // SAFETY: an object event's union holds `{data, len}` the profile owns.
                unsafe { std::slice::from_raw_parts(x.value[0] as *const u8, x.value[1] as usize) }.to_vec()
            });
            Ok(Event { event_type: x.event_type, value: x.value[1], unit: x.unit, identifier: text(x.identifier), object, sub: Vec::new() })
        };
        let ids = |list: *const u64, n: u32| -> Vec<u64> {
            if list.is_null() {
                return Vec::new();
            }
            // SAFETY: the library returned `n` ids at `list`, valid while the profile lives.
            unsafe { std::slice::from_raw_parts(list, n as usize) }.to_vec()
        };
        fn tree(id: u64, depth: u32, read: &dyn Fn(u64) -> Result<Event>, children: &dyn Fn(u64) -> Result<Vec<u64>>) -> Result<Event> {
            let mut e = read(id)?;
            if depth < 8 {
                for s in children(id)? {
                    e.sub.push(tree(s, depth + 1, read, children)?);
                }
            }
            Ok(e)
        }
        let children = |id: u64| -> Result<Vec<u64>> {
            let (mut sl, mut sn) = (std::ptr::null::<u64>(), 0u32);
            // SAFETY: `id` is an event of this live profile; both outputs are valid for a write.
            check("profileGetSubEvents", None, unsafe { sub(id, &mut sl, &mut sn) })?;
            Ok(ids(sl, sn))
        };
        let (mut list, mut n) = (std::ptr::null::<u64>(), 0u32);
        // SAFETY: the handle is live; both outputs are valid for a write.
        check("profileGetEvents", None, unsafe { get(self.handle, &mut list, &mut n) })?;
        ids(list, n).into_iter().map(|id| tree(id, 0, &read, &children)).collect()
    }

    /// The performance estimate among `events` (the last one: a profile may see several
    /// finalizes), if the library's model covers the SoC.
    pub fn estimate(events: &[Event]) -> Option<Estimate> {
        let e = events.iter().rev().find(|e| e.event_type == PERF_ESTIMATE)?;
        let value = |ty: u32| e.sub.iter().find(|s| s.event_type == ty).map(|s| s.value);
        Some(Estimate { cycles: value(PERF_ESTIMATE_CYCLES)?, micros: value(PERF_ESTIMATE_MICROS)? })
    }
}

impl Drop for Profile {
    fn drop(&mut self) {
        if let Some(free) = self.device.backend.lib.table().profile_free {
            // SAFETY: the handle is live and freed once.
            unsafe { free(self.handle) };
        }
    }
}
