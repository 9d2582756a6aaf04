//! The repository's shape, kept: in every crate, no module imports one that imports it back,
//! however deep either sits (a loop makes the modules along it one, whatever the files say).
//! A module may name its ancestors: they are its namespace (a file of `node/` implements the
//! `Node` that `node/mod.rs` declares), and a parent's `mod child;` is no import. Read from the
//! sources: the paths a module's code names (`crate::a::b`, `super::x`, `self::y`, a child's
//! `child::z`, and each of `use a::{b, c::d}`), not in comments, not in its tests.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// A module, as the names from the crate's root down to it (the root is empty).
type Module = Vec<String>;

/// Every module of the crate whose sources are under `src` (tests and binaries left out),
/// with its file.
fn modules(src: &Path) -> BTreeMap<Module, PathBuf> {
    let mut files = Vec::new();
    collect(src, &mut files);
    let mut modules = BTreeMap::new();
    for file in files {
        let rel = file.strip_prefix(src).unwrap().with_extension("");
        let mut names: Module =
            rel.components().map(|c| c.as_os_str().to_string_lossy().into_owned()).collect();
        if names.last().is_some_and(|n| n == "mod") || names == ["lib"] || names == ["main"] {
            names.pop();
        }
        let test = names.iter().any(|n| n == "tests");
        if test || names.first().is_some_and(|n| n == "bin") {
            continue;
        }
        modules.insert(names, file);
    }
    modules
}

fn collect(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            collect(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// A module's code: comments and its tests left out, and `a::{b, c::d}` written out as
/// `a::b a::c::d`.
fn code_of(file: &Path) -> String {
    let text = std::fs::read_to_string(file).unwrap();
    let code = text.split("#[cfg(test)]").next().unwrap_or_default();
    let mut code: String = code
        .lines()
        .filter(|l| !l.trim_start().starts_with("//"))
        .map(|l| format!("{l}\n"))
        .collect();
    // Innermost braces first, a few levels deep.
    for _ in 0..4 {
        let mut out = String::new();
        let mut rest = code.as_str();
        while let Some(at) = rest.find("::{") {
            let inner = &rest[at + 3..];
            let Some(close) = inner.find(['{', '}']).filter(|&c| inner.as_bytes()[c] == b'}')
            else {
                out.push_str(&rest[..at + 3]);
                rest = inner;
                continue;
            };
            let head_start = rest[..at]
                .rfind(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == ':'))
                .map_or(0, |s| s + 1);
            let head = &rest[head_start..at];
            out.push_str(&rest[..head_start]);
            let items = inner[..close].split(',').map(str::trim).filter(|i| !i.is_empty());
            let paths: Vec<String> =
                items.filter(|&i| i != "self").map(|i| format!("{head}::{i}")).collect();
            out.push_str(&paths.join(" "));
            rest = &inner[close + 1..];
        }
        out.push_str(rest);
        code = out;
    }
    code
}

/// Each module of the crate under `src`, and the crate's other modules its code names (not
/// counting its ancestors).
fn imports(src: &Path) -> BTreeMap<Module, BTreeSet<Module>> {
    let modules = modules(src);
    let mut graph = BTreeMap::new();
    for (module, file) in &modules {
        let code = code_of(file);
        let mut named = BTreeSet::new();
        let bytes = code.as_bytes();
        let word = |b: u8| b.is_ascii_alphanumeric() || b == b'_';
        let mut at = 0;
        while at < bytes.len() {
            // The start of a path: a word not preceded by a word character or `::`.
            if !word(bytes[at]) || (at > 0 && (word(bytes[at - 1]) || bytes[at - 1] == b':')) {
                at += 1;
                continue;
            }
            let len = code[at..]
                .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == ':'))
                .unwrap_or(code.len() - at);
            let path: Vec<&str> = code[at..at + len].split("::").collect();
            at += len.max(1);
            if path.len() < 2 {
                continue;
            }
            let (mut base, mut rest): (Module, &[&str]) = match path[0] {
                "crate" => (Vec::new(), &path[1..]),
                "super" | "self" => (module.clone(), &path[..]),
                child => {
                    let mut child_path = module.clone();
                    child_path.push(child.to_string());
                    if !modules.contains_key(&child_path) {
                        continue;
                    }
                    (module.clone(), &path[..])
                }
            };
            while let Some((&first, tail)) = rest.split_first() {
                match first {
                    "super" => drop(base.pop()),
                    "self" => {}
                    _ => break,
                }
                rest = tail;
            }
            // The deepest module the path reaches.
            let mut reached = None;
            let mut at_module = base.clone();
            if modules.contains_key(&at_module) {
                reached = Some(at_module.clone());
            }
            for name in rest {
                at_module.push(name.to_string());
                if modules.contains_key(&at_module) {
                    reached = Some(at_module.clone());
                }
            }
            let Some(reached) = reached else { continue };
            if !module.starts_with(&reached) {
                named.insert(reached);
            }
        }
        graph.insert(module.clone(), named);
    }
    graph
}

