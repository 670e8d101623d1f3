//! `include/llada.h` is what cbindgen generates from the crate now: a change to the exported
//! functions or types without a regenerated header fails here. `LLADA_BLESS=1` rewrites it.

use std::path::PathBuf;

#[test]
fn header_is_current() {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let config = cbindgen::Config::from_file(dir.join("cbindgen.toml")).expect("cbindgen.toml parses");
    let bindings = cbindgen::Builder::new()
        .with_config(config)
        .with_src(dir.join("src/lib.rs"))
        .generate()
        .expect("cbindgen reads the crate");
    let mut generated = Vec::new();
    bindings.write(&mut generated);
    let path = dir.join("include/llada.h");
    if std::env::var_os("LLADA_BLESS").is_some() {
        std::fs::write(&path, &generated).unwrap();
    }
    let checked_in = std::fs::read(&path).unwrap_or_default();
    assert!(
        checked_in == generated,
        "{} is not what cbindgen generates from src/; regenerate it with `LLADA_BLESS=1 cargo test -p llada-capi --test header`",
        path.display()
    );
}
