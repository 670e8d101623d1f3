#version 450
#extension GL_GOOGLE_include_directive : require
// Row-wise elementwise ops over `cols` columns of each row (one invocation per element):
// MODE 0 a += b; 1 a *= factor; 2 a = silu(gate) * up with b's rows [gate | up] (a is `cols`
// wide, b twice that); 3 a = b's row head_row[r] (the rows whose logits the sampler needs);
// 4 a += bias, the bias an f32 vector at word b_off of binding 1 (a projection's bias);
// 5 a = gelu_tanh(gate) * up with b's rows [gate | up] (as 2); 6 a = tanh(a / factor) * factor
// (logit soft-capping).
layout(local_size_x = 64) in;
#include "common.glsl"

layout(push_constant) uniform Params {
    uint mode; uint a_off; uint b_off; uint cols; uint rows; uint from_heads; float factor; uint max_rows;
} pc;

void main() {
    uint i = gl_GlobalInvocationID.x, row = gl_GlobalInvocationID.y;
    if (i >= pc.cols || row >= value_rows(pc.rows, pc.from_heads)) return;
    uint a = pc.a_off + row * pc.cols + i;
    if (pc.mode == 0u) {
        act[a] += act[pc.b_off + row * pc.cols + i];
    } else if (pc.mode == 1u) {
        act[a] *= pc.factor;
    } else if (pc.mode == 2u) {
        float g = act[pc.b_off + row * 2u * pc.cols + i], u = act[pc.b_off + row * 2u * pc.cols + pc.cols + i];
        precise float o = g / (1.0 + exp_host(-g)) * u;
        act[a] = o;
    } else if (pc.mode == 3u) {
        act[a] = act[pc.b_off + inp[IN_POS + pc.max_rows + row] * pc.cols + i];
    } else if (pc.mode == 4u) {
        act[a] += uintBitsToFloat(wa[pc.b_off + i]);
    } else if (pc.mode == 5u) {
        float g = act[pc.b_off + row * 2u * pc.cols + i], u = act[pc.b_off + row * 2u * pc.cols + pc.cols + i];
        // The host's `gelu_tanh`, unfused.
        precise float inner = GELU_BETA * (g + GELU_KAPPA * (g * g * g));
        precise float o = 0.5 * g * (1.0 + tanh_host(inner)) * u;
        act[a] = o;
    } else {
        precise float o = tanh_host(act[a] / pc.factor) * pc.factor;
        act[a] = o;
    }
}
