//! Which instruction-set paths the kernels take, detected once at run time. Every kernel has
//! a portable version; the wider ones are chosen only when the CPU has their features.
//!
//! `LLADA_ISA` caps the choice, for testing the fallbacks and for debugging. On x86-64:
//! `portable` (no SIMD), `avx2` (no AVX-512: every matmul on the AVX2 tiles), `avx512`
//! (AVX-512 F/BW/VL/DQ without the BF16 and VNNI extensions, so bf16-activation and int8
//! matmuls take their AVX2 path). On AArch64: `portable`, `neon` (no dot-product
//! extensions: int8 by widening multiplies, bf16 widened), `dotprod` (adds `sdot`, not
//! `smmla` or `bfdot`). The matmuls follow the `Features` they are given (normally
//! [`features`], so the cap reaches them).
//! `LLADA_DISABLE_AMX=1` is honoured too; this build has no AMX kernels (see BENCHMARKS.md),
//! so AMX is only detected and reported.

use std::sync::OnceLock;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Features {
    /// AVX2 + FMA + F16C (x86-64-v3): every matmul format has AVX2 tiles.
    pub avx2: bool,
    /// AVX-512 F, BW, VL, DQ (x86-64-v4).
    pub avx512: bool,
    /// AVX-512 BF16: `vdpbf16ps`, bf16 pair dot products.
    pub avx512_bf16: bool,
    /// AVX-512 VNNI: `vpdpbusd`, int8 quad dot products.
    pub avx512_vnni: bool,
    /// AMX tiles (bf16 and int8).
    pub amx: bool,
    /// AArch64 Advanced SIMD (every ARMv8-A phone core): f32 FMA, f16 widening.
    pub neon: bool,
    /// ARMv8.2 dot product: `sdot`, int8 quad dot products.
    pub dotprod: bool,
    /// ARMv8.6 int8 matrix multiply: `smmla`, 2x8 by 8x2 int8 blocks.
    pub i8mm: bool,
    /// ARMv8.6 bf16: `bfdot`, bf16 pair dot products.
    pub bf16: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Isa {
    Portable,
    Avx2,
    Avx512,
    /// AArch64 NEON.
    Neon,
}

impl Isa {
    pub fn name(self) -> &'static str {
        match self {
            Isa::Portable => "portable",
            Isa::Avx2 => "avx2",
            Isa::Avx512 => "avx512",
            Isa::Neon => "neon",
        }
    }
}

fn detect() -> Features {
    let cap = std::env::var("LLADA_ISA").ok();
    let mut f = Features::default();
    #[cfg(target_arch = "x86_64")]
    {
        f.avx2 = is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma") && is_x86_feature_detected!("f16c");
        f.avx512 = f.avx2
            && is_x86_feature_detected!("avx512f")
            && is_x86_feature_detected!("avx512bw")
            && is_x86_feature_detected!("avx512vl")
            && is_x86_feature_detected!("avx512dq");
        f.avx512_bf16 = f.avx512 && is_x86_feature_detected!("avx512bf16");
        f.avx512_vnni = f.avx512 && is_x86_feature_detected!("avx512vnni");
        f.amx = amx_in_cpuid();
    }
    #[cfg(target_arch = "aarch64")]
    {
        use std::arch::is_aarch64_feature_detected as has;
        f.neon = has!("neon");
        f.dotprod = f.neon && has!("dotprod");
        // The i8mm tiles finish odd quads with `sdot`, so they need both.
        f.i8mm = f.dotprod && has!("i8mm");
        f.bf16 = f.neon && has!("bf16");
    }
    match cap.as_deref() {
        Some("portable") => f = Features::default(),
        Some("avx2") => f = Features { avx2: f.avx2, ..Features::default() },
        Some("avx512") => f = Features { avx2: f.avx2, avx512: f.avx512, ..Features::default() },
        Some("neon") => f = Features { neon: f.neon, ..Features::default() },
        Some("dotprod") => f = Features { neon: f.neon, dotprod: f.dotprod, ..Features::default() },
        _ => {}
    }
    if std::env::var_os("LLADA_DISABLE_AMX").is_some() {
        f.amx = false;
    }
    f
}

