//! The crate's modules are layered: none reaches back to itself through the others.
//!
//! Reads `src/`, takes each top-level module's references to the others (`crate::m`, and
//! `super::m` where `super` is the crate root; a directory module's submodules count as the
//! module) and refuses a cycle, naming it. Comments and literals are not read.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// Top-level module → the top-level modules it refers to.
type Graph = BTreeMap<String, BTreeSet<String>>;

/// `src` with comments, string literals and character literals blanked out.
fn code_only(src: &str) -> String {
    let c: Vec<char> = src.chars().collect();
    let mut out = String::with_capacity(src.len());
    let mut i = 0;
    let ident = |ch: char| ch.is_alphanumeric() || ch == '_';
    while i < c.len() {
        let start = i;
        if c[i] == '/' && c.get(i + 1) == Some(&'/') {
            while i < c.len() && c[i] != '\n' {
                i += 1;
            }
        } else if c[i] == '/' && c.get(i + 1) == Some(&'*') {
            let mut depth = 0;
            while i < c.len() {
                if c[i] == '/' && c.get(i + 1) == Some(&'*') {
                    depth += 1;
                    i += 2;
                } else if c[i] == '*' && c.get(i + 1) == Some(&'/') {
                    depth -= 1;
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    i += 1;
                }
            }
        } else if c[i] == 'r'
            && (i == 0 || !ident(c[i - 1]) || (c[i - 1] == 'b' && (i < 2 || !ident(c[i - 2]))))
            && matches!(c.get(i + 1), Some('"' | '#'))
        {
            let hashes = c[i + 1..].iter().take_while(|&&h| h == '#').count();
            if c.get(i + 1 + hashes) != Some(&'"') {
                out.push(c[i]);
                i += 1;
                continue;
            }
            i += hashes + 2;
            while i < c.len() {
                if c[i] == '"' && c[i + 1..].iter().take_while(|&&h| h == '#').count() >= hashes {
                    i += hashes + 1;
                    break;
                }
                i += 1;
            }
        } else if c[i] == '"' {
            i += 1;
            while i < c.len() && c[i] != '"' {
                i += if c[i] == '\\' { 2 } else { 1 };
            }
            i += 1;
        } else if c[i] == '\'' && c.get(i + 1) == Some(&'\\') {
            i += 3;
            while i < c.len() && c[i] != '\'' {
                i += 1;
            }
            i += 1;
        } else if c[i] == '\'' && c.get(i + 2) == Some(&'\'') {
            i += 3;
        } else {
            out.push(c[i]);
            i += 1;
            continue;
        }
        let end = i.min(c.len());
        out.extend(
            c[start..end]
                .iter()
                .map(|&ch| if ch == '\n' { '\n' } else { ' ' }),
        );
    }
    out
}

/// Identifiers, `::` and single punctuation characters.
fn tokens(code: &str) -> Vec<String> {
    let c: Vec<char> = code.chars().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < c.len() {
        if c[i].is_alphanumeric() || c[i] == '_' {
            let start = i;
            while i < c.len() && (c[i].is_alphanumeric() || c[i] == '_') {
                i += 1;
            }
            out.push(c[start..i].iter().collect());
        } else if c[i] == ':' && c.get(i + 1) == Some(&':') {
            out.push("::".to_string());
            i += 2;
        } else {
            if !c[i].is_whitespace() {
                out.push(c[i].to_string());
            }
            i += 1;
        }
    }
    out
}

