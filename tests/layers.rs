//! The crate's modules stand in layers, stated once in the crate doc of `src/lib.rs`: a
//! module imports only from its own layer or the layers below, and no two top-level
//! modules reach each other. This test reads the layer list from that doc, follows the
//! `mod` declarations from `src/lib.rs` (leaving out `#[cfg(test)]` modules and items:
//! a test may drive its module through the layers above), and fails on any
//! `crate::` path that points up and on any import cycle between top-level modules.
//! It also keeps Kubernetes API calls in one layer: outside `k8s`, code may hold a
//! client, name objects and watch them, but writes, events, deadlines and the reading
//! of API errors go through `crate::k8s` (see `every_api_write_event_and_deadline_goes_through_k8s`);
//! it checks lib.rs's "lower modules never see gRPC types" (`lower_modules_never_see_grpc_types`),
//! and that every module and its unit tests are where the compiler looks, without `#[path]`.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};

fn src() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

/// The numbered list in lib.rs's crate doc, top layer first: `//! 3. `a`, `b`: why`.
/// Returns module -> rank (0 is the top).
fn stated_layers(lib: &str) -> BTreeMap<String, usize> {
    let mut layers = BTreeMap::new();
    for line in lib.lines().filter_map(|l| l.strip_prefix("//!")) {
        let line = line.trim_start();
        let Some((number, rest)) = line.split_once(". ") else {
            continue;
        };
        let Ok(rank) = number.parse::<usize>() else {
            continue;
        };
        let names = rest.split(':').next().unwrap_or("");
        for name in names.split(',') {
            let name = name.trim().trim_matches('`');
            assert!(
                !name.is_empty()
                    && name
                        .bytes()
                        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_'),
                "lib.rs layer {rank}: {name:?} is not a module name"
            );
            let before = layers.insert(name.to_string(), rank);
            assert!(before.is_none(), "lib.rs names {name} in two layers");
        }
    }
    layers
}

/// Source with comments and string/char literals blanked out, so that only code remains.
fn code_only(text: &str) -> String {
    let chars: Vec<char> = text.chars().collect();
    let mut out = String::with_capacity(text.len());
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        let next = chars.get(i + 1).copied();
        if c == '/' && next == Some('/') {
            while i < chars.len() && chars[i] != '\n' {
                i += 1;
            }
        } else if c == '/' && next == Some('*') {
            let mut depth = 0;
            while i < chars.len() {
                if chars[i] == '/' && chars.get(i + 1) == Some(&'*') {
                    depth += 1;
                    i += 2;
                } else if chars[i] == '*' && chars.get(i + 1) == Some(&'/') {
                    depth -= 1;
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    i += 1;
                }
            }
            out.push(' ');
        } else if c == 'r' && (next == Some('"') || next == Some('#')) && !ident_char_before(&chars, i) {
            // A raw string: r"..." or r#"..."#.
            let mut j = i + 1;
            let mut hashes = 0;
            while chars.get(j) == Some(&'#') {
                hashes += 1;
                j += 1;
            }
            if chars.get(j) != Some(&'"') {
                out.push(c);
                i += 1;
                continue;
            }
            j += 1;
            loop {
                if j >= chars.len() {
                    break;
                }
                if chars[j] == '"' && (0..hashes).all(|k| chars.get(j + 1 + k) == Some(&'#')) {
                    j += 1 + hashes;
                    break;
                }
                j += 1;
            }
            out.push_str("\"\"");
            i = j;
        } else if c == '"' && out.ends_with("#[path = ") {
            // A module's file name: kept, the reader needs it.
            let end = text_index_after_string(&chars, i);
            out.extend(&chars[i..end]);
            i = end;
        } else if c == '"' {
            i += 1;
            while i < chars.len() && chars[i] != '"' {
                i += if chars[i] == '\\' { 2 } else { 1 };
            }
            i += 1;
            out.push_str("\"\"");
        } else if c == '\'' {
            // A char literal ('x', '\n', '{') or a lifetime ('a).
            if next == Some('\\') {
                i += 2;
                while i < chars.len() && chars[i] != '\'' {
                    i += 1;
                }
                i += 1;
                out.push_str("' '");
            } else if chars.get(i + 2) == Some(&'\'') {
                i += 3;
                out.push_str("' '");
            } else {
                out.push(c);
                i += 1;
            }
        } else {
            out.push(c);
            i += 1;
        }
    }
    out
}

