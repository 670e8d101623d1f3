#version 450
#extension GL_GOOGLE_include_directive : require
// Rotary embedding in place on the first `heads` heads of every row, half-split convention,
// at each row's position: [x1, x2] -> [x1 cos - x2 sin, x2 cos + x1 sin]. cos and sin are
// f32 tables [positions, head_dim / 2] in bindings 1 and 2.
layout(local_size_x = 64) in;
#include "common.glsl"

layout(push_constant) uniform Params {
    uint x_off; uint x_stride; uint heads; uint head_dim; uint rows; uint cos_off; uint sin_off;
} pc;

void main() {
    uint half_dim = pc.head_dim / 2u;
    uint i = gl_GlobalInvocationID.x, row = gl_GlobalInvocationID.y;
    if (i >= pc.heads * half_dim || row >= pc.rows) return;
    uint head = i / half_dim, d = i % half_dim;
    uint t = position_of(row) * half_dim + d;
    float c = uintBitsToFloat(wa[pc.cos_off + t]), s = uintBitsToFloat(wb[pc.sin_off + t]);
    uint at = pc.x_off + row * pc.x_stride + head * pc.head_dim + d;
    float a = act[at], b = act[at + half_dim];
    // Unfused, as the host computes it.
    precise float x1 = a * c + (-b) * s;
    precise float x2 = b * c + a * s;
    act[at] = x1;
    act[at + half_dim] = x2;
}
