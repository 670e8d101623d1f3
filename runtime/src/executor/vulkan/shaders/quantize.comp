#version 450
#extension GL_GOOGLE_include_directive : require
// Symmetric int8 quantisation of each activation row for the integer matmuls, as the host's
// `quantize_row`: scale = max|x| / 127, q = round-half-even(x / scale) clamped to +-127.
// Quants are packed four to a word into binding 2 (row r at word q_off + r * q_stride, zero
// beyond k up to the row's padded length), the row's scale at word scale_off + r. With
// `blocks` > 1 (per-block scales, `ActivationScales::PerBlock`) each block of 32 inputs is
// quantised on its own and its scale is at word scale_off + r * blocks + b.
layout(local_size_x = 64) in;
#include "common.glsl"

layout(push_constant) uniform Params {
    uint x_off; uint k; uint rows; uint from_heads; uint q_off; uint q_stride; uint scale_off; uint blocks;
} pc;

shared float partial[64];

void main() {
    uint row = gl_WorkGroupID.x, t = gl_LocalInvocationID.x;
    if (row >= value_rows(pc.rows, pc.from_heads)) return;
    uint x0 = pc.x_off + row * pc.k;
    if (pc.blocks > 1u) {
        // One invocation per block: its 32 inputs are 8 words.
        for (uint b = t; b < pc.blocks; b += 64u) {
            float bm = 0.0;
            for (uint i = 0u; i < 32u; i++) bm = max(bm, abs(act[x0 + 32u * b + i]));
            float bscale = bm / 127.0;
            float binv = bscale > 0.0 ? 1.0 / bscale : 0.0;
            for (uint word = 8u * b; word < 8u * b + 8u; word++) {
                uint packed = 0u;
                for (uint j = 0u; j < 4u; j++) {
                    int q = int(clamp(roundEven(act[x0 + 4u * word + j] * binv), -127.0, 127.0));
                    packed |= (uint(q) & 0xffu) << (8u * j);
                }
                wb[pc.q_off + row * pc.q_stride + word] = packed;
            }
            wb[pc.scale_off + row * pc.blocks + b] = floatBitsToUint(bscale);
        }
        for (uint word = 8u * pc.blocks + t; word < pc.q_stride; word += 64u) wb[pc.q_off + row * pc.q_stride + word] = 0u;
        return;
    }
    float m = 0.0;
    for (uint i = t; i < pc.k; i += 64u) m = max(m, abs(act[x0 + i]));
    partial[t] = m;
    barrier();
    for (uint w = 32u; w > 0u; w >>= 1) {
        if (t < w) partial[t] = max(partial[t], partial[t + w]);
        barrier();
    }
    float scale = partial[0] / 127.0;
    float inv = scale > 0.0 ? 1.0 / scale : 0.0;
    for (uint word = t; word < pc.q_stride; word += 64u) {
        uint packed = 0u;
        for (uint j = 0u; j < 4u; j++) {
            uint kk = 4u * word + j;
            int q = kk < pc.k ? int(clamp(roundEven(act[x0 + kk] * inv), -127.0, 127.0)) : 0;
            packed |= (uint(q) & 0xffu) << (8u * j);
        }
        wb[pc.q_off + row * pc.q_stride + word] = packed;
    }
    if (t == 0u) wb[pc.scale_off + row] = floatBitsToUint(scale);
}
