//! The shape of the source tree, checked: no import cycle between the
//! modules of any crate, and no source file over 1,000 lines of code
//! (tests apart) unless it is listed as being split.
//!
//! Each crate's modules form a tree (`a.rs` or `a/mod.rs` is `a`,
//! `a/b.rs` is `a::b`). A module that names `crate::x::…`, `super::…` or
//! `self::…` in its code (not in comments, strings or `#[cfg(test)]`
//! items) depends on the module that path reaches. A dependency is lifted
//! to the two siblings that hold its ends, below their closest common
//! ancestor, so that `metadata::writes` using `metadata::repair` counts
//! between `writes` and `repair`, and `metadata::writes` using `wire`
//! between `metadata` and `wire`. A module using its own ancestors or
//! descendants is how a module is split into files, and is not counted.
//! Among the children of one module, the dependencies must have no cycle.
//!
//! Cycles that are known and being removed are listed in [`KNOWN_CYCLES`]:
//! a new cycle fails the test, and so does a listed cycle that is gone,
//! so that the list only shrinks.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Cycles that exist today, each as `crate: module, module, …` (sorted),
/// to be removed (issue 25). Remove a line when its cycle goes.
const KNOWN_CYCLES: &[&str] = &[];

/// Most lines a source file may have before its `#[cfg(test)]` module.
const MAX_FILE_LINES: usize = 1_000;

/// Files over [`MAX_FILE_LINES`] today, to be split by concern (issue 25).
/// Remove a line when its file gets under the limit; never add one.
const KNOWN_LONG_FILES: &[&str] = &[];

#[test]
fn no_new_source_file_over_a_thousand_lines() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let root = std::env::var_os("STRATA_SOURCE_ROOT").map_or(root, PathBuf::from);
    let mut long = BTreeSet::new();
    for entry in std::fs::read_dir(root.join("crates")).unwrap() {
        let src = entry.unwrap().path().join("src");
        if !src.is_dir() {
            continue;
        }
        for file in module_files(&src).into_values() {
            let text = std::fs::read_to_string(&file).unwrap();
            let code_lines = text
                .lines()
                .take_while(|line| !line.starts_with("#[cfg(test)]"))
                .count();
            if code_lines > MAX_FILE_LINES {
                let relative = file.strip_prefix(&root).unwrap_or(&file);
                long.insert(relative.to_string_lossy().into_owned());
            }
        }
    }
    let known: BTreeSet<String> = KNOWN_LONG_FILES.iter().map(|s| s.to_string()).collect();
    let new: Vec<_> = long.difference(&known).cloned().collect();
    let gone: Vec<_> = known.difference(&long).cloned().collect();
    assert!(
        new.is_empty(),
        "source files over {MAX_FILE_LINES} lines before their tests: split them by \
         concern:\n  {}",
        new.join("\n  ")
    );
    assert!(
        gone.is_empty(),
        "these files are under {MAX_FILE_LINES} lines now: remove them from \
         KNOWN_LONG_FILES:\n  {}",
        gone.join("\n  ")
    );
}

#[test]
fn no_new_import_cycles_between_modules() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let root = std::env::var_os("STRATA_SOURCE_ROOT").map_or(root, PathBuf::from);
    let mut found = BTreeSet::new();
    let mut crates = 0;
    for entry in std::fs::read_dir(root.join("crates")).unwrap() {
        let dir = entry.unwrap().path();
        if !dir.join("src").is_dir() {
            continue;
        }
        crates += 1;
        let name = dir.file_name().unwrap().to_string_lossy().into_owned();
        for cycle in crate_cycles(&dir.join("src")) {
            found.insert(format!("{name}: {}", cycle.join(", ")));
        }
    }
    assert!(crates >= 7, "found only {crates} crates under crates/");
    let known: BTreeSet<String> = KNOWN_CYCLES.iter().map(|s| s.to_string()).collect();
    let new: Vec<_> = found.difference(&known).collect();
    let gone: Vec<_> = known.difference(&found).collect();
    assert!(
        new.is_empty(),
        "new import cycles between modules (each list is a set of sibling modules that \
         reach each other through `crate::`/`super::` paths; give the shared part a module \
         of its own):\n  {}",
        new.iter()
            .map(|s| s.as_str())
            .collect::<Vec<_>>()
            .join("\n  ")
    );
    assert!(
        gone.is_empty(),
        "these cycles are gone: remove them from KNOWN_CYCLES:\n  {}",
        gone.iter()
            .map(|s| s.as_str())
            .collect::<Vec<_>>()
            .join("\n  ")
    );
}

