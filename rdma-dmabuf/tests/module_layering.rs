//! The crate's modules depend on each other in one direction only: each file's `crate::x`
//! paths name the modules it uses, and the graph of those uses has no cycle. (A cycle means
//! two concepts that cannot be read, or changed, one without the other.)

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// Module -> the modules its files name through `crate::<module>` (comments left out).
fn uses() -> BTreeMap<String, BTreeSet<String>> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut graph = BTreeMap::new();
    let mut dirs = vec![src.clone()];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                dirs.push(path);
                continue;
            }
            if path.extension().is_none_or(|e| e != "rs") {
                continue;
            }
            // The top-level module a file belongs to: `qp/post.rs` is part of `qp`.
            let rel = path.strip_prefix(&src).unwrap();
            let first = rel
                .components()
                .next()
                .unwrap()
                .as_os_str()
                .to_string_lossy();
            let module = first.trim_end_matches(".rs").to_string();
            if module == "lib" {
                continue;
            }
            let text = std::fs::read_to_string(&path).unwrap();
            let used = graph.entry(module.clone()).or_insert_with(BTreeSet::new);
            for line in text.lines() {
                let code = line.split("//").next().unwrap_or("");
                for (i, _) in code.match_indices("crate::") {
                    let name: String = code[i + "crate::".len()..]
                        .chars()
                        .take_while(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == '_')
                        .collect();
                    if !name.is_empty() && name != module {
                        used.insert(name);
                    }
                }
            }
        }
    }
    graph
}

/// A cycle in `graph`, if any, as the path of modules round it.
fn cycle(graph: &BTreeMap<String, BTreeSet<String>>) -> Option<Vec<String>> {
    fn visit(
        graph: &BTreeMap<String, BTreeSet<String>>,
        node: &str,
        path: &mut Vec<String>,
        done: &mut BTreeSet<String>,
    ) -> Option<Vec<String>> {
        if let Some(at) = path.iter().position(|p| p == node) {
            let mut c = path[at..].to_vec();
            c.push(node.to_string());
            return Some(c);
        }
        if done.contains(node) {
            return None;
        }
        path.push(node.to_string());
        for next in graph.get(node).into_iter().flatten() {
            if let Some(c) = visit(graph, next, path, done) {
                return Some(c);
            }
        }
        path.pop();
        done.insert(node.to_string());
        None
    }
    let mut done = BTreeSet::new();
    graph
        .keys()
        .find_map(|m| visit(graph, m, &mut Vec::new(), &mut done))
}

#[test]
fn modules_depend_on_each_other_in_one_direction_only() {
    let graph = uses();
    assert!(
        graph.contains_key("qp") && graph["cm"].contains("qp"),
        "{graph:?}"
    );
    if let Some(c) = cycle(&graph) {
        panic!("modules import each other: {}", c.join(" -> "));
    }
}

#[test]
fn the_check_finds_a_cycle() {
    let mut graph = uses();
    graph.get_mut("qp").unwrap().insert("cm".into());
    let c = cycle(&graph).expect("qp -> cm -> qp is a cycle");
    assert!(
        c.contains(&"qp".to_string()) && c.contains(&"cm".to_string()),
        "{c:?}"
    );
}
