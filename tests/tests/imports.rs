//! The library's import structure stays one-way: no two source files of a crate import each
//! other, nor does any longer loop of files. Each crate's `src` tree is read as Rust source
//! (comments and literals skipped), its module tree followed from `lib.rs`, `main.rs` and
//! `bin/*.rs` through `mod` declarations, and every path a file names (`use` trees, `crate::`,
//! `super::` and `self::` paths, and paths that start at a name a `use` or a `mod` bound)
//! resolved to the file whose module defines the item, following `use` and `pub use`
//! re-exports on the way (so `super::X` that the parent re-exports from a sibling counts as
//! the sibling).
//!
//! Not counted: a module reaching its ancestors (`super::` and `crate::` items of `lib.rs` or
//! a `mod.rs`) or an ancestor reaching its descendants, which is how Rust modules nest; and
//! code under `#[cfg(test)]` (unit tests and the test fixtures they share), which is not part
//! of the library and may test it from above. A glob import (`use x::*`) counts as importing
//! `x`; the bare names it brings in are not followed further.
//!
//! Run: `cargo test --release -p llada-e2e --test imports`. Standard library only; it reads
//! about a hundred files in a fraction of a second.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::path::{Path, PathBuf};

/// The crates whose `src` trees are checked.
const CRATES: &[&str] = &["ir", "chat-template", "targets", "compiler", "runtime", "rt-tools", "serve", "cli", "tools", "capi", "python"];

#[test]
fn no_files_import_each_other() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
    let mut cycles = Vec::new();
    let mut files_seen = 0;
    for krate in CRATES {
        let graph = Crate::read(&root.join(krate).join("src"));
        files_seen += graph.files.len();
        cycles.extend(graph.cycles(root));
    }
    assert!(files_seen > 50, "only {files_seen} source files found under {}", root.display());
    assert!(cycles.is_empty(), "the import structure is not one-way:\n  {}", cycles.join("\n  "));
}

/// The runtime's model loader stays below what runs it: it imports no kernel, executor,
/// session or sampler.
#[test]
fn the_runtime_model_imports_nothing_above_it() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
    let graph = Crate::read(&root.join("runtime/src"));
    let model = root.join("runtime/src/model.rs");
    let above = ["runtime/src/kernels/", "runtime/src/executor/", "runtime/src/moe/", "runtime/src/sampler/", "runtime/src/session.rs", "runtime/src/staging.rs"];
    let wrong: Vec<String> = graph
        .imports()
        .into_iter()
        .filter(|((from, to), _)| *from == model && above.iter().any(|a| rel(root, to).starts_with(a)))
        .map(|((_, to), line)| format!("runtime/src/model.rs:{line} imports {}", rel(root, &to)))
        .collect();
    assert!(graph.files.contains_key(&model), "runtime/src/model.rs not found");
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

