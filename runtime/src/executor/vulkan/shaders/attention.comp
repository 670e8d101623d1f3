#version 450
#extension GL_GOOGLE_include_directive : require
// Bidirectional attention of query head `h` of row `r` (one workgroup each) against the first
// `context` positions (block-causal: those before the end of the row's block; with a `window`
// of W, only those from W - 1 before the row's block's first position on) of one layer's KV
// cache (binding 2, as store_kv.comp wrote it), as the
// host's `attention::attend` on its dot-product path (the portable kernels, AVX2, NEON), in
// its order of operations so both get the same bits: scores q.k * scale (the host's `dot`:
// 16 lanes of fused multiply-adds added pairwise; a row's own key by fused multiply-adds in
// order), softmax with the maximum subtracted (the exponentials summed in 16 lanes, the lanes
// in order, then the rest), weights below 2^-100 dropped, then P V by fused multiply-adds in
// key order. (The host's AVX-512 kernel, query rows in vector lanes with an online softmax,
// orders its sums otherwise.) Rows after the stored ones attend with their own key and value
// at their position instead of the cache's.
layout(local_size_x = 64) in;
layout(constant_id = 0) const uint MAX_KEYS = 4096u;
// The widest head an op of the artifact has.
layout(constant_id = 1) const uint MAX_HEAD_DIM = 256u;
#include "common.glsl"

layout(push_constant) uniform Params {
    uint qkv_off; uint width; uint out_off; uint heads; uint kv_heads; uint head_dim;
    uint capacity; uint kv_off; uint kv_dtype; uint rows; float scale; uint window;
} pc;
const float NEGLIGIBLE = 7.888609e-31;

// Vector views of the same bindings: rows of q|k|v and of the cache are read four elements
// at a time (head_dim is a multiple of 4 and every offset a multiple of 4 elements: checked
// when recording).
layout(std430, set = 0, binding = 0) readonly buffer ActivationVectors { vec4 act4[]; };
layout(std430, set = 0, binding = 2) readonly buffer CacheVectors { vec4 kv4[]; };
layout(std430, set = 0, binding = 2) readonly buffer CachePairs { uvec2 kv2[]; };

shared float scores[MAX_KEYS];
shared vec4 q[MAX_HEAD_DIM / 4u];
shared float partial[64];
shared float total;

// Elements e..e+4 of the layer's cache (e a multiple of 4).
vec4 kv_at(uint e) {
    if (pc.kv_dtype == 0u) return kv4[(pc.kv_off + e) / 4u];
    uvec2 w = kv2[(pc.kv_off + e / 2u) / 2u];
    if (pc.kv_dtype == 1u) return vec4(unpackHalf2x16(w.x), unpackHalf2x16(w.y));
    return vec4(uintBitsToFloat(w.x << 16), uintBitsToFloat(w.x & 0xffff0000u), uintBitsToFloat(w.y << 16), uintBitsToFloat(w.y & 0xffff0000u));
}

// The host's 16-lane dot product of the query with 16-element chunks of a key (lanes 4l..4l+3
// in vector l), then the halving sum, then the elements past the last whole chunk in order.
float dot_host(uint key_plane_elem) {
    uint quads = pc.head_dim / 4u, full = pc.head_dim / 16u * 4u;
    vec4 l0 = vec4(0.0), l1 = vec4(0.0), l2 = vec4(0.0), l3 = vec4(0.0);
    for (uint d = 0u; d < full; d += 4u) {
        l0 = fma(q[d], kv_at(key_plane_elem + 4u * d), l0);
        l1 = fma(q[d + 1u], kv_at(key_plane_elem + 4u * d + 4u), l1);
        l2 = fma(q[d + 2u], kv_at(key_plane_elem + 4u * d + 8u), l2);
        l3 = fma(q[d + 3u], kv_at(key_plane_elem + 4u * d + 12u), l3);
    }
    l0 += l2;
    l1 += l3;
    l0 += l1;
    l0.xy += l0.zw;
    float s = l0.x + l0.y;
    for (uint d = full; d < quads; d++) {
        vec4 k = kv_at(key_plane_elem + 4u * d);
        s = fma(q[d].x, k.x, s);
        s = fma(q[d].y, k.y, s);
        s = fma(q[d].z, k.z, s);
        s = fma(q[d].w, k.w, s);
    }
    return s;
}

