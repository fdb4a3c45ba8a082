//! Build script of vrnic's libibverbs.so.1:
//! 1. Rust bindings of Debian's `<infiniband/verbs.h>` (libibverbs-dev 44) with bindgen, so
//!    every struct the library shares with applications has the header's layout
//!    (`$OUT_DIR/verbs.rs`, included by `src/ffi.rs`).
//! 2. The soname `libibverbs.so.1`.

use std::env;
use std::path::PathBuf;

/// Where Debian's libibverbs-dev installs the header (override: `VRNIC_VERBS_H`).
const VERBS_H: &str = "/usr/include/infiniband/verbs.h";

fn main() {
    let out = PathBuf::from(env::var("OUT_DIR").expect("cargo sets OUT_DIR"));

    let header = env::var("VRNIC_VERBS_H").unwrap_or_else(|_| VERBS_H.to_string());
    println!("cargo:rerun-if-env-changed=VRNIC_VERBS_H");
    println!("cargo:rerun-if-changed={header}");
    if !std::path::Path::new(&header).exists() {
        panic!(
            "{header} not found: vrnic-ibverbs is generated from Debian's libibverbs-dev \
             (and bindgen needs libclang-dev); run scripts/deps.sh"
        );
    }
    let bindings = bindgen::Builder::default()
        .header(&header)
        .allowlist_type("ibv_.*|_ibv_.*|verbs_.*|ib_uverbs_.*")
        .allowlist_var("IBV_.*|IB_UVERBS_.*|VERBS_.*")
        .derive_default(true)
        .derive_debug(false)
        .layout_tests(true)
        .generate_comments(false)
        .generate()
        .expect("bindgen: generating bindings of verbs.h");
    bindings
        .write_to_file(out.join("verbs.rs"))
        .expect("writing verbs.rs");

    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libibverbs.so.1");
}
