//! The engine's layers (docs/ARCHITECTURE.md, "Layers"), enforced: every
//! reference one top module of `vrnic/src` makes to another
//! (`use crate::x::...`, `use crate::{x::A, y::B}`, `crate::x::f()` in
//! code, `super::super::x` reaching the crate root) must be allowed by the
//! rule of the module it is written in. A new back edge fails `cargo test`
//! with its file:line and the rule it breaks.
//!
//! Text-based and fast (no compiler): comments (doc comments too) and
//! string literals are blanked, `#[cfg(test)]` items and test-only files
//! (`*_tests.rs`, files declared `#[cfg(test)] mod x;`) are skipped: tests
//! may reach anything. Inline non-test `mod x { }` blocks are not tracked
//! for `super::` (the engine has none).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// One module's rule: the modules of the crate it may import.
struct Rule {
    /// The top module (`vrnic/src/<module>.rs` or `vrnic/src/<module>/`).
    module: &'static str,
    /// The rule's name, as docs/ARCHITECTURE.md names it.
    name: &'static str,
    /// The other top modules it may import; anything else is a back edge.
    may_import: &'static [&'static str],
    /// Why.
    reason: &'static str,
}

/// The layers, bottom to top (docs/ARCHITECTURE.md, "Layers"): a module
/// imports only modules below it.
const RULES: &[Rule] = &[
    Rule {
        module: "abi",
        name: "abi-stands-alone",
        may_import: &[],
        reason: "the device ABI is shared with drivers and knows nothing of the engine",
    },
    Rule {
        module: "wire",
        name: "wire-knows-only-bytes",
        may_import: &[],
        reason: "packet formats are bytes in, bytes out: no guest memory, no links, no transport",
    },
    Rule {
        module: "counters",
        name: "counters-is-a-leaf",
        may_import: &[],
        reason: "the counters! macro is a utility every layer may use",
    },
    Rule {
        module: "time",
        name: "time-is-a-leaf",
        may_import: &[],
        reason: "the engine's clock type is a utility every layer may use",
    },
    Rule {
        module: "mem",
        name: "mem-below-payload",
        may_import: &["abi", "counters", "time"],
        reason: "bounds-checked driver memory is below the payloads that read it",
    },
    Rule {
        module: "data",
        name: "data-below-verbs",
        may_import: &["abi", "wire", "counters", "time", "mem"],
        reason: "a packet's payload (in the frame or by reference) knows memory, not objects",
    },
    Rule {
        module: "batch",
        name: "batch-above-payload",
        may_import: &["abi", "wire", "counters", "time", "mem", "data"],
        reason: "the in-process fast path (batches, runs, packets by reference) is payloads in frames, below the objects and the transport that make them",
    },
    Rule {
        module: "verbs",
        name: "verbs-below-transport",
        may_import: &["abi", "wire", "counters", "time", "mem", "data", "batch"],
        reason: "the verbs objects do not know the transport or the device that use them",
    },
    Rule {
        module: "transport",
        name: "transport-below-device",
        may_import: &["abi", "wire", "counters", "time", "mem", "data", "batch", "verbs"],
        reason:
            "the transport does not know the device that drives it nor the links its frames go to",
    },
    Rule {
        module: "link",
        name: "link-beside-engine",
        may_import: &["abi", "wire", "counters", "time", "mem", "data", "batch"],
        reason:
            "links carry frames; they do not know the device, the transport or the verbs objects",
    },
    Rule {
        module: "device",
        name: "device-on-top",
        may_import: &[
            "abi",
            "wire",
            "counters",
            "time",
            "mem",
            "data",
            "batch",
            "verbs",
            "transport",
            "link",
        ],
        reason: "the device model drives everything below it and nothing drives it",
    },
    Rule {
        module: "fuzzing",
        name: "fuzzing-is-test-support",
        may_import: &[
            "abi",
            "wire",
            "counters",
            "time",
            "mem",
            "data",
            "batch",
            "verbs",
            "transport",
            "link",
            "device",
        ],
        reason: "the fuzzing harness drives the whole engine",
    },
];

