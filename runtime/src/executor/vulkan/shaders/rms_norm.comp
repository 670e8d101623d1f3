#version 450
#extension GL_GOOGLE_include_directive : require
// RMSNorm of `segs` segments of `seg_len` floats per row (a whole row, or the query or key
// heads of a fused q|k|v row), all sharing one f32 weight: `w * (x * rsqrt(mean(x^2) + eps))`,
// the reference's order; `w_off` NO_WEIGHT: `x * rsqrt(mean(x^2) + eps)` (DiffusionGemma's
// value norm). One workgroup per (segment, row). The sum of squares is the host's
// `dot`: 16 lanes of fused multiply-adds over whole 16-element chunks, added pairwise
// (halving), then the rest in order, so both backends get the same bits.
layout(local_size_x = 64) in;
#include "common.glsl"

layout(push_constant) uniform Params {
    uint x_off; uint out_off; uint x_stride; uint out_stride;
    uint seg_len; uint rows; uint from_heads; uint w_off; float eps;
} pc;

const uint NO_WEIGHT = 0xffffffffu;

shared float lanes[16];
shared float total;

void main() {
    uint seg = gl_WorkGroupID.x, row = gl_WorkGroupID.y, t = gl_LocalInvocationID.x;
    if (row >= value_rows(pc.rows, pc.from_heads)) return;
    uint x0 = pc.x_off + row * pc.x_stride + seg * pc.seg_len;
    uint o0 = pc.out_off + row * pc.out_stride + seg * pc.seg_len;
    uint full = pc.seg_len / 16u * 16u;
    if (t < 16u) {
        float a = 0.0;
        for (uint c = 0u; c < full; c += 16u) a = fma(act[x0 + c + t], act[x0 + c + t], a);
        lanes[t] = a;
    }
    barrier();
    if (t == 0u) {
        for (uint n = 8u; n > 0u; n >>= 1) {
            for (uint i = 0u; i < n; i++) lanes[i] += lanes[i + n];
        }
        float s = lanes[0];
        for (uint i = full; i < pc.seg_len; i++) s = fma(act[x0 + i], act[x0 + i], s);
        total = s;
    }
    barrier();
    float r = 1.0 / sqrt(total / float(pc.seg_len) + pc.eps);
    if (pc.w_off == NO_WEIGHT) {
        for (uint i = t; i < pc.seg_len; i += 64u) act[o0 + i] = act[x0 + i] * r;
    } else {
        for (uint i = t; i < pc.seg_len; i += 64u) act[o0 + i] = uintBitsToFloat(wa[pc.w_off + i]) * (act[x0 + i] * r);
    }
}
