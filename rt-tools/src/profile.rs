//! `llada-rt run --op-profile`: where a whole generation's pass time goes, op by op, with the
//! matmuls split by shape and by the rows they computed (a pass of a few rows streams its
//! weights at memory speed; one of dozens computes at the GEMM's rate).

use llada_ir::{Op, Rows};
use llada_rt::executor::PassProfile;
use llada_rt::model::Model;
use serde::Serialize;

/// A generation's op times, summed.
#[derive(Debug, Clone, Serialize)]
pub struct OpSplit {
    pub passes: usize,
    /// Seconds inside the passes' ops.
    pub seconds: f64,
    /// By op kind, largest first.
    pub ops: Vec<OpTotal>,
    /// Matmuls by weight shape and rows computed, in that order.
    pub matmuls: Vec<MatMulTotal>,
}

#[derive(Debug, Clone, Serialize)]
pub struct OpTotal {
    pub op: &'static str,
    pub seconds: f64,
    pub calls: u64,
}

#[derive(Debug, Clone, Serialize)]
pub struct MatMulTotal {
    /// Output columns and inputs of the weight.
    pub n: usize,
    pub k: usize,
    /// The rows of the calls: "1-8", "9-16", "17-32" or "33+".
    pub rows: &'static str,
    pub seconds: f64,
    pub calls: u64,
    /// 2 x rows x n x k over the calls.
    pub gop: f64,
}

/// The row classes matmuls are split by.
fn rows_class(rows: usize) -> &'static str {
    match rows {
        0..=8 => "1-8",
        9..=16 => "9-16",
        17..=32 => "17-32",
        _ => "33+",
    }
}

/// Sums `passes` (from `Session::take_op_profiles`) by op kind and matmul class.
pub fn split(model: &Model, passes: &[PassProfile]) -> OpSplit {
    let mut ops: Vec<OpTotal> = Vec::new();
    let mut matmuls: Vec<MatMulTotal> = Vec::new();
    for p in passes {
        let g = model.graph(p.graph);
        for &(index, seconds) in &p.ops.times {
            let op = &g.ops[index];
            match ops.iter_mut().find(|t| t.op == op.name()) {
                Some(t) => {
                    t.seconds += seconds;
                    t.calls += 1;
                }
                None => ops.push(OpTotal { op: op.name(), seconds, calls: 1 }),
            }
            if let Op::MatMul { x, weight, .. } = *op {
                let shape = &model.header.tensors[weight as usize].shape;
                let (n, k) = (shape[0] as usize, shape[1] as usize);
                let rows = if g.values[x as usize].rows == Rows::Logits { p.logit_rows } else { p.rows };
                let class = rows_class(rows);
                let gop = 2.0 * (rows * n * k) as f64 / 1e9;
                match matmuls.iter_mut().find(|m| (m.n, m.k, m.rows) == (n, k, class)) {
                    Some(m) => {
                        m.seconds += seconds;
                        m.calls += 1;
                        m.gop += gop;
                    }
                    None => matmuls.push(MatMulTotal { n, k, rows: class, seconds, calls: 1, gop }),
                }
            }
        }
    }
    ops.sort_by(|a, b| b.seconds.total_cmp(&a.seconds));
    let order = |c: &str| ["1-8", "9-16", "17-32", "33+"].iter().position(|&r| r == c);
    matmuls.sort_by_key(|m| (m.n, m.k, order(m.rows)));
    OpSplit { passes: passes.len(), seconds: ops.iter().map(|t| t.seconds).sum(), ops, matmuls }
}

impl OpSplit {
    /// The split as a table for people, on stdout (an error there is the command's, see
    /// `llada_cli::Failure`).
    pub fn print<E>(&self) -> Result<(), llada_cli::Failure<E>> {
        use llada_cli::outln;
        outln!("op profile: {} passes, {:.3} s in their ops", self.passes, self.seconds)?;
        for t in &self.ops {
            outln!("  {:<16} {:>8.3} s {:>5.1}%  {:>7} calls", t.op, t.seconds, 100.0 * t.seconds / self.seconds, t.calls)?;
        }
        outln!("  matmuls by weight (n x k) and rows computed:")?;
        for m in &self.matmuls {
            outln!("    {:>6} x {:<6} rows {:<6} {:>8.3} s {:>7} calls {:>9.1} GOP {:>7.0} GOP/s", m.n, m.k, m.rows, m.seconds, m.calls, m.gop, m.gop / m.seconds)?;
        }
        Ok(())
    }
}