/// Back edges tolerated for now, `(file under vrnic/src, imported module)`:
/// empty since `Resources` and the neighbour table moved into `transport`
/// (issue 29). An entry no longer needed fails the test too, so the list
/// only shrinks.
const KNOWN_BACK_EDGES: &[(&str, &str)] = &[];

/// One reference from a file to a top module.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Ref {
    /// 1-based line of the reference.
    line: usize,
    /// The top module referred to.
    module: String,
}

/// `src` with comments and the contents of string and char literals
/// replaced by spaces, newlines kept (so lines still count).
fn blank_comments_and_strings(src: &str) -> String {
    let c: Vec<char> = src.chars().collect();
    let mut out = String::with_capacity(src.len());
    let blank = |ch: char| if ch == '\n' { '\n' } else { ' ' };
    let mut i = 0;
    while i < c.len() {
        if c[i] == '/' && c.get(i + 1) == Some(&'/') {
            while i < c.len() && c[i] != '\n' {
                out.push(' ');
                i += 1;
            }
        } else if c[i] == '/' && c.get(i + 1) == Some(&'*') {
            let mut depth = 0;
            while i < c.len() {
                if c[i] == '/' && c.get(i + 1) == Some(&'*') {
                    depth += 1;
                    out.push_str("  ");
                    i += 2;
                } else if c[i] == '*' && c.get(i + 1) == Some(&'/') {
                    depth -= 1;
                    out.push_str("  ");
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    out.push(blank(c[i]));
                    i += 1;
                }
            }
        } else if c[i] == 'r'
            && (c.get(i + 1) == Some(&'"') || c.get(i + 1) == Some(&'#'))
            && (i == 0 || !is_ident(c[i - 1]))
        {
            // Raw string r"..." or r#"..."#.
            let mut j = i + 1;
            let mut hashes = 0;
            while c.get(j) == Some(&'#') {
                hashes += 1;
                j += 1;
            }
            if c.get(j) != Some(&'"') {
                out.push(c[i]);
                i += 1;
                continue;
            }
            for _ in i..=j {
                out.push(' ');
            }
            i = j + 1;
            while i < c.len() {
                if c[i] == '"' && (0..hashes).all(|k| c.get(i + 1 + k) == Some(&'#')) {
                    for _ in 0..=hashes {
                        out.push(' ');
                    }
                    i += 1 + hashes;
                    break;
                }
                out.push(blank(c[i]));
                i += 1;
            }
        } else if c[i] == '"' {
            out.push(' ');
            i += 1;
            while i < c.len() && c[i] != '"' {
                if c[i] == '\\' {
                    out.push(' ');
                    i += 1;
                }
                if i < c.len() {
                    out.push(blank(c[i]));
                    i += 1;
                }
            }
            out.push(' ');
            i += 1;
        } else if c[i] == '\'' {
            // A char literal ('x', '\n', '\u{..}') or a lifetime ('a).
            let end = if c.get(i + 1) == Some(&'\\') {
                (i + 2..c.len()).find(|&j| c[j] == '\'')
            } else if c.get(i + 2) == Some(&'\'') {
                Some(i + 2)
            } else {
                None
            };
            match end {
                Some(e) => {
                    for _ in i..=e {
                        out.push(' ');
                    }
                    i = e + 1;
                }
                None => {
                    out.push('\'');
                    i += 1;
                }
            }
        } else {
            out.push(c[i]);
            i += 1;
        }
    }
    out
}

fn is_ident(ch: char) -> bool {
    ch.is_ascii_alphanumeric() || ch == '_'
}

