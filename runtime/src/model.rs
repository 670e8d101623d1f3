//! A loaded artifact: the file mapped read-only, its header decoded and everything verified
//! once. After [`Model::open`] returns, the hot path trusts every index and offset in it.

use std::fs::File;
use std::ops::Range;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use half::{bf16, f16};
use llada_ir::window::{operand_layout, operand_of, ActivationScales, Operand, OperandLayout};
use llada_ir::{Artifact, DType, Graph, Header, TensorId};
use llada_ir::diffusion_gemma::DiffusionGemmaSection;
use llada_ir::program::{Programs, Step};
use memmap2::Mmap;

use crate::error::{Error, Result};

/// Shared, not copied, by [`Model::share`]: the CPU side path's worker thread holds its own
/// handle, so it needs no borrow of the caller's.
pub struct Model {
    pub path: PathBuf,
    pub header: Arc<Header>,
    /// The file that was verified: every later read goes through it (or the mapping of it),
    /// never through the path again, which may name another file by then.
    file: Arc<File>,
    mapping: Arc<Mapping>,
    data: Range<usize>,
    /// Each graph's steps, as the artifact's `program` section lists them.
    programs: Arc<Programs>,
    /// DiffusionGemma's section: which graphs encode and which denoise, and the checkpoint's
    /// generation defaults (`None` for the other families).
    diffusion_gemma: Option<Arc<DiffusionGemmaSection>>,
}

/// The verified file's mapping and its fault guard.
struct Mapping {
    /// Declared before `map`: unregistered before the mapping is unmapped.
    guard: Option<crate::fault::Guard>,
    map: Mmap,
}

/// A stored tensor viewed in place, in its stored element type.
#[derive(Clone, Copy)]
pub enum Weights<'a> {
    F32(&'a [f32]),
    Bf16(&'a [bf16]),
    F16(&'a [f16]),
}

/// A packed weight matrix `[n, k]` viewed in place, as the matmul kernels take it.
#[derive(Clone, Copy)]
pub struct Matrix<'a> {
    pub format: DType,
    pub n: usize,
    pub k: usize,
    pub bytes: &'a [u8],
    /// bf16 weights only: round the activations to bf16 too (`vdpbf16ps`) rather than
    /// multiplying in f32.
    pub bf16_activations: bool,
    /// Integer formats: one activation scale per row or per block (the plan's choice).
    pub activation_scales: ActivationScales,
}

impl Matrix<'_> {
    pub(crate) fn operand(&self) -> Operand {
        operand_of(self.format, self.bf16_activations)
    }

    /// Where the prepared operand of `rows` rows goes in the scratch.
    pub fn operand_layout(&self, rows: usize) -> OperandLayout {
        operand_layout(self.format, self.bf16_activations, self.activation_scales, rows, self.k)
    }
}

impl Model {
    /// Maps `path`, checks the preamble, header and structure, and (unless `verify_data` is
    /// false) every tensor checksum.
    pub fn open(path: &Path, verify_data: bool) -> Result<Model> {
        // A regular file only: a FIFO would block here forever, a device maps as nothing.
        let file = match std::fs::metadata(path) {
            Ok(meta) if meta.is_dir() => return Err(Error::Input { path: path.to_path_buf(), msg: "is a directory; give the artifact file `lladac compile -o` wrote".into() }),
            _ => llada_ir::files::open_regular(path).map_err(|e| Error::io(path, e))?,
        };
        // SAFETY: a read-only private map of a file the runtime only reads. A file renamed
        // over the path later leaves this one (and its mapping) intact; one truncated in place
        // would fault on reads past its new end, which the guard turns into zero pages and a
        // clear error (`fault`); one rewritten in place shows its new bytes, which no loader
        // can prevent (docs/c-api.md says to replace artifacts by rename).
        let map = unsafe { Mmap::map(&file) }.map_err(|e| Error::io(path, e))?;
        let guard = crate::fault::Guard::new(map.as_ptr(), map.len());
        let wrap = |source| Error::Artifact { path: path.to_path_buf(), source };
        let art = Artifact::parse(&map).map_err(wrap)?;
        if verify_data {
            // Hand each tensor's pages back once checked, so verification does not make the
            // whole file resident: only what the passes read stays (most of the embedding
            // never is).
            art.verify_data_each(|offset, len| {
                let start = offset / 4096 * 4096;
                // SAFETY: a private read-only file mapping holds no changes, so dropping its
                // pages loses nothing: later reads fault them back in from the file.
                let _ = unsafe { map.unchecked_advise_range(memmap2::UncheckedAdvice::DontNeed, start as usize, (offset + len - start) as usize) };
            })
            .map_err(wrap)?;
        }
        // `Artifact::parse` verified the programs against the graphs; a missing section is
        // refused here (recompile).
        let programs = Arc::new(Programs::decode(&art.header.extensions).map_err(wrap)?);
        let diffusion_gemma = DiffusionGemmaSection::of(&art.header).map_err(wrap)?.map(Arc::new);
        let (p, header) = (art.preamble, art.header);
        let data = p.data_offset as usize..(p.data_offset + p.data_len) as usize;
        Ok(Model { path: path.to_path_buf(), header: Arc::new(header), file: Arc::new(file), mapping: Arc::new(Mapping { guard, map }), data, programs, diffusion_gemma })
    }

