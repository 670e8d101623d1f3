//! The `llada` Python module: compile a checkpoint (`llada.compile`), open an artifact
//! (`llada.Model`), and generate on a session of it (`Session.generate`, or step by step with
//! `Session.steps`). Settings go by the CLI's flag names with underscores, through
//! `llada_rt::settings::sampler_params`, which checks them as every front end does.
//!
//! Every pass runs with the GIL released, so Python threads generate on separate sessions at
//! once. A session serves one generation at a time: a second use while one runs (another
//! thread, or a step iterator still open) is refused, not queued. Models and sessions belong
//! to the process that opened them: a forked child that uses its parent's is refused.

use std::sync::{Arc, Mutex, MutexGuard};

use llada_ir::FileError;
use llada_rt::moe::ExpertStrategy;
use llada_rt::settings::Value;
use llada_rt::staging::StagingMode;
use llada_rt::text::Text;
use llada_rt::{Generation, Generator, SessionParams};
use pyo3::create_exception;
use pyo3::exceptions::{PyFileNotFoundError, PyOSError, PyRuntimeError, PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyDict, PyFloat, PyInt, PyString};

create_exception!(llada, LladaError, PyRuntimeError, "A failure of the runtime or the compiler that is not the caller's settings.");
create_exception!(llada, SettingError, PyValueError, "A setting or request the model cannot serve; the message names the setting.");

/// The runtime's error as the Python exception a caller catches: bad settings and requests
/// are `ValueError`s (`SettingError`), a missing file `FileNotFoundError`, other I/O
/// `OSError`, the rest `LladaError`.
fn rt_err(e: llada_rt::Error) -> PyErr {
    use llada_rt::Error as E;
    let msg = e.to_string();
    match e {
        E::Setting { .. } | E::Request(_) | E::Template(_) => SettingError::new_err(msg),
        E::File(FileError::NotFound { .. }) => PyFileNotFoundError::new_err(msg),
        E::File(FileError::Io { .. }) => PyOSError::new_err(msg),
        _ => LladaError::new_err(msg),
    }
}

/// The compiler's error, mapped as [`rt_err`] maps the runtime's.
fn compile_err(e: lladac::Error) -> PyErr {
    use lladac::Error as E;
    let msg = e.to_string();
    match e {
        E::File(FileError::NotFound { .. }) => PyFileNotFoundError::new_err(msg),
        E::File(FileError::Io { .. }) => PyOSError::new_err(msg),
        E::Options(_) => SettingError::new_err(msg),
        _ => LladaError::new_err(msg),
    }
}

/// The process that opened a model, a session or a step iterator. `fork` copies memory but
/// not threads: a session's worker pool, and any lock a parent's thread held, are gone in the
/// child, which would wait for them forever. So a child's use is refused, and its copy is
/// leaked rather than dropped (dropping would join those threads).
#[derive(Clone, Copy)]
struct Opened(u32);

impl Opened {
    fn here() -> Opened {
        Opened(std::process::id())
    }

    fn forked(self) -> bool {
        self.0 != std::process::id()
    }

