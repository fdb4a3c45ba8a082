//! The library exports exactly what Debian's `librdmacm.so.1` exports,
//! each symbol with its version node, under soname `librdmacm.so.1` and
//! needing `libibverbs.so.1`; and `librdmacm.map` is what
//! `guest-lib/ibverbs/gen-map.sh librdmacm.so.1` makes from Debian's library.

mod common;

use std::path::Path;
use std::process::Command;

use common::{built_lib, debian_lib, versioned_exports};

/// `name@@NODE` for every symbol line of `librdmacm.map`.
fn map_exports() -> Vec<String> {
    let map = Path::new(env!("CARGO_MANIFEST_DIR")).join("librdmacm.map");
    let text = std::fs::read_to_string(&map).expect("read librdmacm.map");
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
    let map = map_exports();
    assert_eq!(map.len(), 68, "librdmacm 44 exports 68 functions");
    assert_eq!(
        versioned_exports(&so),
        map,
        "exports of {} differ from librdmacm.map",
        so.display()
    );
}

#[test]
fn library_has_soname_and_needs_libibverbs() {
    let out = Command::new("readelf")
        .args(["-d", "-W"])
        .arg(built_lib())
        .output()
        .expect("readelf runs");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("Library soname: [librdmacm.so.1]"),
        "no soname librdmacm.so.1:\n{text}"
    );
    assert!(
        text.contains("Shared library: [libibverbs.so.1]"),
        "not linked to libibverbs.so.1:\n{text}"
    );
}

#[test]
fn map_matches_debian_library() {
    let Some(deb) = debian_lib() else {
        eprintln!("skipping: Debian's librdmacm.so.1 (package librdmacm1) is not installed");
        return;
    };
    assert_eq!(
        versioned_exports(&deb),
        map_exports(),
        "librdmacm.map differs from {}: run guest-lib/ibverbs/gen-map.sh librdmacm.so.1 > guest-lib/rdmacm/librdmacm.map",
        deb.display()
    );
}

#[test]
fn gen_map_reproduces_the_committed_map() {
    let Some(deb) = debian_lib() else {
        eprintln!("skipping: Debian's librdmacm.so.1 (package librdmacm1) is not installed");
        return;
    };
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    let out = Command::new(dir.join("../ibverbs/gen-map.sh"))
        .arg(&deb)
        .output()
        .expect("gen-map.sh runs");
    assert!(
        out.status.success(),
        "gen-map.sh: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let committed = std::fs::read_to_string(dir.join("librdmacm.map")).expect("read map");
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        committed,
        "gen-map.sh output differs from the committed librdmacm.map"
    );
}
