// Bindings every llada compute shader shares (one descriptor set layout for all of them):
// 0: the window's activation region as floats; 1 and 2: byte ranges of the window (weights,
// the KV cache of one layer, the GEMM scratch) read as 32-bit words; 3: the pass inputs.
// Offsets in push constants are in elements of the binding they index.

layout(std430, set = 0, binding = 0) buffer Activations { float act[]; };
layout(std430, set = 0, binding = 1) readonly buffer WordsA { uint wa[]; };
layout(std430, set = 0, binding = 2) buffer WordsB { uint wb[]; };
// Pass inputs, written by the host before each submit: stored rows, context, head rows,
// real rows, the block-causal mask's block length (0: none), then one position per graph
// row, then the head rows (from word 5 + max_rows).
layout(std430, set = 0, binding = 3) readonly buffer Inputs { uint inp[]; };

const uint IN_STORED = 0u;
const uint IN_CONTEXT = 1u;
const uint IN_HEADS = 2u;
const uint IN_BLOCK = 4u;
const uint IN_POS = 5u;

uint position_of(uint row) { return inp[IN_POS + row]; }

// Rows of a value in this pass: a graph's token rows, or as many as the head rows asked for.
uint value_rows(uint fixed_rows, uint from_heads) { return from_heads != 0u ? inp[IN_HEADS] : fixed_rows; }

float bf16_bits_to_f32(uint bits) { return uintBitsToFloat(bits << 16); }

float f16_bits_to_f32(uint bits) { return unpackHalf2x16(bits & 0xffffu).x; }

// f32 to bf16 bits, rounded to nearest even (NaN kept quiet), as the host's `half::bf16`.
uint f32_to_bf16_bits(float v) {
    uint x = floatBitsToUint(v);
    if ((x & 0x7fffffffu) > 0x7f800000u) return (x >> 16) | 0x40u;
    return (x + 0x7fffu + ((x >> 16) & 1u)) >> 16;
}

// f32 to f16 bits, rounded to nearest even, as the host's `half::f16` (packHalf2x16 leaves
// the rounding to the implementation).
uint f32_to_f16_bits(float v) {
    uint x = floatBitsToUint(v);
    uint sign = (x >> 16) & 0x8000u;
    uint e = (x >> 23) & 0xffu;
    uint m = x & 0x7fffffu;
    if (e == 0xffu) return sign | 0x7c00u | (m != 0u ? 0x200u : 0u);
    int ex = int(e) - 112;
    if (ex >= 31) return sign | 0x7c00u;
    if (ex <= 0) {
        if (ex < -10) return sign;
        uint full = m | 0x800000u;
        uint shift = uint(14 - ex);
        uint h = full >> shift;
        uint rest = full & ((1u << shift) - 1u);
        uint halfway = 1u << (shift - 1u);
        if (rest > halfway || (rest == halfway && (h & 1u) == 1u)) h += 1u;
        return sign | h;
    }
    uint h = sign | (uint(ex) << 10) | (m >> 13);
    uint rest = m & 0x1fffu;
    if (rest > 0x1000u || (rest == 0x1000u && (h & 1u) == 1u)) h += 1u;
    return h;
}

// The host kernels' e^x (`kernels::exp`): the same reduction and polynomial, so softmax and
// SiLU agree with the CPU to the last bits where the arithmetic allows.
float exp_host(float x) {
    x = clamp(x, -87.3, 88.3);
    precise float n = roundEven(x * 1.44269504088896341);
    precise float r = (x - n * 0.69314575) - n * 1.4286068e-6;
    precise float p = 1.0 + r * (1.0 + r * (0.5 + r * (1.0 / 6.0 + r * (1.0 / 24.0 + r * (1.0 / 120.0 + r * (1.0 / 720.0 + r * (1.0 / 5040.0)))))));
    return uintBitsToFloat(uint(int(n) + 127) << 23) * p;
}

