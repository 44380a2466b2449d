//! Builds the SIGBUS-guarded row copy (`csrc/guard.c`, see `io::mmap::guard`).

fn main() {
    println!("cargo:rerun-if-changed=csrc/guard.c");
    cc::Build::new()
        .file("csrc/guard.c")
        .opt_level(3)
        .warnings(true)
        .compile("ple_guard");
}