/// Blanks every item under `#[cfg(test)]` (a `mod tests { ... }`, a
/// `mod x;`, a `use`, a fn) in already comment-free code.
fn blank_test_items(code: &str) -> String {
    let mut c: Vec<char> = code.chars().collect();
    let pat: Vec<char> = "#[cfg(test)]".chars().collect();
    let mut i = 0;
    while i + pat.len() <= c.len() {
        if c[i..i + pat.len()] != pat[..] {
            i += 1;
            continue;
        }
        // The item ends at the first `;` at depth 0 before any `{`, or
        // at the `}` closing its first `{`.
        let mut j = i + pat.len();
        let mut depth = 0usize;
        let mut bracket = 0usize;
        while j < c.len() {
            match c[j] {
                '[' => bracket += 1,
                ']' => bracket = bracket.saturating_sub(1),
                ';' if depth == 0 && bracket == 0 => break,
                '{' => depth += 1,
                '}' => {
                    depth -= 1;
                    if depth == 0 {
                        break;
                    }
                }
                _ => {}
            }
            j += 1;
        }
        let end = (j + 1).min(c.len());
        for ch in &mut c[i..end] {
            if *ch != '\n' {
                *ch = ' ';
            }
        }
        i = j + 1;
    }
    c.into_iter().collect()
}

/// The names of the modules a file declares `#[cfg(test)] mod x;`.
fn test_only_submodules(code: &str) -> Vec<String> {
    let words: Vec<&str> = code.split_whitespace().collect();
    let mut out = Vec::new();
    for (k, w) in words.iter().enumerate() {
        if *w != "#[cfg(test)]" {
            continue;
        }
        let rest = &words[k + 1..];
        let rest = match rest.first() {
            Some(&"pub") | Some(&"pub(crate)") | Some(&"pub(super)") => &rest[1..],
            _ => rest,
        };
        if rest.first() == Some(&"mod") {
            if let Some(name) = rest.get(1).and_then(|n| n.strip_suffix(';')) {
                out.push(name.to_string());
            }
        }
    }
    out
}

/// The top modules `code` refers to, written in a file whose module path
/// below the crate root is `path` (`["transport", "requester"]`).
fn crate_refs(code: &str, path: &[&str]) -> Vec<Ref> {
    module_refs(code, path, &[])
}

/// The modules directly below `base` (a module path; `[]`: the crate
/// root) that `code` refers to, written in a file whose module path is
/// `path`: through `crate::<base>::x`, or a `super` chain reaching `base`
/// or a module above it and naming the rest of `base`.
fn module_refs(code: &str, path: &[&str], base: &[&str]) -> Vec<Ref> {
    let c: Vec<char> = code.chars().collect();
    let newlines: Vec<usize> = (0..c.len()).filter(|&k| c[k] == '\n').collect();
    let line_of = |pos: usize| newlines.partition_point(|&n| n < pos) + 1;
    let mut refs = Vec::new();
    let mut i = 0;
    while i < c.len() {
        let starts_word = i == 0 || !(is_ident(c[i - 1]) || c[i - 1] == ':');
        if !starts_word || !is_ident(c[i]) {
            i += 1;
            continue;
        }
        // Walk a path's leading `crate::` or `super::super::...`.
        let mut j = i;
        let mut level: Option<usize> = None;
        if word_at(&c, j, "crate") {
            level = Some(0);
            j += "crate".len();
            if !sep_at(&c, j) {
                i = j;
                continue;
            }
            j = skip_sep(&c, j);
        } else if word_at(&c, j, "super") {
            let mut depth = path.len();
            while word_at(&c, j, "super") {
                depth = depth.saturating_sub(1);
                j += "super".len();
                if !sep_at(&c, j) {
                    break;
                }
                j = skip_sep(&c, j);
            }
            if base.starts_with(&path[..depth]) {
                level = Some(depth);
            } else {
                i = j;
                continue;
            }
        }
        let Some(mut level) = level else {
            while i < c.len() && is_ident(c[i]) {
                i += 1;
            }
            continue;
        };
        // Walk the rest of `base`: `crate::transport::` for base `transport`.
        while level < base.len() && word_at(&c, j, base[level]) && sep_at(&c, j + base[level].len())
        {
            j = skip_sep(&c, j + base[level].len());
            level += 1;
        }
        if level < base.len() {
            i = j.max(i + 1);
            continue;
        }
        if c.get(j) == Some(&'{') {
            for (pos, name) in group_heads(&c, j) {
                refs.push(Ref {
                    line: line_of(pos),
                    module: name,
                });
            }
        } else {
            let start = j;
            while j < c.len() && is_ident(c[j]) {
                j += 1;
            }
            if j > start {
                refs.push(Ref {
                    line: line_of(start),
                    module: c[start..j].iter().collect(),
                });
            }
        }
        i = j.max(i + 1);
    }
    refs.retain(|r| r.module != "self" && r.module != "super" && r.module != "crate");
    refs
}

