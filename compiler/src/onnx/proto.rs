//! An ONNX file read into plain data: nodes with their attributes, initializers as tensors
//! (inline or in external data files), and the graph's inputs and outputs. Protobuf comes
//! through `onnx-ir`'s generated types; nothing else of that crate is used.

use std::collections::{HashMap, HashSet};
use std::path::Path;

use bytes::Bytes;
use onnx_ir::{AttributeProto, AttributeType, Message, ModelProto, TensorProto};

use super::tensor::{Data, Elem, Tensor};

#[derive(Clone)]
pub enum Attr {
    Int(i64),
    Float(f64),
    Ints(Vec<i64>),
    Floats(Vec<f64>),
    Tensor(Tensor),
    Other,
}

pub struct Node {
    pub name: String,
    /// The op type, prefixed with its domain where that is not the default one
    /// (`com.microsoft::SimplifiedLayerNormalization`).
    pub op: String,
    pub inputs: Vec<String>,
    pub outputs: Vec<String>,
    pub attrs: HashMap<String, Attr>,
}

impl Node {
    pub fn int(&self, name: &str) -> Option<i64> {
        match self.attrs.get(name) {
            Some(Attr::Int(i)) => Some(*i),
            _ => None,
        }
    }

    pub fn float(&self, name: &str) -> Option<f64> {
        match self.attrs.get(name) {
            Some(Attr::Float(f)) => Some(*f),
            _ => None,
        }
    }

    pub fn ints(&self, name: &str) -> Option<&[i64]> {
        match self.attrs.get(name) {
            Some(Attr::Ints(v)) => Some(v),
            _ => None,
        }
    }

    /// `node 'node_linear_3' (MatMul)`: how errors name a node.
    pub fn label(&self) -> String {
        format!("node '{}' ({})", self.name, self.op)
    }
}

/// A graph input: its element type and dimensions (`None`: a named, dynamic axis).
pub struct Input {
    pub name: String,
    pub elem: Option<Elem>,
    pub dims: Vec<Option<usize>>,
}

pub struct Graph {
    /// The default domain's opset.
    pub opset: i64,
    pub nodes: Vec<Node>,
    pub inputs: Vec<Input>,
    pub outputs: Vec<String>,
    pub initializers: HashMap<String, Tensor>,
}

/// Maps `path` read-only as shared bytes: initializers parsed from it, or sliced from an
/// external data file, are views of the mapping, so a model's weights are copied once, into
/// the checkpoint the compiler takes.
fn map(path: &Path) -> std::io::Result<Bytes> {
    let file = llada_ir::files::open_regular(path)?;
    // SAFETY: the mapping is read-only; lladac does not guard against another process
    // truncating the file while it compiles (as with the safetensors importer's mappings).
    let map = unsafe { memmap2::Mmap::map(&file) }?;
    Ok(Bytes::from_owner(map))
}

/// Reads `path` and any external data files it names (relative to its directory).
pub fn read(path: &Path) -> Result<Graph, String> {
    let bytes = map(path).map_err(|e| format!("cannot read: {e}"))?;
    let model = ModelProto::parse_from_tokio_bytes(&bytes).map_err(|e| format!("not a valid ONNX model (truncated or not protobuf): {e}"))?;
    let g = model.graph.as_ref().ok_or("the ONNX model has no graph")?;
    let opset = model.opset_import.iter().find(|o| matches!(o.domain.as_str(), "" | "ai.onnx")).map_or(1, |o| o.version);
    let dir = path.parent().unwrap_or(Path::new("."));
    let mut files = ExternalFiles { dir, open: HashMap::new() };

    let mut initializers = HashMap::new();
    for t in &g.initializer {
        initializers.insert(t.name.clone(), tensor(t, &mut files).map_err(|e| format!("initializer '{}': {e}", t.name))?);
    }
    let inputs = g
        .input
        .iter()
        .filter(|i| !initializers.contains_key(&i.name))
        .map(|i| {
            let tt = i.type_.tensor_type();
            let dims = tt.shape.dim.iter().map(|d| (d.has_dim_value() && d.dim_value() > 0).then(|| d.dim_value() as usize)).collect();
            Input { name: i.name.clone(), elem: Elem::from_onnx(tt.elem_type), dims }
        })
        .collect();
    let mut nodes = Vec::with_capacity(g.node.len());
    let mut defined: HashSet<&str> = g.input.iter().map(|i| i.name.as_str()).chain(g.initializer.iter().map(|t| t.name.as_str())).collect();
    for (i, n) in g.node.iter().enumerate() {
        let op = if matches!(n.domain.as_str(), "" | "ai.onnx") { n.op_type.clone() } else { format!("{}::{}", n.domain, n.op_type) };
        let name = if n.name.is_empty() { format!("#{i}") } else { n.name.clone() };
        if let Some(missing) = n.input.iter().find(|i| !i.is_empty() && !defined.contains(i.as_str())) {
            return Err(format!(
                "node '{name}' ({op}): input '{missing}' is missing: not an initializer, a graph input or an earlier node's output"
            ));
        }
        defined.extend(n.output.iter().map(|o| o.as_str()));
        let mut attrs = HashMap::new();
        for a in &n.attribute {
            attrs.insert(a.name.clone(), attr(a, &mut files).map_err(|e| format!("node '{name}' ({op}): attribute '{}': {e}", a.name))?);
        }
        nodes.push(Node { name, op, inputs: n.input.clone(), outputs: n.output.clone(), attrs });
    }
    let outputs = g.output.iter().map(|o| o.name.clone()).collect();
    Ok(Graph { opset, nodes, inputs, outputs, initializers })
}