fn text_index_after_string(chars: &[char], open: usize) -> usize {
    let mut i = open + 1;
    while i < chars.len() && chars[i] != '"' {
        i += if chars[i] == '\\' { 2 } else { 1 };
    }
    i + 1
}

fn ident_char_before(chars: &[char], i: usize) -> bool {
    i > 0 && (chars[i - 1].is_alphanumeric() || chars[i - 1] == '_')
}

/// The code with every `#[cfg(test)]` item (a module, a `use`, a function) removed.
fn without_test_items(code: &str) -> String {
    let mut out = String::new();
    let mut rest = code;
    while let Some(at) = rest.find("#[cfg(test)]") {
        out.push_str(&rest[..at]);
        let item = &rest[at..];
        let (semi, brace) = (item.find(';'), item.find('{'));
        let end = match (semi, brace) {
            (Some(s), Some(b)) if s < b => s + 1,
            (Some(s), None) => s + 1,
            (_, Some(b)) => {
                let mut depth = 0;
                let mut end = item.len();
                for (k, ch) in item[b..].char_indices() {
                    match ch {
                        '{' => depth += 1,
                        '}' => {
                            depth -= 1;
                            if depth == 0 {
                                end = b + k + 1;
                                break;
                            }
                        }
                        _ => {}
                    }
                }
                end
            }
            (None, None) => item.len(),
        };
        rest = &item[end..];
    }
    out.push_str(rest);
    out
}

/// `mod name;` declarations (with their `#[path]`, if any) left in non-test code.
fn child_modules(code: &str) -> Vec<(String, Option<String>)> {
    let mut children = Vec::new();
    let mut path_attr = None;
    for line in code.lines().map(str::trim) {
        if let Some(p) = line.strip_prefix("#[path = ") {
            path_attr = Some(p.trim_end_matches(']').trim().trim_matches('"').to_string());
            continue;
        }
        let decl = line
            .strip_prefix("pub mod ")
            .or_else(|| line.strip_prefix("pub(crate) mod "))
            .or_else(|| line.strip_prefix("mod "));
        if let Some(name) = decl.and_then(|d| d.strip_suffix(';')) {
            children.push((name.trim().to_string(), path_attr.take()));
        } else if !line.starts_with("#[") {
            path_attr = None;
        }
    }
    children
}

/// Non-test source files, each with its top-level module, following `mod` from lib.rs.
fn crate_files() -> Vec<(String, PathBuf, String)> {
    let root = src();
    let mut files = Vec::new();
    // (file, top-level module, directory its children live in)
    let lib = root.join("lib.rs");
    let mut queue: Vec<(PathBuf, Option<String>, PathBuf)> = vec![(lib, None, root.clone())];
    while let Some((file, top, child_dir)) = queue.pop() {
        let text = fs::read_to_string(&file).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
        let code = without_test_items(&code_only(&text));
        for (name, path_attr) in child_modules(&code) {
            let child = match path_attr {
                Some(p) => file.parent().unwrap().join(p),
                None if child_dir.join(format!("{name}.rs")).exists() => child_dir.join(format!("{name}.rs")),
                None => child_dir.join(&name).join("mod.rs"),
            };
            assert!(
                child.exists(),
                "{}: mod {name}: no file {}",
                file.display(),
                child.display()
            );
            let grandchildren = if child.file_name().unwrap() == "mod.rs" {
                child.parent().unwrap().to_path_buf()
            } else {
                child.with_extension("")
            };
            queue.push((
                child,
                Some(top.clone().unwrap_or_else(|| name.clone())),
                grandchildren,
            ));
        }
        if let Some(top) = top {
            files.push((top, file, code));
        }
    }
    files
}

/// Top-level modules a piece of code names through `crate::`.
fn crate_paths(code: &str) -> BTreeSet<String> {
    paths_after(code, "crate::")
}

