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