fn attr(a: &AttributeProto, files: &mut ExternalFiles) -> Result<Attr, String> {
    Ok(match a.type_.enum_value() {
        Ok(AttributeType::INT) => Attr::Int(a.i),
        Ok(AttributeType::FLOAT) => Attr::Float(a.f as f64),
        Ok(AttributeType::INTS) => Attr::Ints(a.ints.clone()),
        Ok(AttributeType::FLOATS) => Attr::Floats(a.floats.iter().map(|&f| f as f64).collect()),
        Ok(AttributeType::TENSOR) => Attr::Tensor(tensor(&a.t, files)?),
        _ => Attr::Other,
    })
}

/// External data files, each mapped once.
struct ExternalFiles<'a> {
    dir: &'a Path,
    open: HashMap<String, Bytes>,
}

impl ExternalFiles<'_> {
    fn bytes(&mut self, location: &str, offset: usize, length: Option<usize>) -> Result<Bytes, String> {
        if Path::new(location).is_absolute() || location.split(['/', '\\']).any(|c| c == "..") {
            return Err(format!("external data location '{location}' leaves the model's directory"));
        }
        let path = self.dir.join(location);
        if !self.open.contains_key(location) {
            let bytes = map(&path).map_err(|e| format!("external data file {}: {e}", path.display()))?;
            self.open.insert(location.to_string(), bytes);
        }
        let map = &self.open[location];
        let end = length.map_or(map.len(), |l| offset.saturating_add(l));
        if end > map.len() || offset > end {
            return Err(format!("byte range {offset}..{end} exceeds the {} bytes of external data file {}", map.len(), path.display()));
        }
        Ok(map.slice(offset..end))
    }
}

fn tensor(t: &TensorProto, files: &mut ExternalFiles) -> Result<Tensor, String> {
    let elem = Elem::from_onnx(t.data_type).ok_or_else(|| format!("element type {} is not one lladac reads", t.data_type))?;
    let dims = t.dims.iter().map(|&d| usize::try_from(d).map_err(|_| format!("negative dimension {d}"))).collect::<Result<Vec<_>, _>>()?;
    let numel = dims.iter().try_fold(1usize, |n, &d| n.checked_mul(d)).ok_or_else(|| format!("shape {dims:?} overflows"))?;
    let data = if t.data_location.value() == 1 {
        let key = |k: &str| t.external_data.iter().find(|e| e.key == k).map(|e| e.value.as_str());
        let location = key("location").ok_or("external data without a location")?;
        let num = |k: &str| key(k).map(|v| v.parse::<usize>().map_err(|_| format!("external data {k} '{v}' is not a number"))).transpose();
        Data::Raw(files.bytes(location, num("offset")?.unwrap_or(0), num("length")?)?)
    } else if !t.raw_data.is_empty() {
        Data::Raw(t.raw_data.clone())
    } else {
        match elem {
            Elem::F32 => Data::Float(t.float_data.iter().map(|&x| x as f64).collect::<Vec<_>>().into()),
            Elem::F64 => Data::Float(t.double_data.clone().into()),
            Elem::I64 => Data::Int(t.int64_data.clone().into()),
            // float16 and bfloat16 travel as their bits in int32_data.
            Elem::F16 | Elem::Bf16 => Data::Raw(Bytes::from(t.int32_data.iter().flat_map(|&x| (x as u16).to_le_bytes()).collect::<Vec<u8>>())),
            Elem::I32 | Elem::I8 | Elem::U8 | Elem::Bool => Data::Int(t.int32_data.iter().map(|&x| x as i64).collect::<Vec<_>>().into()),
        }
    };
    let have = match &data {
        Data::Raw(b) => b.len() / elem.size(),
        Data::Float(v) => v.len(),
        Data::Int(v) => v.len(),
    };
    if have != numel || matches!(&data, Data::Raw(b) if b.len() % elem.size() != 0) {
        return Err(format!("shape {dims:?} needs {numel} elements; the data holds {have}"));
    }
    Ok(Tensor { elem, dims, data })
}
