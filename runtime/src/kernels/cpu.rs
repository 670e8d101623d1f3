//! Which instruction-set paths the kernels take, detected once at run time. Every kernel has
//! a portable version; the wider ones are chosen only when the CPU has their features.
//!
//! `LLADA_ISA` caps the choice, for testing the fallbacks and for debugging. On x86-64:
//! `portable` (no SIMD), `avx2` (no AVX-512: every matmul on the AVX2 tiles), `avx512`
//! (AVX-512 F/BW/VL/DQ without the BF16 and VNNI extensions, so bf16-activation and int8
//! matmuls take their AVX2 path). On AArch64: `portable`, `neon` (no dot-product
//! extensions: int8 by widening multiplies, bf16 widened), `dotprod` (adds `sdot`, not
//! `smmla` or `bfdot`). Every kernel (matmuls, attention and its softmax, RMSNorm, SwiGLU,
//! dot) follows the [`Features`] it is given, normally [`features`], so the cap reaches them
//! all. The sampler's arithmetic (softmax of a row, argmax, Gumbel noise) has no
//! instruction-set paths: it is compiled for the base target only.
//! `LLADA_DISABLE_AMX=1` is honoured too; this build has no AMX kernels (see BENCHMARKS.md),
//! so AMX is only detected and reported.

use std::sync::OnceLock;

/// The CPU features the kernels may use. A `Features` is always the set in use ([`features`]:
/// detected, capped by `LLADA_ISA`) or a subset of it: its fields are private, and every way
/// to make one starts from that set and only removes features. Every kernel dispatches on the
/// `Features` it is given, so safe code cannot reach an instruction the CPU lacks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Features {
    avx2: bool,
    avx512: bool,
    avx512_bf16: bool,
    avx512_vnni: bool,
    amx: bool,
    neon: bool,
    dotprod: bool,
    i8mm: bool,
    bf16: bool,
}

/// Features a caller asks for; [`Features::request`] keeps those the CPU has.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct FeatureRequest {
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

impl FeatureRequest {
    /// Every feature there is.
    pub const ALL: FeatureRequest =
        FeatureRequest { avx2: true, avx512: true, avx512_bf16: true, avx512_vnni: true, amx: true, neon: true, dotprod: true, i8mm: true, bf16: true };