/// The first segment of every path that starts with `prefix` (`crate::`, `super::`,
/// `crate::k8s::`): what such paths name one level below the prefix.
fn paths_after(code: &str, prefix: &str) -> BTreeSet<String> {
    let mut named = BTreeSet::new();
    for (at, _) in code.match_indices(prefix) {
        if at > 0 {
            let before = code[..at].chars().next_back().unwrap();
            if before.is_alphanumeric() || before == '_' || before == ':' {
                continue; // `localvol_crate::`, the second `super::` of `super::super::`
            }
        }
        let rest = &code[at + prefix.len()..];
        if let Some(group) = rest.strip_prefix('{') {
            // `crate::{a::b, c}`: the first segment of each top-level entry.
            let mut depth = 0;
            let mut entry_start = true;
            for (k, ch) in group.char_indices() {
                match ch {
                    '{' => depth += 1,
                    '}' if depth == 0 => break,
                    '}' => depth -= 1,
                    ',' if depth == 0 => entry_start = true,
                    c if entry_start && (c.is_alphanumeric() || c == '_') => {
                        let ident: String = group[k..]
                            .chars()
                            .take_while(|c| c.is_alphanumeric() || *c == '_')
                            .collect();
                        named.insert(ident);
                        entry_start = false;
                    }
                    _ => {}
                }
            }
        } else if rest.starts_with('*') {
            named.insert("*".to_string());
        } else {
            let ident: String = rest
                .chars()
                .take_while(|c| c.is_alphanumeric() || *c == '_')
                .collect();
            named.insert(ident);
        }
    }
    named
}

/// Every import edge between top-level modules: (from, to) -> files that make it.
fn edges() -> BTreeMap<(String, String), BTreeSet<PathBuf>> {
    let mut edges: BTreeMap<(String, String), BTreeSet<PathBuf>> = BTreeMap::new();
    for (top, file, code) in crate_files() {
        for to in crate_paths(&code) {
            if to != top && to != "self" {
                edges.entry((top.clone(), to)).or_default().insert(file.clone());
            }
        }
    }
    edges
}

fn upward(
    edges: &BTreeMap<(String, String), BTreeSet<PathBuf>>,
    layers: &BTreeMap<String, usize>,
) -> Vec<String> {
    let rank = |m: &str| {
        *layers
            .get(m)
            .unwrap_or_else(|| panic!("module {m} is in no layer of lib.rs"))
    };
    edges
        .iter()
        .filter(|((from, to), _)| rank(to) < rank(from))
        .map(|((from, to), files)| {
            let files: Vec<_> = files
                .iter()
                .map(|f| f.strip_prefix(src()).unwrap().display().to_string())
                .collect();
            format!(
                "{from} (layer {}) imports {to} (layer {}) in {}",
                rank(from),
                rank(to),
                files.join(", ")
            )
        })
        .collect()
}

/// Modules on some cycle of the import graph (strongly connected, more than one).
fn cycles(edges: &BTreeMap<(String, String), BTreeSet<PathBuf>>) -> Vec<BTreeSet<String>> {
    let mut graph: BTreeMap<&str, BTreeSet<&str>> = BTreeMap::new();
    for (from, to) in edges.keys() {
        graph.entry(from).or_default().insert(to);
        graph.entry(to).or_default();
    }
    let reaches = |start: &str| {
        let mut seen = BTreeSet::new();
        let mut stack = vec![start];
        while let Some(m) = stack.pop() {
            for &next in &graph[m] {
                if seen.insert(next) {
                    stack.push(next);
                }
            }
        }
        seen
    };
    let reach: BTreeMap<&str, BTreeSet<&str>> = graph.keys().map(|&m| (m, reaches(m))).collect();
    let mut found: Vec<BTreeSet<String>> = Vec::new();
    for (&m, reached) in &reach {
        if !reached.contains(m) {
            continue;
        }
        let component: BTreeSet<String> = reached
            .iter()
            .filter(|&&o| reach[o].contains(m))
            .map(|o| o.to_string())
            .collect();
        if !found.contains(&component) {
            found.push(component);
        }
    }
    found
}

#[test]
fn every_import_points_down_and_no_modules_import_each_other() {
    let lib = fs::read_to_string(src().join("lib.rs")).unwrap();
    let layers = stated_layers(&lib);
    assert!(layers.len() > 5, "lib.rs states no layer list: {layers:?}");
    let declared: BTreeSet<String> = child_modules(&code_only(&lib))
        .into_iter()
        .map(|(name, _)| name)
        .collect();
    let stated: BTreeSet<String> = layers.keys().cloned().collect();
    assert_eq!(
        declared, stated,
        "the modules of lib.rs and its layer list differ"
    );

    let edges = edges();
    assert!(
        edges.len() > 20,
        "too few imports found; is the reader broken? {edges:?}"
    );
    let up = upward(&edges, &layers);
    assert!(up.is_empty(), "imports that point up:\n{}", up.join("\n"));
    let cycles = cycles(&edges);
    assert!(cycles.is_empty(), "import cycles between modules: {cycles:?}");
}

