//! Generates the C header with cbindgen into OUT_DIR (a test compares it with the committed
//! `include/ple.h`) and gives `libple.so` its SONAME.

use std::env;
use std::path::PathBuf;

/// The C API's source files, in header order.
const SECTIONS: &[&str] = &[
    "status.rs",
    "types.rs",
    "version.rs",
    "boundary.rs",
    "log.rs",
    "handle.rs",
    "step.rs",
    "gpu.rs",
    "pack.rs",
];

fn main() {
    let crate_dir = PathBuf::from(env::var("CARGO_MANIFEST_DIR").unwrap());
    let out_dir = PathBuf::from(env::var("OUT_DIR").unwrap());
    let major = env::var("CARGO_PKG_VERSION_MAJOR").unwrap();
    let minor = env::var("CARGO_PKG_VERSION_MINOR").unwrap();

    // cargo-c rule: while at 0.x the ABI may change with the minor version.
    let soname = if major == "0" {
        format!("libple.so.0.{minor}")
    } else {
        format!("libple.so.{major}")
    };
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,{soname}");
    println!("cargo:rustc-env=PLE_SONAME={soname}");

    println!("cargo:rerun-if-changed=src");
    println!("cargo:rerun-if-changed=cbindgen.toml");
    let config =
        cbindgen::Config::from_file(crate_dir.join("cbindgen.toml")).expect("cbindgen.toml");
    let header = out_dir.join("ple.h");
    // The header's sections, in this order: one source file each.
    let mut b = cbindgen::Builder::new().with_config(config);
    for f in SECTIONS {
        b = b.with_src(crate_dir.join("src").join(f));
    }
    b.generate()
        .expect("cbindgen failed on the C API sources")
        .write_to_file(&header);
}