fn word_at(c: &[char], i: usize, w: &str) -> bool {
    let n = w.len();
    c.len() >= i + n
        && c[i..i + n].iter().copied().eq(w.chars())
        && !c.get(i + n).is_some_and(|&ch| is_ident(ch))
}

/// Whether `::` follows at `i`, whitespace allowed around it.
fn sep_at(c: &[char], mut i: usize) -> bool {
    while c.get(i).is_some_and(|ch| ch.is_whitespace()) {
        i += 1;
    }
    c.get(i) == Some(&':') && c.get(i + 1) == Some(&':')
}

fn skip_sep(c: &[char], mut i: usize) -> usize {
    while c[i].is_whitespace() {
        i += 1;
    }
    i += 2;
    while c.get(i).is_some_and(|ch| ch.is_whitespace()) {
        i += 1;
    }
    i
}

/// The first name of each entry of the group `{ a::X, b::{Y, Z}, c }`
/// that opens at `open`, with its position.
fn group_heads(c: &[char], open: usize) -> Vec<(usize, String)> {
    let mut out = Vec::new();
    let mut depth = 0usize;
    let mut expect_head = true;
    let mut i = open;
    while i < c.len() {
        match c[i] {
            '{' => {
                depth += 1;
                if depth == 1 {
                    expect_head = true;
                }
            }
            '}' => {
                depth -= 1;
                if depth == 0 {
                    break;
                }
            }
            ',' if depth == 1 => expect_head = true,
            ch if depth == 1 && expect_head && is_ident(ch) => {
                let start = i;
                while i < c.len() && is_ident(c[i]) {
                    i += 1;
                }
                out.push((start, c[start..i].iter().collect()));
                expect_head = false;
                continue;
            }
            _ => {}
        }
        i += 1;
    }
    out
}

/// Every `.rs` file under `dir`, sorted.
fn rust_files(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).expect("read vrnic/src") {
            let p = e.expect("dir entry").path();
            if p.is_dir() {
                stack.push(p);
            } else if p.extension().is_some_and(|x| x == "rs") {
                out.push(p);
            }
        }
    }
    out.sort();
    out
}

/// One violation: a file:line referring to a module its rule forbids.
#[derive(Debug)]
struct Violation {
    file: String,
    line: usize,
    from: String,
    to: String,
}

/// Every cross-module reference of non-test code under `src`:
/// `(file relative to src, its top module, reference)`.
fn scan(src: &Path) -> Vec<(String, String, Ref)> {
    let mut out = Vec::new();
    for (rel, path, code) in non_test_code(src) {
        let top = path[0].clone();
        let path: Vec<&str> = path.iter().map(String::as_str).collect();
        for r in crate_refs(&code, &path) {
            if r.module != top {
                out.push((rel.clone(), top.clone(), r));
            }
        }
    }
    out
}

