//! Build script of vrnic's librdmacm.so.1:
//! 1. Rust bindings of Debian's `<rdma/rdma_cma.h>` and `<rdma/rsocket.h>` (librdmacm-dev 44)
//!    with bindgen (`$OUT_DIR/rdma_cma.rs`, included by `src/ffi.rs`). The `ibv_*` types those
//!    headers reference (`ibv_context`, `ibv_qp_init_attr`, `ibv_ah_attr`, ...) come from the same
//!    run: vrnic-ibverbs' `ffi` is generated from the same `<infiniband/verbs.h>`, but depending
//!    on that crate would link the whole verbs library (and its exports) into this one, which
//!    must instead reach verbs through whatever `libibverbs.so.1` the process loaded.
//! 2. One versioned export per line of `librdmacm.map` (`$OUT_DIR/exports.rs`, included by
//!    `src/symbols.rs`), the map as the cdylib's version script (nodes RDMACM_1.0 ... 1.3), the
//!    soname `librdmacm.so.1`, and `NEEDED libibverbs.so.1`, as rdma-core's librdmacm has.
//! 3. The rsocket API: rdma-core v44.0's `librdmacm/rsocket.c` with `indexer.c` and
//!    `util/util.c`, vendored unchanged under `vendor/rdma-core/` (its README says what and why),
//!    compiled with the `cc` crate into a static library linked into the cdylib. Each file is
//!    compiled with `vendor/rdma-core/vrnic/names.h` included first, which renames the 27
//!    public functions `vrnic_rs_<name>` (hidden), the targets of `src/symbols.rs`'s versioned
//!    trampolines; the few librdmacm internals rsocket.c calls (`ucma_init`, `ucma_complete`, ...)
//!    are Rust (`src/internals.rs`).

use std::env;
use std::fmt::Write as _;
use std::fs;
use std::path::PathBuf;

/// Where Debian's librdmacm-dev installs the headers (override the directory: `VRNIC_RDMA_INCLUDE`).
const RDMA_INCLUDE: &str = "/usr/include/rdma";

fn main() {
    let out = PathBuf::from(env::var("OUT_DIR").expect("cargo sets OUT_DIR"));
    let dir = PathBuf::from(env::var("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR"));

    let inc = env::var("VRNIC_RDMA_INCLUDE").unwrap_or_else(|_| RDMA_INCLUDE.to_string());
    println!("cargo:rerun-if-env-changed=VRNIC_RDMA_INCLUDE");
    let headers = ["rdma_cma.h", "rsocket.h"].map(|h| format!("{inc}/{h}"));
    for h in &headers {
        println!("cargo:rerun-if-changed={h}");
        if !std::path::Path::new(h).exists() {
            panic!(
                "{h} not found: vrnic-rdmacm is generated from Debian's librdmacm-dev \
                 (and bindgen needs libclang-dev); run scripts/deps.sh"
            );
        }
    }
    let wrapper: String = headers
        .iter()
        .map(|h| format!("#include \"{h}\"\n"))
        .collect();
    let bindings = bindgen::Builder::default()
        .header_contents("vrnic_rdmacm.h", &wrapper)
        .allowlist_type(
            "rdma_.*|ibv_path_data|ibv_sa_path_rec|ibv_qp_init_attr(_ex)?|ibv_srq_init_attr(_ex)?\
             |ibv_qp_attr|ibv_ece|ibv_event_type|ibv_device|ibv_device_attr|ibv_port_attr\
             |ibv_qp_attr_mask|ibv_qp_state|ibv_transport_type|ibv_qp_init_attr_mask\
             |ibv_srq_init_attr_mask|ibv_srq_type|ibv_ah_attr|ibv_srq|ibv_cq|ibv_comp_channel",
        )
        .allowlist_var("RDMA_.*|RAI_.*|SOL_RDMA")
        // The few libc types the signatures need are libc's.
        .blocklist_type("sockaddr|sockaddr_in|sockaddr_in6|sockaddr_storage|socklen_t|msghdr|iovec|pollfd|nfds_t|fd_set|timeval|sa_family_t|in_addr|in6_addr|in_port_t|in_addr_t")
        .raw_line("pub use libc::{sockaddr, sockaddr_in, sockaddr_in6, sockaddr_storage, socklen_t};")
        .prepend_enum_name(false)
        .derive_default(true)
        .derive_debug(false)
        .layout_tests(true)
        .generate_comments(false)
        .generate()
        .expect("bindgen: generating bindings of rdma_cma.h and rsocket.h");
    bindings
        .write_to_file(out.join("rdma_cma.rs"))
        .expect("writing rdma_cma.rs");

    let map = dir.join("librdmacm.map");
    println!("cargo:rerun-if-changed={}", map.display());
    let text = fs::read_to_string(&map).expect("reading librdmacm.map");
    fs::write(out.join("exports.rs"), exports(&text)).expect("writing exports.rs");
    println!(
        "cargo:rustc-cdylib-link-arg=-Wl,--version-script={}",
        map.display()
    );
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,librdmacm.so.1");
    // `rdma_get_devices(3)` goes through the process's libibverbs.so.1
    // (vrnic's or rdma-core's), linked like rdma-core's librdmacm links it.
    println!("cargo:rustc-link-lib=dylib=ibverbs");

    rsocket(&dir, &out);
}