/// The analysis finds a cycle it is shown, and none where there is none.
#[test]
fn the_cycle_finder_finds_cycles() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path();
    std::fs::create_dir_all(src.join("meta")).unwrap();
    let files = [
        ("lib.rs", "mod a; mod b; mod c; mod meta;"),
        // a -> b through a grouped use, b -> a through a full path in code.
        (
            "a.rs",
            "use crate::{b::Thing, c};\n// crate::c::nothing in a comment\n",
        ),
        ("b.rs", "fn f() { crate::a::g(); let s = \"crate::c::h\"; }"),
        // c uses its parent's children only in tests: not counted.
        ("c.rs", "#[cfg(test)]\nmod tests { use crate::a::x; }\n"),
        // Children of `meta` using each other and their parent.
        ("meta/mod.rs", "mod one; mod two; use self::one::X;"),
        ("meta/one.rs", "use super::two::Y; use super::Z;"),
        ("meta/two.rs", "use crate::meta::one::X; use crate::c::W;"),
    ];
    for (path, text) in files {
        std::fs::write(src.join(path), text).unwrap();
    }
    let cycles = crate_cycles(src);
    assert_eq!(
        cycles,
        vec![
            vec!["a".to_string(), "b".to_string()],
            vec!["meta::one".to_string(), "meta::two".to_string()],
        ]
    );
}

/// The cycles among sibling modules of the crate whose sources are in
/// `src`, each sorted, in order.
fn crate_cycles(src: &Path) -> Vec<Vec<String>> {
    let modules = module_files(src);
    let names: BTreeSet<String> = modules.keys().cloned().collect();
    // For each parent module, the dependencies among its children.
    let mut sibling_edges: BTreeMap<String, BTreeSet<(String, String)>> = BTreeMap::new();
    for (module, file) in &modules {
        let text = std::fs::read_to_string(file).unwrap();
        let code = without_tests(&code_only(&text));
        for path in referenced_paths(&code) {
            let Some(target) = resolve(module, &path, &names) else {
                continue;
            };
            if let Some((parent, from, to)) = lift(module, &target) {
                sibling_edges.entry(parent).or_default().insert((from, to));
            }
        }
    }
    let mut cycles = Vec::new();
    for (parent, edges) in sibling_edges {
        for component in strongly_connected(&edges) {
            let full = component
                .into_iter()
                .map(|m| join(&parent, &m))
                .collect::<Vec<_>>();
            cycles.push(full);
        }
    }
    cycles.sort();
    cycles
}

/// Every module of the crate and its file: `""` for the root.
fn module_files(src: &Path) -> BTreeMap<String, PathBuf> {
    let mut modules = BTreeMap::new();
    let mut stack = vec![src.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                stack.push(path);
                continue;
            }
            if !matches!(path.extension(), Some(e) if e == "rs") {
                continue;
            }
            let relative = path.strip_prefix(src).unwrap().with_extension("");
            let mut parts: Vec<String> = relative
                .components()
                .map(|c| c.as_os_str().to_string_lossy().into_owned())
                .collect();
            let last = parts.last().cloned().unwrap_or_default();
            if last == "mod" || (parts.len() == 1 && (last == "lib" || last == "main")) {
                parts.pop();
            }
            if parts.first().is_some_and(|p| p == "bin") {
                continue;
            }
            modules.insert(parts.join("::"), path);
        }
    }
    modules
}

/// The text with comments removed and string and character literals
/// emptied, so that only code is searched for paths.
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
        } else if c == 'r' && (next == Some('"') || next == Some('#')) && !is_ident(prev(&chars, i))
        {
            // A raw string: r"…" or r#"…"#.
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
        } else if c == '"' {
            i += 1;
            while i < chars.len() && chars[i] != '"' {
                if chars[i] == '\\' {
                    i += 1;
                }
                i += 1;
            }
            i += 1;
            out.push_str("\"\"");
        } else if c == '\'' && is_char_literal(&chars, i) {
            i += 1;
            while i < chars.len() && chars[i] != '\'' {
                if chars[i] == '\\' {
                    i += 1;
                }
                i += 1;
            }
            i += 1;
            out.push_str("' '");
        } else {
            out.push(c);
            i += 1;
        }
    }
    out
}

