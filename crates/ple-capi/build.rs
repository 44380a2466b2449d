//! Generates the C header with cbindgen into OUT_DIR (a test compares it with the committed
//! `include/ple.h`), generates the C counters struct from the core's counter list (see
//! [`counters_source`]), and gives `libple.so` its SONAME.

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
    "ids.rs",
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
    println!("cargo:rerun-if-changed={COUNTER_LIST}");
    let list = std::fs::read_to_string(crate_dir.join(COUNTER_LIST)).expect("the counter list");
    let counters = out_dir.join("ple_counters.rs");
    std::fs::write(&counters, counters_source(&list)).expect("writing ple_counters.rs");
    let config =
        cbindgen::Config::from_file(crate_dir.join("cbindgen.toml")).expect("cbindgen.toml");
    let header = out_dir.join("ple.h");
    // The header's sections, in this order: one source file each.
    let mut b = cbindgen::Builder::new().with_config(config);
    let mut all_enums = Vec::new();
    for f in SECTIONS {
        let src = crate_dir.join("src").join(f);
        let text = std::fs::read_to_string(&src).expect("a C API source file");
        b = b.with_src(&src);
        // the file's `c_enum!` lists, written out as plain enums for cbindgen
        let (enums, names) = c_enums_source(&text);
        if !names.is_empty() {
            let enums_file = out_dir.join(format!("c_enums_{f}"));
            std::fs::write(&enums_file, enums).expect("writing the C enums");
            b = b.with_src(&enums_file);
            for n in &names {
                b = b.include_item(n);
            }
            all_enums.extend(names);
        }
        if *f == "types.rs" {
            b = b.with_src(&counters);
        }
    }
    let mut text = Vec::new();
    b.generate()
        .expect("cbindgen failed on the C API sources")
        .write(&mut text);
    let text = String::from_utf8(text).expect("cbindgen writes UTF-8");
    let text = with_typedefs_beside_enums(&text, &all_enums);
    std::fs::write(&header, with_banners(&text)).expect("writing the generated header");
}