    fn check(self, what: &str) -> PyResult<()> {
        if !self.forked() {
            return Ok(());
        }
        Err(LladaError::new_err(format!(
            "this {what} was opened in process {}; open it again in this process ({}): a forked child (os.fork, or multiprocessing's default start method on Linux) cannot use its parent's models and sessions",
            self.0,
            std::process::id()
        )))
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panic while locked (caught at the Python boundary) leaves nothing half written in
    // these slots: they only ever hold a whole value or none.
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// An opened, verified artifact and its tokenizer.
#[pyclass(frozen, module = "llada")]
struct Model {
    inner: Arc<llada_rt::Model>,
    text: Arc<Text>,
    opened: Opened,
}

impl Drop for Model {
    fn drop(&mut self) {
        if self.opened.forked() {
            std::mem::forget(self.inner.clone());
        }
    }
}

#[pymethods]
impl Model {
    #[new]
    fn new(py: Python<'_>, path: std::path::PathBuf) -> PyResult<Model> {
        // Verifying the data reads the whole file: without the GIL.
        let (inner, text) = py
            .detach(|| -> llada_rt::Result<_> {
                let m = llada_rt::Model::open(&path, true)?;
                let text = Text::new(&m.header.tokenizer, &m.header.special)?;
                Ok((m, text))
            })
            .map_err(rt_err)?;
        Ok(Model { inner: Arc::new(inner), text: Arc::new(text), opened: Opened::here() })
    }

    /// The artifact's path.
    #[getter]
    fn path(&self) -> String {
        self.inner.path.display().to_string()
    }

    /// `llada`, `llada-moe`, `llada2-moe`, `dream` or `diffusion-gemma`.
    #[getter]
    fn family(&self) -> &'static str {
        self.inner.family().name()
    }

    /// The longest prompt + generation the artifact serves.
    #[getter]
    fn max_len(&self) -> u32 {
        self.inner.max_exact_len()
    }

    /// The mask token's id (open positions of a step view's `generated`).
    #[getter]
    fn mask_id(&self) -> u32 {
        self.inner.header.special.mask
    }

    /// Token ids of plain text (without the GIL: a long text takes a while).
    fn encode(&self, py: Python<'_>, text: &str) -> PyResult<Vec<u32>> {
        self.opened.check("llada.Model")?;
        py.detach(|| self.text.encode(text)).map_err(rt_err)
    }

    /// Token ids of one user turn through the model's chat template.
    fn encode_chat(&self, py: Python<'_>, user: &str) -> PyResult<Vec<u32>> {
        self.opened.check("llada.Model")?;
        py.detach(|| self.text.encode_chat(user)).map_err(rt_err)
    }

    /// The text of `ids`; an id the tokenizer has no token for is a `ValueError` naming it
    /// (the tokenizer would drop it silently).
    #[pyo3(signature = (ids, skip_special=true))]
    fn decode(&self, py: Python<'_>, ids: Vec<u32>, skip_special: bool) -> PyResult<String> {
        self.opened.check("llada.Model")?;
        self.text.check_ids(&ids).map_err(rt_err)?;
        Ok(py.detach(|| self.text.decode(&ids, skip_special)))
    }

    /// The answer in generated ids: up to the first end-of-text or end-of-turn token.
    fn answer(&self, ids: Vec<u32>) -> PyResult<String> {
        self.opened.check("llada.Model")?;
        Ok(self.text.answer(&ids))
    }

    /// A session on this model, with `llada-rt run`'s session options: `backend` is `host`,
    /// `vulkan` or `qnn`; `threads` `None` for every core; `staging` `async` or `sync`; and for
    /// a mixture-of-experts model `experts` (`hybrid`, `lru` or `static`; `None`: hybrid) and
    /// `cpu_threads` (`None`: 1).
    #[pyo3(signature = (threads=None, backend="host", staging="async", experts=None, cpu_threads=None))]
    fn session(slf: &Bound<'_, Self>, threads: Option<usize>, backend: &str, staging: &str, experts: Option<&str>, cpu_threads: Option<usize>) -> PyResult<Session> {
        slf.get().opened.check("llada.Model")?;
        let backend = llada_rt::executor::find(backend).map_err(|_| SettingError::new_err(format!("--backend '{backend}' is not one of {}", llada_rt::executor::names().join(", "))))?;
        let staging = StagingMode::parse(staging).ok_or_else(|| SettingError::new_err(format!("--staging '{staging}' is not one of {}", StagingMode::NAMES.join(", "))))?;
        let experts = experts.map(|e| ExpertStrategy::parse(e).ok_or_else(|| SettingError::new_err(format!("--experts '{e}' is not one of {}", ExpertStrategy::NAMES.join(", "))))).transpose()?;
        Session::open(slf, SessionParams { backend, threads, staging, experts, cpu_threads })
    }

    fn __repr__(&self) -> String {
        format!("llada.Model('{}', family='{}', max_len={})", self.path(), self.family(), self.max_len())
    }
}

/// Where a session waits between generations: `None` while one has it out.
type Slot = Arc<Mutex<Option<Box<llada_rt::Session>>>>;

fn take(slot: &Slot) -> PyResult<Box<llada_rt::Session>> {
    lock(slot).take().ok_or_else(|| {
        LladaError::new_err(
            "this session is busy: a step iterator over it is still open (exhaust it or call its close()), or another thread is generating on it; use one session per thread",
        )
    })
}

/// A session taken out of its slot, put back when dropped (a panic included).
struct Lent<'a> {
    held: Option<Box<llada_rt::Session>>,
    slot: &'a Slot,
}

