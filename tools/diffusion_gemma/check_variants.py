#!/usr/bin/env python3
"""Wrong variants of the DiffusionGemma model and sampler, replayed on the golden cases.

    python tools/diffusion_gemma/check_variants.py [--golden KIT/tiny-dg-A/golden.json] [--only NAME,...]

Each variant monkeypatches the published classes (transformers 5.23.0) or the loaded model for the time of the
replay, reruns every golden case exactly as make_golden.py does (same seed, same settings) and counts the cases
whose output_ids or tokens_per_forward (i.e. the number of decoder passes) differ from the golden. A kit that catches the mistake has the
variant change most cases. The unpatched replay must change none.
"""

import argparse
import contextlib
import json
import math
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import dg_common as C  # noqa: E402
import make_golden as G  # noqa: E402

VARIANTS = {}


def variant(name, doc):
    def deco(f):
        VARIANTS[name] = (doc, f)
        return f

    return deco


@contextlib.contextmanager
def patch_attr(obj, name, value):
    old = getattr(obj, name)
    setattr(obj, name, value)
    try:
        yield
    finally:
        setattr(obj, name, old)


@contextlib.contextmanager
def patch_tensors(pairs):
    """pairs: (tensor, new value); restored afterwards."""
    saved = [(t, t.detach().clone()) for t, _ in pairs]
    with torch.no_grad():
        for t, v in pairs:
            t.copy_(v)
    try:
        yield
    finally:
        with torch.no_grad():
            for t, v in saved:
                t.copy_(v)


def _mods():
    return C.published()


@variant("none", "the published code unchanged (must change nothing)")
def v_none(model):
    return contextlib.nullcontext()


@variant("rmsnorm_1_plus_w", "RMSNorm multiplies by (1 + weight) (Gemma 1-3 style) instead of weight")
def v_rms(model):
    _, M, _ = _mods()

    def forward(self, x):
        y = self._norm(x.float())
        if self.with_scale:
            y = y * (1.0 + self.weight.float())
        return y.type_as(x)

    return patch_attr(M.DiffusionGemmaRMSNorm, "forward", forward)


@variant("no_self_conditioning", "the decoder never gets the previous step's logits (zero signal every step)")
def v_nosc(model):
    _, M, _ = _mods()
    real = M.DiffusionGemmaDecoderModel.forward

    def forward(self, *a, **k):
        k["self_conditioning_logits"] = None
        return real(self, *a, **k)

    return patch_attr(M.DiffusionGemmaDecoderModel, "forward", forward)


def _layers(model):
    return model.model.encoder.language_model.layers, model.model.decoder.layers


@variant("layer_scalar_ignored", "layer_scalar not applied (encoder and decoder)")
def v_ls_off(model):
    enc, dec = _layers(model)
    return patch_tensors([(l.layer_scalar, torch.ones_like(l.layer_scalar)) for l in list(enc) + list(dec)])


@variant("decoder_uses_encoder_layer_scalar", "the decoder layers use the encoder's layer_scalar values")
def v_ls_enc(model):
    enc, dec = _layers(model)
    return patch_tensors([(d.layer_scalar, e.layer_scalar.clone()) for e, d in zip(enc, dec)])


@variant("encoder_uses_decoder_layer_scalar", "the encoder layers use the decoder's layer_scalar values")
def v_ls_dec(model):
    enc, dec = _layers(model)
    return patch_tensors([(e.layer_scalar, d.layer_scalar.clone()) for e, d in zip(enc, dec)])


@variant("no_softcap", "final logits not soft-capped (tanh(x/30)*30 left out)")
def v_nosoftcap(model):
    return patch_attr(model, "final_logit_softcapping", 1e30)


def _rope_buffers(model):
    return [model.model.encoder.language_model.rotary_emb, model.model.decoder.rotary_emb]


def _inv_freq(d, theta=1e6):
    """Default RoPE's inverse frequencies over `d` rotated dimensions."""
    return 1.0 / (theta ** (torch.arange(0, d, 2, dtype=torch.float) / d))