    /// An `LLADA_ISA` level: `portable`, `avx2`, `avx512`, `neon` or `dotprod`.
    pub fn level(name: &str) -> Option<FeatureRequest> {
        let none = FeatureRequest::default();
        Some(match name {
            "portable" => none,
            "avx2" => FeatureRequest { avx2: true, ..none },
            "avx512" => FeatureRequest { avx2: true, avx512: true, ..none },
            "neon" => FeatureRequest { neon: true, ..none },
            "dotprod" => FeatureRequest { neon: true, dotprod: true, ..none },
            _ => return None,
        })
    }
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

/// What the CPU has, before any cap.
fn detect() -> Features {
    #[allow(unused_mut)]
    let mut f = Features::PORTABLE;
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

/// The features in use: detected once, capped by `LLADA_ISA` (an unknown level is ignored,
/// with a warning) and by `LLADA_DISABLE_AMX`.
pub fn features() -> Features {
    static FEATURES: OnceLock<Features> = OnceLock::new();
    *FEATURES.get_or_init(|| {
        let mut f = detect();
        if let Ok(level) = std::env::var("LLADA_ISA") {
            match FeatureRequest::level(&level) {
                Some(r) => f = f.cut(r),
                None => eprintln!("warning: LLADA_ISA={level} is not portable, avx2, avx512, neon or dotprod; ignored"),
            }
        }
        if std::env::var_os("LLADA_DISABLE_AMX").is_some() {
            f.amx = false;
        }
        f
    })
}

impl Features {
    /// No SIMD feature: the portable kernels everywhere.
    pub const PORTABLE: Features =
        Features { avx2: false, avx512: false, avx512_bf16: false, avx512_vnni: false, amx: false, neon: false, dotprod: false, i8mm: false, bf16: false };

    /// The features in use that `r` asks for. A feature the CPU lacks is cut, and so is one
    /// whose base is cut (AVX-512 without AVX2, `i8mm` without `dotprod`, ...).
    pub fn request(r: FeatureRequest) -> Features {
        features().cut(r)
    }

    /// `self` without the features `r` does not ask for, closed under the kernels'
    /// requirements (each extension needs its base).
    fn cut(self, r: FeatureRequest) -> Features {
        let avx2 = self.avx2 && r.avx2;
        let avx512 = avx2 && self.avx512 && r.avx512;
        let neon = self.neon && r.neon;
        let dotprod = neon && self.dotprod && r.dotprod;
        Features {
            avx2,
            avx512,
            avx512_bf16: avx512 && self.avx512_bf16 && r.avx512_bf16,
            avx512_vnni: avx512 && self.avx512_vnni && r.avx512_vnni,
            amx: self.amx && r.amx,
            neon,
            dotprod,
            i8mm: dotprod && self.i8mm && r.i8mm,
            bf16: neon && self.bf16 && r.bf16,
        }
    }

    /// Every feature of `other` is in `self`.
    pub fn contains(self, other: Features) -> bool {
        let Features { avx2, avx512, avx512_bf16, avx512_vnni, amx, neon, dotprod, i8mm, bf16 } = other;
        self.cut(FeatureRequest { avx2, avx512, avx512_bf16, avx512_vnni, amx, neon, dotprod, i8mm, bf16 }) == other
    }

    pub fn avx2(self) -> bool {
        self.avx2
    }
    pub fn avx512(self) -> bool {
        self.avx512
    }
    pub fn avx512_bf16(self) -> bool {
        self.avx512_bf16
    }
    pub fn avx512_vnni(self) -> bool {
        self.avx512_vnni
    }
    pub fn amx(self) -> bool {
        self.amx
    }
    pub fn neon(self) -> bool {
        self.neon
    }
    pub fn dotprod(self) -> bool {
        self.dotprod
    }
    pub fn i8mm(self) -> bool {
        self.i8mm
    }
    pub fn bf16(self) -> bool {
        self.bf16
    }

    /// The widest general-purpose vector path (for the f32 kernels outside the matmuls).
    pub fn isa(self) -> Isa {
        if self.avx512 {
            Isa::Avx512
        } else if self.avx2 {
            Isa::Avx2
        } else if self.neon {
            Isa::Neon
        } else {
            Isa::Portable
        }
    }

    /// One line for logs and reports: `avx2 avx512 avx512-vnni`.
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

/// Defines `pub fn $name(features: Features, args) -> ret` that runs
/// `$body::<FMA>(features, args)` compiled for the widest instruction set `features` allows
/// ([`Features::isa`]). `$body` must be `#[inline(always)]` so each copy is compiled with its
/// wrapper's features; `FMA` says whether fused multiply-add is a single instruction there
/// (without it, `mul_add` would be a slow library call). On AArch64, NEON and FMA are in the
/// base instruction set, so the NEON copy is the body with `FMA` on and the portable twin the
/// same body with it off (unfused, as the x86 fallback).
macro_rules! multiversion {
    ($(#[$meta:meta])* $vis:vis fn $name:ident($features:ident : Features $(, $arg:ident : $ty:ty)* $(,)?) $(-> $ret:ty)? => $body:ident) => {
        $(#[$meta])*
        $vis fn $name($features: $crate::kernels::cpu::Features $(, $arg: $ty)*) $(-> $ret)? {
            #[cfg(target_arch = "x86_64")]
            {
                #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c")]
                unsafe fn v4($features: $crate::kernels::cpu::Features $(, $arg: $ty)*) $(-> $ret)? { $body::<true>($features $(, $arg)*) }
                #[target_feature(enable = "avx2,fma,f16c")]
                unsafe fn v3($features: $crate::kernels::cpu::Features $(, $arg: $ty)*) $(-> $ret)? { $body::<true>($features $(, $arg)*) }
                match $features.isa() {
                    // SAFETY: a `Features` holds only features the CPU has (see the type).
                    $crate::kernels::cpu::Isa::Avx512 => return unsafe { v4($features $(, $arg)*) },
                    $crate::kernels::cpu::Isa::Avx2 => return unsafe { v3($features $(, $arg)*) },
                    _ => {}
                }
            }
            #[cfg(target_arch = "aarch64")]
            if $features.isa() == $crate::kernels::cpu::Isa::Neon {
                return $body::<true>($features $(, $arg)*);
            }
            $body::<false>($features $(, $arg)*)
        }
    };
}
pub(crate) use multiversion;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_request_beyond_the_cpu_is_cut_to_what_it_has() {
        let f = features();
        assert_eq!(Features::request(FeatureRequest::ALL), f);
        assert_eq!(Features::request(FeatureRequest::default()), Features::PORTABLE);
        for level in ["portable", "avx2", "avx512", "neon", "dotprod"] {
            let r = Features::request(FeatureRequest::level(level).unwrap());
            assert!(f.contains(r), "{level}: {} is not within {}", r.describe(), f.describe());
        }
        // An extension without its base is cut with it.
        let no_base = FeatureRequest { avx512: true, avx512_vnni: true, i8mm: true, bf16: true, ..FeatureRequest::default() };
        assert_eq!(Features::request(no_base), Features::PORTABLE);
        assert!(FeatureRequest::level("avx1024").is_none());
    }
}
