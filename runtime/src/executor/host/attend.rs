//! The host executor's attention: the cache's stores, then every row attending to the keys
//! its pass lets it see, in units of one head and a group of rows that threads claim.

use std::sync::atomic::{AtomicUsize, Ordering};

use llada_ir::ValueId;
use rayon::prelude::*;

use crate::kernels::{self, attention};
use crate::operands::operands;
use crate::executor::HeadShape;
use crate::window::KvView;

use super::{HostExecutor, OpBuffers, OpView};

impl HostExecutor {
    /// An attention layer: stores the stored rows' keys and values in the cache, then
    /// attends every row to the keys it sees.
    pub(super) fn attention(&self, v: &OpView<'_>, b: &mut OpBuffers<'_>, qkv: ValueId, out: ValueId, heads: HeadShape, layer: u32) {
        let (features, inp) = (v.features, v.inp);
        let m = &v.model.header.model;
        let hd = heads.head_dim as usize;
        let kv_capacity = v.model.header.plan.kv_capacity as usize;
        // Every layer's cache is sized by the model's heads; a layer with wider heads and
        // fewer of them (verified to fit) uses the start of it.
        let kv_layer = 2 * m.n_kv_heads as usize * m.head_dim as usize * kv_capacity;
        let ([q], o) = operands(b.win, [v.range(qkv)], v.range(out));
        let width = v.cols(qkv);
        let layer = layer as usize * kv_layer..(layer as usize + 1) * kv_layer;
        let real = &inp.positions[..inp.stored_rows];
        let shape = |capacity, keys| attention::Shape { width, capacity, heads: heads.heads as usize, kv_heads: heads.kv_heads as usize, head_dim: hd, keys, scale: heads.scale, threads: v.threads };
        let kv_heads = heads.kv_heads as usize;
        // Units of one head and a group of rows, claimed one at a time by whichever thread is
        // free: a core of a shared host can run at half speed for seconds (a neighbour on its
        // sibling hyperthread), and a fixed share would leave the other waiting for it.
        // A block-causal pass over several blocks: each run of rows attends to the keys
        // before its block's end (one run otherwise), from its window's start.
        match &mut b.kv {
            KvView::F32(all) => attention::store_kv(q, &shape(kv_capacity, 0), real, &mut all[layer.clone()]),
            KvView::Half(all, dtype) => attention::store_kv_half(q, &shape(kv_capacity, 0), real, &mut all[layer.clone()], *dtype),
        }
        // A half-precision cache's positions widened to f32 so far (a window's runs each
        // need their own span; without one, the context once serves every run).
        let mut widened_span = None;
        // With a window, rows that see the same keys but count back from different block
        // starts are runs of their own.
        let runs = inp.key_runs().flat_map(|(run, keys)| {
            let windowed = heads.window.is_some();
            let mut start = run.start;
            std::iter::from_fn(move || {
                (start < run.end).then(|| {
                    let end = if windowed { (start..run.end).find(|&r| inp.block_start(r) != inp.block_start(start)).unwrap_or(run.end) } else { run.end };
                    let sub = start..end;
                    start = end;
                    (sub, keys)
                })
            })
        });
        for (run, keys) in runs {
            let first = heads.window.map_or(0, |w| inp.block_start(run.start).saturating_sub(w as usize - 1)).min(keys);
            let (rows, oc) = (run.len(), v.cols(out));
            // The planes from key `first` on: the kernels index keys from the slice's start
            // (planes keep their stride).
            let (planes, sh) = match &b.kv {
                KvView::F32(all) => (&all[layer.clone()][first * hd..], shape(kv_capacity, keys - first)),
                KvView::Half(all, dtype) => {
                    let span = if heads.window.is_some() { (first, keys) } else { (0, inp.context) };
                    let (from, ctx) = (span.0, span.1 - span.0);
                    if widened_span != Some(span) {
                        // The kernels read f32: widen the keys and values attended to into
                        // scratch, planes of `ctx` positions.
                        let planes = &all[layer.clone()];
                        self.pool.install(|| {
                            b.widened[..2 * kv_heads * ctx * hd].par_chunks_mut(ctx * hd).enumerate().for_each(|(p, dst)| {
                                let src = &planes[attention::kv_plane(p, kv_capacity, hd) + from * hd..][..ctx * hd];
                                kernels::widen_half(src, *dtype, dst);
                            })
                        });
                        widened_span = Some(span);
                    }
                    (&b.widened[(first - from) * hd..], shape(ctx, keys - first))
                }
            };
            let q = &q[run.start * width..];
            // Rows that did not store attend with their own key and value at their position,
            // which the kernels count from the first key seen.
            let shifted: Vec<u32>;
            let positions = if first == 0 || inp.stored_rows >= run.end {
                &inp.positions[run.start..]
            } else {
                shifted = inp.positions[run.start..].iter().map(|&p| p.saturating_sub(first as u32)).collect();
                &shifted[..]
            };
            let own = attention::OwnKv { from_row: inp.stored_rows.saturating_sub(run.start), positions };
            let units = attention::units(features, &sh, rows);
            let next = AtomicUsize::new(0);
            let out = attention::Out::new(&mut o[run.start * oc..run.end * oc]);
            self.pool.install(|| {
                b.scores.par_chunks_mut(b.score_floats).for_each(|scores| loop {
                    let u = next.fetch_add(1, Ordering::Relaxed);
                    if u >= units {
                        break;
                    }
                    attention::attend(features, &attention::Call { qkv: q, kv: planes, shape: sh, own, rows }, u..u + 1, out, scores);
                })
            });
        }
    }
}