def _patch_inv_freq(model, buffer, inv):
    """Sets `buffer` (full or sliding layers' inverse frequencies) of both rotary modules."""
    return patch_tensors([(getattr(r, buffer), inv) for r in _rope_buffers(model)])


@variant("full_rope_not_proportional", "full-attention layers rotate every dimension (default RoPE, theta 1e6)")
def v_fullrope(model):
    return _patch_inv_freq(model, "full_attention_inv_freq", _inv_freq(32))


@variant("partial_rope_exponent_over_rotated_dims", "proportional RoPE with the exponent over the rotated dims (2i/8) instead of head_dim (2i/32)")
def v_partial(model):
    inv = torch.zeros(32 // 2)
    inv[:4] = _inv_freq(2 * 4)
    return _patch_inv_freq(model, "full_attention_inv_freq", inv)


@variant("sliding_rope_theta_1e6", "sliding layers use the full layers' theta 1e6")
def v_slide_theta(model):
    return _patch_inv_freq(model, "sliding_attention_inv_freq", _inv_freq(16))


@variant("no_sliding_window", "sliding layers see the whole context (encoder mask and cache)")
def v_noslide(model):
    return patch_attr(model.config.text_config, "sliding_window", 10**6)


@variant("sliding_cache_keeps_W", "the sliding cache keeps the last W keys (not W-1): the decoder sees one more context token")
def v_slideW(model):
    from transformers import cache_utils

    L = cache_utils.DynamicSlidingWindowLayer
    real_update = L.update

    def update(self, key_states, value_states, *args, **kwargs):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        self.cumulative_length += key_states.shape[-2]
        full_k = torch.cat([self.keys, key_states], dim=-2)
        full_v = torch.cat([self.values, value_states], dim=-2)
        self.keys, self.values = full_k[:, :, -self.sliding_window:, :], full_v[:, :, -self.sliding_window:, :]
        return full_k, full_v

    def get_mask_sizes(self, query_length):
        cached = min(self.cumulative_length, self.sliding_window)
        return cached + query_length, self.cumulative_length - cached

    @contextlib.contextmanager
    def cm():
        with patch_attr(L, "update", update), patch_attr(L, "get_mask_sizes", get_mask_sizes):
            yield

    del real_update
    return cm()


@variant("decoder_sliding_window_over_canvas", "decoder sliding layers see only the last W-1 context keys AND a W window inside the canvas")
def v_dec_window(model):
    _, M, _ = _mods()
    real = M.DiffusionGemmaDecoderTextAttention.forward

    def forward(self, hidden_states, position_embeddings, attention_mask, past_key_values=None, **kwargs):
        if self.is_sliding and attention_mask is None:
            q = hidden_states.shape[1]
            kv = past_key_values.layers[self.layer_idx].keys.shape[-2] + q
            qi = torch.arange(q)[:, None] + (kv - q)
            ki = torch.arange(kv)[None, :]
            allowed = (ki > qi - self.config.sliding_window) & (ki < qi + self.config.sliding_window)
            attention_mask = torch.where(allowed, 0.0, float("-inf"))[None, None].to(hidden_states.dtype)
        return real(self, hidden_states, position_embeddings, attention_mask, past_key_values, **kwargs)

    return patch_attr(M.DiffusionGemmaDecoderTextAttention, "forward", forward)


@contextlib.contextmanager
def patch_attrs(objs, name, value_of):
    """`patch_attr` over many objects: each one's `name` set to `value_of(obj)`, restored afterwards."""
    saved = [(o, getattr(o, name)) for o in objs]
    for o in objs:
        setattr(o, name, value_of(o))
    try:
        yield
    finally:
        for o, old in saved:
            setattr(o, name, old)


@variant("no_v_norm", "values not RMS-normalised (v_norm left out, all layers)")
def v_novnorm(model):
    mods = [l.self_attn for part in _layers(model) for l in part]
    return patch_attrs(mods, "v_norm", lambda m: torch.nn.Identity())


@variant("full_values_use_k_norm", "full layers' values = k_proj output through k_norm (with weight) instead of v_norm")
def v_vknorm(model):
    mods = [l.self_attn for part in _layers(model) for l in part if not l.self_attn.is_sliding]
    return patch_attrs(mods, "v_norm", lambda m: m.k_norm)


def _router_forward(per_expert=True, renorm=True):
    def forward(self, hidden_states):
        h = self.norm(hidden_states)
        h = h * self.scale * self.scalar_root_size
        scores = self.proj(h)
        probs = torch.nn.functional.softmax(scores, dim=-1, dtype=torch.float32)
        w, idx = torch.topk(probs, k=self.config.top_k_experts, dim=-1)
        if renorm:
            w = w / w.sum(dim=-1, keepdim=True)
        if per_expert:
            w = w * self.per_expert_scale[idx]
        return probs, w, idx

    return forward


@variant("router_no_per_expert_scale", "router weights not multiplied by per_expert_scale")
def v_router_pes(model):
    _, M, _ = _mods()
    return patch_attr(M.DiffusionGemmaTextRouter, "forward", _router_forward(per_expert=False))


@variant("router_no_renormalisation", "top-k router weights not renormalised to sum 1")
def v_router_renorm(model):
    _, M, _ = _mods()
    return patch_attr(M.DiffusionGemmaTextRouter, "forward", _router_forward(renorm=False))


@variant("router_without_scale", "router input not multiplied by router.scale (only hidden**-0.5)")
def v_router_scale(model):
    _, M, _ = _mods()

    def forward(self, hidden_states):
        h = self.norm(hidden_states) * self.scalar_root_size
        probs = torch.nn.functional.softmax(self.proj(h), dim=-1, dtype=torch.float32)
        w, idx = torch.topk(probs, k=self.config.top_k_experts, dim=-1)
        w = w / w.sum(dim=-1, keepdim=True)
        return probs, w * self.per_expert_scale[idx], idx

    return patch_attr(M.DiffusionGemmaTextRouter, "forward", forward)


@variant("router_on_normed_residual", "router reads pre_feedforward_layernorm_2(residual) instead of the raw residual")
def v_router_in(model):
    _, M, _ = _mods()
    layers = [l for part in _layers(model) for l in part]

    @contextlib.contextmanager
    def cm():
        saved = []
        for l in layers:
            r = l.router
            real = r.forward

            def fwd(h, _real=real, _n=l.pre_feedforward_layernorm_2):
                return _real(_n(h))

            r.forward = fwd
            saved.append(r)
        try:
            yield
        finally:
            for r in saved:
                del r.forward

    return cm()


@variant("attention_scaling_rsqrt_d", "attention scores scaled by 1/sqrt(head_dim) (published: 1.0)")
def v_scale(model):
    mods = [l.self_attn for part in _layers(model) for l in part]

    @contextlib.contextmanager
    def cm():
        for m in mods:
            m.scaling = m.head_dim**-0.5
        try:
            yield
        finally:
            for m in mods:
                m.scaling = 1.0

    return cm()


@variant("no_embed_scale", "token embeddings not multiplied by sqrt(hidden_size)")
def v_embscale(model):
    embs = [model.model.encoder.language_model.embed_tokens, model.model.decoder.embed_tokens]
    return patch_tensors([(e.embed_scale, torch.ones_like(e.embed_scale)) for e in embs])


def _temp_patch(fn):
    _, _, Gn = _mods()
    return patch_attr(Gn.LinearTemperatureScheduleLogitsProcessor, "__call__", fn)


@variant("temperature_reversed", "temperature rises from t_min to t_max instead of falling")
def v_temp_rev(model):
    def call(self, input_ids, scores, cur_step):
        t = self.t_max - ((self.t_max - self.t_min) * (cur_step / self.max_denoising_steps))
        return scores / t

    return _temp_patch(call)


@variant("temperature_step_off_by_one", "temperature uses (cur_step - 1) / N (0-based step counter)")
def v_temp_obo(model):
    def call(self, input_ids, scores, cur_step):
        return scores / (self.t_min + (self.t_max - self.t_min) * ((cur_step - 1) / self.max_denoising_steps))

    return _temp_patch(call)


@variant("temperature_float64", "temperature computed in float64 (python floats) and the logits divided by it")
def v_temp_f64(model):
    def call(self, input_ids, scores, cur_step):
        t = self.t_min + (self.t_max - self.t_min) * (int(cur_step) / self.max_denoising_steps)
        return (scores.double() / t).float()

    return _temp_patch(call)


_RAW = {}


def _stash_raw_patch(model, use_for):
    """Keeps the raw (pre-temperature) logits of the current step for the sampler and/or self-conditioning."""
    _, M, Gn = _mods()
    real_call = Gn.LinearTemperatureScheduleLogitsProcessor.__call__
    real_accept = Gn.EntropyBoundSampler.accept_canvas
    real_stop = Gn.StableAndConfidentStoppingCriteria.__call__
    real_dec = M.DiffusionGemmaDecoderModel.forward

    def call(self, input_ids, scores, cur_step):
        _RAW["raw"] = scores
        return real_call(self, input_ids, scores, cur_step)

    def accept(self, cur, den, logits, step):
        return real_accept(self, cur, den, _RAW.get("raw", logits), step)

    def stop(self, argmax_canvas, logits, **kw):
        return real_stop(self, argmax_canvas, _RAW.get("raw", logits), **kw)

    def dec(self, *a, **k):
        if k.get("self_conditioning_logits") is not None and "prev_raw" in _RAW:
            k["self_conditioning_logits"] = _RAW["prev_raw"]
        out = real_dec(self, *a, **k)
        return out

    @contextlib.contextmanager
    def cm():
        _RAW.clear()
        ps = [patch_attr(Gn.LinearTemperatureScheduleLogitsProcessor, "__call__", call)]
        if use_for == "entropy":
            ps += [patch_attr(Gn.EntropyBoundSampler, "accept_canvas", accept),
                   patch_attr(Gn.StableAndConfidentStoppingCriteria, "__call__", stop)]
        else:
            real_fwd = model.forward

            def fwd(*a, **k):
                out = real_fwd(*a, **k)
                _RAW["prev_raw"] = out.logits
                return out

            ps += [patch_attr(M.DiffusionGemmaDecoderModel, "forward", dec), patch_attr(model, "forward", fwd)]
        with contextlib.ExitStack() as st:
            for p in ps:
                st.enter_context(p)
            yield
        _RAW.clear()

    return cm()


@variant("entropy_of_unscaled_logits", "acceptance and stopping entropies from the raw logits (before temperature)")
def v_ent_raw(model):
    return _stash_raw_patch(model, "entropy")


@variant("self_conditioning_on_raw_logits", "self-conditioning fed the raw logits instead of the temperature-scaled ones")
def v_sc_raw(model):
    return _stash_raw_patch(model, "sc")


@variant("stopping_off", "adaptive stopping ignored (always max_denoising_steps)")
def v_stop_off(model):
    _, _, Gn = _mods()
    return patch_attr(Gn.DiffusionGemmaGenerationMixin, "_prepare_diffusion_stopping_criteria", lambda self, gc: None)


@variant("stability_ignored", "stopping on confidence alone (stability test always true)")
def v_stab(model):
    _, _, Gn = _mods()
    real = Gn.StableAndConfidentStoppingCriteria.__call__

    def call(self, argmax_canvas, logits, **kw):
        old = self.stability_threshold
        self.stability_threshold = 0
        try:
            return real(self, argmax_canvas, logits, **kw)
        finally:
            self.stability_threshold = old

    return patch_attr(Gn.StableAndConfidentStoppingCriteria, "__call__", call)


@variant("acceptance_sum_includes_current", "accept while cumsum(sorted entropies) <= bound (the max term not subtracted)")
def v_accept(model):
    _, _, Gn = _mods()

    def accept(self, current, denoiser, logits, cur_step):
        ent = torch.distributions.Categorical(logits=logits).entropy()
        srt, idx = torch.sort(ent, dim=-1)
        sel = torch.cumsum(srt, dim=-1) <= self.entropy_bound
        self.accepted_token_mask = torch.scatter(torch.zeros_like(sel), -1, idx, sel)
        return torch.where(self.accepted_token_mask, denoiser, current)

    return patch_attr(Gn.EntropyBoundSampler, "accept_canvas", accept)


@variant("greedy_denoiser", "denoiser canvas = argmax instead of torch.multinomial (no RNG used for it)")
def v_greedy(model):
    def mn(p, num_samples, *a, **k):
        return torch.argmax(p, dim=-1, keepdim=True)

    return patch_attr(torch, "multinomial", mn)


@variant("renoise_reuses_first_noise", "non-accepted positions are renoised with the canvas's initial noise (no new randint)")
def v_renoise(model):
    _, _, Gn = _mods()
    real_init = Gn.EntropyBoundSampler.initialize_canvas

    def init(self, batch_size, device):
        if getattr(self, "_first", None) is None or self._first.shape[0] != batch_size:
            self._first = real_init(self, batch_size, device)
        return self._first

    real_prep = Gn.DiffusionGemmaGenerationMixin._prepare_denoiser_inputs

    def prep(self, *a, sampler, **k):
        sampler._first = None
        return real_prep(self, *a, sampler=sampler, **k)

    @contextlib.contextmanager
    def cm():
        with patch_attr(Gn.EntropyBoundSampler, "initialize_canvas", init), patch_attr(Gn.DiffusionGemmaGenerationMixin, "_prepare_denoiser_inputs", prep):
            yield

    return cm()


@variant("output_sampled_canvas", "the canvas appended is the last accepted/renoised canvas, not the argmax canvas")
def v_out_sampled(model):
    _, _, Gn = _mods()
    real = Gn.DiffusionGemmaGenerationMixin._denoising_step

    def step(self, *a, **k):
        cur, am, sc, fin = real(self, *a, **k)
        return cur, cur, sc, fin

    return patch_attr(Gn.DiffusionGemmaGenerationMixin, "_denoising_step", step)


# Output-level variants: computed from the golden output directly (no rerun).
def out_truncated(case):
    return case["output_ids"][: case["settings"]["max_new_tokens"]]


OUTPUT_VARIANTS = {
    "output_truncated_to_max_new_tokens": ("output cut to max_new_tokens (published: whole canvases)", out_truncated),
}


def main():
    a = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    a.add_argument("--golden", default=os.path.join(C.CKPT_F32, "golden.json"))
    a.add_argument("--only")
    a.add_argument("--out", help="write the table as JSON here")
    args = a.parse_args()
    torch.set_num_threads(1)
    _, _, generation = C.published()
    golden = json.load(open(args.golden))
    model = C.load_model(os.path.join(C.REPO, golden["checkpoint"]))
    cases = golden["cases"]
    names = args.only.split(",") if args.only else list(VARIANTS)
    table = []
    for name in names:
        doc, make = VARIANTS[name]
        changed, t0 = [], time.time()
        for c in cases:
            with make(model):
                try:
                    out, _, tpf, _ = G.run_case(model, generation, c["prompt_ids"], c["seed"], c["settings"], instrument=False)
                    diff = out != c["output_ids"] or abs(tpf - c["tokens_per_forward"]) > 1e-9
                except Exception as e:  # a variant that crashes counts as changed
                    print(f"   {name} {c['name']}: {type(e).__name__}: {e}")
                    diff = True
            if diff:
                changed.append(c["name"])
        frac = len(changed) / len(cases)
        table.append(dict(variant=name, description=doc, changed=len(changed), cases=len(cases), fraction=round(frac, 3),
                          unchanged_cases=[c["name"] for c in cases if c["name"] not in changed] if frac > 0.5 else None))
        print(f"{name:42s} {len(changed):3d}/{len(cases)} = {frac:.2f}   ({time.time() - t0:.0f}s) {doc}", flush=True)
        if name == "none":
            assert not changed, changed
    for name, (doc, fn) in OUTPUT_VARIANTS.items():
        changed = [c["name"] for c in cases if fn(c) != c["output_ids"]]
        table.append(dict(variant=name, description=doc, changed=len(changed), cases=len(cases), fraction=round(len(changed) / len(cases), 3)))
        print(f"{name:42s} {len(changed):3d}/{len(cases)} = {len(changed) / len(cases):.2f}   {doc}")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(table, f, indent=1)
            f.write("\n")


if __name__ == "__main__":
    main()