    /// Another handle on the same loaded artifact (nothing is read or verified again), for a
    /// thread that must own one.
    pub fn share(&self) -> Model {
        Model { path: self.path.clone(), header: self.header.clone(), file: self.file.clone(), mapping: self.mapping.clone(), data: self.data.clone(), programs: self.programs.clone(), diffusion_gemma: self.diffusion_gemma.clone() }
    }

    /// The verified file, for threads that read from it (staging).
    pub fn file(&self) -> Arc<File> {
        self.file.clone()
    }

    /// Reads `dst.len()` bytes at `offset` of the data section from the verified file.
    pub fn read_data(&self, dst: &mut [u8], offset: u64) -> Result<()> {
        self.file.read_exact_at(dst, self.data_offset() + offset).map_err(|e| read_error(&self.path, e))
    }

    /// Fails if the artifact changed under the mapping since it was verified (truncated in
    /// place: reads past its new end saw zeros). Checked after every pass.
    pub fn check_intact(&self) -> Result<()> {
        match &self.mapping.guard {
            Some(g) if g.faulted() => Err(Error::Changed { path: self.path.clone() }),
            _ => Ok(()),
        }
    }

    /// The bytes of segment `id`, in place (a backend's executable, which no window region
    /// holds).
    pub fn segment_bytes(&self, id: u32) -> &[u8] {
        let s = &self.header.segments[id as usize];
        &self.mapping.map[self.data.clone()][s.offset as usize..(s.offset + s.nbytes) as usize]
    }

    pub fn tensor_bytes(&self, id: TensorId) -> &[u8] {
        let t = &self.header.tensors[id as usize];
        &self.mapping.map[self.data.clone()][t.offset as usize..(t.offset + t.nbytes) as usize]
    }