/// A loop through `from` in `graph`, as the modules along it, if there is one.
fn loop_through(graph: &BTreeMap<Module, BTreeSet<Module>>, from: &Module) -> Option<Vec<Module>> {
    let mut stack = vec![(from.clone(), vec![from.clone()])];
    let mut seen = BTreeSet::new();
    while let Some((at, path)) = stack.pop() {
        for next in graph.get(&at).into_iter().flatten() {
            if next == from {
                return Some([path.clone(), vec![next.clone()]].concat());
            }
            if seen.insert(next.clone()) {
                stack.push((next.clone(), [path.clone(), vec![next.clone()]].concat()));
            }
        }
    }
    None
}

fn module(path: &str) -> Module {
    path.split("::").filter(|n| !n.is_empty()).map(String::from).collect()
}

#[test]
fn no_module_imports_one_that_imports_it_back() {
    let crates = Path::new(env!("CARGO_MANIFEST_DIR")).join("../crates");
    let mut checked = 0;
    let mut deep = 0;
    for entry in std::fs::read_dir(&crates).unwrap() {
        let src = entry.unwrap().path().join("src");
        if !src.is_dir() {
            continue;
        }
        let graph = imports(&src);
        for module in graph.keys() {
            if let Some(path) = loop_through(&graph, module) {
                let path: Vec<String> = path.iter().map(|m| m.join("::")).collect();
                panic!("{}: {} import each other", src.display(), path.join(" -> "));
            }
        }
        checked += graph.len();
        deep += graph.keys().filter(|m| m.len() > 1).count();
    }
    assert!(checked > 120 && deep > 50, "only {checked} modules ({deep} nested) found");
}

/// The reading of paths and the search for loops, on the shapes that hid loops before: a
/// `use super::{a, b}` group, a child named by a bare path, a module three levels down.
#[test]
fn loops_are_found_among_nested_modules_and_ancestors_are_not_loops() {
    let src = std::env::temp_dir().join(format!("rlaunch-structure-{}", std::process::id()));
    let files = [
        ("lib.rs", "mod node;\n"),
        ("node/mod.rs", "mod launch;\nmod pmix;\nuse launch::JobRank;\npub struct Node;\n"),
        ("node/launch.rs", "use super::{spawned, Node};\npub struct JobRank;\n"),
        ("node/spawned.rs", "// use super::launch::JobRank; (a comment)\n"),
        ("node/pmix/mod.rs", "mod server;\nfn f() { crate::node::pmix::server::go(); }\n"),
        ("node/pmix/server.rs", "use crate::node::{Node, launch::JobRank};\npub fn go() {}\n"),
    ];
    for (path, text) in files {
        let path = src.join(path);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, text).unwrap();
    }
    let graph = imports(&src);
    assert_eq!(graph[&module("node::launch")], BTreeSet::from([module("node::spawned")]));
    assert_eq!(graph[&module("node")], BTreeSet::from([module("node::launch")]));
    assert!(graph[&module("node::spawned")].is_empty(), "comments name nothing");
    let server: BTreeSet<Module> = BTreeSet::from([module("node::launch")]);
    assert_eq!(graph[&module("node::pmix::server")], server, "Node is an ancestor's");
    assert_eq!(loop_through(&graph, &module("node::launch")), None);
    std::fs::write(src.join("node/spawned.rs"), "use crate::node::pmix::server;\n").unwrap();
    std::fs::write(src.join("node/launch.rs"), "use super::spawned::X;\n").unwrap();
    std::fs::write(src.join("node/pmix/server.rs"), "use crate::node::launch::JobRank;\n").unwrap();
    let graph = imports(&src);
    let found = loop_through(&graph, &module("node::launch")).expect("a loop");
    let found: Vec<String> = found.iter().map(|m| m.join("::")).collect();
    assert_eq!(found, ["node::launch", "node::spawned", "node::pmix::server", "node::launch"]);
    std::fs::remove_dir_all(&src).unwrap();
}
