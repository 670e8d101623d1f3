#version 450
#extension GL_GOOGLE_include_directive : require
// RMSNorm of `segs` segments of `seg_len` floats per row (a whole row, or the query or key
// heads of a fused q|k|v row), all sharing one f32 weight: `w * (x * rsqrt(mean(x^2) + eps))`,
// the reference's order. One workgroup per (segment, row).
layout(local_size_x = 64) in;
#include "common.glsl"

layout(push_constant) uniform Params {
    uint x_off; uint out_off; uint x_stride; uint out_stride;
    uint seg_len; uint rows; uint from_heads; uint w_off; float eps;
} pc;

shared float partial[64];

void main() {
    uint seg = gl_WorkGroupID.x, row = gl_WorkGroupID.y, t = gl_LocalInvocationID.x;
    if (row >= value_rows(pc.rows, pc.from_heads)) return;
    uint x0 = pc.x_off + row * pc.x_stride + seg * pc.seg_len;
    uint o0 = pc.out_off + row * pc.out_stride + seg * pc.seg_len;
    float s = 0.0;
    for (uint i = t; i < pc.seg_len; i += 64u) s = fma(act[x0 + i], act[x0 + i], s);
    partial[t] = s;
    barrier();
    for (uint w = 32u; w > 0u; w >>= 1) {
        if (t < w) partial[t] += partial[t + w];
        barrier();
    }
    float r = 1.0 / sqrt(partial[0] / float(pc.seg_len) + pc.eps);
    for (uint i = t; i < pc.seg_len; i += 64u) act[o0 + i] = uintBitsToFloat(wa[pc.w_off + i]) * (act[x0 + i] * r);
}
