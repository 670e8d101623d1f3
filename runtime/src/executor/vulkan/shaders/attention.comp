#version 450
#extension GL_GOOGLE_include_directive : require
// Bidirectional attention of query head `h` of row `r` (one workgroup each) against the first
// `context` positions of one layer's KV cache (binding 2, as store_kv.comp wrote it), as the
// host's `attention::attend`: scores q.k * scale, softmax with the maximum subtracted,
// weights below 2^-100 dropped, then P V. Rows after the stored ones attend with their own
// key and value at their position instead of the cache's.
layout(local_size_x = 64) in;
layout(constant_id = 0) const uint MAX_KEYS = 4096u;
#include "common.glsl"

layout(push_constant) uniform Params {
    uint qkv_off; uint width; uint out_off; uint heads; uint kv_heads; uint head_dim;
    uint capacity; uint kv_off; uint kv_dtype; uint rows; float scale;
} pc;

const uint MAX_HEAD_DIM = 256u;
const float NEGLIGIBLE = 7.888609e-31;

shared float scores[MAX_KEYS];
shared float q[MAX_HEAD_DIM];
shared float partial[64];

float kv_at(uint e) {
    if (pc.kv_dtype == 0u) return uintBitsToFloat(wb[pc.kv_off + e]);
    uint word = wb[pc.kv_off + e / 2u];
    uint bits = (e & 1u) == 0u ? word & 0xffffu : word >> 16;
    return pc.kv_dtype == 1u ? f16_bits_to_f32(bits) : bf16_bits_to_f32(bits);
}

void main() {
    uint h = gl_WorkGroupID.x, row = gl_WorkGroupID.y, t = gl_LocalInvocationID.x;
    if (row >= pc.rows) return;
    uint hd = pc.head_dim;
    uint kvh = h / (pc.heads / pc.kv_heads);
    uint keys = inp[IN_CONTEXT];
    uint own = row >= inp[IN_STORED] ? position_of(row) : 0xffffffffu;
    uint row0 = pc.qkv_off + row * pc.width;
    uint own_k = row0 + (pc.heads + kvh) * hd, own_v = row0 + (pc.heads + pc.kv_heads + kvh) * hd;
    uint k_plane = kvh * pc.capacity * hd, v_plane = (pc.kv_heads + kvh) * pc.capacity * hd;
    for (uint d = t; d < hd; d += 64u) q[d] = act[row0 + h * hd + d];
    barrier();

    float m = -1.0 / 0.0;
    for (uint j = t; j < keys; j += 64u) {
        float s = 0.0;
        if (j == own) {
            for (uint d = 0u; d < hd; d++) s = fma(q[d], act[own_k + d], s);
        } else {
            for (uint d = 0u; d < hd; d++) s = fma(q[d], kv_at(k_plane + j * hd + d), s);
        }
        s *= pc.scale;
        scores[j] = s;
        m = max(m, s);
    }
    partial[t] = m;
    barrier();
    for (uint w = 32u; w > 0u; w >>= 1) {
        if (t < w) partial[t] = max(partial[t], partial[t + w]);
        barrier();
    }
    m = partial[0];
    barrier();
    float sum = 0.0;
    for (uint j = t; j < keys; j += 64u) {
        float e = exp_host(scores[j] - m);
        scores[j] = e;
        sum += e;
    }
    partial[t] = sum;
    barrier();
    for (uint w = 32u; w > 0u; w >>= 1) {
        if (t < w) partial[t] += partial[t + w];
        barrier();
    }
    float inv = 1.0 / partial[0];
    barrier();
    float own_weight = 0.0;
    for (uint j = t; j < keys; j += 64u) {
        float p = scores[j] * inv;
        scores[j] = p < NEGLIGIBLE ? 0.0 : p;
    }
    barrier();
    if (own < keys) {
        own_weight = scores[own];
        barrier();
        if (t == 0u) scores[own] = 0.0;
        barrier();
    }
    for (uint d = t; d < hd; d += 64u) {
        float acc = 0.0;
        for (uint j = 0u; j < keys; j++) acc = fma(scores[j], kv_at(v_plane + j * hd + d), acc);
        if (own < keys) acc = fma(own_weight, act[own_v + d], acc);
        act[pc.out_off + row * pc.heads * hd + h * hd + d] = acc;
    }
}