/// The header's section banners: (title, the line that starts the section's first item). cbindgen
/// orders items by kind (constants, types, functions), so the sections follow that order.
const BANNERS: &[(&str, &str)] = &[
    ("Versions and limits", "#define PLE_VERSION_MAJOR"),
    (
        "Status codes and the values of the typed fields (PLE_FORMAT_*, PLE_IO_*, ...)",
        "typedef int32_t ple_status;",
    ),
    (
        "Types: handle, options, table facts, counters, batches, callbacks",
        "typedef struct ple_handle",
    ),
    (
        "Values of the flag fields and arguments (PLE_FUSE_*)",
        "#define PLE_FUSE_ACCUMULATE",
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

/// The first line of the item at line `at`: back over its doc comment (`//` lines), if any.
fn item_start(lines: &[String], at: usize) -> usize {
    // back over the item's doc comment (`// ...` lines: cbindgen's c99 style)
    let mut start = at;
    while start > 0 && lines[start - 1].starts_with("//") {
        start -= 1;
    }
    start
}

/// Moves the typedef of each `c_enum!` (`typedef int32_t ple_x;` for the enum `ple_x_code`), with
/// its doc, to just before the enum: cbindgen puts the enums first and each typedef before its
/// first use, and the values belong beside their type.
fn with_typedefs_beside_enums(text: &str, enums: &[String]) -> String {
    let mut lines: Vec<String> = text.lines().map(str::to_owned).collect();
    for e in enums {
        let ty = e
            .strip_suffix("_code")
            .unwrap_or_else(|| panic!("{e}: not NAME_code"));
        let def = lines
            .iter()
            .position(|l| l.starts_with("typedef ") && l.ends_with(&format!(" {ty};")))
            .unwrap_or_else(|| panic!("no typedef of {ty} in the header"));
        let block: Vec<String> = lines.drain(item_start(&lines, def)..=def).collect();
        let at = lines
            .iter()
            .position(|l| l.starts_with(&format!("typedef enum {e} ")))
            .unwrap_or_else(|| panic!("no enum {e} in the header"));
        let at = item_start(&lines, at);
        // drop the blank line the typedef leaves behind, keep one between typedef and enum
        let _ = lines.splice(at..at, block.into_iter().chain([String::new()]));
    }
    let mut out = lines.join("\n");
    out = out.replace("\n\n\n", "\n\n");
    out.push('\n');
    out
}

/// Inserts a banner before the doc comment of each section's first item (the generated header
/// stays generated: the banners come from [`BANNERS`], and a missing anchor fails the build).
fn with_banners(text: &str) -> String {
    let mut lines: Vec<String> = text.lines().map(str::to_owned).collect();
    for (title, anchor) in BANNERS.iter().rev() {
        let at = lines
            .iter()
            .position(|l| l.starts_with(anchor))
            .unwrap_or_else(|| panic!("header banner anchor {anchor:?} not found"));
        let start = item_start(&lines, at);
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

/// The core's counter list (`KIND NAME,` lines after their doc lines; see its header).
const COUNTER_LIST: &str = "../ple-core/src/stats/counter_list.rs";

/// Rust source of the C struct `ple_stats` (`ple_counters` in C: `struct_size`, then a `uint64_t`
/// per counter of `list`, in order, with its doc) and of `counters_to_c`. types.rs `include!`s it;
/// cbindgen reads it as one of the header's sources.
fn counters_source(list: &str) -> String {
    let body = list
        .split_once("counters! {")
        .and_then(|(_, b)| b.rsplit_once('}'))
        .expect("counter list: no `counters! { ... }`")
        .0;
    let mut fields = String::new();
    let mut convert = String::new();
    let mut doc = Vec::new();
    for line in body.lines().map(str::trim).filter(|l| !l.is_empty()) {
        if let Some(d) = line.strip_prefix("///") {
            doc.push(d.strip_prefix(' ').unwrap_or(d).to_owned());
            continue;
        }
        let entry = line
            .strip_suffix(',')
            .unwrap_or_else(|| panic!("counter list: {line:?}"));
        let mut words = entry.split_whitespace();
        let (Some(kind), Some(name)) = (words.next(), words.next()) else {
            panic!("counter list: {line:?} is not `KIND NAME,`");
        };
        assert!(
            matches!(kind, "sum" | "demand" | "process"),
            "counter list: unknown kind in {line:?}"
        );
        assert!(!doc.is_empty(), "counter list: {name} has no doc");
        for d in doc.drain(..) {
            fields.push_str(&format!("    /// {d}\n").replace("/// \n", "///\n"));
        }
        fields.push_str(&format!("    pub {name}: u64,\n"));
        convert.push_str(&format!("        {name}: k.{name},\n"));
    }
    format!(
        "// Generated by ple-capi's build.rs from {COUNTER_LIST}. Do not edit.

/// Cumulative counters of a handle, filled by `ple_stats()` (named `ple_counters` in C). Times
/// are nanoseconds.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct ple_stats {{
    /// Set by the caller to `sizeof(ple_counters)`.
    pub struct_size: usize,
{fields}}}

/// `ple_counters` from the core's counters.
pub fn counters_to_c(k: &ple_core::stats::Counters) -> ple_stats {{
    ple_stats {{
        struct_size: std::mem::size_of::<ple_stats>(),
{convert}    }}
}}
"
    )
}

/// The `c_enum!` lists of a source file (see c_enum.rs) as plain `#[repr(C)]` enums,
/// with their docs, and the enums' names: cbindgen does not expand macros, so it reads these.
fn c_enums_source(text: &str) -> (String, Vec<String>) {
    let mut out = String::new();
    let mut names = Vec::new();
    let mut doc = String::new();
    let mut inside = false;
    for line in text.lines() {
        let t = line.trim();
        if t.is_empty() || (t.starts_with("//") && !t.starts_with("///")) {
            continue;
        }
        if !inside {
            inside = t == "c_enum! {";
            continue;
        }
        if let Some(d) = t.strip_prefix("///") {
            doc.push_str(&format!("///{d}\n"));
        } else if let Some(head) = t.strip_prefix("enum ") {
            let name = head.split(':').next().expect("enum NAME: ...").trim();
            out.push_str(&format!("{doc}#[repr(C)]\npub enum {name} {{\n"));
            names.push(name.to_owned());
            doc.clear();
        } else if t == "}" && line.starts_with('}') {
            inside = false;
        } else if t == "}" {
            out.push_str("}\n\n");
        } else {
            // `NAME = VALUE [=> (CORE)],`: cbindgen needs `NAME = VALUE,`
            let entry = t
                .strip_suffix(',')
                .unwrap_or_else(|| panic!("c_enum!: {t:?}"));
            let value = entry.split(" => ").next().unwrap_or(entry);
            assert!(
                value.contains(" = "),
                "c_enum!: {t:?} is not `NAME = VALUE [=> (CORE)],`"
            );
            out.push_str(&format!("{doc}{value},\n"));
            doc.clear();
        }
    }
    (out, names)
}
