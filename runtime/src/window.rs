//! The accelerator window: one allocation per session, laid out by the plan
//! (`llada_ir::WindowPlan`). On a phone this is the one shared buffer the NPU maps; here it
//! is ordinary memory the host executor works in under the same bounds. Regions are handed
//! out as disjoint slices, so the KV cache, activations, scratch and weights can be used at
//! once; slots are written by the staging thread and read by the executor only through
//! [`SlotPtr`], whose reads the swap protocol orders (see `staging`).

use std::ops::Range;

use llada_ir::{Header, KvDType, Region, TensorId};

pub struct Window {
    /// The memory: an anonymous mapping (the host backend) or a device's host-visible
    /// allocation (a GPU backend on unified memory).
    #[allow(dead_code)] // held for its drop: the memory lives as long as the window
    backing: Backing,
    /// Bytes of the memory.
    len: usize,
    /// The mapping's start, taken once: every view below derives from it, so no later
    /// `&mut` borrow of the whole map invalidates the slot pointers the staging thread holds.
    base: *mut u8,
    kv: Range<usize>,
    kv_dtype: KvDType,
    activations: Range<usize>,
    gemm: Range<usize>,
    attention: Range<usize>,
    /// All resident segments (placed one after another).
    resident: Range<usize>,
    slots: Vec<Range<usize>>,
    /// Every layer's expert slots, layer-major.
    expert_slots: Vec<Range<usize>>,
}

