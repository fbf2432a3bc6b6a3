//! The module graph, checked from the sources: the library's modules form layers that only
//! import downward (so no circle can form among them), the CLI's modules (the binary's
//! tree: `src/cli/`, `src/commands/`, `src/bin/`) import each other without a circle, and
//! the library never names the CLI. A test, so CI fails on a circle the day one appears.
//!
//! Edges are read from the text: every `crate::<module>` path (and `crate::<Item>` of the
//! root's re-exports) outside comments and `#[cfg(test)]` modules; in the CLI, also
//! `crate::cli::<module>` and `super::<module>` between the CLI's own modules.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// The library's layers, lowest first: a module may import its own layer's siblings only
/// where that forms no circle, and any module of a lower layer.
const LAYERS: &[&[&str]] = &[
    &["kind", "redact"],
    &["error"],
    &["ident"],
    &["command", "settings", "recurring"],
    &["attempts"],
    &["otel"],
    &["engine"],
    &["schema"],
    &["handler"],
    &["processor"],
    &["queue"],
    &["admin", "migrate"],
];

fn src() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The text of `path` that is compiled outside tests, without comments.
fn production_code(path: &Path) -> String {
    let text = std::fs::read_to_string(path).unwrap();
    let mut code = String::new();
    let mut lines = text.lines().peekable();
    while let Some(line) = lines.next() {
        let trimmed = line.trim_start();
        // A test module at the end of the file: the rest is test code.
        if trimmed.starts_with("#[cfg(")
            && trimmed.contains("test")
            && lines
                .peek()
                .is_some_and(|next| next.trim_start().starts_with("mod "))
        {
            break;
        }
        let without_comment = match line.find("//") {
            Some(at) => &line[..at],
            None => line,
        };
        code.push_str(without_comment);
        code.push('\n');
    }
    code
}

/// Every `prefix<name>` in `code`, `name` being an identifier.
fn names_after<'a>(code: &'a str, prefix: &str) -> Vec<&'a str> {
    code.match_indices(prefix)
        .filter(|(at, _)| {
            // `crate::` itself, not `icq_crate::` or `mycrate::`.
            !code[..*at]
                .chars()
                .next_back()
                .is_some_and(|c| c.is_alphanumeric() || c == '_')
        })
        .map(|(at, _)| {
            let rest = &code[at + prefix.len()..];
            let end = rest
                .find(|c: char| !(c.is_alphanumeric() || c == '_'))
                .unwrap_or(rest.len());
            &rest[..end]
        })
        .filter(|name| !name.is_empty())
        .collect()
}

/// The root's re-exported items and the module each comes from (`Error` → `error`).
fn root_reexports() -> BTreeMap<String, String> {
    let lib = production_code(&src().join("lib.rs"));
    let mut items = BTreeMap::new();
    for statement in lib.split(';') {
        let Some(used) = statement.trim().strip_prefix("pub use ") else {
            continue;
        };
        let Some((module, rest)) = used.split_once("::") else {
            continue;
        };
        let module = module.trim().to_owned();
        let rest = rest.trim().trim_start_matches('{').trim_end_matches('}');
        for item in rest.split(',') {
            let item = item.rsplit("::").next().unwrap_or_default().trim();
            let item = item.split(" as ").last().unwrap_or_default().trim();
            if !item.is_empty() {
                items.insert(item.to_owned(), module.clone());
            }
        }
    }
    items
}

/// The library module a file belongs to: the first component under `src/`.
fn library_module(path: &Path) -> Option<String> {
    let relative = path.strip_prefix(src()).unwrap();
    let first = relative.components().next()?.as_os_str().to_str()?;
    let name = first.trim_end_matches(".rs");
    match name {
        "lib" | "bin" | "cli" | "commands" | "module_graph" => None,
        "otel_off" => Some("otel".to_owned()),
        other => Some(other.to_owned()),
    }
}

/// The CLI unit a file belongs to: `main` (src/bin), `commands`, or `cli::<module>`.
fn cli_unit(path: &Path) -> Option<String> {
    let relative = path.strip_prefix(src()).unwrap();
    let parts: Vec<&str> = relative
        .components()
        .map(|c| c.as_os_str().to_str().unwrap())
        .collect();
    match parts.as_slice() {
        ["bin", ..] => Some("main".to_owned()),
        ["commands", ..] => Some("commands".to_owned()),
        ["cli", "mod.rs"] => None,
        ["cli", file] if file.ends_with("tests.rs") || *file == "properties.rs" => None,
        ["cli", file] => Some(format!("cli::{}", file.trim_end_matches(".rs"))),
        ["cli", dir, ..] => Some(format!("cli::{dir}")),
        _ => None,
    }
}

type Graph = BTreeMap<String, BTreeSet<String>>;

fn library_graph() -> Graph {
    let reexports = root_reexports();
    let mut files = Vec::new();
    rust_files(&src(), &mut files);
    let modules: BTreeSet<String> = files.iter().filter_map(|p| library_module(p)).collect();
    let mut graph = Graph::new();
    for path in &files {
        let Some(from) = library_module(path) else {
            continue;
        };
        let code = production_code(path);
        let edges = graph.entry(from.clone()).or_default();
        for name in names_after(&code, "crate::") {
            let to = if modules.contains(name) {
                Some(name.to_owned())
            } else {
                reexports.get(name).cloned()
            };
            if let Some(to) = to.filter(|to| *to != from) {
                edges.insert(to);
            }
        }
    }
    graph
}