void main() {
    uint h = gl_WorkGroupID.x, row = gl_WorkGroupID.y, t = gl_LocalInvocationID.x;
    if (row >= pc.rows) return;
    uint hd = pc.head_dim, quads = pc.head_dim / 4u;
    uint kvh = h / (pc.heads / pc.kv_heads);
    // A block-causal pass (LLaDA 2.x's blocks): the keys before the end of the row's block.
    uint block = inp[IN_BLOCK];
    uint keys = block == 0u ? inp[IN_CONTEXT] : min(inp[IN_CONTEXT], (position_of(row) / block + 1u) * block);
    // A windowed layer's first key (0 without a window); the sums below run from it, in the
    // order the host's kernels sum the keys they are given from it on.
    uint block_start = block == 0u ? position_of(0u) : position_of(row) / block * block;
    uint first = pc.window == 0u ? 0u : min(block_start - min(block_start, pc.window - 1u), keys);
    uint n = keys - first;
    uint own = row >= inp[IN_STORED] ? position_of(row) : 0xffffffffu;
    uint row0 = pc.qkv_off + row * pc.width;
    uint own_k = row0 + (pc.heads + kvh) * hd, own_v = row0 + (pc.heads + pc.kv_heads + kvh) * hd;
    uint k_plane = kvh * pc.capacity * hd, v_plane = (pc.kv_heads + kvh) * pc.capacity * hd;
    for (uint d = t; d < quads; d += 64u) q[d] = act4[(row0 + h * hd) / 4u + d];
    barrier();

    float m = -1.0 / 0.0;
    for (uint i = t; i < n; i += 64u) {
        uint j = first + i;
        float s = 0.0;
        if (j == own) {
            for (uint d = 0u; d < quads; d++) {
                vec4 k = act4[own_k / 4u + d];
                s = fma(q[d].x, k.x, s);
                s = fma(q[d].y, k.y, s);
                s = fma(q[d].z, k.z, s);
                s = fma(q[d].w, k.w, s);
            }
        } else {
            s = dot_host(k_plane + j * hd);
        }
        s *= pc.scale;
        scores[i] = s;
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
    for (uint i = t; i < n; i += 64u) scores[i] = exp_host(scores[i] - m);
    barrier();
    uint full = n / 16u * 16u;
    if (t < 16u) {
        float lane = 0.0;
        for (uint j = t; j < full; j += 16u) lane += scores[j];
        partial[t] = lane;
    }
    barrier();
    if (t == 0u) {
        float sum = 0.0;
        for (uint l = 0u; l < 16u; l++) sum += partial[l];
        for (uint i = full; i < n; i++) sum += scores[i];
        total = sum;
    }
    barrier();
    float inv = 1.0 / total;
    for (uint i = t; i < n; i += 64u) {
        float p = scores[i] * inv;
        scores[i] = p < NEGLIGIBLE ? 0.0 : p;
    }
    barrier();
    // A row attending with its own key and value: its weight applies to its own value,
    // after the cache's (whose entry at its position is skipped).
    float own_weight = 0.0;
    bool own_seen = own >= first && own < keys;
    if (own_seen) {
        own_weight = scores[own - first];
        barrier();
        if (t == 0u) scores[own - first] = 0.0;
        barrier();
    }
    for (uint d = t; d < quads; d += 64u) {
        vec4 acc = vec4(0.0);
        for (uint i = 0u; i < n; i++) acc = fma(vec4(scores[i]), kv_at(v_plane + (first + i) * hd + 4u * d), acc);
        if (own_seen) acc = fma(vec4(own_weight), act4[own_v / 4u + d], acc);
        uint o = pc.out_off + row * pc.heads * hd + h * hd + 4u * d;
        act[o] = acc.x;
        act[o + 1u] = acc.y;
        act[o + 2u] = acc.z;
        act[o + 3u] = acc.w;
    }
}