impl Drop for Lent<'_> {
    fn drop(&mut self) {
        if let Some(h) = self.held.take() {
            *lock(self.slot) = Some(h);
        }
    }
}

/// The session's counters as a dict.
fn counters<'py>(py: Python<'py>, c: &llada_rt::session::Counters) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("forward_passes", c.forward_passes)?;
    d.set_item("rows_computed", c.rows_computed)?;
    d.set_item("logit_rows_computed", c.logit_rows_computed)?;
    d.set_item("forward_seconds", c.forward_seconds)?;
    d.set_item("staged_bytes", c.staged_bytes)?;
    d.set_item("stall_seconds", c.stall_seconds)?;
    d.set_item("copy_seconds", c.copy_seconds)?;
    d.set_item("side_path_starts", c.side_path_starts)?;
    d.set_item("context_loads", c.context_loads)?;
    Ok(d)
}

/// A generation's result as the dict `Session.generate` returns.
fn generation<'py>(py: Python<'py>, text: &Text, g: &Generation, c: &llada_rt::session::Counters) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("text", text.answer(&g.output_ids))?;
    d.set_item("output_ids", &g.output_ids)?;
    d.set_item("prompt_ids", &g.prompt_ids)?;
    d.set_item("reveals", &g.reveals)?;
    d.set_item("revisions", &g.revisions)?;
    d.set_item("forward_passes", g.forward_passes)?;
    d.set_item("rows_computed", g.rows_computed)?;
    d.set_item("drafts_confirmed", g.drafts_confirmed)?;
    d.set_item("seconds", g.seconds)?;
    d.set_item("counters", counters(py, c)?)?;
    Ok(d)
}

/// Python values of settings as the runtime's: `None`, `bool`, `int`, `float` and `str`;
/// anything else is a `TypeError` naming the setting. Names and ranges are checked by
/// `sampler_params`.
fn settings(model: &llada_rt::Model, given: Option<&Bound<'_, PyDict>>) -> PyResult<llada_rt::SamplerParams> {
    let mut values: Vec<(String, Value)> = Vec::new();
    for (k, v) in given.into_iter().flat_map(|d| d.iter()) {
        let name: String = k.extract()?;
        let value = if v.is_none() {
            Value::Null
        } else if v.is_instance_of::<PyBool>() {
            Value::Bool(v.extract()?)
        } else if v.is_instance_of::<PyInt>() {
            // Wider than any setting (a seed is a u64): the settings check the range. An int
            // past i128 goes as a float, which they refuse by range too.
            match v.extract::<i128>() {
                Ok(n) => Value::Int(n),
                Err(_) => Value::Float(v.extract::<f64>().unwrap_or(f64::INFINITY)),
            }
        } else if v.is_instance_of::<PyFloat>() {
            Value::Float(v.extract()?)
        } else if v.is_instance_of::<PyString>() {
            Value::Str(v.extract()?)
        } else {
            let ty = v.get_type().name().map(|n| n.to_string()).unwrap_or_else(|_| "?".into());
            return Err(PyTypeError::new_err(format!("{name}: expected None, a bool, an int, a float or a str, got {ty}")));
        };
        values.push((name, value));
    }
    let refs: Vec<(&str, Value)> = values.iter().map(|(n, v)| (n.as_str(), v.clone())).collect();
    llada_rt::settings::sampler_params(model, &refs).map_err(rt_err)
}