/// The non-test files under `src` (not `lib.rs`): `(file relative to src,
/// its module path, its code with comments, strings and `#[cfg(test)]`
/// items blanked)`.
fn non_test_code(src: &Path) -> Vec<(String, Vec<String>, String)> {
    let files = rust_files(src);
    let mut code_of = BTreeMap::new();
    let mut test_only = BTreeSet::new();
    for f in &files {
        let rel = f.strip_prefix(src).unwrap().to_string_lossy().into_owned();
        let text = std::fs::read_to_string(f).expect("read source");
        let code = blank_comments_and_strings(&text);
        let dir = Path::new(&rel).parent().unwrap().to_path_buf();
        let dir = if rel.ends_with("mod.rs") || rel == "lib.rs" {
            dir
        } else {
            dir.join(Path::new(&rel).file_stem().unwrap())
        };
        for m in test_only_submodules(&code) {
            let base = dir.join(&m);
            test_only.insert(format!("{}.rs", base.display()));
            test_only.insert(format!("{}/mod.rs", base.display()));
        }
        code_of.insert(rel, code);
    }
    let mut out = Vec::new();
    for (rel, code) in code_of {
        if rel == "lib.rs" || rel.ends_with("_tests.rs") || test_only.contains(&rel) {
            continue;
        }
        let mut path: Vec<String> = rel
            .trim_end_matches(".rs")
            .split('/')
            .map(String::from)
            .collect();
        if path.last().is_some_and(|l| l == "mod") {
            path.pop();
        }
        let code = blank_test_items(&code);
        out.push((rel, path, code));
    }
    out
}

/// One import between two submodules of a top module, `from` → `to`, and
/// where.
#[derive(Debug, Clone)]
struct Edge {
    to: String,
    at: String,
}

/// The imports among the submodules of each top module that is a
/// directory (`transport/requester.rs` → `transport/completer.rs`): top
/// module → submodule → the submodules it imports. A file deeper down
/// counts as its submodule of the top (`device/control/qp.rs` is
/// `control`); `mod.rs` is the top module itself and left out (it
/// declares and re-exports its submodules).
fn submodule_imports(src: &Path) -> BTreeMap<String, BTreeMap<String, Vec<Edge>>> {
    let files = non_test_code(src);
    let mut subs: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (_, path, _) in &files {
        if path.len() >= 2 {
            subs.entry(path[0].clone())
                .or_default()
                .insert(path[1].clone());
        }
    }
    let mut out: BTreeMap<String, BTreeMap<String, Vec<Edge>>> = BTreeMap::new();
    for (rel, path, code) in &files {
        let (Some(top), Some(from)) = (path.first(), path.get(1)) else {
            continue;
        };
        let p: Vec<&str> = path.iter().map(String::as_str).collect();
        for r in module_refs(code, &p, &[top.as_str()]) {
            if &r.module != from && subs[top].contains(&r.module) {
                out.entry(top.clone())
                    .or_default()
                    .entry(from.clone())
                    .or_default()
                    .push(Edge {
                        to: r.module,
                        at: format!("vrnic/src/{rel}:{}", r.line),
                    });
            }
        }
    }
    out
}

/// A circle in `graph` (submodule → imports), as the edges that make it,
/// if there is one.
fn find_circle(graph: &BTreeMap<String, Vec<Edge>>) -> Option<Vec<(String, Edge)>> {
    fn visit(
        graph: &BTreeMap<String, Vec<Edge>>,
        node: &str,
        stack: &mut Vec<(String, Edge)>,
        done: &mut BTreeSet<String>,
    ) -> Option<Vec<(String, Edge)>> {
        for e in graph.get(node).into_iter().flatten() {
            if let Some(k) = stack.iter().position(|(from, _)| *from == e.to) {
                let mut circle = stack[k..].to_vec();
                circle.push((node.to_string(), e.clone()));
                return Some(circle);
            }
            if e.to == node || done.contains(&e.to) {
                continue;
            }
            stack.push((node.to_string(), e.clone()));
            let found = visit(graph, &e.to.clone(), stack, done);
            stack.pop();
            if found.is_some() {
                return found;
            }
        }
        done.insert(node.to_string());
        None
    }
    let mut done = BTreeSet::new();
    for node in graph.keys() {
        if !done.contains(node) {
            if let Some(c) = visit(graph, node, &mut Vec::new(), &mut done) {
                return Some(c);
            }
        }
    }
    None
}

