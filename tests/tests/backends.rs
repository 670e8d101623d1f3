//! Backends come from a registry by name: a backend nothing else names (`recording`, a folder
//! of the runtime registered for tests only, which records each pass and runs it on the host)
//! runs every decoding policy of every model family and gives the host backend's tokens, and
//! the passes it saw are the ones the session counted.

mod common;

use std::path::{Path, PathBuf};

use llada_rt::executor::{self, recording};
use llada_rt::sampler::{Policy, Revision};
use llada_rt::{generate, Generation, Model, SamplerParams, Session, SessionParams};

fn decode(model: &Model, backend: &str, prompt: &[u32], p: &SamplerParams) -> Generation {
    let params = SessionParams { backend: executor::find(backend).unwrap(), threads: Some(2), ..Default::default() };
    let mut s = Session::open(model, &params).unwrap();
    assert_eq!(s.backend().backend, backend);
    generate(&mut s, prompt, p, &mut |_| {}).unwrap()
}

/// Every policy `family` runs, on the host and on `recording`: the same tokens, reveals and
/// passes, and one recorded pass per pass the session counted.
fn every_policy_on_recording(model: &Model, prompt: &[u32], base: SamplerParams, policies: &[SamplerParams]) {
    recording::take_recorded();
    for p in std::iter::once(base).chain(policies.iter().cloned()) {
        let host = decode(model, "host", prompt, &p);
        assert!(recording::take_recorded().is_empty(), "the host backend records nothing");
        let rec = decode(model, "recording", prompt, &p);
        assert_eq!((&rec.output_ids, &rec.reveals), (&host.output_ids, &host.reveals), "{p:?}");
        assert_eq!((rec.forward_passes, rec.rows_computed), (host.forward_passes, host.rows_computed), "{p:?}");
        let passes = recording::take_recorded();
        assert_eq!(passes.len() as u64, rec.forward_passes, "{p:?}");
        assert_eq!(passes.iter().map(|r| r.rows as u64).sum::<u64>(), rec.rows_computed, "{p:?}");
        if p.policy != Policy::Exact {
            // A cached policy's passes reuse the cache: some compute fewer rows than they attend.
            assert!(passes.iter().any(|r| r.rows < r.context), "{p:?}");
        }
    }
}

fn policies(base: &SamplerParams, dream: bool) -> Vec<SamplerParams> {
    let mut all = vec![
        SamplerParams { policy: Policy::Prefix, ..base.clone() },
        SamplerParams { policy: Policy::Dual, ..base.clone() },
        SamplerParams { policy: Policy::Mbsd, spec_blocks: 1, revision: Revision::Off, ..base.clone() },
        SamplerParams { policy: Policy::Mbsd, spec_blocks: 1, revision: Revision::DualPath, ..base.clone() },
    ];
    if !dream {
        all.push(SamplerParams { policy: Policy::Spec, spec_blocks: 1, ..base.clone() });
    }
    all
}

#[test]
fn a_backend_only_the_registry_names_runs_every_policy_of_every_family() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let dir = tempfile::tempdir().unwrap();
    let compiled = |ckpt: PathBuf, name: &str| {
        let out = dir.path().join(name);
        common::compile(&ckpt, &out, Some(128));
        Model::open(&out, true).unwrap()
    };

    // LLaDA (the embedded model): exact, prefix, dual, spec, mbsd with and without revision.
    let llada = Model::open(&common::embedded(dir.path()), true).unwrap();
    let text = llada_rt::text::Text::new(&llada.header.tokenizer, &llada.header.special).unwrap();
    let prompt = text.encode_chat("SHIFT:PONMLKJIHGFEDCBAABCDEFGHIJKLMNOPAEIMBFJNCGKODHLPPLHDOKGCNJFBMIEA=").unwrap();
    let base = SamplerParams { gen_length: 64, block_length: 32, steps: 64, ..Default::default() };
    every_policy_on_recording(&llada, &prompt, base.clone(), &policies(&base, false));

    // Dream (its conformance kit's checkpoint): exact, prefix, dual, mbsd.
    let dream = compiled(root.join("data/dream-conformance/tiny-dream-A"), "dream.lad");
    let prompt: Vec<u32> = (40..60).collect();
    let base = SamplerParams { gen_length: 32, block_length: 16, steps: 32, ..Default::default() };
    // Dream's exact sampler has no blocks.
    let exact = SamplerParams { block_length: 32, ..base.clone() };
    every_policy_on_recording(&dream, &prompt, exact, &policies(&base, true));

    // LLaDA 2.x (block diffusion, a mixture of experts): its schedule and mbsd.
    let llada2 = compiled(root.join("data/llada2-conformance/tiny-llada2"), "llada2.lad");
    let prompt = [5u32, 9, 200, 31, 77, 8, 8, 8, 8, 8];
    let base = SamplerParams { gen_length: 32, block_length: 16, steps: 16, threshold: Some(0.2), ..Default::default() };
    let mbsd = SamplerParams { policy: Policy::Mbsd, spec_blocks: 1, spec_threshold: 0.0, ..base.clone() };
    every_policy_on_recording(&llada2, &prompt, base, &[mbsd]);
}