/// Compiles the vendored rsocket implementation (see the module
/// documentation, item 3) into `libvrnic_rsocket.a`. rdma-core's build
/// puts `buildlib/fixup-include/valgrind-memcheck.h` at
/// `<valgrind/memcheck.h>` when valgrind's headers are absent; so does
/// this, always (the stubs: no valgrind client requests).
fn rsocket(dir: &std::path::Path, out: &std::path::Path) {
    let vendor = dir.join("vendor/rdma-core");
    println!("cargo:rerun-if-changed={}", vendor.display());
    let fixup = out.join("fixup-include");
    fs::create_dir_all(fixup.join("valgrind")).expect("creating fixup-include/valgrind");
    fs::copy(
        vendor.join("buildlib/fixup-include/valgrind-memcheck.h"),
        fixup.join("valgrind/memcheck.h"),
    )
    .expect("copying valgrind-memcheck.h");
    cc::Build::new()
        .files(
            ["librdmacm/rsocket.c", "librdmacm/indexer.c", "util/util.c"].map(|f| vendor.join(f)),
        )
        .include(vendor.join("vrnic"))
        .include(&vendor)
        .include(vendor.join("librdmacm"))
        .include(&fixup)
        .flag("-std=gnu11")
        .flag("-include")
        .flag(vendor.join("vrnic/names.h").to_str().expect("a UTF-8 path"))
        // As rdma-core builds it; hidden: nothing of it is exported but
        // through the trampolines (and rustc's `local: *` would hide it anyway).
        .flag("-fno-strict-aliasing")
        .flag("-fvisibility=hidden")
        .define("_FILE_OFFSET_BITS", "64")
        // rdma-core's own warning set is not this crate's business: the
        // files are compiled as they are.
        .warnings(false)
        .try_compile("vrnic_rsocket")
        .unwrap_or_else(|e| {
            panic!(
                "compiling the vendored rsocket.c: {e}\n(vrnic-rdmacm needs a C compiler, gcc, \
                 and Debian's librdmacm-dev/libibverbs-dev headers: run scripts/deps.sh)"
            )
        });
}

/// One `export!` per symbol line of the version script (librdmacm has no
/// compatibility versions and no data symbols; a map that grew them would
/// need vrnic-ibverbs' `export_compat!`/`export_object!`).
fn exports(map: &str) -> String {
    let mut node = String::new();
    let mut s = String::from("// Generated by build.rs from librdmacm.map.\n");
    for line in map.lines() {
        let t = line.trim();
        if let Some(n) = t.strip_suffix('{').map(str::trim) {
            node = n.to_string();
            continue;
        }
        let (sym, comment) = match t.split_once(';') {
            Some((sym, rest)) => (sym.trim(), rest),
            None => continue,
        };
        if sym.is_empty() || sym.contains([' ', ':', '*', '}']) {
            continue;
        }
        assert!(
            !comment.contains("compat") && !comment.contains("object"),
            "librdmacm.map: {sym} is a compat version or an object; build.rs does not export those"
        );
        let tramp = format!("vrnic_sym_{sym}_{}", node.replace('.', "_"));
        writeln!(s, "export!({sym}, \"{tramp}\", \"{sym}@@{node}\");").unwrap();
    }
    s
}