/// The checker itself, on small crates written to a temporary folder.
#[test]
fn the_checker_finds_cycles_through_uses_paths_and_re_exports() {
    let dir = std::env::temp_dir().join(format!("llada-imports-{}", std::process::id()));
    let check = |files: &[(&str, &str)]| -> Vec<String> {
        let _ = std::fs::remove_dir_all(&dir);
        for (path, text) in files {
            let p = dir.join(path);
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(p, text).unwrap();
        }
        let graph = Crate::read(&dir);
        // Without the places named.
        graph.cycles(&dir).into_iter().map(|m| m.split(" (").next().unwrap().to_string()).collect()
    };
    let pair = |a: &str, b: &str| vec![format!("{a} and {b} import each other")];
    // `use crate::` both ways.
    assert_eq!(check(&[("lib.rs", "mod a; mod b;"), ("a.rs", "use crate::b::B; pub struct A;"), ("b.rs", "use crate::a::A; pub struct B;")]), pair("a.rs", "b.rs"));
    // A path in code one way, through a name bound by `use` the other; `super::` between siblings.
    assert_eq!(
        check(&[
            ("lib.rs", "pub mod k;"),
            ("k/mod.rs", "mod a; mod b;"),
            ("k/a.rs", "fn f() { let _ = super::b::g(); }"),
            ("k/b.rs", "use super::a; pub fn g() { a::h() }"),
        ]),
        pair("k/a.rs", "k/b.rs")
    );
    // Through a re-export in the parent, and a nested use tree.
    assert_eq!(
        check(&[
            ("lib.rs", "mod a; mod b; pub use b::B;"),
            ("a.rs", "use crate::{B, other::{x, y}}; pub struct A;"),
            ("b.rs", "fn f(_: crate::a::A) {} pub struct B;"),
        ]),
        pair("a.rs", "b.rs")
    );
    // A longer loop.
    assert_eq!(
        check(&[("lib.rs", "mod a; mod b; mod c;"), ("a.rs", "use crate::b::B; pub struct A;"), ("b.rs", "use crate::c::C; pub struct B;"), ("c.rs", "use crate::a::A; pub struct C;")]),
        vec!["a.rs -> b.rs -> c.rs -> a.rs import each other in a loop".to_string()]
    );
    // Not cycles: children using their parent, the parent using its children, one-way siblings,
    // `super::*` in a test module (its own file), code under `#[cfg(test)]`, comments, strings
    // and other crates' paths.
    assert_eq!(
        check(&[
            ("lib.rs", "pub mod k; pub struct Root; fn f() { k::a::g() } #[cfg(test)] mod testing;"),
            ("testing.rs", "use crate::k::a::g;"),
            ("k/mod.rs", "pub mod a; mod b; pub struct K; fn f() { a::g(); b::h() }"),
            ("k/a.rs", "use super::K; use crate::Root; pub fn g() { super::b::h() } #[cfg(test)] mod tests { use super::*; use crate::testing; }"),
            ("k/b.rs", "// use super::a::g;\npub fn h() { let _ = \"crate::k::a::g\"; let _ = other::k::a::g; let _ = '\"'; }\n#[cfg(test)]\nfn t() { crate::k::a::g() }"),
        ]),
        Vec::<String>::new()
    );
    let _ = std::fs::remove_dir_all(&dir);
}

fn rel(root: &Path, p: &Path) -> String {
    p.strip_prefix(root).unwrap_or(p).to_string_lossy().replace('\\', "/")
}

/// A module's absolute path within its crate tree: the tree (one per root file) and the names.
type ModPath = (usize, Vec<String>);

#[derive(Default)]
struct Module {
    file: PathBuf,
    children: BTreeSet<String>,
    /// Names bound by `use` (the alias or last segment) to the path as written.
    uses: BTreeMap<String, Vec<String>>,
    /// Targets of glob imports, as written.
    globs: Vec<Vec<String>>,
    /// Names of items defined here (functions, types, constants, macros...).
    items: BTreeSet<String>,
}

/// Where a file names a path: its tokens, the module it is written in, and the line.
struct PathUse {
    module: ModPath,
    segments: Vec<String>,
    line: usize,
}

struct Crate {
    modules: BTreeMap<ModPath, Module>,
    /// Each file's own module (its outermost one).
    files: BTreeMap<PathBuf, ModPath>,
    paths: Vec<(PathBuf, PathUse)>,
}

impl Crate {
    fn read(src: &Path) -> Crate {
        let mut krate = Crate { modules: BTreeMap::new(), files: BTreeMap::new(), paths: Vec::new() };
        let mut roots = vec![src.join("lib.rs"), src.join("main.rs")];
        if let Ok(dir) = std::fs::read_dir(src.join("bin")) {
            let mut bins: Vec<_> = dir.flatten().map(|e| e.path()).filter(|p| p.extension().is_some_and(|e| e == "rs")).collect();
            bins.sort();
            roots.extend(bins);
        }
        for (tree, file) in roots.into_iter().filter(|p| p.is_file()).enumerate() {
            krate.read_file(&file, (tree, Vec::new()), true);
        }
        krate
    }

