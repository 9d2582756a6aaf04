//! The repository's shape, kept: in every crate, no top-level module imports one that imports
//! it back (a loop makes two modules one, whatever the files say). Read from the sources:
//! a module's `crate::NAME` paths in code (not in comments, not in its tests).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Each top-level module of the crate whose sources are under `src`, and the crate's other
/// top-level modules its code names.
fn imports(src: &Path) -> BTreeMap<String, BTreeSet<String>> {
    let mut files = Vec::new();
    collect(src, &mut files);
    let mut graph: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for file in files {
        let rel = file.strip_prefix(src).unwrap();
        let first = rel.components().next().unwrap().as_os_str().to_string_lossy().into_owned();
        let module = first.trim_end_matches(".rs").to_string();
        let tests =
            rel.components().any(|c| c.as_os_str() == "tests" || c.as_os_str() == "tests.rs");
        if ["lib", "main", "bin"].contains(&module.as_str()) || tests {
            continue;
        }
        let text = std::fs::read_to_string(&file).unwrap();
        let code = text.split("#[cfg(test)]").next().unwrap_or_default();
        let named = graph.entry(module.clone()).or_default();
        for line in code.lines().filter(|l| !l.trim_start().starts_with("//")) {
            for (at, _) in line.match_indices("crate::") {
                let rest = &line[at + "crate::".len()..];
                let name: String =
                    rest.chars().take_while(|c| c.is_ascii_alphanumeric() || *c == '_').collect();
                // `rlaunch_tree::...` ends in "tree::", not "crate::": only this crate's paths.
                let own = at == 0 || !line.as_bytes()[at - 1].is_ascii_alphanumeric();
                if own && !name.is_empty() && name != module {
                    named.insert(name);
                }
            }
        }
    }
    graph
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

/// A loop through `from` in `graph`, as the modules along it, if there is one.
fn loop_through(graph: &BTreeMap<String, BTreeSet<String>>, from: &str) -> Option<Vec<String>> {
    let mut stack = vec![(from.to_string(), vec![from.to_string()])];
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

#[test]
fn no_top_level_module_imports_one_that_imports_it_back() {
    let crates = Path::new(env!("CARGO_MANIFEST_DIR")).join("../crates");
    let mut checked = 0;
    for entry in std::fs::read_dir(&crates).unwrap() {
        let src = entry.unwrap().path().join("src");
        if !src.is_dir() {
            continue;
        }
        let graph = imports(&src);
        for module in graph.keys() {
            if let Some(path) = loop_through(&graph, module) {
                panic!("{}: {} import each other", src.display(), path.join(" -> "));
            }
        }
        checked += graph.len();
    }
    assert!(checked > 40, "only {checked} modules found under {}", crates.display());
}

#[test]
fn a_loop_is_found() {
    let graph: BTreeMap<String, BTreeSet<String>> = [
        ("a".to_string(), BTreeSet::from(["b".to_string()])),
        ("b".to_string(), BTreeSet::from(["c".to_string()])),
        ("c".to_string(), BTreeSet::from(["a".to_string()])),
        ("d".to_string(), BTreeSet::from(["a".to_string()])),
    ]
    .into();
    assert_eq!(
        loop_through(&graph, "a"),
        Some(vec!["a".into(), "b".into(), "c".into(), "a".into()])
    );
    assert_eq!(loop_through(&graph, "d"), None);
}