/// Non-test source files with their module path (`crate::k8s::lookup`) and the path of
/// the module they are declared in, following `mod` from lib.rs as `crate_files` does.
fn module_tree() -> Vec<(String, String, PathBuf, String)> {
    let root = src();
    let mut out = Vec::new();
    let mut queue: Vec<(PathBuf, String, PathBuf)> = vec![(root.join("lib.rs"), "crate".to_string(), root)];
    while let Some((file, path, child_dir)) = queue.pop() {
        let text = fs::read_to_string(&file).unwrap();
        let code = without_test_items(&code_only(&text));
        for (name, _) in child_modules(&code) {
            let flat = child_dir.join(format!("{name}.rs"));
            let (child, grandchildren) = if flat.exists() {
                (flat, child_dir.join(&name))
            } else {
                (child_dir.join(&name).join("mod.rs"), child_dir.join(&name))
            };
            let child_path = format!("{path}::{name}");
            let child_text = fs::read_to_string(&child).unwrap();
            let child_code = without_test_items(&code_only(&child_text));
            out.push((child_path.clone(), path.clone(), child.clone(), child_code));
            queue.push((child, child_path, grandchildren));
        }
    }
    out
}

/// Inside a top-level module, imports point down too: a child module takes from its
/// parent (through `super::` or the parent's `crate::` path) only the parent's other
/// children, never an item the parent defines or re-imports. What children share lives
/// in the child that owns it, so a parent's `mod.rs` stays a root that declares, re-exports
/// and wires, and reading it never needs its children's view of it. Checked for the
/// modules that hold to it; a module joins the list once its up-arrows are gone.
const NO_UP_ARROWS_INSIDE: [&str; 1] = ["crate::k8s"];

#[test]
fn inside_a_module_children_import_only_their_siblings_from_their_parent() {
    let tree = module_tree();
    let children_of = |parent: &str| -> BTreeSet<String> {
        tree.iter()
            .filter(|(_, p, _, _)| p == parent)
            .map(|(path, _, _, _)| path.rsplit("::").next().unwrap().to_string())
            .collect()
    };
    let mut up = Vec::new();
    for (path, parent, file, code) in &tree {
        if !NO_UP_ARROWS_INSIDE
            .iter()
            .any(|m| path.starts_with(&format!("{m}::")))
        {
            continue;
        }
        let siblings = children_of(parent);
        let named: BTreeSet<String> = paths_after(code, "super::")
            .into_iter()
            .chain(paths_after(code, &format!("{parent}::")))
            .collect();
        for name in named {
            // `super::super::` reaches past the parent, to a module beside it.
            if name != "super" && !siblings.contains(&name) {
                up.push(format!(
                    "{}: {path} takes {name} from its parent {parent}",
                    file.strip_prefix(src()).unwrap().display()
                ));
            }
        }
    }
    assert!(
        tree.len() > 40,
        "too few modules found; is the reader broken? {}",
        tree.len()
    );
    assert!(
        up.is_empty(),
        "imports that point up inside a module (move the item into the child that owns it):\n{}",
        up.join("\n")
    );
}

/// `resize` decides (what a claim's status should show, whether a failure is terminal,
/// when to grow); `k8s::claim_resize` holds the API shapes it decides about. Below its
/// wiring (`resize/mod.rs`, which takes the daemon's client), no resize code names kube
/// or k8s-openapi.
#[test]
fn resize_decides_and_leaves_the_api_shapes_to_k8s() {
    let tree = module_tree();
    let resize: Vec<_> = tree
        .iter()
        .filter(|(path, _, _, _)| path.starts_with("crate::resize::"))
        .collect();
    assert!(resize.len() > 5, "too few resize modules found: {}", resize.len());
    let named: Vec<String> = resize
        .iter()
        .filter(|(_, _, _, code)| code.contains("kube::") || code.contains("k8s_openapi"))
        .map(|(_, _, file, _)| file.strip_prefix(src()).unwrap().display().to_string())
        .collect();
    assert!(
        named.is_empty(),
        "resize code that names kube or k8s-openapi (move the API shape into k8s::claim_resize):\n{}",
        named.join("\n")
    );
}

/// What only `src/k8s/` may name: the parameters of every write (field manager and
/// all), the event recorder, and the client's error (callers get `k8s::api::ApiError`).
const K8S_ONLY: [&str; 6] = [
    "kube::Error",
    "kube::runtime::events",
    "PatchParams",
    "PostParams",
    "DeleteParams",
    "Patch::",
];

