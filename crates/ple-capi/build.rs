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
    let mut text = Vec::new();
    b.generate()
        .expect("cbindgen failed on the C API sources")
        .write(&mut text);
    let text = String::from_utf8(text).expect("cbindgen writes UTF-8");
    std::fs::write(&header, with_banners(&text)).expect("writing the generated header");
}

/// The header's section banners: (title, the line that starts the section's first item). cbindgen
/// orders items by kind (constants, types, functions), so the sections follow that order.
const BANNERS: &[(&str, &str)] = &[
    ("Versions and limits", "#define PLE_VERSION_MAJOR"),
    ("Status codes", "typedef enum ple_status_code"),
    (
        "Types: handle, options, table facts, counters, batches, callbacks",
        "typedef struct ple_handle",
    ),
    (
        "Values of the typed fields and arguments (PLE_FORMAT_*, PLE_DTYPE_*, ...)",
        "#define PLE_FORMAT_NVFP4",
    ),
    (
        "Errors, versions and logging",
        "const char *ple_status_name(",
    ),
    (
        "Handles: open, close, table facts, counters",
        "ple_status ple_options_default(",
    ),
    (
        "Steps: submit, wait, host views, CPU dequant, row ids",
        "ple_status ple_submit(",
    ),
    (
        "GPU: fused dequant, CUDA Graph mode, device errors",
        "ple_status ple_dequant_fuse(",
    ),
    (
        "Packing a checkpoint into a table",
        "ple_status ple_pack_options_default(",
    ),
];

/// Inserts a banner before the doc comment of each section's first item (the generated header
/// stays generated: the banners come from [`BANNERS`], and a missing anchor fails the build).
fn with_banners(text: &str) -> String {
    let mut lines: Vec<String> = text.lines().map(str::to_owned).collect();
    for (title, anchor) in BANNERS.iter().rev() {
        let at = lines
            .iter()
            .position(|l| l.starts_with(anchor))
            .unwrap_or_else(|| panic!("header banner anchor {anchor:?} not found"));
        // back over the item's doc comment (`// ...` lines: cbindgen's c99 style)
        let mut start = at;
        while start > 0 && lines[start - 1].starts_with("//") {
            start -= 1;
        }
        let rule = "/* ".to_owned() + &"=".repeat(94);
        lines.splice(
            start..start,
            [
                rule.clone(),
                format!(" * {title}"),
                " * ".to_owned() + &"=".repeat(94) + " */",
                String::new(),
            ],
        );
    }
    let mut out = lines.join("\n");
    out.push('\n');
    out
}
