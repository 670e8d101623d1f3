//! Which instruction-set path the kernels take, detected once at run time. Every kernel has
//! a portable version; the wider ones are the same code compiled with more features enabled.

use std::sync::OnceLock;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Isa {
    /// Whatever the build's baseline target allows.
    Portable,
    /// x86-64-v3: AVX2 and FMA.
    Avx2,
    /// x86-64-v4: AVX-512 (F, BW, VL, DQ).
    Avx512,
}

impl Isa {
    pub fn name(self) -> &'static str {
        match self {
            Isa::Portable => "portable",
            Isa::Avx2 => "avx2",
            Isa::Avx512 => "avx512",
        }
    }
}

fn detect() -> Isa {
    // LLADA_ISA=portable|avx2 caps the path (for tests of the fallbacks, and for debugging).
    let cap = std::env::var("LLADA_ISA").ok();
    if cap.as_deref() == Some("portable") {
        return Isa::Portable;
    }
    #[cfg(target_arch = "x86_64")]
    {
        let v3 = is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma") && is_x86_feature_detected!("f16c");
        let v4 = v3
            && is_x86_feature_detected!("avx512f")
            && is_x86_feature_detected!("avx512bw")
            && is_x86_feature_detected!("avx512vl")
            && is_x86_feature_detected!("avx512dq");
        if v4 && cap.as_deref() != Some("avx2") {
            return Isa::Avx512;
        }
        if v3 {
            return Isa::Avx2;
        }
    }
    Isa::Portable
}

/// The path in use.
pub fn isa() -> Isa {
    static ISA: OnceLock<Isa> = OnceLock::new();
    *ISA.get_or_init(detect)
}

/// Defines `pub fn $name(args) -> ret` that runs `$body::<FMA>(args)` compiled for the best
/// instruction set [`isa`] reports. `$body` must be `#[inline(always)]` so each copy is
/// compiled with its wrapper's features; `FMA` says whether fused multiply-add is a single
/// instruction there (without it, `mul_add` would be a slow library call).
macro_rules! multiversion {
    ($(#[$meta:meta])* pub fn $name:ident($($arg:ident : $ty:ty),* $(,)?) $(-> $ret:ty)? => $body:ident) => {
        $(#[$meta])*
        pub fn $name($($arg: $ty),*) $(-> $ret)? {
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
                    $crate::kernels::cpu::Isa::Portable => {}
                }
            }
            $body::<false>($($arg),*)
        }
    };
}
pub(crate) use multiversion;
