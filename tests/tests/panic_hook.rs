//! The library never replaces the process's panic hook: a panic it contains (the tokenizers
//! library panics on some malformed tokenizer sections) is silent, on any number of threads at
//! once, while the app's own panics still reach the app's hook. (Its own test binary: the hook
//! is process-wide, and no other test may set one meanwhile.)

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};

use llada_rt::text::Text;
use llada_rt::Model;

#[test]
fn contained_panics_are_silent_and_the_apps_hook_stays() {
    let dir = tempfile::tempdir().unwrap();
    let model = Model::open(&common::embedded(dir.path()), true).unwrap();
    let mut spec = model.header.tokenizer.clone();
    let at = spec.tokenizer_json.find("\"decoder\"").expect("the tokenizer has a decoder section");
    spec.tokenizer_json = format!("{}{}", &spec.tokenizer_json[..at], spec.tokenizer_json[at..].replacen("\"trim_offsets\": true", "\"trim_offsets\" true", 1));
    static SEEN: AtomicUsize = AtomicUsize::new(0);
    std::panic::set_hook(Box::new(|_| {
        SEEN.fetch_add(1, Ordering::SeqCst);
    }));
    std::thread::scope(|s| {
        let loads: Vec<_> = (0..4).map(|_| s.spawn(|| Text::new(&spec, &model.header.special).err().map(|e| e.to_string()))).collect();
        for l in loads {
            let err = l.join().unwrap().expect("a malformed tokenizer is refused");
            assert!(err.contains("malformed"), "{err}");
        }
    });
    assert!(std::thread::spawn(|| panic!("the app's own")).join().is_err());
    assert_eq!(SEEN.load(Ordering::SeqCst), 1, "the app's hook saw its own panic and none of the contained ones");
    let _ = std::panic::take_hook();
}
