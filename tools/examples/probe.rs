use burn::tensor::{activation, Device, Int, Tensor, TensorData};
use llada_tools::checkpoint::{tokenizer_json, SpecialIds};
use llada_tools::reference::{Hyper, Llada};
use llada_tools::tasks;
fn main() {
    let dir = std::path::PathBuf::from(std::env::args().nth(1).unwrap());
    let content = std::env::args().nth(2).unwrap();
    let reveal: usize = std::env::args().nth(3).map(|s| s.parse().unwrap()).unwrap_or(0);
    let shape = llada_tools::train::TrainConfig::embedded().shape;
    let special = SpecialIds::for_vocab(shape.embedding_size);
    let tok: tokenizers::Tokenizer = tokenizer_json(special).to_string().parse().unwrap();
    let mut ids: Vec<i64> = tok.encode(tasks::chat_prompt(&content), false).unwrap().get_ids().iter().map(|&x| x as i64).collect();
    let p = ids.len();
    let kind = if content.starts_with("PARITY") { tasks::Kind::Parity } else { tasks::Kind::Shift };
    let input = &content[content.find(':').unwrap() + 1..content.len() - 1];
    let ans = tasks::solve(kind, input);
    for i in 0..64 { ids.push(if i < reveal { ans.as_bytes()[i] as i64 } else { special.mask as i64 }); }
    let device = Device::default();
    let m = Llada::load(&dir, &shape, &device).unwrap();
    let x = Tensor::<2, Int>::from_data(TensorData::new(ids.clone(), [1, ids.len()]), &device);
    let probs: Vec<f32> = activation::softmax(m.forward(x, Hyper::of(&shape)), 2).into_data().try_to_vec().unwrap();
    let v = shape.embedding_size;
    for i in reveal..reveal + 8 {
        let row = &probs[(p + i) * v..(p + i + 1) * v];
        let best = (0..v).max_by(|&a, &b| row[a].total_cmp(&row[b])).unwrap();
        println!("pos {i}: want {} p0 {:.3} p1 {:.3} best {} ({:.3})", ans.as_bytes()[i] as char, row[b'0' as usize], row[b'1' as usize], best, row[best]);
    }
}
