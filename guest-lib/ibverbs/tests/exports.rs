//! The library exports exactly what Debian's `libibverbs.so.1` exports,
//! each symbol with its version node, and `libibverbs.map` is what
//! `gen-map.sh` makes from Debian's library.

mod common;

use std::path::Path;
use std::process::Command;

use common::{built_lib, debian_lib, versioned_exports};

/// `name@@NODE` / `name@NODE` for every symbol line of `libibverbs.map`.
fn map_exports() -> Vec<String> {
    let map = Path::new(env!("CARGO_MANIFEST_DIR")).join("libibverbs.map");
    let text = std::fs::read_to_string(&map).expect("read libibverbs.map");
    let mut node = String::new();
    let mut v = Vec::new();
    for line in text.lines() {
        let t = line.trim();
        if let Some(n) = t.strip_suffix('{') {
            node = n.trim().to_string();
        } else if let Some((sym, rest)) = t.split_once(';') {
            let sym = sym.trim();
            if sym.is_empty() || sym.contains([' ', ':', '*', '}']) {
                continue;
            }
            let at = if rest.contains("compat") { "@" } else { "@@" };
            v.push(format!("{sym}{at}{node}"));
        }
    }
    v.sort();
    v
}

#[test]
fn library_exports_the_map() {
    let so = built_lib();
    let ours = versioned_exports(&so);
    let map = map_exports();
    assert!(map.len() > 150, "map lists only {} symbols", map.len());
    assert_eq!(
        ours,
        map,
        "exports of {} differ from libibverbs.map",
        so.display()
    );
}

#[test]
fn library_has_soname_libibverbs_so_1() {
    let out = Command::new("readelf")
        .args(["-d", "-W"])
        .arg(built_lib())
        .output()
        .expect("readelf runs");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("Library soname: [libibverbs.so.1]"),
        "no soname libibverbs.so.1:\n{text}"
    );
}

#[test]
fn map_matches_debian_library() {
    let Some(deb) = debian_lib() else {
        eprintln!("skipping: Debian's libibverbs.so.1 (package libibverbs1) is not installed");
        return;
    };
    assert_eq!(
        versioned_exports(&deb),
        map_exports(),
        "libibverbs.map differs from {}: run guest-lib/ibverbs/gen-map.sh > guest-lib/ibverbs/libibverbs.map",
        deb.display()
    );
}

#[test]
fn gen_map_reproduces_the_committed_map() {
    let Some(deb) = debian_lib() else {
        eprintln!("skipping: Debian's libibverbs.so.1 (package libibverbs1) is not installed");
        return;
    };
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    let out = Command::new(dir.join("gen-map.sh"))
        .arg(&deb)
        .output()
        .expect("gen-map.sh runs");
    assert!(
        out.status.success(),
        "gen-map.sh: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let committed = std::fs::read_to_string(dir.join("libibverbs.map")).expect("read map");
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        committed,
        "gen-map.sh output differs from the committed libibverbs.map"
    );
}