/// Where a window's bytes are.
enum Backing {
    /// Page-aligned like the shared buffer an NPU maps; zero pages that become resident only
    /// when touched (an aligned heap allocation would be zeroed by hand, touching every page),
    /// except the weight slots, committed at once.
    Anonymous(#[allow(dead_code)] memmap2::MmapMut),
    /// Memory a device backend allocated and mapped; the owner frees it when dropped, after
    /// the window (it holds it).
    Device(#[allow(dead_code)] Box<dyn Send>),
}

// SAFETY: the window owns its mapping; `base` only addresses it, and every access goes
// through `&self`/`&mut self` methods or `SlotPtr`, whose users follow the staging protocol.
unsafe impl Send for Window {}

/// The mutable regions of one run, borrowed together.
pub struct Parts<'w> {
    pub activations: &'w mut [f32],
    /// First byte of the activation region, to turn value offsets into indexes.
    pub activations_offset: u64,
    pub kv: KvView<'w>,
    pub gemm: &'w mut [u8],
    pub attention: &'w mut [f32],
    /// Resident weight segments, read-only while the session runs.
    pub resident: &'w [u8],
    pub resident_offset: u64,
}

/// The KV cache region in its element type.
pub enum KvView<'w> {
    F32(&'w mut [f32]),
    /// f16 or bf16 bits.
    Half(&'w mut [u16], KvDType),
}

fn range(r: &Region) -> Range<usize> {
    r.offset as usize..(r.offset + r.bytes) as usize
}

impl Window {
    /// Allocates the plan's window, up to the end of its last region (the plan's window size
    /// bounds it; a session needs no more). The verifier checked that the regions lie inside
    /// it, aligned and disjoint; that is re-asserted here because the slices handed out rely
    /// on it.
    pub fn new(h: &Header) -> std::io::Result<Window> {
        Window::with_weights(h, true)
    }

    /// [`new`](Self::new) for a backend whose device reads host memory (the host's kernels,
    /// QNN), a failure naming the window's size.
    pub fn in_host_memory(h: &Header) -> crate::Result<Window> {
        Window::new(h).map_err(|e| crate::Error::io(format!("allocating the {}-byte window", h.plan.window.bytes), e))
    }

    /// The CPU side path's working memory: the same layout as the accelerator window (so the
    /// same graphs run in it) with its own KV cache, activations and scratch, but no weight
    /// regions: the side path reads weights from the artifact. Pages of the mapping it never
    /// touches (where the weights would be) cost no memory.
    pub fn cpu_side(h: &Header) -> std::io::Result<Window> {
        Window::with_weights(h, false)
    }

    /// A window in `len` bytes at `base` that a device backend mapped (writable by the host,
    /// valid until `owner` drops; not necessarily zeroed: nothing reads a region before a pass
    /// or the loader writes it), laid out as [`new`](Self::new) lays it out.
    ///
    /// # Safety
    /// `base..base + len` is mapped, writable and used by nothing but this window (and the
    /// device, as the backend orders it) until `owner` is dropped.
    pub unsafe fn over_device(h: &Header, base: *mut u8, len: usize, owner: Box<dyn Send>) -> Window {
        let need = Window::bytes_for(h, true);
        assert!(len >= need, "device window of {len} bytes; the plan needs {need}");
        assert!(base as usize % 64 == 0, "a device window must start 64-byte aligned (typed views of its regions)");
        Window::lay_out(h, true, Backing::Device(owner), base, len)
    }

    /// Bytes a window of `h` needs: up to the end of its last region.
    pub fn bytes_for(h: &Header, weights: bool) -> usize {
        let w = &h.plan.window;
        let resident_end = match w.resident.last() {
            Some(b) if weights => b.offset + h.segments[b.segment as usize].nbytes,
            _ => 0,
        };
        let x = &w.experts;
        let expert_end = if weights && x.slots_per_layer > 0 { x.region.offset + h.model.moe_layers() as u64 * x.slots_per_layer as u64 * x.slot_bytes } else { 0 };
        let slots: &[Region] = if weights { &w.slots } else { &[] };
        let ends = [&w.kv, &w.activations, &w.scratch.gemm_operand, &w.scratch.attention].into_iter().chain(slots).map(|r| r.offset + r.bytes);
        ends.chain([expert_end, resident_end]).max().unwrap_or(0).max(1) as usize
    }

    fn with_weights(h: &Header, weights: bool) -> std::io::Result<Window> {
        // Zero pages, resident only once touched: the KV cache and activations grow with the
        // request, not with the plan's capacity (a 64-token generation on a 4096-position plan
        // touches 1/64 of the cache).
        let bytes = Window::bytes_for(h, weights);
        let mut map = memmap2::MmapMut::map_anon(bytes)?;
        let base = map.as_mut_ptr();
        let win = Window::lay_out(h, weights, Backing::Anonymous(map), base, bytes);
        // Weight slots are committed now, as an NPU's buffer is: a page first touched while
        // staging costs its fault and zeroing on the critical path (measured: 6 ms to copy a
        // 3.1 MiB expert into fresh pages, against 0.5 ms). The resident segments are
        // committed by being read in.
        for r in win.slots.iter().chain(&win.expert_slots) {
            // SAFETY: inside the mapping (asserted by `lay_out`), and nothing else holds it yet.
            commit(unsafe { std::slice::from_raw_parts_mut(base.add(r.start), r.len()) });
        }
        Ok(win)
    }

    fn lay_out(h: &Header, weights: bool, backing: Backing, base: *mut u8, bytes: usize) -> Window {
        let w = &h.plan.window;
        let resident = match (w.resident.first(), w.resident.last()) {
            (Some(a), Some(b)) if weights => a.offset as usize..(b.offset + h.segments[b.segment as usize].nbytes) as usize,
            _ => 0..0,
        };
        let slots: &[Region] = if weights { &w.slots } else { &[] };
        let x = &w.experts;
        let expert_slots: Vec<Range<usize>> = match weights {
            true => (0..h.model.moe_layers() as u64 * x.slots_per_layer as u64).map(|i| (x.region.offset + i * x.slot_bytes) as usize..(x.region.offset + (i + 1) * x.slot_bytes) as usize).collect(),
            false => Vec::new(),
        };
        let win = Window {
            backing,
            len: bytes,
            base,
            kv: range(&w.kv),
            kv_dtype: w.kv_dtype,
            activations: range(&w.activations),
            gemm: range(&w.scratch.gemm_operand),
            attention: range(&w.scratch.attention),
            resident,
            slots: slots.iter().map(range).collect(),
            expert_slots,
        };
        let mut all: Vec<&Range<usize>> = [&win.kv, &win.activations, &win.gemm, &win.attention, &win.resident].into_iter().chain(&win.slots).chain(&win.expert_slots).collect();
        all.retain(|r| !r.is_empty());
        all.sort_by_key(|r| r.start);
        assert!(all.windows(2).all(|p| p[0].end <= p[1].start), "window regions overlap");
        assert!(all.last().is_none_or(|r| r.end <= bytes), "a window region lies outside the window");
        assert!(all.iter().all(|r| r.start % 64 == 0), "a window region is misaligned");
        win
    }

    /// Bytes allocated (the used part of the plan's window).
    pub fn bytes(&self) -> u64 {
        self.len as u64
    }

    /// The mutable regions of one run (see [`Parts`]).
    pub fn parts(&mut self) -> Parts<'_> {
        let base = self.base;
        // SAFETY: the ranges lie inside the allocation and are pairwise disjoint (asserted in
        // `new`), and 64-byte aligned, so typed views are aligned; `&mut self` keeps every
        // other borrow of the window out for 'w, and the staging thread writes only slots,
        // which no slice here covers.
        unsafe {
            let bytes = |r: &Range<usize>| std::slice::from_raw_parts_mut(base.add(r.start), r.len());
            let f32s = |r: &Range<usize>| std::slice::from_raw_parts_mut(base.add(r.start) as *mut f32, r.len() / 4);
            let kv = match self.kv_dtype {
                KvDType::F32 => KvView::F32(f32s(&self.kv)),
                half => KvView::Half(std::slice::from_raw_parts_mut(base.add(self.kv.start) as *mut u16, self.kv.len() / 2), half),
            };
            Parts {
                activations: f32s(&self.activations),
                activations_offset: self.activations.start as u64,
                kv,
                gemm: bytes(&self.gemm),
                attention: f32s(&self.attention),
                resident: &*bytes(&self.resident),
                resident_offset: self.resident.start as u64,
            }
        }
    }

    /// The resident region for filling at session start.
    pub fn resident_mut(&mut self) -> (&mut [u8], u64) {
        // SAFETY: inside the allocation, disjoint from the slots the staging thread writes.
        // SAFETY: inside the mapping, disjoint from the slots the staging thread writes.
        (unsafe { std::slice::from_raw_parts_mut(self.base.add(self.resident.start), self.resident.len()) }, self.resident.start as u64)
    }

    /// Copies the keys and values at `positions` (every layer and head) from `src`'s KV cache
    /// into this window's: both windows come from the same plan.
    pub fn copy_kv_from(&mut self, src: &Window, positions: &[u32], h: &Header) {
        assert_eq!((self.kv.len(), self.kv_dtype), (src.kv.len(), src.kv_dtype), "KV caches of one plan");
        let row = h.model.head_dim as usize * self.kv_dtype.bytes() as usize;
        let plane = h.plan.kv_capacity as usize * row;
        // SAFETY: both ranges lie inside their own mappings (asserted in `new`); `&mut self`
        // and `&src` are two different windows (one is borrowed mutably, the other shared).
        let (dst, from) = unsafe {
            (
                std::slice::from_raw_parts_mut(self.base.add(self.kv.start), self.kv.len()),
                std::slice::from_raw_parts(src.base.add(src.kv.start) as *const u8, src.kv.len()),
            )
        };
        for p in 0..self.kv.len() / plane.max(1) {
            for &pos in positions {
                let at = p * plane + pos as usize * row;
                dst[at..at + row].copy_from_slice(&from[at..at + row]);
            }
        }
    }

    /// Raw handles to the slots, for the staging thread (writes) and the executor (reads).
    pub fn slot_ptrs(&self) -> Vec<SlotPtr> {
        self.slots.iter().map(|r| SlotPtr { ptr: self.base.wrapping_add(r.start), len: r.len() }).collect()
    }

    /// Raw handles to the expert slots, layer-major (see [`slot_ptrs`](Self::slot_ptrs)).
    pub fn expert_slot_ptrs(&self) -> Vec<SlotPtr> {
        self.expert_slots.iter().map(|r| SlotPtr { ptr: self.base.wrapping_add(r.start), len: r.len() }).collect()
    }
}

/// Makes `bytes` (zero pages of an anonymous mapping) resident, without changing them.
fn commit(bytes: &mut [u8]) {
    if bytes.is_empty() {
        return;
    }
    #[cfg(any(target_os = "linux", target_os = "android"))]
    {
        /// Linux 5.14's `MADV_POPULATE_WRITE` (not in every libc's headers yet).
        const MADV_POPULATE_WRITE: libc::c_int = 23;
        // Page-aligned start of the range (the kernel wants one); the range grows to cover it.
        // SAFETY: sysconf has no preconditions.
        let page = usize::try_from(unsafe { libc::sysconf(libc::_SC_PAGESIZE) }).unwrap_or(4096).max(1);
        let start = bytes.as_mut_ptr() as usize;
        let aligned = start & !(page - 1);
        // SAFETY: [aligned, start + len) lies in pages of this mapping (the region starts
        // inside a page the mapping covers, as mappings are page-aligned); populating
        // pages with write intent changes no byte of them.
        let done = unsafe { libc::madvise(aligned as *mut libc::c_void, start + bytes.len() - aligned, MADV_POPULATE_WRITE) } == 0;
        if done {
            return;
        }
    }
    // An older kernel: write one zero per page (the pages hold zeros already).
    for b in bytes.iter_mut().step_by(4096) {
        // SAFETY: `b` is a valid, exclusive reference (volatile: the write of the value the
        // byte holds must still be made).
        unsafe { std::ptr::write_volatile(b, 0) };
    }
}

/// A slot's bytes in the window. Who may touch them when is decided by the staging protocol:
/// the staging thread writes a slot only after the executor released it, and the executor
/// reads it only after the staging thread published it as ready.
#[derive(Clone, Copy)]
pub struct SlotPtr {
    ptr: *mut u8,
    len: usize,
}

// SAFETY: a plain address; the staging protocol orders every access across threads.
unsafe impl Send for SlotPtr {}
unsafe impl Sync for SlotPtr {}

impl SlotPtr {
    /// A slot over `buf`, which must outlive every use of it.
    #[cfg(test)]
    pub(crate) fn new_for_test(buf: &mut [u8]) -> SlotPtr {
        SlotPtr { ptr: buf.as_mut_ptr(), len: buf.len() }
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The slot's bytes, for as long as this handle is borrowed (the stager's or the expert
    /// runtime's list of slots, which the window outlives).
    ///
    /// # Safety
    /// No thread writes the slot while the returned slice lives (the slot is ready and not
    /// yet released).
    pub unsafe fn bytes(&self) -> &[u8] {
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }

}

/// The one handle that writes a slot's bytes. It is not `Clone`, and a stager keeps it as a
/// lease's value (`lease::Slots`), so the thread that holds it is the slot's only writer; the
/// executor reads the slot (through [`SlotPtr`]) only while the handle is home and its copy
/// has finished.
pub struct SlotMem(SlotPtr);

impl SlotMem {
    /// # Safety
    /// No other `SlotMem` of this slot is alive, nobody reads the slot while this handle is
    /// lent, and the window outlives the handle.
    pub unsafe fn new(slot: SlotPtr) -> SlotMem {
        SlotMem(slot)
    }