// e^x - 1 as the host's libm computes it in f32 (glibc's `expm1f`, fdlibm's algorithm: the
// same argument reduction and rational approximation, operation for operation), for
// `tanh_host`. Arguments at or past 88.7 (no caller passes them) are not handled.
float expm1_host(float x) {
    uint hx = floatBitsToUint(x);
    bool negative = (hx & 0x80000000u) != 0u;
    hx &= 0x7fffffffu;
    if (hx >= 0x4195b844u && negative) return -1.0;
    const float ln2_hi = uintBitsToFloat(0x3f317180u), ln2_lo = uintBitsToFloat(0x3717f7d1u);
    // Every result `precise`: a fused multiply-add would round once where libm rounds twice.
    precise float hi, lo, c = 0.0, r;
    int k = 0;
    if (hx > 0x3eb17218u) {
        if (hx < 0x3f851592u) {
            k = negative ? -1 : 1;
            hi = negative ? x + ln2_hi : x - ln2_hi;
            lo = negative ? -ln2_lo : ln2_lo;
        } else {
            precise float kf = uintBitsToFloat(0x3fb8aa3bu) * x + (negative ? -0.5 : 0.5);
            k = int(kf);
            precise float t = float(k);
            hi = x - t * ln2_hi;
            lo = t * ln2_lo;
        }
        x = hi - lo;
        c = (hi - x) - lo;
    } else if (hx < 0x33000000u) {
        return x;
    }
    precise float hfx = 0.5 * x;
    precise float hxs = x * hfx;
    precise float r1 = 1.0 + hxs * (uintBitsToFloat(0xbd088889u) + hxs * (uintBitsToFloat(0x3ad00d01u) + hxs * (uintBitsToFloat(0xb8a670cdu) + hxs * (uintBitsToFloat(0x36867e54u) + hxs * uintBitsToFloat(0xb457edbbu)))));
    precise float t = 3.0 - r1 * hfx;
    precise float e = hxs * ((r1 - t) / (6.0 - x * t));
    if (k == 0) {
        r = x - (x * e - hxs);
        return r;
    }
    e = x * (e - c) - c;
    e -= hxs;
    if (k == -1) {
        r = 0.5 * (x - e) - 0.5;
    } else if (k == 1) {
        r = x < -0.25 ? -2.0 * (e - (x + 0.5)) : 1.0 + 2.0 * (x - e);
    } else if (k <= -2 || k > 56) {
        precise float y = 1.0 - (e - x);
        r = uintBitsToFloat(floatBitsToUint(y) + (uint(k) << 23)) - 1.0;
    } else {
        precise float y;
        if (k < 23) {
            y = uintBitsToFloat(0x3f800000u - (0x1000000u >> uint(k))) - (e - x);
        } else {
            y = x - (e + uintBitsToFloat(uint(0x7f - k) << 23));
            y += 1.0;
        }
        r = uintBitsToFloat(floatBitsToUint(y) + (uint(k) << 23));
    }
    return r;
}

// tanh as the host's libm computes it in f32 (glibc's `tanhf`, through `expm1_host`), so
// DiffusionGemma's GELU and soft-capping agree with the host to the bit.
float tanh_host(float x) {
    uint ix = floatBitsToUint(x) & 0x7fffffffu;
    precise float z;
    if (ix >= 0x41b00000u) {
        z = 1.0;
    } else if (ix == 0u) {
        return x;
    } else if (ix < 0x24000000u) {
        z = abs(x) * (1.0 + abs(x));
    } else if (ix >= 0x3f800000u) {
        precise float t = expm1_host(2.0 * abs(x));
        z = 1.0 - 2.0 / (t + 2.0);
    } else {
        precise float t = expm1_host(-2.0 * abs(x));
        z = -t / (t + 2.0);
    }
    return x < 0.0 ? -z : z;
}

// PyTorch's `gelu(approximate='tanh')` constants as the host's `kernels::gemma` has them.
// (0x3f4c422a: the f32 nearest sqrt(2 / pi); the decimal below rounds to it.)
const float GELU_BETA = 0.7978845834732056;
const float GELU_KAPPA = 0.044715;