/// A session on a model: its window, its threads and its counters. One generation at a time.
#[pyclass(frozen, module = "llada")]
struct Session {
    slot: Slot,
    model: Py<Model>,
    rt_model: Arc<llada_rt::Model>,
    text: Arc<Text>,
    backend: &'static str,
    threads: usize,
    opened: Opened,
}

impl Drop for Session {
    fn drop(&mut self) {
        if self.opened.forked() {
            std::mem::forget(self.slot.clone());
            std::mem::forget(self.rt_model.clone());
        }
    }
}

impl Session {
    fn open(model: &Bound<'_, Model>, params: SessionParams) -> PyResult<Session> {
        let kind = params.backend;
        let m = model.get();
        let rt_model = m.inner.clone();
        let held = model.py().detach(|| llada_rt::Session::open(&rt_model, &params)).map_err(rt_err)?;
        let threads = held.threads();
        Ok(Session { slot: Arc::new(Mutex::new(Some(Box::new(held)))), model: model.clone().unbind(), rt_model, text: m.text.clone(), backend: kind.name, threads, opened: Opened::here() })
    }

    /// The prompt's ids: `prompt` text (through the chat template with `chat`) or `ids`. Text
    /// is tokenized without the GIL, after a text too long for the model is refused untokenized.
    fn prompt(&self, py: Python<'_>, prompt: Option<&str>, ids: Option<Vec<u32>>, chat: bool) -> PyResult<Vec<u32>> {
        self.opened.check("llada.Session")?;
        // One position at least is left for the generation.
        let most = (self.rt_model.max_exact_len() as usize).saturating_sub(1);
        match (prompt, ids) {
            (Some(p), None) => py
                .detach(|| {
                    self.text.check_length(p, most)?;
                    if chat { self.text.encode_chat(p) } else { self.text.encode(p) }
                })
                .map_err(rt_err),
            (None, Some(_)) if chat => Err(SettingError::new_err("chat=True applies the chat template to a text prompt; with ids, give the template's ids yourself")),
            (None, Some(ids)) => Ok(ids),
            (None, None) => Err(SettingError::new_err("give a prompt: prompt='text' or ids=[token ids]")),
            (Some(_), Some(_)) => Err(SettingError::new_err("give prompt or ids, not both")),
        }
    }
}

#[pymethods]
impl Session {
    #[getter]
    fn model(&self, py: Python<'_>) -> Py<Model> {
        self.model.clone_ref(py)
    }