fn prev(chars: &[char], i: usize) -> char {
    if i == 0 {
        ' '
    } else {
        chars[i - 1]
    }
}

fn is_ident(c: char) -> bool {
    c.is_alphanumeric() || c == '_'
}

/// Whether the quote at `i` opens a character literal (`'a'`, `'\n'`)
/// rather than a lifetime (`'a`).
fn is_char_literal(chars: &[char], i: usize) -> bool {
    match chars.get(i + 1) {
        Some('\\') => true,
        Some(_) => chars.get(i + 2) == Some(&'\''),
        None => false,
    }
}

/// The code with every `#[cfg(test)]` item removed: an item ends at the
/// `;` or the closing brace of its first block.
fn without_tests(code: &str) -> String {
    let mut out = String::with_capacity(code.len());
    let mut rest = code;
    while let Some(at) = rest.find("#[cfg(test)]") {
        out.push_str(&rest[..at]);
        let item = &rest[at..];
        let mut depth = 0;
        let mut end = item.len();
        for (k, ch) in item.char_indices() {
            match ch {
                '{' => depth += 1,
                '}' => {
                    depth -= 1;
                    if depth == 0 {
                        end = k + 1;
                        break;
                    }
                }
                ';' if depth == 0 => {
                    end = k + 1;
                    break;
                }
                _ => {}
            }
        }
        rest = &item[end..];
    }
    out.push_str(rest);
    out
}

/// Every path that starts with `crate::`, `super::` or `self::`, as its
/// segments, with grouped imports (`use crate::{a::b, c}`) expanded.
fn referenced_paths(code: &str) -> Vec<Vec<String>> {
    let chars: Vec<char> = code.chars().collect();
    let mut paths = Vec::new();
    let mut i = 0;
    while i < chars.len() {
        if is_ident(chars[i]) && (i == 0 || !is_ident(chars[i - 1]) && chars[i - 1] != ':') {
            let start = i;
            while i < chars.len() && is_ident(chars[i]) {
                i += 1;
            }
            let word: String = chars[start..i].iter().collect();
            if matches!(word.as_str(), "crate" | "super" | "self") && at_separator(&chars, i) {
                let mut prefix = vec![word];
                i = parse_tree(&chars, i, &mut prefix, &mut paths);
            }
        } else {
            i += 1;
        }
    }
    paths
}

fn at_separator(chars: &[char], i: usize) -> bool {
    chars.get(i) == Some(&':') && chars.get(i + 1) == Some(&':')
}

fn skip_space(chars: &[char], mut i: usize) -> usize {
    while i < chars.len() && chars[i].is_whitespace() {
        i += 1;
    }
    i
}

/// Parses `::seg::seg…` or `::{tree, tree}` after `prefix`, pushing each
/// complete path; returns where it stopped.
fn parse_tree(
    chars: &[char],
    mut i: usize,
    prefix: &mut Vec<String>,
    paths: &mut Vec<Vec<String>>,
) -> usize {
    let depth = prefix.len();
    loop {
        if !at_separator(chars, i) {
            break;
        }
        i = skip_space(chars, i + 2);
        if chars.get(i) == Some(&'{') {
            i += 1;
            loop {
                i = skip_space(chars, i);
                match chars.get(i) {
                    Some('}') | None => {
                        i += 1;
                        break;
                    }
                    Some(',') => i += 1,
                    _ => {
                        let start = i;
                        while i < chars.len() && (is_ident(chars[i]) || chars[i] == '*') {
                            i += 1;
                        }
                        if i == start {
                            i += 1;
                            continue;
                        }
                        prefix.push(chars[start..i].iter().collect());
                        i = parse_tree(chars, i, prefix, paths);
                        // `as name` and the like up to the next separator.
                        while i < chars.len() && !matches!(chars[i], ',' | '}') {
                            i += 1;
                        }
                    }
                }
            }
            prefix.truncate(depth);
            return i;
        }
        let start = i;
        while i < chars.len() && (is_ident(chars[i]) || chars[i] == '*') {
            i += 1;
        }
        if i == start {
            break;
        }
        prefix.push(chars[start..i].iter().collect());
    }
    paths.push(prefix.clone());
    prefix.truncate(depth);
    i
}