    /// A row-major tensor in its stored element type. Tensors are 64-byte aligned in a
    /// page-aligned map, so the casts cannot fail; the verifier checked that row-major ops
    /// only name row-major tensors.
    pub fn weights(&self, id: TensorId) -> Weights<'_> {
        let b = self.tensor_bytes(id);
        match self.header.tensors[id as usize].dtype {
            DType::F32 => Weights::F32(bytemuck::cast_slice(b)),
            DType::Bf16 => Weights::Bf16(bytemuck::cast_slice(b)),
            DType::F16 => Weights::F16(bytemuck::cast_slice(b)),
            packed => unreachable!("row-major access to a {} tensor", packed.name()),
        }
    }

    /// Packed matrix `id` `[n, k]` for the matmul kernels, its bytes wherever the plan put
    /// them (`bytes`: the tensor's whole stored bytes).
    pub fn matrix_at<'a>(&self, id: TensorId, bytes: &'a [u8]) -> Matrix<'a> {
        let t = &self.header.tensors[id as usize];
        Matrix { format: t.dtype, n: t.shape[0] as usize, k: t.shape[1] as usize, bytes, bf16_activations: self.header.plan.bf16_activations, activation_scales: self.header.plan.activation_scales }
    }

    /// File offset of the data section (segments' offsets are relative to it).
    pub fn data_offset(&self) -> u64 {
        self.data.start as u64
    }

    pub fn graph(&self, id: u32) -> &Graph {
        &self.header.graphs[id as usize]
    }

    /// Graph `id`'s program: its ops in runs, with the swap schedule's waits and releases
    /// and the CPU's MoE step where they fall.
    pub fn program(&self, id: u32) -> &[Step] {
        &self.programs.graphs[id as usize]
    }

    /// DiffusionGemma's section (its encoder and decoder graphs, generation defaults), if the
    /// model is one.
    pub fn diffusion_gemma(&self) -> Option<&DiffusionGemmaSection> {
        self.diffusion_gemma.as_deref()
    }

    /// What the model is (LLaDA, LLaDA-MoE or Dream).
    pub fn family(&self) -> llada_ir::Family {
        self.header.model.family()
    }

    /// Whether the model is Dream, whose sampler and logit shift differ from LLaDA's.
    pub fn is_dream(&self) -> bool {
        self.family() == llada_ir::Family::Dream
    }

    /// How far left of a position the network's output predicts it: 1 for Dream, whose
    /// published sampler shifts the logits by one position (position 0 keeps its own), 0
    /// for LLaDA.
    pub fn logit_shift(&self) -> u32 {
        u32::from(self.is_dream())
    }

    /// The longest sequence (prompt + generation) the artifact serves: what its largest graph
    /// and its KV cache hold.

    pub fn max_exact_len(&self) -> u32 {
        self.header.plan.by_rows.last().map_or(0, |&g| self.graph(g).rows).min(self.header.plan.kv_capacity)
    }

    /// Most logit rows one pass over `rows` positions can return.
    pub fn logit_capacity(&self, rows: usize) -> Result<usize> {
        Ok(self.graph(self.graph_for_rows(rows)?).logit_rows as usize)
    }

    /// Whether `prompt` can start a generation: at least one token, none the mask token (masks
    /// mark the positions the sampler fills: a masked prompt position would be infilling, not
    /// prompting) and every one in the vocabulary. The generator checks it when it starts; a
    /// front end may call it first to refuse a request before queueing it, naming its own
    /// field for the prompt.
    pub fn check_prompt(&self, prompt: &[u32]) -> Result<()> {
        let (mask, vocab) = (self.header.special.mask, self.header.model.embedding_size);
        if prompt.is_empty() {
            return Err(Error::request("the prompt is empty: give at least one token".to_string()));
        }
        // DiffusionGemma denoises uniform noise: no token marks a position to fill.
        let masks = self.diffusion_gemma.is_none();
        if let Some(i) = prompt.iter().position(|&t| masks && t == mask) {
            return Err(Error::request(format!("prompt token {i} is the mask token (id {mask}); a prompt cannot contain masks (they mark the positions to generate)")));
        }
        match prompt.iter().find(|&&t| t >= vocab) {
            Some(&bad) => Err(Error::request(format!("token id {bad} is outside the vocabulary (0..{vocab})"))),
            None => Ok(()),
        }
    }

    /// The graph that computes `rows` positions: the smallest bucket that holds them.
    pub fn graph_for_rows(&self, rows: usize) -> Result<u32> {
        self.header.graph_for_rows(rows).ok_or_else(|| self.too_long("the sequence (prompt + gen length)", rows, self.max_exact_len() as usize))
    }

    /// The refusal of a generation whose `what` needs `positions` where this artifact serves
    /// `limit`: the numbers and the fix, the same words for every model family.
    pub(crate) fn too_long(&self, what: &str, positions: usize, limit: usize) -> Error {
        // Recompiling helps only up to the model's own maximum.
        let model_max = self.header.model.max_sequence_length as usize;
        let advice = if positions <= model_max {
            format!("recompile with `lladac compile --max-seq {positions}` or shorten the prompt or --gen-len")
        } else {
            format!("the model itself takes at most {model_max} (its max_sequence_length), so shorten the prompt or --gen-len")
        };
        Error::request(format!("{what}: {positions} positions, but {} serves at most {limit}; {advice}", self.path.display()))
    }
}

/// A read of the verified file that failed; one that ran past its end means the file was
/// truncated after it was verified.
pub(crate) fn read_error(path: &Path, e: std::io::Error) -> Error {
    if e.kind() == std::io::ErrorKind::UnexpectedEof { Error::Changed { path: path.to_path_buf() } } else { Error::io(path, e) }
}

/// What a session opens on: a model shared with it (`Arc<Model>`, as the C API and Python
/// hold one for all their sessions), or a `&Model`, of which the session takes its own handle
/// ([`Model::share`]: nothing is read or verified again).
pub trait SharedModel {
    fn into_shared(self) -> Arc<Model>;
}

impl SharedModel for Arc<Model> {
    fn into_shared(self) -> Arc<Model> {
        self
    }
}

impl SharedModel for &Arc<Model> {
    fn into_shared(self) -> Arc<Model> {
        self.clone()
    }
}

impl SharedModel for &Model {
    fn into_shared(self) -> Arc<Model> {
        Arc::new(self.share())
    }
}