    #[getter]
    fn backend(&self) -> &'static str {
        self.backend
    }

    #[getter]
    fn threads(&self) -> usize {
        self.threads
    }

    /// The session's counters since it opened (passes, rows, seconds).
    #[getter]
    fn counters<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        self.opened.check("llada.Session")?;
        let held = take(&self.slot)?;
        let lent = Lent { held: Some(held), slot: &self.slot };
        counters(py, &lent.held.as_ref().expect("lent").counters)
    }

    /// Generates from `prompt` (text; `chat=True` applies the chat template) or `ids`, with
    /// settings by the CLI's names (`gen_len=64, steps=64, ...`). The GIL is released while
    /// the passes run.
    #[pyo3(signature = (prompt=None, ids=None, chat=false, **settings))]
    fn generate<'py>(&self, py: Python<'py>, prompt: Option<&str>, ids: Option<Vec<u32>>, chat: bool, settings: Option<&Bound<'py, PyDict>>) -> PyResult<Bound<'py, PyDict>> {
        let ids = self.prompt(py, prompt, ids, chat)?;
        let params = crate::settings(&self.rt_model, settings)?;
        let mut lent = Lent { held: Some(take(&self.slot)?), slot: &self.slot };
        // Ctrl-C (a pending signal) stops the generation between steps: the GIL is taken back
        // for a moment after each step to let Python look.
        let mut interrupted: Option<PyErr> = None;
        let (g, c) = py.detach(|| {
            let session = &mut **lent.held.as_mut().expect("lent");
            let g = llada_rt::generate_until(session, &ids, &params, &mut |_| match Python::attach(|py| py.check_signals()) {
                Ok(()) => std::ops::ControlFlow::Continue(()),
                Err(e) => {
                    interrupted = Some(e);
                    std::ops::ControlFlow::Break(())
                }
            });
            (g, session.counters)
        });
        drop(lent);
        if let Some(e) = interrupted {
            return Err(e);
        }
        generation(py, &self.text, &g.map_err(rt_err)?, &c)
    }

    /// A step iterator: each `next()` runs one step (one pass, without the GIL) and yields
    /// its view. The session is busy until the iterator is exhausted, closed or dropped.
    #[pyo3(signature = (prompt=None, ids=None, chat=false, **settings))]
    fn steps(&self, py: Python<'_>, prompt: Option<&str>, ids: Option<Vec<u32>>, chat: bool, settings: Option<&Bound<'_, PyDict>>) -> PyResult<Steps> {
        let ids = self.prompt(py, prompt, ids, chat)?;
        let params = crate::settings(&self.rt_model, settings)?;
        // The session leaves its slot for the generator, which owns it until `give_back`.
        let generator = Generator::start_owned(take(&self.slot)?, &ids, &params).map_err(|(e, session)| {
            *lock(&self.slot) = Some(session);
            rt_err(e)
        })?;
        let stepping = Stepping { generator: Some(generator), slot: self.slot.clone(), result: None, opened: Opened::here() };
        Ok(Steps { inner: Mutex::new(stepping), text: self.text.clone(), mask: self.rt_model.header.special.mask, opened: Opened::here() })
    }

    fn __repr__(&self) -> String {
        format!("llada.Session(backend='{}', threads={})", self.backend, self.threads)
    }
}

/// A generation in progress, owning its session while it runs: the session leaves its slot
/// for the generator (the session is busy meanwhile) and goes back when the generation
/// completes or the iterator is closed or dropped part-way (`Generator` leaves the session
/// usable when ended part-way).
struct Stepping {
    generator: Option<Generator<'static>>,
    slot: Slot,
    result: Option<(Generation, llada_rt::session::Counters)>,
    opened: Opened,
}

impl Stepping {
    /// Ends the generation and puts the session back in its slot: what the generation did
    /// and the session's counters (`None` if it was given back already).
    fn give_back(&mut self) -> Option<(Generation, llada_rt::session::Counters)> {
        let (g, session) = self.generator.take()?.end();
        let session = session.expect("the generator owns its session");
        let counters = session.counters;
        *lock(&self.slot) = Some(session);
        Some((g, counters))
    }
}

impl Drop for Stepping {
    fn drop(&mut self) {
        if self.opened.forked() {
            std::mem::forget(self.generator.take());
            std::mem::forget(self.slot.clone());
            return;
        }
        self.give_back();
    }
}

/// What one step shows, copied out of the generator's view.
struct View {
    step: usize,
    steps: usize,
    generated: Vec<u32>,
    committed: Vec<[u32; 2]>,
    revised: Vec<[u32; 2]>,
    settled: usize,
}

/// The step iterator of `Session.steps`.
#[pyclass(frozen, module = "llada")]
struct Steps {
    inner: Mutex<Stepping>,
    text: Arc<Text>,
    mask: u32,
    opened: Opened,
}