    /// Reads `file` as the module `path`; `owns_dir` when its children live beside it
    /// (`lib.rs`, `main.rs`, `mod.rs`, a `bin/` root) rather than in a folder named after it.
    fn read_file(&mut self, file: &Path, path: ModPath, owns_dir: bool) {
        let Ok(text) = std::fs::read_to_string(file) else { return };
        let dir = if owns_dir {
            file.parent().unwrap().to_path_buf()
        } else {
            file.parent().unwrap().join(file.file_stem().unwrap())
        };
        self.files.insert(file.to_path_buf(), path.clone());
        let tokens = lex(&text);
        let mut file_children = Vec::new();
        // Inline modules open at brace depths; `stack` holds (module path, depth it closes at).
        let mut stack: Vec<(ModPath, usize)> = vec![(path.clone(), 0)];
        self.modules.entry(path.clone()).or_default().file = file.to_path_buf();
        let mut depth = 0usize;
        let mut i = 0;
        while i < tokens.len() {
            let current = stack.last().unwrap().0.clone();
            let (tok, line) = (&tokens[i].0, tokens[i].1);
            if is_cfg_test(&tokens, i) {
                i = skip_item(&tokens, i);
                continue;
            }
            match tok.as_str() {
                "{" => depth += 1,
                "}" => {
                    depth = depth.saturating_sub(1);
                    if stack.len() > 1 && stack.last().unwrap().1 == depth {
                        stack.pop();
                    }
                }
                "mod" if is_ident(tok_at(&tokens, i + 1)) => {
                    let name = tok_at(&tokens, i + 1).to_string();
                    self.modules.get_mut(&current).unwrap().children.insert(name.clone());
                    let mut child = current.clone();
                    child.1.push(name.clone());
                    if tok_at(&tokens, i + 2) == ";" {
                        // A file module; inline modules' file children would nest further, not
                        // used here, so they resolve relative to the file's own folder.
                        file_children.push((name, child));
                    } else if tok_at(&tokens, i + 2) == "{" {
                        self.modules.entry(child.clone()).or_default().file = file.to_path_buf();
                        stack.push((child, depth));
                        depth += 1;
                        i += 3;
                        continue;
                    }
                }
                "use" if i == 0 || tokens[i - 1].0 != "::" => {
                    let mut j = i + 1;
                    let mut leaves = Vec::new();
                    parse_use_tree(&tokens, &mut j, Vec::new(), &mut leaves);
                    let module = self.modules.get_mut(&current).unwrap();
                    for leaf in leaves {
                        match leaf {
                            UseLeaf::Name(name, segments) => {
                                if name != "_" {
                                    module.uses.insert(name, segments.clone());
                                }
                                self.paths.push((file.to_path_buf(), PathUse { module: current.clone(), segments, line }));
                            }
                            UseLeaf::Glob(segments) => {
                                module.globs.push(segments.clone());
                                self.paths.push((file.to_path_buf(), PathUse { module: current.clone(), segments, line }));
                            }
                        }
                    }
                    i = j;
                    continue;
                }
                "fn" | "struct" | "enum" | "trait" | "type" | "const" | "static" | "union" if is_ident(tok_at(&tokens, i + 1)) => {
                    let name = tok_at(&tokens, i + 1).to_string();
                    self.modules.get_mut(&current).unwrap().items.insert(name);
                }
                "macro_rules" if tok_at(&tokens, i + 1) == "!" => {
                    let name = tok_at(&tokens, i + 2).to_string();
                    self.modules.get_mut(&current).unwrap().items.insert(name);
                }
                _ if is_ident(tok) && (i == 0 || tokens[i - 1].0 != "::") && tok_at(&tokens, i + 1) == "::" => {
                    // A path in code: kept whole; whether its first segment means anything here
                    // is decided once every module's names are known.
                    let mut segments = vec![tok.clone()];
                    let mut j = i + 1;
                    while tok_at(&tokens, j) == "::" && is_ident(tok_at(&tokens, j + 1)) {
                        segments.push(tokens[j + 1].0.clone());
                        j += 2;
                    }
                    self.paths.push((file.to_path_buf(), PathUse { module: current.clone(), segments, line }));
                    i = j;
                    continue;
                }
                _ => {}
            }
            i += 1;
        }
        for (name, child) in file_children {
            let flat = dir.join(format!("{name}.rs"));
            let nested = dir.join(&name).join("mod.rs");
            if flat.is_file() {
                self.read_file(&flat, child, false);
            } else if nested.is_file() {
                self.read_file(&nested, child, true);
            }
        }
    }