/// AMX-TILE, AMX-BF16 and AMX-INT8 in CPUID leaf 7 (EDX bits 24, 22, 25). Read directly:
/// the standard library's AMX detection is unstable in Rust 1.95.
#[cfg(target_arch = "x86_64")]
fn amx_in_cpuid() -> bool {
    // CPUID is safe to call on x86-64; leaf 7 exists when leaf 0 reports it.
    if std::arch::x86_64::__cpuid(0).eax < 7 {
        return false;
    }
    let edx = std::arch::x86_64::__cpuid_count(7, 0).edx;
    [24, 22, 25].iter().all(|bit| edx & (1 << bit) != 0)
}

/// The features in use (detected once, capped by `LLADA_ISA`).
pub fn features() -> Features {
    static FEATURES: OnceLock<Features> = OnceLock::new();
    *FEATURES.get_or_init(detect)
}

/// The widest general-purpose vector path (for f32 kernels outside the matmuls).
pub fn isa() -> Isa {
    let f = features();
    if f.avx512 {
        Isa::Avx512
    } else if f.avx2 {
        Isa::Avx2
    } else if f.neon {
        Isa::Neon
    } else {
        Isa::Portable
    }
}

impl Features {
    /// One line for logs and reports: `avx512 bf16 vnni (no amx)`.
    pub fn describe(self) -> String {
        let mut parts = Vec::new();
        for (on, name) in [(self.avx2, "avx2"), (self.avx512, "avx512"), (self.avx512_bf16, "avx512-bf16"), (self.avx512_vnni, "avx512-vnni"), (self.amx, "amx"), (self.neon, "neon"), (self.dotprod, "dotprod"), (self.i8mm, "i8mm"), (self.bf16, "bf16")] {
            if on {
                parts.push(name);
            }
        }
        if parts.is_empty() {
            "portable".into()
        } else {
            parts.join(" ")
        }
    }
}

/// Defines `pub fn $name(args) -> ret` that runs `$body::<FMA>(args)` compiled for the best
/// instruction set [`isa`] reports. `$body` must be `#[inline(always)]` so each copy is
/// compiled with its wrapper's features; `FMA` says whether fused multiply-add is a single
/// instruction there (without it, `mul_add` would be a slow library call). On AArch64, NEON
/// and FMA are in the base instruction set, so the NEON copy is the body with `FMA` on and
/// the portable twin the same body with it off (unfused, as the x86 fallback).
macro_rules! multiversion {
    ($(#[$meta:meta])* $vis:vis fn $name:ident($($arg:ident : $ty:ty),* $(,)?) $(-> $ret:ty)? => $body:ident) => {
        $(#[$meta])*
        $vis fn $name($($arg: $ty),*) $(-> $ret)? {
            #[cfg(target_arch = "x86_64")]
            {
                #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c")]
                unsafe fn v4($($arg: $ty),*) $(-> $ret)? { $body::<true>($($arg),*) }
                #[target_feature(enable = "avx2,fma,f16c")]
                unsafe fn v3($($arg: $ty),*) $(-> $ret)? { $body::<true>($($arg),*) }
                match $crate::kernels::cpu::isa() {
                    // SAFETY: `isa()` reports a path only when the CPU has all its features.
                    $crate::kernels::cpu::Isa::Avx512 => return unsafe { v4($($arg),*) },
                    $crate::kernels::cpu::Isa::Avx2 => return unsafe { v3($($arg),*) },
                    _ => {}
                }
            }
            #[cfg(target_arch = "aarch64")]
            if $crate::kernels::cpu::isa() == $crate::kernels::cpu::Isa::Neon {
                return $body::<true>($($arg),*);
            }
            $body::<false>($($arg),*)
        }
    };
}
pub(crate) use multiversion;