/// The crate-level names a path names from `t[i]` on: `m` or each item of `{a, b::c, ..}`.
fn path_heads(t: &[String], i: usize, heads: &mut BTreeSet<String>) {
    match t.get(i).map(String::as_str) {
        Some("{") => {
            let mut depth = 0;
            let mut expect_head = true;
            for tok in &t[i..] {
                match tok.as_str() {
                    "{" => {
                        depth += 1;
                        expect_head = depth == 1;
                    }
                    "}" => {
                        depth -= 1;
                        if depth == 0 {
                            break;
                        }
                    }
                    "," if depth == 1 => expect_head = true,
                    name if expect_head => {
                        if name != "self" {
                            heads.insert(name.to_string());
                        }
                        expect_head = false;
                    }
                    _ => {}
                }
            }
        }
        Some(name) if name != "self" => {
            heads.insert(name.to_string());
        }
        _ => {}
    }
}

/// The crate-level names one source file refers to; `depth` is how deep its module is (1 for
/// `src/m.rs` and `src/m/mod.rs`, 2 for `src/m/sub.rs`).
fn references(src: &str, depth: usize) -> BTreeSet<String> {
    let t = tokens(&code_only(src));
    let mut heads = BTreeSet::new();
    // For each open brace: whether it opens an inline `mod name { .. }`.
    let mut braces: Vec<bool> = Vec::new();
    let tok = |i: usize| t.get(i).map(String::as_str);
    for i in 0..t.len() {
        match t[i].as_str() {
            "{" => braces.push(i >= 2 && tok(i - 2) == Some("mod")),
            "}" => {
                braces.pop();
            }
            "crate" if tok(i + 1) == Some("::") && (i == 0 || tok(i - 1) != Some("$")) => {
                path_heads(&t, i + 2, &mut heads);
            }
            "super" if tok(i + 1) == Some("::") && (i == 0 || tok(i - 1) != Some("::")) => {
                let mut ups = 0;
                let mut j = i;
                while tok(j) == Some("super") && tok(j + 1) == Some("::") {
                    ups += 1;
                    j += 2;
                }
                // Fewer steps up stay inside this top-level module; more are not a path.
                let here = depth + braces.iter().filter(|&&m| m).count();
                if ups == here {
                    path_heads(&t, j, &mut heads);
                }
            }
            _ => {}
        }
    }
    heads
}

/// Every `.rs` file under `dir`, with its path relative to `root`.
fn rust_files(root: &Path, dir: &Path, out: &mut Vec<(Vec<String>, String)>) {
    let entries =
        std::fs::read_dir(dir).unwrap_or_else(|e| panic!("listing {}: {e}", dir.display()));
    for entry in entries {
        let path = entry
            .unwrap_or_else(|e| panic!("listing {}: {e}", dir.display()))
            .path();
        if path.is_dir() {
            rust_files(root, &path, out);
        } else if path.extension().is_some_and(|x| x == "rs") {
            let text = std::fs::read_to_string(&path)
                .unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
            let parts = path
                .strip_prefix(root)
                .unwrap_or(&path)
                .iter()
                .map(|p| p.to_string_lossy().into_owned())
                .collect();
            out.push((parts, text));
        }
    }
}

/// The module graph of the crate whose sources are in `src` (`lib.rs` and `main.rs` are roots,
/// not modules).
fn module_graph(src: &Path) -> Graph {
    let mut files = Vec::new();
    rust_files(src, src, &mut files);
    let mut modules: Vec<(String, usize, String)> = Vec::new();
    for (parts, text) in files {
        let Some(first) = parts.first() else {
            continue;
        };
        let top = first.strip_suffix(".rs").unwrap_or(first).to_string();
        if parts.len() == 1 && (top == "lib" || top == "main") {
            continue;
        }
        // `src/m.rs` and `src/m/mod.rs` are `crate::m`, `src/m/sub.rs` is `crate::m::sub`.
        let depth = parts.len() - usize::from(parts.last().is_some_and(|l| l == "mod.rs"));
        modules.push((top, depth, text));
    }
    let mut graph: Graph = modules
        .iter()
        .map(|(m, _, _)| (m.clone(), BTreeSet::new()))
        .collect();
    let names: BTreeSet<String> = graph.keys().cloned().collect();
    for (module, depth, text) in &modules {
        let targets = references(text, *depth)
            .into_iter()
            .filter(|h| names.contains(h) && h != module);
        graph.entry(module.clone()).or_default().extend(targets);
    }
    graph
}

