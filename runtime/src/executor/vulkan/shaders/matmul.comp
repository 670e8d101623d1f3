#version 450
#extension GL_GOOGLE_include_directive : require
#ifdef INT8_DOT
// Built a second time with INT8_DOT (matmul_dot.spv) for devices that report
// VK_KHR_shader_integer_dot_product: the packed 4 x int8 dot products become one instruction.
#extension GL_EXT_spirv_intrinsics : require
spirv_instruction(extensions = ["SPV_KHR_integer_dot_product"], capabilities = [6019, 6018], id = 4450) int sdot4x8(uint x, uint y, spirv_literal int packed_format);
spirv_instruction(extensions = ["SPV_KHR_integer_dot_product"], capabilities = [6019, 6018], id = 4452) int sudot4x8(uint x, uint y, spirv_literal int packed_format);
#endif
// out[r, n] = x[r, :] . W[n, :] over packed 16-column panels (layouts: `llada_ir::packing`),
// for the columns of `panels` panels starting at word w_off of binding 1 (a large matrix is
// split into several dispatches, each binding a part of it). One invocation computes four
// columns for four rows from 128-bit loads: each weight vector it loads serves four rows and
// each activation vector four columns. k is a multiple of 4 (checked when recording).
//
// FORMAT (specialisation constant): 0 f32, 1 f16, 2 bf16, 3 bf16 with activations rounded to
// bf16, 4 q8 and 5 q4 on int8 activations that `quantize.comp` wrote to binding 2. The sums
// follow the host kernels' order: K is walked in the SIMD kernels' chunks of `chunk` inputs,
// each chunk's sum (fused multiply-adds in input order from zero; integer for q8 and q4, q8
// scaled as the portable and NEON kernels scale it, (sum * w) * x, where the x86 SIMD ones
// take sum * (w * x)) added to the output in chunk order. On a driver whose division and
// square root round correctly (lavapipe) that is the host's portable kernels' bits.
// With `blocks` > 1 (per-block activation scales) each 32-input block's integer sum is scaled
// by its row's scale of that block (q8: then by the column's; q4: times the group's).
layout(local_size_x = 32) in;
layout(constant_id = 0) const uint FORMAT = 0u;
#include "common.glsl"

// The same bindings as 128- and 64-bit vectors (offsets of vectors are multiples of their
// size: the recorder aligns bindings to 16 bytes, and values and tensors are 64-byte aligned).
layout(std430, set = 0, binding = 0) readonly buffer ActivationVectors { vec4 act4[]; };
layout(std430, set = 0, binding = 1) readonly buffer WordVectorsA { uvec4 wa4[]; };
layout(std430, set = 0, binding = 1) readonly buffer WordPairsA { uvec2 wa2[]; };
layout(std430, set = 0, binding = 2) readonly buffer WordPairsB { uvec2 wb2[]; };

layout(push_constant) uniform Params {
    uint x_off; uint out_off; uint k; uint n; uint rows; uint from_heads;
    uint w_off; uint panel_words; uint col0; uint group;
    uint q_off; uint q_stride; uint scale_off; uint chunk; uint blocks;
} pc;

ivec4 s8x4(uint word) { return ivec4(bitfieldExtract(int(word), 0, 8), bitfieldExtract(int(word), 8, 8), bitfieldExtract(int(word), 16, 8), bitfieldExtract(int(word), 24, 8)); }

int idot(ivec4 a, ivec4 b) { ivec4 p = a * b; return p.x + p.y + p.z + p.w; }

// Dot products of four packed bytes: both signed, or signed `s` with unsigned `u`.
#ifdef INT8_DOT
int dot_ss(uint a, uint b) { return sdot4x8(a, b, 0); }
int dot_su(uint s, uint u) { return sudot4x8(s, u, 0); }
#else
int dot_ss(uint a, uint b) { return idot(s8x4(a), s8x4(b)); }
int dot_su(uint s, uint u) { return idot(s8x4(s), ivec4(u & 0xffu, (u >> 8) & 0xffu, (u >> 16) & 0xffu, u >> 24)); }
#endif

// The four columns' 4-k dot products with one row's four quants.
ivec4 dot4(uvec4 w, uint x) { return ivec4(dot_ss(w.x, x), dot_ss(w.y, x), dot_ss(w.z, x), dot_ss(w.w, x)); }

// Four columns' q4 words (nibbles: low k..k+4, high k+4..k+8) against a row's two quant
// words: the sums of (u - 8) * x, as sum(u * x) - 8 * sum(x).
ivec4 dot_q4x4(uvec4 w, uvec2 x) {
    const uint LOW = 0x0f0f0f0fu;
    int offset = 8 * (dot_ss(x.x, 0x01010101u) + dot_ss(x.y, 0x01010101u));
    ivec4 s = ivec4(dot_su(x.x, w.x & LOW) + dot_su(x.y, (w.x >> 4) & LOW), dot_su(x.x, w.y & LOW) + dot_su(x.y, (w.y >> 4) & LOW),
                    dot_su(x.x, w.z & LOW) + dot_su(x.y, (w.z >> 4) & LOW), dot_su(x.x, w.w & LOW) + dot_su(x.y, (w.w >> 4) & LOW));
    return s - offset;
}