fn cli_graph() -> Graph {
    let mut files = Vec::new();
    rust_files(&src(), &mut files);
    let mut graph = Graph::new();
    for path in &files {
        let Some(from) = cli_unit(path) else {
            continue;
        };
        let code = production_code(path);
        let edges = graph.entry(from.clone()).or_default();
        let mut targets: Vec<String> = names_after(&code, "crate::cli::")
            .into_iter()
            .map(|name| format!("cli::{name}"))
            .collect();
        if !names_after(&code, "crate::commands").is_empty() || code.contains("crate::commands::") {
            targets.push("commands".to_owned());
        }
        // A module directly under src/cli/ naming a sibling through `super::`.
        let relative = path.strip_prefix(src().join("cli")).ok();
        let top_level = relative.is_some_and(|r| {
            r.components().count() == 1 || r.file_name().is_some_and(|f| f == "mod.rs")
        });
        if top_level {
            targets.extend(
                names_after(&code, "super::")
                    .into_iter()
                    .map(|name| format!("cli::{name}")),
            );
        }
        for to in targets {
            if to != from && graph_has_unit(&files, &to) {
                edges.insert(to);
            }
        }
    }
    graph
}

fn graph_has_unit(files: &[PathBuf], unit: &str) -> bool {
    files.iter().any(|p| cli_unit(p).as_deref() == Some(unit))
}

/// The strongly connected components of more than one node (each is a circle).
fn circles(graph: &Graph) -> Vec<Vec<String>> {
    // Tarjan's algorithm, iterative enough for a few dozen nodes.
    struct State<'g> {
        graph: &'g Graph,
        index: BTreeMap<&'g str, usize>,
        low: BTreeMap<&'g str, usize>,
        stack: Vec<&'g str>,
        on_stack: BTreeSet<&'g str>,
        next: usize,
        found: Vec<Vec<String>>,
    }
    fn visit<'g>(state: &mut State<'g>, node: &'g str) {
        state.index.insert(node, state.next);
        state.low.insert(node, state.next);
        state.next += 1;
        state.stack.push(node);
        state.on_stack.insert(node);
        for next in state.graph.get(node).into_iter().flatten() {
            let next = next.as_str();
            if !state.index.contains_key(next) {
                visit(state, next);
                let low = state.low[node].min(state.low[next]);
                state.low.insert(node, low);
            } else if state.on_stack.contains(next) {
                let low = state.low[node].min(state.index[next]);
                state.low.insert(node, low);
            }
        }
        if state.low[node] == state.index[node] {
            let mut component = Vec::new();
            while let Some(member) = state.stack.pop() {
                state.on_stack.remove(member);
                component.push(member.to_owned());
                if member == node {
                    break;
                }
            }
            if component.len() > 1 {
                component.sort();
                state.found.push(component);
            }
        }
    }
    let mut state = State {
        graph,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on_stack: BTreeSet::new(),
        next: 0,
        found: Vec::new(),
    };
    for node in graph.keys() {
        if !state.index.contains_key(node.as_str()) {
            visit(&mut state, node);
        }
    }
    state.found
}

fn layer_of(module: &str) -> Option<usize> {
    LAYERS.iter().position(|layer| layer.contains(&module))
}

#[test]
fn every_library_module_has_a_layer() {
    let graph = library_graph();
    let missing: Vec<&String> = graph.keys().filter(|m| layer_of(m).is_none()).collect();
    assert!(
        missing.is_empty(),
        "modules without a layer in LAYERS: {missing:?}"
    );
}

#[test]
fn the_library_imports_only_downward_and_without_circles() {
    let graph = library_graph();
    let mut upward = Vec::new();
    for (from, targets) in &graph {
        for to in targets {
            if let (Some(a), Some(b)) = (layer_of(from), layer_of(to))
                && b > a
            {
                upward.push(format!("{from} -> {to}"));
            }
        }
    }
    assert!(upward.is_empty(), "imports that run upward: {upward:?}");
    assert_eq!(circles(&graph), Vec::<Vec<String>>::new(), "{graph:#?}");
}

#[test]
fn the_cli_imports_without_circles() {
    let graph = cli_graph();
    assert!(graph.len() > 5, "the CLI's modules were found: {graph:#?}");
    assert_eq!(circles(&graph), Vec::<Vec<String>>::new(), "{graph:#?}");
}

#[test]
fn the_library_never_names_the_cli() {
    let mut files = Vec::new();
    rust_files(&src(), &mut files);
    for path in files.iter().filter(|p| library_module(p).is_some()) {
        let code = production_code(path);
        assert!(
            !code.contains("crate::cli") && !code.contains("crate::commands"),
            "{} names the CLI",
            path.display()
        );
    }
}

#[test]
fn a_circle_is_found() {
    let mut graph = Graph::new();
    graph.entry("a".into()).or_default().insert("b".into());
    graph.entry("b".into()).or_default().insert("c".into());
    graph.entry("c".into()).or_default().insert("a".into());
    graph.entry("d".into()).or_default().insert("a".into());
    assert_eq!(circles(&graph), vec![vec!["a", "b", "c"]]);
}