/// Every cycle a depth-first walk meets, each as `a -> b -> a`.
fn cycles(graph: &Graph) -> Vec<String> {
    fn walk(
        node: &str,
        graph: &Graph,
        path: &mut Vec<String>,
        done: &mut BTreeSet<String>,
        found: &mut Vec<String>,
    ) {
        if let Some(at) = path.iter().position(|p| p == node) {
            let mut cycle = path[at..].to_vec();
            cycle.push(node.to_string());
            found.push(cycle.join(" -> "));
            return;
        }
        if done.contains(node) {
            return;
        }
        path.push(node.to_string());
        for next in graph.get(node).into_iter().flatten() {
            walk(next, graph, path, done, found);
        }
        path.pop();
        done.insert(node.to_string());
    }
    let mut found = Vec::new();
    let mut done = BTreeSet::new();
    for node in graph.keys() {
        walk(node, graph, &mut Vec::new(), &mut done, &mut found);
    }
    found
}

fn graph_of(edges: &[(&str, &str)]) -> Graph {
    let mut g = Graph::new();
    for (a, b) in edges {
        g.entry(a.to_string()).or_default().insert(b.to_string());
        g.entry(b.to_string()).or_default();
    }
    g
}

#[test]
fn modules_have_no_cycle() {
    let graph = module_graph(&Path::new(env!("CARGO_MANIFEST_DIR")).join("src"));
    let found = cycles(&graph);
    assert!(
        found.is_empty(),
        "module cycles: {}\ngraph: {graph:#?}",
        found.join("; ")
    );
}

#[test]
fn the_graph_sees_the_crate() {
    let graph = module_graph(&Path::new(env!("CARGO_MANIFEST_DIR")).join("src"));
    for (from, to) in [
        ("server", "commands"),
        ("server", "state"),
        ("commands", "state"),
        ("storage", "oplog"),
        ("matcher", "values"),
    ] {
        assert!(
            graph.get(from).is_some_and(|t| t.contains(to)),
            "{from} -> {to} missing from {graph:#?}"
        );
    }
}

#[test]
fn references_follow_paths_not_text() {
    let src = r##"
        use crate::a::X;
        use crate::{b, c::{D, E}, self};
        use super::f::G;
        pub(crate) fn h() { crate::i::j(); $crate::k::l(); }
        // crate::m::n
        /* crate::o /* nested */ crate::p */
        const S: &str = "crate::q";
        const R: &str = r#"crate::r " crate::s"#;
        const C: char = '"';
        const Q: char = '\'';
        const B: char = '{';
        fn life<'a>(x: &'a str) -> &'a str { let _ = crate::t::U; x }
        mod tests {
            use super::*;
            use super::super::v::W;
        }
    "##;
    let got: Vec<String> = references(src, 1).into_iter().collect();
    assert_eq!(got, ["a", "b", "c", "f", "i", "t", "v"]);
    // In `src/m/sub.rs`, `super` is `m` itself; `super::super` is the crate root.
    let sub = "use super::Ctx;\nuse super::super::state::State;\n";
    let got: Vec<String> = references(sub, 2).into_iter().collect();
    assert_eq!(got, ["state"]);
}

#[test]
fn cycles_are_named() {
    let layered = graph_of(&[
        ("server", "commands"),
        ("commands", "state"),
        ("server", "state"),
    ]);
    assert!(cycles(&layered).is_empty());
    let tangled = graph_of(&[
        ("server", "commands"),
        ("commands", "state"),
        ("state", "server"),
        ("storage", "oplog"),
        ("oplog", "storage"),
    ]);
    assert_eq!(
        cycles(&tangled),
        [
            "commands -> state -> server -> commands",
            "oplog -> storage -> oplog"
        ]
    );
}