/// The names in `code` that only `src/k8s/` may use; a file that talks to the API also
/// may not set its own deadline (`k8s::api::call` holds the one timeout).
fn k8s_only_names(code: &str) -> Vec<&'static str> {
    let mut found: Vec<&'static str> = K8S_ONLY.into_iter().filter(|n| code.contains(n)).collect();
    if code.contains("kube") && code.contains("tokio::time::timeout") {
        found.push("tokio::time::timeout");
    }
    found
}

/// "file: name, name" for each non-test file outside `allowed` top-level modules whose
/// code names something `names` finds.
fn names_outside(allowed: &[&str], names: impl Fn(&str) -> Vec<&'static str>) -> Vec<String> {
    crate_files()
        .into_iter()
        .filter(|(top, _, _)| !allowed.contains(&top.as_str()))
        .filter_map(|(_, file, code)| {
            let found = names(&code);
            (!found.is_empty()).then(|| {
                format!(
                    "{}: {}",
                    file.strip_prefix(src()).unwrap().display(),
                    found.join(", ")
                )
            })
        })
        .collect()
}

#[test]
fn every_api_write_event_and_deadline_goes_through_k8s() {
    let outside = names_outside(&["k8s"], k8s_only_names);
    assert!(
        outside.is_empty(),
        "Kubernetes API calls made outside src/k8s/ (use crate::k8s::api and crate::k8s::events):\n{}",
        outside.join("\n")
    );
}

/// gRPC types stay in the layers down to `error`'s (the command line, the wiring, the
/// gRPC edges, the one mapping of errors to statuses) and, below them, in the two
/// modules lib.rs names: `proto`, the generated code, and `request`, which turns its
/// messages into typed requests. "Lower modules never see gRPC types."
const GRPC_LOWEST_LAYER_MODULE: &str = "error";
const GRPC_BELOW_THE_EDGE: [&str; 2] = ["proto", "request"];

/// The modules that may name gRPC types, from lib.rs's layers; and lib.rs must state
/// the rule with its exceptions.
fn grpc_modules() -> Vec<String> {
    let lib = fs::read_to_string(src().join("lib.rs")).unwrap();
    let rule: String = lib
        .lines()
        .filter_map(|l| l.strip_prefix("//!"))
        .skip_while(|l| !l.contains("gRPC types ("))
        .take_while(|l| !l.trim().is_empty())
        .collect();
    let layers = stated_layers(&lib);
    let lowest = layers[GRPC_LOWEST_LAYER_MODULE];
    assert!(
        rule.contains(&format!("layers 1 to {lowest}")) && rule.contains("never see gRPC types"),
        "lib.rs no longer states that gRPC types stay in layers 1 to {lowest}: {rule:?}"
    );
    for module in GRPC_BELOW_THE_EDGE {
        assert!(
            rule.contains(&format!("`{module}`")),
            "lib.rs's gRPC rule does not name its exception {module}: {rule:?}"
        );
    }
    layers
        .into_iter()
        .filter(|(_, rank)| *rank <= lowest)
        .map(|(module, _)| module)
        .chain(GRPC_BELOW_THE_EDGE.map(String::from))
        .collect()
}

/// gRPC types named in `code`: tonic's, prost's, or the generated messages.
fn grpc_names(code: &str) -> Vec<&'static str> {
    ["tonic::", "prost::", "crate::proto"]
        .into_iter()
        .filter(|n| code.contains(n))
        .collect()
}

#[test]
fn lower_modules_never_see_grpc_types() {
    let allowed = grpc_modules();
    let allowed: Vec<&str> = allowed.iter().map(String::as_str).collect();
    let found = names_outside(&allowed, grpc_names);
    assert!(
        found.is_empty(),
        "gRPC types below the edges (convert at the edge, in csi/ or request.rs):\n{}",
        found.join("\n")
    );
}

/// Every `.rs` file under `src/`, test code included.
fn all_source_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            all_source_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// One way to place a module's unit tests and children: a module's unit tests are its
/// child module `tests`, inline or in the file the compiler looks in for a child
/// (`foo/tests.rs` beside `foo.rs`, `tests.rs` beside a `mod.rs`); a large one has
/// children of its own in `tests/`. No `#[path]` moves a module elsewhere, and no
/// `*_tests.rs` file stands beside its module.
#[test]
fn modules_and_their_tests_are_where_the_compiler_looks() {
    let mut files = Vec::new();
    all_source_files(&src(), &mut files);
    let misplaced: Vec<String> = files
        .iter()
        .filter_map(|file| {
            let text = fs::read_to_string(file).unwrap();
            let rel = file.strip_prefix(src()).unwrap().display();
            if file.file_name().unwrap().to_string_lossy().ends_with("_tests.rs") {
                Some(format!(
                    "{rel}: a *_tests.rs sibling (move it to <module>/tests.rs)"
                ))
            } else if code_only(&text).contains("#[path") {
                Some(format!("{rel}: #[path] (put the file where the compiler looks)"))
            } else {
                None
            }
        })
        .collect();
    assert!(misplaced.is_empty(), "{}", misplaced.join("\n"));
}

