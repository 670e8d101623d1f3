#version 450
#extension GL_GOOGLE_include_directive : require
// out[r, n] = x[r, :] . W[n, :] over packed 16-column panels (layouts: `llada_ir::packing`),
// for the columns of `panels` panels starting at word w_off of binding 1 (a large matrix is
// split into several dispatches, each binding a part of it). One invocation computes one
// column for four rows, so each weight word it loads serves four rows.
//
// FORMAT (specialisation constant): 0 f32, 1 f16, 2 bf16, 3 bf16 with activations rounded to
// bf16, 4 q8 and 5 q4 on int8 activations that `quantize.comp` wrote to binding 2. Integer
// sums are exact; the scales are applied in the host kernels' order.
layout(local_size_x = 64) in;
layout(constant_id = 0) const uint FORMAT = 0u;
#include "common.glsl"

layout(push_constant) uniform Params {
    uint x_off; uint out_off; uint k; uint n; uint rows; uint from_heads;
    uint w_off; uint panel_words; uint col0; uint group;
    uint q_off; uint q_stride; uint scale_off;
} pc;

const uint ROWS = 4u;

int s8(uint word, uint j) { return bitfieldExtract(int(word), int(8u * j), 8); }

float half_of(uint word, uint which) { return f16_bits_to_f32(which == 0u ? word : word >> 16); }

void main() {
    uint c = gl_GlobalInvocationID.x;
    uint col = pc.col0 + c;
    uint rows = value_rows(pc.rows, pc.from_heads);
    uint r0 = gl_GlobalInvocationID.y * ROWS;
    if (col >= pc.n || r0 >= rows) return;
    uint m = min(ROWS, rows - r0);
    uint base = pc.w_off + (c / 16u) * pc.panel_words;
    uint lane = c % 16u;
    float acc[ROWS] = float[ROWS](0.0, 0.0, 0.0, 0.0);
    if (FORMAT <= 3u) {
        for (uint kk = 0u; kk < pc.k; kk++) {
            float w;
            if (FORMAT == 0u) w = uintBitsToFloat(wa[base + kk * 16u + lane]);
            else if (FORMAT == 1u) w = half_of(wa[base + kk * 8u + lane / 2u], lane & 1u);
            else w = bf16_bits_to_f32((kk & 1u) == 0u ? wa[base + 16u * (kk / 2u) + lane] & 0xffffu : wa[base + 16u * (kk / 2u) + lane] >> 16);
            for (uint i = 0u; i < m; i++) {
                float x = act[pc.x_off + (r0 + i) * pc.k + kk];
                if (FORMAT == 3u) x = bf16_bits_to_f32(f32_to_bf16_bits(x));
                acc[i] = fma(x, w, acc[i]);
            }
        }
    } else if (FORMAT == 4u) {
        int sums[ROWS] = int[ROWS](0, 0, 0, 0);
        uint words = (pc.k + 3u) / 4u;
        for (uint q = 0u; q < words; q++) {
            uint w = wa[base + 16u * q + lane];
            for (uint i = 0u; i < m; i++) {
                uint x = wb[pc.q_off + (r0 + i) * pc.q_stride + q];
                sums[i] += s8(w, 0u) * s8(x, 0u) + s8(w, 1u) * s8(x, 1u) + s8(w, 2u) * s8(x, 2u) + s8(w, 3u) * s8(x, 3u);
            }
        }
        float ws = uintBitsToFloat(wa[base + 16u * words + lane]);
        for (uint i = 0u; i < m; i++) acc[i] = float(sums[i]) * ws * uintBitsToFloat(wb[pc.scale_off + r0 + i]);
    } else {
        uint groups = pc.k / pc.group;
        for (uint g = 0u; g < groups; g++) {
            int sums[ROWS] = int[ROWS](0, 0, 0, 0);
            for (uint b = g * pc.group / 8u; b < (g + 1u) * pc.group / 8u; b++) {
                uint w = wa[base + 16u * b + lane];
                for (uint i = 0u; i < m; i++) {
                    uint row = pc.q_off + (r0 + i) * pc.q_stride + 2u * b;
                    uint xlo = wb[row], xhi = wb[row + 1u];
                    int s = 0;
                    for (uint j = 0u; j < 4u; j++) {
                        s += (int((w >> (8u * j)) & 0xfu) - 8) * s8(xlo, j);
                        s += (int((w >> (8u * j + 4u)) & 0xfu) - 8) * s8(xhi, j);
                    }
                    sums[i] += s;
                }
            }
            float d = half_of(wa[base + 2u * pc.k + 8u * g + lane / 2u], lane & 1u);
            for (uint i = 0u; i < m; i++) acc[i] += float(sums[i]) * d;
        }
        for (uint i = 0u; i < m; i++) acc[i] *= uintBitsToFloat(wb[pc.scale_off + r0 + i]);
    }
    for (uint i = 0u; i < m; i++) act[pc.out_off + (r0 + i) * pc.n + col] = acc[i];
}