    /// `segments` as written in `module`, made absolute; `None` for other crates' paths.
    fn absolute(&self, module: &ModPath, segments: &[String], depth: usize) -> Option<ModPath> {
        let first = segments.first()?;
        let (tree, mut path) = module.clone();
        let mut rest = segments;
        match first.as_str() {
            "crate" | "$crate" => {
                path.clear();
                rest = &rest[1..];
            }
            "self" => rest = &rest[1..],
            "super" => {
                while rest.first().is_some_and(|s| s == "super") {
                    path.pop()?;
                    rest = &rest[1..];
                }
            }
            _ => {
                let m = self.modules.get(module)?;
                if m.children.contains(first) || m.items.contains(first) {
                } else if let Some(bound) = m.uses.get(first) {
                    if depth > 16 || bound.as_slice() == segments {
                        return None;
                    }
                    let mut full = self.absolute(module, bound, depth + 1)?;
                    full.1.extend(rest[1..].iter().cloned());
                    return Some(full);
                } else {
                    return None;
                }
            }
        }
        path.extend(rest.iter().cloned());
        Some((tree, path))
    }

    /// The module whose file defines what the absolute path `target` names.
    fn resolve(&self, target: &ModPath, depth: usize) -> Option<ModPath> {
        let mut module: ModPath = (target.0, Vec::new());
        for (k, name) in target.1.iter().enumerate() {
            let m = self.modules.get(&module)?;
            if m.children.contains(name) {
                module.1.push(name.clone());
                continue;
            }
            if depth < 16 && !m.items.contains(name) {
                if let Some(bound) = m.uses.get(name) {
                    let mut full = self.absolute(&module, bound, depth + 1)?;
                    full.1.extend(target.1[k + 1..].iter().cloned());
                    return self.resolve(&full, depth + 1);
                }
                for glob in &m.globs {
                    let Some(g) = self.absolute(&module, glob, depth + 1) else { continue };
                    let Some(gm) = self.resolve(&g, depth + 1) else { continue };
                    let found = self.modules.get(&gm).is_some_and(|x| x.items.contains(name) || x.children.contains(name) || x.uses.contains_key(name));
                    if found && gm != module {
                        let mut full = gm;
                        full.1.extend(target.1[k..].iter().cloned());
                        return self.resolve(&full, depth + 1);
                    }
                }
            }
            break;
        }
        Some(module)
    }

    /// Which files each file imports, with the first line each import is made on.
    fn imports(&self) -> BTreeMap<(PathBuf, PathBuf), usize> {
        let mut edges = BTreeMap::new();
        for (file, p) in &self.paths {
            let Some(abs) = self.absolute(&p.module, &p.segments, 0) else { continue };
            let Some(target) = self.resolve(&abs, 0) else { continue };
            let to = &self.modules[&target].file;
            if to != file {
                let line = edges.entry((file.clone(), to.clone())).or_insert(p.line);
                *line = (*line).min(p.line);
            }
        }
        edges
    }

    /// What keeps the import structure from being one-way, leaving out imports between a
    /// module and its ancestors: each pair of files importing each other
    /// (with a place each import is made), then, where files reach each other only through a
    /// longer loop, one such loop.
    fn cycles(&self, root: &Path) -> Vec<String> {
        let mut edges = self.imports();
        edges.retain(|(a, b), _| {
            let (ma, mb) = (&self.files[a], &self.files[b]);
            let nested = ma.0 == mb.0 && (ma.1.starts_with(&mb.1) || mb.1.starts_with(&ma.1));
            !nested
        });
        let mut out = Vec::new();
        for ((a, b), at_a) in &edges {
            if let Some(at_b) = edges.get(&(b.clone(), a.clone())).filter(|_| a < b) {
                let (a, b) = (rel(root, a), rel(root, b));
                out.push(format!("{a} and {b} import each other ({a}:{at_a}, {b}:{at_b})"));
            }
        }
        let mut next: BTreeMap<&PathBuf, Vec<&PathBuf>> = BTreeMap::new();
        for (a, b) in edges.keys() {
            next.entry(a).or_default().push(b);
        }
        // For each file, the shortest loop back to it; reported once, from its first file, for
        // loops of three or more files not already named by a pair.
        let mut reported: BTreeSet<Vec<&PathBuf>> = BTreeSet::new();
        for &start in next.keys() {
            let mut from: BTreeMap<&PathBuf, &PathBuf> = BTreeMap::new();
            let mut queue = VecDeque::from([start]);
            let mut found = None;
            while let Some(f) = queue.pop_front() {
                for &t in next.get(f).into_iter().flatten() {
                    if t == start {
                        found = Some(f);
                        break;
                    }
                    if !from.contains_key(t) {
                        from.insert(t, f);
                        queue.push_back(t);
                    }
                }
                if found.is_some() {
                    break;
                }
            }
            let Some(mut last) = found else { continue };
            let mut lp = vec![last];
            while last != start {
                last = from[last];
                lp.push(last);
            }
            lp.reverse();
            let mut key = lp.clone();
            key.sort();
            if lp.len() >= 3 && reported.insert(key) {
                let names: Vec<String> = lp.iter().chain([&start]).map(|f| rel(root, f)).collect();
                out.push(format!("{} import each other in a loop", names.join(" -> ")));
            }
        }
        out
    }
}

