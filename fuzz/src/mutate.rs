//! Mutations: raw bytes (flips, interesting values, inserts, deletes, splices of the input
//! with itself) and structure-aware JSON edits (a random node of the tree replaced by an
//! interesting value of any type, removed, duplicated or emptied). The random source is
//! SplitMix64, so a run is replayed exactly from its seed.

use serde_json::Value;

pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed)
    }
    pub fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    pub fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
    pub fn chance(&mut self, one_in: usize) -> bool {
        self.below(one_in) == 0
    }
}

const INTERESTING: [u64; 14] = [0, 1, 2, 3, 4, 7, 8, 63, 64, 255, 4096, 0x7fff_ffff, 0xffff_ffff, u64::MAX];

/// One to four byte-level mutations of `data` in place.
pub fn bytes(rng: &mut Rng, data: &mut Vec<u8>) {
    for _ in 0..1 + rng.below(4) {
        if data.is_empty() {
            data.push(rng.next() as u8);
            continue;
        }
        let at = rng.below(data.len());
        match rng.below(7) {
            0 => data[at] ^= 1 << rng.below(8),
            1 => data[at] = rng.next() as u8,
            2 => {
                // An interesting little-endian integer of 1, 2, 4 or 8 bytes.
                let v = INTERESTING[rng.below(INTERESTING.len())];
                let width = [1, 2, 4, 8][rng.below(4)];
                for (i, b) in v.to_le_bytes()[..width].iter().enumerate() {
                    if let Some(d) = data.get_mut(at + i) {
                        *d = *b;
                    }
                }
            }
            3 => {
                let n = 1 + rng.below(16);
                let end = (at + n).min(data.len());
                data.drain(at..end);
            }
            4 => {
                let n = 1 + rng.below(16);
                let fill = rng.next() as u8;
                data.splice(at..at, std::iter::repeat_n(fill, n));
            }
            5 => {
                // Copy a run of the input over another place (duplicated structure).
                let from = rng.below(data.len());
                let n = (1 + rng.below(32)).min(data.len() - from).min(data.len() - at);
                let run: Vec<u8> = data[from..from + n].to_vec();
                data[at..at + n].copy_from_slice(&run);
            }
            _ => data.truncate(at),
        }
    }
}

/// Paths to every node of `v` (as index lists: array index or object key position).
fn nodes(v: &Value, path: &mut Vec<usize>, out: &mut Vec<Vec<usize>>) {
    out.push(path.clone());
    let children: Vec<&Value> = match v {
        Value::Array(a) => a.iter().collect(),
        Value::Object(o) => o.values().collect(),
        _ => return,
    };
    for (i, c) in children.into_iter().enumerate() {
        path.push(i);
        nodes(c, path, out);
        path.pop();
    }
}

fn at_path<'v>(v: &'v mut Value, path: &[usize]) -> &'v mut Value {
    let Some((&i, rest)) = path.split_first() else { return v };
    let child = match v {
        Value::Array(a) => &mut a[i],
        Value::Object(o) => o.values_mut().nth(i).expect("a path from nodes()"),
        _ => unreachable!("a path from nodes()"),
    };
    at_path(child, rest)
}

fn interesting_value(rng: &mut Rng, old: &Value) -> Value {
    let n = |x: f64| serde_json::Number::from_f64(x).map_or(Value::Null, Value::Number);
    match rng.below(12) {
        0 => Value::Null,
        1 => Value::Bool(rng.chance(2)),
        2 => Value::from(INTERESTING[rng.below(INTERESTING.len())]),
        3 => Value::from(-(1 + rng.below(1 << 20) as i64)),
        4 => n([0.5, -0.0, 1e-30, 1e30, f64::MAX, -1.5][rng.below(6)]),
        5 => Value::String(["", "../x", "/etc/passwd", "a/b", "\u{0}", "<|mdm_mask|>", "llada"][rng.below(7)].to_string()),
        6 => Value::String("A".repeat(1 + rng.below(5000))),
        7 => Value::Array(Vec::new()),
        8 => Value::Object(Default::default()),
        // Nudge a number by one or scale it.
        _ => match old.as_u64() {
            Some(u) => Value::from([u.wrapping_add(1), u.wrapping_sub(1), u.wrapping_mul(2), u / 2, u.wrapping_mul(1 << 20)][rng.below(5)]),
            None => match old.as_f64() {
                Some(f) => n([f + 1.0, f - 1.0, f * 2.0, -f][rng.below(4)]),
                None => Value::from(rng.next() % 1_000_000),
            },
        },
    }
}

/// One to three structural edits of `v`.
pub fn json(rng: &mut Rng, v: &mut Value) {
    for _ in 0..1 + rng.below(3) {
        let mut all = Vec::new();
        nodes(v, &mut Vec::new(), &mut all);
        let path = all[rng.below(all.len())].clone();
        let node = at_path(v, &path);
        match (rng.below(5), &mut *node) {
            (0, Value::Array(a)) if !a.is_empty() => {
                let i = rng.below(a.len());
                a.remove(i);
            }
            (1, Value::Array(a)) if !a.is_empty() => {
                let i = rng.below(a.len());
                let dup = a[i].clone();
                a.insert(rng.below(a.len() + 1), dup);
            }
            (0, Value::Object(o)) if !o.is_empty() => {
                let key = o.keys().nth(rng.below(o.len())).cloned().expect("non-empty");
                o.remove(&key);
            }
            (1, Value::Object(o)) => {
                o.insert(["x", "vocab_size", "weight_map", "__metadata__", "dtype"][rng.below(5)].to_string(), Value::from(rng.next() % 4096));
            }
            _ => {
                let old = node.clone();
                *node = interesting_value(rng, &old);
            }
        }
    }
}