impl Steps {
    /// The generation, unless another thread is stepping it. Not a blocking `lock`: a thread
    /// waiting for it with the GIL held would keep the stepping thread, which takes the GIL
    /// back after its pass, from ever finishing.
    fn stepping(&self) -> PyResult<MutexGuard<'_, Stepping>> {
        self.opened.check("llada step iterator")?;
        match self.inner.try_lock() {
            Ok(s) => Ok(s),
            // A step that panicked: the generator refuses further steps; the rest is whole.
            Err(std::sync::TryLockError::Poisoned(p)) => Ok(p.into_inner()),
            Err(std::sync::TryLockError::WouldBlock) => Err(LladaError::new_err("this step iterator is in use by another thread")),
        }
    }
}

#[pymethods]
impl Steps {
    fn __iter__(slf: PyRef<'_, Self>) -> PyRef<'_, Self> {
        slf
    }

    fn __next__<'py>(&self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyDict>>> {
        let mut s = self.stepping()?;
        let Some(generator) = s.generator.as_mut() else { return Ok(None) };
        let step = py.detach(|| {
            generator.step().map(|v| {
                v.map(|v| View { step: v.step, steps: v.steps, generated: v.generated().to_vec(), committed: v.committed.to_vec(), revised: v.revised.to_vec(), settled: v.settled })
            })
        });
        let view = match step {
            Ok(Some(v)) => v,
            Ok(None) => {
                s.result = s.give_back();
                return Ok(None);
            }
            Err(e) => {
                // A failed step ends the generation; the session goes back for the next.
                s.give_back();
                return Err(rt_err(e));
            }
        };
        let d = PyDict::new(py);
        d.set_item("step", view.step)?;
        d.set_item("steps", view.steps)?;
        d.set_item("settled_text", self.text.settled_answer(&view.generated[..view.settled]))?;
        d.set_item("generated", view.generated)?;
        d.set_item("mask_id", self.mask)?;
        d.set_item("committed", view.committed)?;
        d.set_item("revised", view.revised)?;
        d.set_item("settled", view.settled)?;
        Ok(Some(d))
    }

    /// The whole generation's result (as `Session.generate` returns it) once the iterator is
    /// exhausted; `None` before.
    #[getter]
    fn result<'py>(&self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyDict>>> {
        let s = self.stepping()?;
        s.result.as_ref().map(|(g, c)| generation(py, &self.text, g, c)).transpose()
    }

    /// Stops the generation and frees the session for the next one.
    fn close(&self) -> PyResult<()> {
        let mut s = self.stepping()?;
        s.give_back();
        Ok(())
    }
}