/// The module that `path`, written in `module`, reaches: the longest
/// prefix of it that names a module.
fn resolve(module: &str, path: &[String], modules: &BTreeSet<String>) -> Option<String> {
    let mut base = split(module);
    let mut segments = path;
    match path.first().map(String::as_str) {
        Some("crate") => {
            base.clear();
            segments = &path[1..];
        }
        Some("self") => segments = &path[1..],
        Some("super") => {
            while segments.first().map(String::as_str) == Some("super") {
                base.pop()?;
                segments = &segments[1..];
            }
        }
        _ => return None,
    }
    resolve_from(base, segments, modules)
}

fn resolve_from(
    mut base: Vec<String>,
    segments: &[String],
    modules: &BTreeSet<String>,
) -> Option<String> {
    let mut best = base.join("::");
    for segment in segments {
        base.push(segment.clone());
        let candidate = base.join("::");
        if modules.contains(&candidate) {
            best = candidate;
        } else {
            break;
        }
    }
    modules.contains(&best).then_some(best)
}

fn split(module: &str) -> Vec<String> {
    if module.is_empty() {
        Vec::new()
    } else {
        module.split("::").map(str::to_string).collect()
    }
}

fn join(parent: &str, child: &str) -> String {
    if parent.is_empty() {
        child.to_string()
    } else {
        format!("{parent}::{child}")
    }
}

/// The dependency `from` → `to` as (common ancestor, sibling below it on
/// `from`'s side, sibling on `to`'s side); `None` when one is an ancestor
/// of the other.
fn lift(from: &str, to: &str) -> Option<(String, String, String)> {
    let a = split(from);
    let b = split(to);
    let common = a.iter().zip(&b).take_while(|(x, y)| x == y).count();
    if common == a.len() || common == b.len() {
        return None;
    }
    Some((a[..common].join("::"), a[common].clone(), b[common].clone()))
}

/// The strongly connected components with more than one member (Tarjan's
/// algorithm is overkill for a few dozen modules: reachability will do).
fn strongly_connected(edges: &BTreeSet<(String, String)>) -> Vec<Vec<String>> {
    let mut next: BTreeMap<&str, BTreeSet<&str>> = BTreeMap::new();
    for (from, to) in edges {
        next.entry(from).or_default().insert(to);
    }
    let nodes: BTreeSet<&str> = edges
        .iter()
        .flat_map(|(a, b)| [a.as_str(), b.as_str()])
        .collect();
    let reach = |start: &str| {
        let mut seen = BTreeSet::new();
        let mut stack = vec![start];
        while let Some(n) = stack.pop() {
            for &m in next.get(n).into_iter().flatten() {
                if seen.insert(m) {
                    stack.push(m);
                }
            }
        }
        seen
    };
    let reachable: BTreeMap<&str, BTreeSet<&str>> = nodes.iter().map(|&n| (n, reach(n))).collect();
    let mut components = BTreeSet::new();
    for &n in &nodes {
        let component: Vec<String> = nodes
            .iter()
            .filter(|&&m| m == n || (reachable[n].contains(m) && reachable[m].contains(n)))
            .map(|m| m.to_string())
            .collect();
        if component.len() > 1 {
            components.insert(component);
        }
    }
    components.into_iter().collect()
}

/// The suite runs with the invariants on: `scripts/cargo-checked` builds
/// the workspace's crates with debug assertions and overflow checks, and
/// a plain `cargo test --release` (which has neither) would let every
/// `debug_assert!` go unchecked without a sign.
#[test]
fn the_suite_is_built_with_debug_assertions_and_overflow_checks() {
    if !cfg!(debug_assertions) {
        panic!("built without debug assertions: run the tests through scripts/cargo-checked");
    }
    let one = std::hint::black_box(u8::MAX);
    assert!(
        std::panic::catch_unwind(|| one + std::hint::black_box(1)).is_err(),
        "built without overflow checks: run the tests through scripts/cargo-checked"
    );
}
