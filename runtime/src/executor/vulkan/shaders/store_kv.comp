#version 450
#extension GL_GOOGLE_include_directive : require
// Stores the key and value heads of every stored row of a fused q|k|v matrix at the row's
// position in one layer's KV cache (binding 2: 2 * kv_heads planes of [capacity, head_dim],
// f32, or f16 / bf16 rounded to nearest even). Each invocation writes one 32-bit word: one
// f32 element or two 16-bit ones.
layout(local_size_x = 64) in;
#include "common.glsl"

layout(push_constant) uniform Params {
    uint qkv_off; uint width; uint heads; uint kv_heads; uint head_dim; uint capacity; uint kv_off; uint kv_dtype;
} pc;

void main() {
    uint per = pc.kv_dtype == 0u ? 1u : 2u;
    uint words = pc.head_dim / per;
    uint i = gl_GlobalInvocationID.x, row = gl_GlobalInvocationID.y;
    if (i >= 2u * pc.kv_heads * words || row >= inp[IN_STORED]) return;
    uint plane = i / words, d = (i % words) * per;
    uint src = pc.qkv_off + row * pc.width + (pc.heads + plane) * pc.head_dim + d;
    uint elem = (plane * pc.capacity + position_of(row)) * pc.head_dim + d;
    if (pc.kv_dtype == 0u) {
        wb[pc.kv_off + elem] = floatBitsToUint(act[src]);
    } else if (pc.kv_dtype == 1u) {
        wb[pc.kv_off + elem / 2u] = f32_to_f16_bits(act[src]) | (f32_to_f16_bits(act[src + 1u]) << 16);
    } else {
        wb[pc.kv_off + elem / 2u] = f32_to_bf16_bits(act[src]) | (f32_to_bf16_bits(act[src + 1u]) << 16);
    }
}
