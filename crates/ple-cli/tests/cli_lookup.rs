//! `ple lookup` against the hash test vector of docs/FORMAT.md, on a table with the real model's shape and hash
//! parameters (sparse row file).

use std::process::Command;

const SPEC_VECTOR: [i64; 16] = [
    16410909, 39682429, 55103279, 60931720, 87006904, 116506179, 131512017, 152932897, 169641436,
    182022480, 209277433, 237891023, 256841529, 277007269, 290665954, 300984276,
];

#[test]
fn lookup_prints_the_spec_vector() {
    let d = tempfile::tempdir().unwrap();
    ple_testkit::synth::write_sparse_full_table(d.path(), ple_core::model::RowFormat::Nvfp4)
        .unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_ple"))
        .args([
            "lookup",
            d.path().to_str().unwrap(),
            "--tokens",
            "9707,11,248044,9707",
            "--json",
        ])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let ids: Vec<Vec<i64>> = serde_json::from_value(v["ids"].clone()).unwrap();
    assert_eq!(ids.len(), 4);
    assert_eq!(ids[0], SPEC_VECTOR);
    // after an EOS the context is cut: 9707 at position 3 has context (EOS, EOS) again
    assert_eq!(ids[3], SPEC_VECTOR);
    assert_ne!(ids[1], SPEC_VECTOR);

    let text = Command::new(env!("CARGO_BIN_EXE_ple"))
        .args(["lookup", d.path().to_str().unwrap(), "--tokens", "9707"])
        .output()
        .unwrap();
    let line = String::from_utf8(text.stdout).unwrap();
    let want: Vec<String> = SPEC_VECTOR.iter().map(|i| i.to_string()).collect();
    assert_eq!(line.trim(), format!("0\t9707\t{}", want.join(" ")));
}

#[test]
fn lookup_refuses_bad_tokens() {
    let d = tempfile::tempdir().unwrap();
    ple_testkit::synth::write_sparse_full_table(d.path(), ple_core::model::RowFormat::Fp8).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_ple"))
        .args(["lookup", d.path().to_str().unwrap(), "--tokens", "5,248320"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("248320") && err.contains("position 1"),
        "{err}"
    );
}