    pub fn bytes_mut(&mut self) -> &mut [u8] {
        // SAFETY: `new`'s contract: this handle is the slot's only writer, the window is
        // alive, and `&mut self` makes the slice exclusive for its lifetime.
        unsafe { std::slice::from_raw_parts_mut(self.0.ptr, self.0.len) }
    }
}

/// Where each tensor an op reads lives in the window, worked out once per session from the
/// plan: resident (byte offset in the window) or rotating (index into the plan's rotating
/// list, and offset inside its segment).
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Home {
    Resident { offset: u64 },
    Rotating { rotating: u32, offset: u64 },
    /// Read by the CPU from the artifact (the embedding).
    Host,
}

pub fn homes(h: &Header) -> Vec<Home> {
    let w = &h.plan.window;
    (0..h.tensors.len() as TensorId)
        .map(|t| {
            let Some(s) = h.segment_of(t) else { return Home::Host };
            let within = h.tensors[t as usize].offset - h.segments[s as usize].offset;
            if let Some(r) = w.resident.iter().find(|r| r.segment == s) {
                Home::Resident { offset: r.offset + within }
            } else if let Some(i) = w.rotating.iter().position(|&x| x == s) {
                Home::Rotating { rotating: i as u32, offset: within }
            } else {
                Home::Host
            }
        })
        .collect()
}
