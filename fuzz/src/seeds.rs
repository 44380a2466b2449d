//! Seed inputs for each target: valid files made by the test kit (so mutations start from what
//! libple accepts) and a few hand-written edge cases. `scripts/fuzz.sh` writes them into
//! `fuzz/corpus/<target>/` (never committed) before fuzzing.

use ple_core::model::{ModelConfig, RowFormat};
use ple_testkit::synth::{self, CheckpointSpec};

/// The target names, in the order `scripts/fuzz.sh` runs them.
pub const TARGETS: [&str; 5] = [
    "safetensors_header",
    "checkpoint_dir",
    "table_json",
    "python_table_json",
    "batch_context",
];

/// Runs target `name` on `data`: `Some(accepted)`, `None` for an unknown name.
pub fn run(name: &str, data: &[u8]) -> Option<bool> {
    Some(match name {
        "safetensors_header" => crate::safetensors_header(data),
        "checkpoint_dir" => crate::checkpoint_dir(data),
        "table_json" => crate::table_json(data),
        "python_table_json" => crate::python_table_json(data),
        "batch_context" => crate::batch_context(data),
        _ => return None,
    })
}

/// The smallest config the hash accepts: 16 heads of primes 2..53 (381 rows), one shard.
fn tiny_config() -> ModelConfig {
    ModelConfig {
        ngram_vocab_size_base: 2,
        make_ngram_vocab_size_divisible_by: 1,
        split_ngram_parts: 1,
        ..ModelConfig::default()
    }
}

/// A single-file checkpoint of `format` with the tiny config: (safetensors bytes, config.json).
fn tiny_checkpoint(format: RowFormat, hash_tensors: bool) -> (Vec<u8>, Vec<u8>) {
    let d = std::env::temp_dir().join(format!("ple-fuzz-seed-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    let mut spec = CheckpointSpec::new(format, 2, 1, 5);
    spec.config = tiny_config();
    spec.single_file = true;
    if hash_tensors {
        spec = spec.with_hash_tensors();
    }
    let info = synth::write_checkpoint(&d, &spec).expect("tiny checkpoint");
    let file = std::fs::read(&info.files[0]).expect("read checkpoint");
    let config = std::fs::read(d.join("config.json")).expect("read config");
    let _ = std::fs::remove_dir_all(&d);
    (file, config)
}

fn with_len(json: &str, data: usize) -> Vec<u8> {
    let mut v = (json.len() as u64).to_le_bytes().to_vec();
    v.extend_from_slice(json.as_bytes());
    v.resize(v.len() + data, 0);
    v
}

/// The seed inputs of target `name`.
pub fn seeds(name: &str) -> Vec<Vec<u8>> {
    match name {
        "safetensors_header" => {
            let mut v = vec![
                with_len(
                    r#"{"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]}}"#,
                    4,
                ),
                with_len(
                    r#"{"__metadata__":{"k":"v"},"a":{"dtype":"F32","shape":[1,2],"data_offsets":[0,8]},"b":{"dtype":"F4","shape":[8],"data_offsets":[8,12]}}"#,
                    12,
                ),
            ];
            for f in [RowFormat::Nvfp4, RowFormat::Fp8] {
                v.push(tiny_checkpoint(f, false).0);
            }
            v
        }
        "checkpoint_dir" => {
            let mut v = Vec::new();
            for (f, ht) in [
                (RowFormat::Nvfp4, false),
                (RowFormat::Fp8, true),
                (RowFormat::Bf16, false),
                (RowFormat::F32, true),
            ] {
                let (file, config) = tiny_checkpoint(f, ht);
                for flags in [2u8, 3] {
                    let mut s = vec![flags, 0, 0, 0, 0];
                    s.extend_from_slice(&(config.len() as u16).to_le_bytes());
                    s.extend_from_slice(&config);
                    s.extend_from_slice(&file);
                    v.push(s);
                }
            }
            v
        }
        "table_json" => {
            let d = std::env::temp_dir().join(format!("ple-fuzz-seed-t-{}", std::process::id()));
            let mut v = Vec::new();
            for f in [RowFormat::Nvfp4, RowFormat::Bf16, RowFormat::F32] {
                let m = synth::write_table(&d, f, &tiny_config(), 1).expect("tiny table");
                v.push(serde_json::to_vec_pretty(&m).expect("json"));
            }
            let _ = std::fs::remove_dir_all(&d);
            v
        }
        "python_table_json" => {
            let py = br#"{"rows_per_shard": 381, "num_shards": 1, "row_width": 90, "codes_width": 80, "scales_width": 10, "total_rows": 381, "shard_dtype": "uint8", "snapshot": "ck", "global_scale": 0.015625}"#;
            let config = serde_json::to_vec(&serde_json::json!({
                "text_config": serde_json::to_value(tiny_config()).expect("config")
            }))
            .expect("json");
            let mut s = (py.len() as u16).to_le_bytes().to_vec();
            s.extend_from_slice(py);
            s.extend_from_slice(&config);
            vec![s]
        }
        "batch_context" => vec![
            vec![0, 0, 0, 0, 0, 3, 1, 2, 3, 0, 0, 0, 3, 15, 4, 5],
            vec![
                1, 3, 1, 2, 0, 1, 4, 9, 9, 15, 9, 1, 1, 1, 2, 2, 3, 6, 1, 7, 2, 2, 2,
            ],
            (0..200u16).map(|i| (i * 37 % 251) as u8).collect(),
        ],
        _ => Vec::new(),
    }
}