#[test]
fn the_reader_sees_what_it_must() {
    let code = code_only(
        "use crate::{a::B, c}; // crate::commented\nlet s = \"crate::quoted\"; let c = '{';\n\
         #[cfg(test)]\nmod tests { use crate::tested; }\nfn f() { crate::d::e(); }",
    );
    let code = without_test_items(&code);
    let named: Vec<String> = crate_paths(&code).into_iter().collect();
    assert_eq!(named, ["a", "c", "d"]);
    let up: Vec<String> = paths_after(
        &code_only("use super::{sibling::X, Shared};\nuse super::*;\nfn f() { super::super::g(); }"),
        "super::",
    )
    .into_iter()
    .collect();
    assert_eq!(up, ["*", "Shared", "sibling", "super"]);

    let layers = stated_layers("//! 1. `top`: edge\n//! 2. `low`, `other`: below\n");
    let mut edges = BTreeMap::new();
    edges.insert(
        ("low".to_string(), "top".to_string()),
        BTreeSet::from([src().join("low.rs")]),
    );
    assert_eq!(
        upward(&edges, &layers).len(),
        1,
        "an import from layer 2 to layer 1 points up"
    );
    edges.insert(("other".to_string(), "low".to_string()), BTreeSet::new());
    edges.insert(("low".to_string(), "other".to_string()), BTreeSet::new());
    assert_eq!(
        cycles(&edges),
        [BTreeSet::from(["low".to_string(), "other".to_string()])]
    );

    let own_write = code_only(
        "use kube::Api; // PatchParams\nasync fn f(api: Api<X>) { api.patch(\"n\", &PatchParams::default(), &p); \
         tokio::time::timeout(d, api.get(\"n\")).await; }",
    );
    assert_eq!(
        k8s_only_names(&own_write),
        ["PatchParams", "tokio::time::timeout"]
    );
    assert!(k8s_only_names(&code_only("let t = tokio::time::timeout(d, fitrim);")).is_empty());
}

/// One mock API server: the raw request/response mock (`tower_test`) is driven by
/// `src/k8s/mock_api.rs` alone, and every test that talks to a fake Kubernetes API
/// talks to that one.
#[test]
fn one_mock_api_server() {
    let mut files = Vec::new();
    all_source_files(&src(), &mut files);
    all_source_files(&src().parent().unwrap().join("tests"), &mut files);
    let drivers: Vec<String> = files
        .iter()
        .filter(|file| code_only(&fs::read_to_string(file).unwrap()).contains("tower_test"))
        .map(|file| {
            file.strip_prefix(src().parent().unwrap())
                .unwrap()
                .display()
                .to_string()
        })
        .collect();
    assert_eq!(
        drivers,
        ["src/k8s/mock_api.rs"],
        "tower_test outside the one mock API server (use crate::k8s::mock_api::MockApi)"
    );
}

/// What tests and benchmarks share is a crate they `use` (tests/testkit), not a file
/// they include: no `#[path]` in tests/ or benches/ reaches out of its own folder (the
/// rewriter's byte fixtures, which the library's unit tests use too, are the crate
/// tests/grpc-frames).
#[test]
fn no_path_include_in_tests_or_benches_crosses_folders() {
    let root = src().parent().unwrap().to_path_buf();
    let mut files = Vec::new();
    all_source_files(&root.join("tests"), &mut files);
    all_source_files(&root.join("benches"), &mut files);
    let mut crossing = Vec::new();
    for file in &files {
        let rel = file.strip_prefix(&root).unwrap().display().to_string();
        let code = code_only(&fs::read_to_string(file).unwrap());
        for (_, path) in child_modules(&code) {
            if let Some(path) = path
                && path.split('/').any(|part| part == "..")
            {
                crossing.push(format!("{rel}: #[path = {path:?}] (use localvol_testkit)"));
            }
        }
    }
    assert!(!files.is_empty());
    assert!(crossing.is_empty(), "{}", crossing.join("\n"));
}