enum UseLeaf {
    Name(String, Vec<String>),
    Glob(Vec<String>),
}

/// Parses a use tree at `tokens[*j]` (after `use`, or inside braces), up to and past the `;`,
/// `,` or before the `}` that ends it.
fn parse_use_tree(tokens: &[(String, usize)], j: &mut usize, mut prefix: Vec<String>, leaves: &mut Vec<UseLeaf>) {
    if tok_at(tokens, *j) == "::" {
        // `use ::other_crate::...`
        prefix.push("::".into());
        *j += 1;
    }
    loop {
        let t = tok_at(tokens, *j).to_string();
        match t.as_str() {
            "{" => {
                *j += 1;
                while !matches!(tok_at(tokens, *j), "}" | "") {
                    parse_use_tree(tokens, j, prefix.clone(), leaves);
                    if tok_at(tokens, *j) == "," {
                        *j += 1;
                    }
                }
                *j += 1;
                break;
            }
            "*" => {
                *j += 1;
                leaves.push(UseLeaf::Glob(prefix));
                break;
            }
            _ if is_ident(&t) => {
                *j += 1;
                if tok_at(tokens, *j) == "::" {
                    prefix.push(t);
                    *j += 1;
                    continue;
                }
                let mut name = if t == "self" { prefix.last().cloned().unwrap_or_default() } else { t.clone() };
                if t != "self" {
                    prefix.push(t);
                }
                if tok_at(tokens, *j) == "as" {
                    name = tok_at(tokens, *j + 1).to_string();
                    *j += 2;
                }
                if prefix.first().is_some_and(|s| s != "::") {
                    leaves.push(UseLeaf::Name(name, prefix));
                }
                break;
            }
            _ => break,
        }
    }
    if tok_at(tokens, *j) == ";" {
        *j += 1;
    }
}

/// Whether `#[cfg(test)]` starts at `tokens[i]`.
fn is_cfg_test(tokens: &[(String, usize)], i: usize) -> bool {
    ["#", "[", "cfg", "(", "test", ")", "]"].iter().enumerate().all(|(k, t)| tok_at(tokens, i + k) == *t)
}

/// The index past the item whose attributes start at `tokens[i]`: past its `;`, or past the
/// `}` of its first top-level braces.
fn skip_item(tokens: &[(String, usize)], mut i: usize) -> usize {
    let mut nest = 0usize;
    while i < tokens.len() {
        let t = tok_at(tokens, i);
        i += 1;
        match t {
            "(" | "[" => nest += 1,
            ")" | "]" => nest = nest.saturating_sub(1),
            "{" => nest += 1,
            "}" => {
                nest = nest.saturating_sub(1);
                if nest == 0 {
                    return i;
                }
            }
            ";" if nest == 0 => return i,
            _ => {}
        }
    }
    i
}

fn tok_at(tokens: &[(String, usize)], i: usize) -> &str {
    tokens.get(i).map_or("", |t| t.0.as_str())
}

fn is_ident(t: &str) -> bool {
    t.starts_with(|c: char| c.is_alphabetic() || c == '_' || c == '$')
}

