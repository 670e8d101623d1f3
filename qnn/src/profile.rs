//! QNN's profiling, for what the compiler reads from it: the HTP's own performance model
//! ("hextimate", QNN.md), which estimates a graph's cycles and microseconds when it is
//! finalized with profiling on, for the SoC ids it models (not SM8650 or SM8750: 72 models a
//! v81 HTP, 77 a v73). Deterministic, unlike the simulator's execute times.

use std::ffi::CStr;
use std::sync::Arc;

use crate::abi::{self, ProfileHandle};
use crate::{check, Device, Error, Result};

/// A profile handle of the device's backend, at the basic level.
pub struct Profile {
    device: Arc<Device>,
    pub(crate) handle: ProfileHandle,
}

/// One profile event and its sub-events.
#[derive(Debug, Clone, PartialEq)]
pub struct Event {
    pub event_type: u32,
    pub value: u64,
    pub unit: u32,
    pub identifier: String,
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
        let t = device.backend.lib.table();
        let create = t.profile_create.ok_or_else(|| Error::Other("QNN profileCreate is missing from the library's table".into()))?;
        let mut handle: ProfileHandle = std::ptr::null_mut();
        // SAFETY: the backend handle is live while `device` is; `handle` is valid for a write.
        check("profileCreate", None, unsafe { create(device.backend.backend, abi::PROFILE_LEVEL_BASIC, &mut handle) })?;
        Ok(Profile { device: device.clone(), handle })
    }

    /// Every event recorded so far, each with its sub-events.
    pub fn events(&self) -> Result<Vec<Event>> {
        let t = self.device.backend.lib.table();
        let (get, sub, data) = match (t.profile_get_events, t.profile_get_sub_events, t.profile_get_event_data) {
            (Some(a), Some(b), Some(c)) => (a, b, c),
            _ => return Err(Error::Other("QNN's profile functions are missing from the library's table".into())),
        };
        let read = |id: u64| -> Result<Event> {
            let mut d = abi::EventData { event_type: 0, value: 0, identifier: std::ptr::null(), unit: 0 };
            // SAFETY: `id` came from the library for this live profile; `d` is valid for a write.
            check("profileGetEventData", None, unsafe { data(id, &mut d) })?;
            // SAFETY: a non-null identifier is a NUL-terminated string the profile owns.
            let identifier = if d.identifier.is_null() { String::new() } else { unsafe { CStr::from_ptr(d.identifier) }.to_string_lossy().into_owned() };
            Ok(Event { event_type: d.event_type, value: d.value, unit: d.unit, identifier, sub: Vec::new() })
        };
        let ids = |list: *const u64, n: u32| -> Vec<u64> {
            if list.is_null() {
                return Vec::new();
            }
            // SAFETY: the library returned `n` ids at `list`, valid while the profile lives.
            unsafe { std::slice::from_raw_parts(list, n as usize) }.to_vec()
        };
        let (mut list, mut n) = (std::ptr::null::<u64>(), 0u32);
        // SAFETY: the handle is live; both outputs are valid for a write.
        check("profileGetEvents", None, unsafe { get(self.handle, &mut list, &mut n) })?;
        let mut out = Vec::new();
        for id in ids(list, n) {
            let mut e = read(id)?;
            let (mut sl, mut sn) = (std::ptr::null::<u64>(), 0u32);
            // SAFETY: as above, for the event's sub-events.
            check("profileGetSubEvents", None, unsafe { sub(id, &mut sl, &mut sn) })?;
            for s in ids(sl, sn) {
                e.sub.push(read(s)?);
            }
            out.push(e);
        }
        Ok(out)
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
