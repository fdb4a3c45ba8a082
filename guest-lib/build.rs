//! Build script of vrnic-guest: Rust bindings of the kernel's rdma_ucm ABI,
//! `<rdma/rdma_user_cm.h>` (Debian's linux-libc-dev), with bindgen
//! (`$OUT_DIR/rdma_user_cm.rs`, included by `src/agent/ucma/abi.rs`). The
//! agent's connection manager speaks this ABI to vrnic's `librdmacm.so.1`
//! (docs/ARCHITECTURE.md, "librdmacm.so.1").

use std::env;
use std::path::PathBuf;

/// Where linux-libc-dev installs the header (override the directory:
/// `VRNIC_RDMA_INCLUDE`).
const RDMA_INCLUDE: &str = "/usr/include/rdma";

fn main() {
    let out = PathBuf::from(env::var("OUT_DIR").expect("cargo sets OUT_DIR"));
    let inc = env::var("VRNIC_RDMA_INCLUDE").unwrap_or_else(|_| RDMA_INCLUDE.to_string());
    println!("cargo:rerun-if-env-changed=VRNIC_RDMA_INCLUDE");
    let header = format!("{inc}/rdma_user_cm.h");
    println!("cargo:rerun-if-changed={header}");
    if !std::path::Path::new(&header).exists() {
        panic!(
            "{header} not found: the rdma_ucm ABI is generated from linux-libc-dev's header \
             (and bindgen needs libclang-dev); run scripts/deps.sh"
        );
    }
    let bindings = bindgen::Builder::default()
        .header_contents("vrnic_ucma.h", &format!("#include \"{header}\"\n"))
        .allowlist_type("rdma_ucm_.*|ib_user_path_rec|ib_path_rec_data|ib_uverbs_ah_attr|ib_uverbs_global_route|ib_uverbs_qp_attr")
        .allowlist_var("RDMA_.*|UCMA_.*")
        .prepend_enum_name(false)
        .derive_default(true)
        .derive_debug(false)
        .layout_tests(true)
        .generate_comments(false)
        .generate()
        .expect("bindgen: generating bindings of rdma_user_cm.h");
    bindings
        .write_to_file(out.join("rdma_user_cm.rs"))
        .expect("writing rdma_user_cm.rs");
}