/// Compiles a Hugging Face checkpoint (or an ONNX export) into an artifact, as `lladac
/// compile` does, with its flags as keyword arguments (`dtype` is `quant`'s alias). Returns
/// what was written.
#[pyfunction]
#[pyo3(signature = (model, output, *, target="host", quant=None, dtype=None, group=None, max_seq=None, logit_rows=256, block_len=32, spec_blocks=None, activations="f32", activation_scales=None, window_bytes=None, kv_dtype=None, host_only=false, qnn_lib=None, npu_contexts=None, npu_shared_weights=false, npu_estimate_soc=None, npu_activations=None, calibration=None, npu_sessions=None, npu_session_bytes=None, progress=false))]
#[allow(clippy::too_many_arguments)]
fn compile<'py>(
    py: Python<'py>,
    model: std::path::PathBuf,
    output: std::path::PathBuf,
    target: &str,
    quant: Option<&str>,
    dtype: Option<&str>,
    group: Option<u32>,
    max_seq: Option<u32>,
    logit_rows: u32,
    block_len: u32,
    spec_blocks: Option<u32>,
    activations: &str,
    activation_scales: Option<&str>,
    window_bytes: Option<u64>,
    kv_dtype: Option<&str>,
    host_only: bool,
    qnn_lib: Option<std::path::PathBuf>,
    npu_contexts: Option<u32>,
    npu_shared_weights: bool,
    npu_estimate_soc: Option<u32>,
    npu_activations: Option<&str>,
    calibration: Option<std::path::PathBuf>,
    npu_sessions: Option<u32>,
    npu_session_bytes: Option<u64>,
    progress: bool,
) -> PyResult<Bound<'py, PyDict>> {
    use lladac::compile::{NpuActivations, Quant};
    // The choices clap checks for the CLI.
    fn one_of<T>(flag: &str, v: &str, names: &[&str], parse: impl Fn(&str) -> Option<T>) -> PyResult<T> {
        match parse(v) {
            Some(t) if names.contains(&v) => Ok(t),
            _ => Err(SettingError::new_err(format!("--{flag} '{v}' is not one of {}", names.join(", ")))),
        }
    }
    let quant = match (quant, dtype) {
        (Some(_), Some(_)) => return Err(SettingError::new_err("give quant or its alias dtype, not both")),
        (q, d) => q.or(d),
    };
    if let Some(g) = group.filter(|g| ![32, 64, 128].contains(g)) {
        return Err(SettingError::new_err(format!("--group {g} is not one of 32, 64, 128")));
    }
    let quant_names = ["f32", "bf16", "f16", "q8", "q4"];
    let q = quant.map(|q| one_of("quant", q, &quant_names, |q| Quant::parse(q, group.unwrap_or_else(|| lladac::compile::default_group_for(&model, target))))).transpose()?;
    let bf16_activations = one_of("activations", activations, &["f32", "bf16"], |a| Some(a == "bf16"))?;
    let activation_scales = activation_scales.map(|a| one_of("activation-scales", a, &["row", "block"], llada_ir::window::ActivationScales::parse)).transpose()?;
    let kv_dtype = kv_dtype.map(|k| one_of("kv-dtype", k, &["f32", "f16", "bf16"], llada_ir::KvDType::parse)).transpose()?;
    let npu_activations = npu_activations.map(|a| one_of("npu-activations", a, &["f16", "u16"], NpuActivations::parse)).transpose()?.unwrap_or_default();
    lladac::compile::check_flags(quant, group, target, max_seq, block_len, spec_blocks).map_err(SettingError::new_err)?;
    let opts = lladac::CompileOptions {
        model,
        output,
        quant: q,
        target: target.to_string(),
        max_seq,
        logit_rows,
        block_len,
        spec_blocks,
        bf16_activations,
        activation_scales,
        window_bytes,
        kv_dtype,
        progress,
        host_only,
        qnn_lib,
        npu_contexts,
        npu_shared_weights,
        npu_estimate_soc,
        npu_activations,
        calibration,
        npu_limits: lladac::compile::NpuLimitOverrides { sessions: npu_sessions, session_bytes: npu_session_bytes },
        ..Default::default()
    };
    let s = py.detach(|| lladac::compile(&opts)).map_err(compile_err)?;
    let d = PyDict::new(py);
    d.set_item("output", s.output.display().to_string())?;
    d.set_item("bytes", s.bytes)?;
    d.set_item("tensors", s.tensors)?;
    d.set_item("graphs", s.graphs)?;
    d.set_item("quant", s.quant.name())?;
    d.set_item("max_seq", s.max_seq)?;
    d.set_item("warnings", s.warnings)?;
    Ok(d)
}

#[pymodule]
fn _llada(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    m.add_class::<Model>()?;
    m.add_class::<Session>()?;
    m.add_class::<Steps>()?;
    m.add_function(wrap_pyfunction!(compile, m)?)?;
    m.add("LladaError", py.get_type::<LladaError>())?;
    m.add("SettingError", py.get_type::<SettingError>())?;
    m.add("SETTINGS", llada_rt::settings::NAMES.to_vec())?;
    Ok(())
}