fn src_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

fn rule_of(module: &str) -> Option<&'static Rule> {
    RULES.iter().find(|r| r.module == module)
}

#[test]
fn layers_hold() {
    let refs = scan(&src_dir());
    let mut problems = Vec::new();
    let mut violations = Vec::new();
    let mut tops = BTreeSet::new();
    for (file, from, r) in &refs {
        tops.insert(from.clone());
        let Some(rule) = rule_of(from) else { continue };
        if rule_of(&r.module).is_none() {
            // Not a module of the crate (a macro at the root, an item of lib.rs).
            continue;
        }
        if !rule.may_import.contains(&r.module.as_str()) {
            violations.push(Violation {
                file: file.clone(),
                line: r.line,
                from: from.clone(),
                to: r.module.clone(),
            });
        }
    }
    for top in &tops {
        if rule_of(top).is_none() {
            problems.push(format!(
                "module `{top}` has no layering rule: add it to RULES in vrnic/tests/layers.rs and to docs/ARCHITECTURE.md"
            ));
        }
    }
    let mut used_known = BTreeSet::new();
    for v in &violations {
        if KNOWN_BACK_EDGES.contains(&(v.file.as_str(), v.to.as_str())) {
            used_known.insert((v.file.as_str(), v.to.as_str()));
            continue;
        }
        let rule = rule_of(&v.from).unwrap();
        problems.push(format!(
            "vrnic/src/{}:{}: `{}` imports `{}`, breaking rule `{}` ({} may import only {:?}): {}",
            v.file, v.line, v.from, v.to, rule.name, v.from, rule.may_import, rule.reason
        ));
    }
    for known in KNOWN_BACK_EDGES {
        if !used_known.contains(known) {
            problems.push(format!(
                "KNOWN_BACK_EDGES lists {known:?}, which is gone: remove it from the list"
            ));
        }
    }
    assert!(
        problems.is_empty(),
        "layering broken:\n{}",
        problems.join("\n")
    );
}