/// Rust source as identifiers, `::` and single punctuation characters, each with its line;
/// comments, string, character and number literals and lifetimes are left out.
fn lex(text: &str) -> Vec<(String, usize)> {
    let c: Vec<char> = text.chars().collect();
    let mut out = Vec::new();
    let (mut i, mut line) = (0, 1);
    let at = |k: usize| c.get(k).copied().unwrap_or('\0');
    while i < c.len() {
        let ch = c[i];
        if ch == '\n' {
            line += 1;
            i += 1;
        } else if ch.is_whitespace() {
            i += 1;
        } else if ch == '/' && at(i + 1) == '/' {
            while i < c.len() && c[i] != '\n' {
                i += 1;
            }
        } else if ch == '/' && at(i + 1) == '*' {
            let mut nest = 0;
            while i < c.len() {
                if c[i] == '/' && at(i + 1) == '*' {
                    nest += 1;
                    i += 2;
                } else if c[i] == '*' && at(i + 1) == '/' {
                    nest -= 1;
                    i += 2;
                    if nest == 0 {
                        break;
                    }
                } else {
                    line += usize::from(c[i] == '\n');
                    i += 1;
                }
            }
        } else if ch == '"' || (matches!(ch, 'r' | 'b' | 'c') && starts_string(&c, i)) {
            // Prefixes (b, c, r, br, cr), then `#`s for raw strings.
            let mut raw = false;
            while c[i] != '"' && c[i] != '#' {
                raw |= c[i] == 'r';
                i += 1;
            }
            let mut hashes = 0;
            while c[i] == '#' {
                hashes += 1;
                i += 1;
            }
            i += 1;
            while i < c.len() {
                if c[i] == '\n' {
                    line += 1;
                }
                if !raw && c[i] == '\\' {
                    line += usize::from(at(i + 1) == '\n');
                    i += 2;
                    continue;
                }
                if c[i] == '"' && (0..hashes).all(|h| at(i + 1 + h) == '#') {
                    i += 1 + hashes;
                    break;
                }
                i += 1;
            }
        } else if ch == '\'' || (ch == 'b' && at(i + 1) == '\'') {
            if ch == 'b' {
                i += 1;
            }
            if at(i + 1) == '\\' {
                // An escaped character: past the escape, to the closing quote.
                i += 3;
                while i < c.len() && c[i] != '\'' {
                    i += 1;
                }
                i += 1;
            } else if at(i + 2) == '\'' {
                i += 3;
            } else {
                // A lifetime or label.
                i += 1;
                while i < c.len() && (c[i].is_alphanumeric() || c[i] == '_') {
                    i += 1;
                }
            }
        } else if ch.is_ascii_digit() {
            while i < c.len() && (c[i].is_alphanumeric() || c[i] == '_' || (c[i] == '.' && at(i + 1).is_ascii_digit())) {
                i += 1;
            }
        } else if ch.is_alphabetic() || ch == '_' || (ch == '$' && (at(i + 1).is_alphabetic() || at(i + 1) == '_')) {
            let start = i;
            i += 1;
            while i < c.len() && (c[i].is_alphanumeric() || c[i] == '_') {
                i += 1;
            }
            let mut word: String = c[start..i].iter().collect();
            if word == "r" && at(i) == '#' && (at(i + 1).is_alphabetic() || at(i + 1) == '_') {
                // A raw identifier.
                let s = i + 1;
                i += 1;
                while i < c.len() && (c[i].is_alphanumeric() || c[i] == '_') {
                    i += 1;
                }
                word = c[s..i].iter().collect();
            }
            out.push((word, line));
        } else if ch == ':' && at(i + 1) == ':' {
            out.push(("::".into(), line));
            i += 2;
        } else {
            out.push((ch.to_string(), line));
            i += 1;
        }
    }
    out
}

/// Whether a string literal with a prefix (`b"`, `r"`, `r#"`, `br"`, `c"`, `cr#"`...) starts at
/// `i`, rather than an identifier.
fn starts_string(c: &[char], i: usize) -> bool {
    if i > 0 && (c[i - 1].is_alphanumeric() || c[i - 1] == '_') {
        return false;
    }
    let mut k = i;
    let mut raw = false;
    while k < c.len() && matches!(c[k], 'b' | 'c' | 'r') && k - i < 2 {
        raw |= c[k] == 'r';
        k += 1;
    }
    if raw {
        while k < c.len() && c[k] == '#' {
            k += 1;
        }
    }
    k > i && c.get(k) == Some(&'"')
}