vec4 halves(uvec2 w) { return vec4(unpackHalf2x16(w.x), unpackHalf2x16(w.y)); }

vec4 bf16s(uvec4 w, uint high) { return uintBitsToFloat(high == 0u ? w << 16 : w & 0xffff0000u); }

// Weights of the invocation's four columns at input kk.
vec4 weights(uint base, uint quad, uint kk) {
    if (FORMAT == 0u) return uintBitsToFloat(wa4[(base + kk * 16u) / 4u + quad]);
    if (FORMAT == 1u) return halves(wa2[(base + kk * 8u) / 2u + quad]);
    return bf16s(wa4[(base + 16u * (kk / 2u)) / 4u + quad], kk & 1u);
}

vec4 activations(uint at) {
    vec4 x = act4[at / 4u];
    if (FORMAT == 3u) x = vec4(bf16_bits_to_f32(f32_to_bf16_bits(x.x)), bf16_bits_to_f32(f32_to_bf16_bits(x.y)), bf16_bits_to_f32(f32_to_bf16_bits(x.z)), bf16_bits_to_f32(f32_to_bf16_bits(x.w)));
    return x;
}

void main() {
    uint c = gl_GlobalInvocationID.x * 4u;
    uint col = pc.col0 + c;
    uint rows = value_rows(pc.rows, pc.from_heads);
    uint r0 = gl_GlobalInvocationID.y * 4u;
    if (col >= pc.n || r0 >= rows) return;
    uint m = min(4u, rows - r0);
    uint base = pc.w_off + (c / 16u) * pc.panel_words;
    uint quad = (c % 16u) / 4u;
    // Rows past the last are computed on the last row again and not stored.
    uint ra = r0, rb = r0 + min(1u, m - 1u), rc = r0 + min(2u, m - 1u), rd = r0 + min(3u, m - 1u);
    vec4 a0 = vec4(0.0), a1 = vec4(0.0), a2 = vec4(0.0), a3 = vec4(0.0);
    if (FORMAT <= 3u) {
        uint xa = pc.x_off + ra * pc.k, xb = pc.x_off + rb * pc.k, xc = pc.x_off + rc * pc.k, xd = pc.x_off + rd * pc.k;
        for (uint k0 = 0u; k0 < pc.k; k0 += pc.chunk) {
            vec4 c0 = vec4(0.0), c1 = vec4(0.0), c2 = vec4(0.0), c3 = vec4(0.0);
            for (uint kk = k0; kk < min(k0 + pc.chunk, pc.k); kk += 4u) {
                vec4 w0 = weights(base, quad, kk), w1 = weights(base, quad, kk + 1u), w2 = weights(base, quad, kk + 2u), w3 = weights(base, quad, kk + 3u);
                vec4 x = activations(xa + kk);
                c0 = fma(vec4(x.w), w3, fma(vec4(x.z), w2, fma(vec4(x.y), w1, fma(vec4(x.x), w0, c0))));
                x = activations(xb + kk);
                c1 = fma(vec4(x.w), w3, fma(vec4(x.z), w2, fma(vec4(x.y), w1, fma(vec4(x.x), w0, c1))));
                x = activations(xc + kk);
                c2 = fma(vec4(x.w), w3, fma(vec4(x.z), w2, fma(vec4(x.y), w1, fma(vec4(x.x), w0, c2))));
                x = activations(xd + kk);
                c3 = fma(vec4(x.w), w3, fma(vec4(x.z), w2, fma(vec4(x.y), w1, fma(vec4(x.x), w0, c3))));
            }
            a0 += c0;
            a1 += c1;
            a2 += c2;
            a3 += c3;
        }
    } else {
        uint qa = pc.q_off + ra * pc.q_stride, qb = pc.q_off + rb * pc.q_stride, qc = pc.q_off + rc * pc.q_stride, qd = pc.q_off + rd * pc.q_stride;
        vec4 xs = vec4(uintBitsToFloat(wb[pc.scale_off + ra]), uintBitsToFloat(wb[pc.scale_off + rb]), uintBitsToFloat(wb[pc.scale_off + rc]), uintBitsToFloat(wb[pc.scale_off + rd]));
        if (pc.blocks > 1u) {
            // Scales of block b of the four rows.
            uint sa = pc.scale_off + ra * pc.blocks, sb = pc.scale_off + rb * pc.blocks, sc = pc.scale_off + rc * pc.blocks, sd = pc.scale_off + rd * pc.blocks;
            uint words = pc.k / 4u;
            vec4 ws = FORMAT == 4u ? uintBitsToFloat(wa4[(base + 16u * words) / 4u + quad]) : vec4(1.0);
            for (uint b = 0u; b < pc.blocks; b++) {
                ivec4 s0 = ivec4(0), s1 = ivec4(0), s2 = ivec4(0), s3 = ivec4(0);
                if (FORMAT == 4u) {
                    // Signed quants against signed weights: exact block sums.
                    for (uint q = 8u * b; q < 8u * b + 8u; q++) {
                        uvec4 w = wa4[(base + 16u * q) / 4u + quad];
                        s0 += dot4(w, wb[qa + q]);
                        s1 += dot4(w, wb[qb + q]);
                        s2 += dot4(w, wb[qc + q]);
                        s3 += dot4(w, wb[qd + q]);
                    }
                } else {
                    for (uint e = 4u * b; e < 4u * b + 4u; e++) {
                        uvec4 w = wa4[(base + 16u * e) / 4u + quad];
                        s0 += dot_q4x4(w, wb2[(qa + 2u * e) / 2u]);
                        s1 += dot_q4x4(w, wb2[(qb + 2u * e) / 2u]);
                        s2 += dot_q4x4(w, wb2[(qc + 2u * e) / 2u]);
                        s3 += dot_q4x4(w, wb2[(qd + 2u * e) / 2u]);
                    }
                }
                // q4: the block's group scale (a group is whole blocks).
                vec4 d = FORMAT == 4u ? vec4(1.0) : halves(wa2[(base + 2u * pc.k + 8u * (32u * b / pc.group)) / 2u + quad]);
                a0 += vec4(s0) * (d * uintBitsToFloat(wb[sa + b]));
                a1 += vec4(s1) * (d * uintBitsToFloat(wb[sb + b]));
                a2 += vec4(s2) * (d * uintBitsToFloat(wb[sc + b]));
                a3 += vec4(s3) * (d * uintBitsToFloat(wb[sd + b]));
            }
            a0 *= ws;
            a1 *= ws;
            a2 *= ws;
            a3 *= ws;
        } else if (FORMAT == 4u) {
            uint words = (pc.k + 3u) / 4u;
            vec4 ws = uintBitsToFloat(wa4[(base + 16u * words) / 4u + quad]);
            // The host adds 128 to every quant (an unsigned operand) and takes it out on the
            // first chunk with the whole-K column sums: each chunk's integer sum is that.
            ivec4 colsum = ivec4(wa4[(base + 16u * words) / 4u + 4u + quad]);
            for (uint q0 = 0u; q0 < words; q0 += pc.chunk / 4u) {
                ivec4 s0 = ivec4(0), s1 = ivec4(0), s2 = ivec4(0), s3 = ivec4(0), wsum = ivec4(0);
                for (uint q = q0; q < min(q0 + pc.chunk / 4u, words); q++) {
                    uvec4 w = wa4[(base + 16u * q) / 4u + quad];
                    s0 += dot4(w, wb[qa + q]);
                    s1 += dot4(w, wb[qb + q]);
                    s2 += dot4(w, wb[qc + q]);
                    s3 += dot4(w, wb[qd + q]);
                    wsum += dot4(w, 0x01010101u);
                }
                ivec4 offset = 128 * wsum - (q0 == 0u ? 128 * colsum : ivec4(0));
                a0 += vec4(s0 + offset) * ws * xs.x;
                a1 += vec4(s1 + offset) * ws * xs.y;
                a2 += vec4(s2 + offset) * ws * xs.z;
                a3 += vec4(s3 + offset) * ws * xs.w;
            }
        } else {
            uint blocks = pc.group / 8u;
            uint groups = pc.k / pc.group;
            uint per_chunk = pc.chunk / pc.group;
            for (uint g0 = 0u; g0 < groups; g0 += per_chunk) {
                vec4 c0 = vec4(0.0), c1 = vec4(0.0), c2 = vec4(0.0), c3 = vec4(0.0);
                for (uint g = g0; g < min(g0 + per_chunk, groups); g++) {
                    ivec4 s0 = ivec4(0), s1 = ivec4(0), s2 = ivec4(0), s3 = ivec4(0);
                    for (uint b = g * blocks; b < (g + 1u) * blocks; b++) {
                        uvec4 w = wa4[(base + 16u * b) / 4u + quad];
                        s0 += dot_q4x4(w, wb2[(qa + 2u * b) / 2u]);
                        s1 += dot_q4x4(w, wb2[(qb + 2u * b) / 2u]);
                        s2 += dot_q4x4(w, wb2[(qc + 2u * b) / 2u]);
                        s3 += dot_q4x4(w, wb2[(qd + 2u * b) / 2u]);
                    }
                    vec4 d = halves(wa2[(base + 2u * pc.k + 8u * g) / 2u + quad]);
                    c0 = fma(vec4(s0), d, c0);
                    c1 = fma(vec4(s1), d, c1);
                    c2 = fma(vec4(s2), d, c2);
                    c3 = fma(vec4(s3), d, c3);
                }
                a0 += c0 * xs.x;
                a1 += c1 * xs.y;
                a2 += c2 * xs.z;
                a3 += c3 * xs.w;
            }
        }
    }
    uint cols = min(4u, pc.n - col);
    vec4 acc[4] = vec4[4](a0, a1, a2, a3);
    for (uint i = 0u; i < m; i++) {
        uint o = pc.out_off + (r0 + i) * pc.n + col;
        for (uint j = 0u; j < cols; j++) act[o + j] = acc[i][j];
    }
}