/// Inside a top module the files import each other without a circle
/// (rule `no-circles-inside`): a submodule that needs another's item does
/// not also serve it, so each can be read, and split, from the bottom up
/// (rxe's `rxe_req.c` → `rxe_comp.c` are one way too: the completer
/// schedules the requester, never the reverse through a call).
#[test]
fn no_circles_inside_a_module() {
    let mut problems = Vec::new();
    for (top, graph) in submodule_imports(&src_dir()) {
        if let Some(circle) = find_circle(&graph) {
            let steps: Vec<String> = circle
                .iter()
                .map(|(from, e)| format!("{top}::{from} -> {top}::{} ({})", e.to, e.at))
                .collect();
            problems.push(format!(
                "rule `no-circles-inside`: {top}'s files import each other in a circle:\n  {}",
                steps.join("\n  ")
            ));
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

#[test]
fn circles_are_found() {
    let edge = |to: &str| Edge {
        to: to.into(),
        at: String::new(),
    };
    let mut g: BTreeMap<String, Vec<Edge>> = BTreeMap::new();
    g.insert("a".into(), vec![edge("b")]);
    g.insert("b".into(), vec![edge("c")]);
    g.insert("c".into(), vec![]);
    assert!(find_circle(&g).is_none());
    g.insert("c".into(), vec![edge("a")]);
    let circle = find_circle(&g).expect("a -> b -> c -> a");
    let names: Vec<(&str, &str)> = circle
        .iter()
        .map(|(f, e)| (f.as_str(), e.to.as_str()))
        .collect();
    assert_eq!(names, [("a", "b"), ("b", "c"), ("c", "a")]);
}

#[test]
fn parser_reads_a_modules_own_submodules() {
    let code = blank_comments_and_strings(
        "use super::psn;\nuse crate::transport::{cwnd::Cwnd, Env};\nfn f() { crate::transport::completer::g(); super::super::wire::h(); }\nuse crate::verbs::qp;\n",
    );
    let refs = module_refs(&code, &["transport", "requester"], &["transport"]);
    let got: Vec<(usize, &str)> = refs.iter().map(|r| (r.line, r.module.as_str())).collect();
    assert_eq!(got, [(1, "psn"), (2, "cwnd"), (2, "Env"), (3, "completer")]);
}

#[test]
fn every_rule_names_a_module_and_only_lower_ones() {
    // The rules form layers: no module may import one that may import it.
    for r in RULES {
        for m in r.may_import {
            let other =
                rule_of(m).unwrap_or_else(|| panic!("rule {} names unknown module {m}", r.name));
            assert!(
                !other.may_import.contains(&r.module),
                "rules {} and {} let {} and {m} import each other",
                r.name,
                other.name,
                r.module
            );
        }
    }
}

#[test]
fn parser_reads_grouped_uses() {
    let code = blank_comments_and_strings(
        "use crate::{\n    data::Payload,\n    verbs::{Qp, Cq},\n    wire,\n};\nuse crate::mem::DmaMemory;\n",
    );
    let refs = crate_refs(&code, &["transport", "requester"]);
    let got: Vec<(usize, &str)> = refs.iter().map(|r| (r.line, r.module.as_str())).collect();
    assert_eq!(got, [(2, "data"), (3, "verbs"), (4, "wire"), (6, "mem")]);
}

#[test]
fn parser_reads_paths_in_code_and_super_chains() {
    let code = blank_comments_and_strings(
        "fn f() { let x = crate::device::Nanos(1); }\nuse super::super::link::LocalMacs;\nuse super::psn;\n",
    );
    let refs = crate_refs(&code, &["transport", "requester"]);
    let got: Vec<(usize, &str)> = refs.iter().map(|r| (r.line, r.module.as_str())).collect();
    assert_eq!(got, [(1, "device"), (2, "link")]);
    // From a `mod.rs` one `super` is the crate root.
    let refs = crate_refs(&code, &["transport"]);
    let got: Vec<&str> = refs.iter().map(|r| r.module.as_str()).collect();
    assert_eq!(got, ["device", "link", "psn"]);
}

#[test]
fn parser_ignores_comments_and_strings() {
    let code = blank_comments_and_strings(
        "//! See [`Device`](crate::device::Device).\n/// Like crate::link::Link.\n/* crate::verbs */\nconst S: &str = \"crate::transport\";\nconst C: char = '\"';\nfn f<'a>(x: &'a u8) {}\nuse crate::wire::Bth;\n",
    );
    let refs = crate_refs(&code, &["data"]);
    let got: Vec<(usize, &str)> = refs.iter().map(|r| (r.line, r.module.as_str())).collect();
    assert_eq!(got, [(7, "wire")]);
}

#[test]
fn parser_skips_cfg_test_items() {
    let code = blank_comments_and_strings(
        "use crate::mem::X;\n#[cfg(test)]\nmod tests {\n    use crate::device::Device;\n    fn f() { if true { crate::link::g(); } }\n}\n#[cfg(test)]\nuse crate::verbs::Qp;\nfn g() { crate::abi::h(); }\n",
    );
    let code = blank_test_items(&code);
    let refs = crate_refs(&code, &["data"]);
    let got: Vec<(usize, &str)> = refs.iter().map(|r| (r.line, r.module.as_str())).collect();
    assert_eq!(got, [(1, "mem"), (9, "abi")]);
    assert_eq!(
        test_only_submodules(&blank_comments_and_strings(
            "#[cfg(test)]\npub(crate) mod packet_tests;\n#[cfg(test)]\nmod proptests;\nmod gso;\n"
        )),
        ["packet_tests", "proptests"]
    );
}
