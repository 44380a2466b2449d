//! Opening a table directory: a libple table (`table.json` + rows) or, failing that, a table made
//! by the Python tool (`<name>.packed_u8` + `<name>.packed_u8.json`, see `python_table.rs`).
//!
//! This is the one place that knows both kinds, so `table.rs` depends on neither the checkpoint
//! reader nor the Python-tool adapter.

use crate::error::{Error, Result};
use crate::format::checkpoint::read_config;
use crate::format::files::{MAX_TABLE_META, non_empty, read_text_capped};
use crate::format::python_table::{PY_ROWS_SUFFIX, find_python_table, python_table_meta};
use crate::format::table::{META_FILE, Table, TableMeta, TableOpenOptions};
use crate::model::{HashParams, ModelConfig};
use std::path::Path;

/// Checks that the table `meta` (in `dir`) serves the model of `cfg` (read from `path`): the
/// geometry (n-gram size, heads per n-gram, head dim, PLE layer index), then the hash parameters
/// derived from it. `Error::Format` names the first field that differs, with both values.
pub(super) fn check_config(
    meta: &TableMeta,
    cfg: &ModelConfig,
    dir: &Path,
    path: &Path,
) -> Result<()> {
    let bad = |field: &str, t: String, c: String| {
        Err(Error::Format(format!(
            "table {} does not fit {}: {field} is {t} in the table but {c} in the config",
            dir.display(),
            path.display()
        )))
    };
    let geometry = [
        ("ngram_size", meta.ngram_size as u64, cfg.ngram_size as u64),
        (
            "heads_per_ngram",
            meta.heads_per_ngram as u64,
            cfg.heads_per_ngram as u64,
        ),
        ("head_dim", meta.head_dim as u64, cfg.head_dim() as u64),
        ("ple_layer_index", meta.ple_layer_index, cfg.ple_layer_index),
    ];
    for (field, t, c) in geometry {
        if t != c {
            return bad(field, t.to_string(), c.to_string());
        }
    }
    let want = HashParams::derive(cfg);
    let h = &meta.hash;
    let fields = [
        (
            "vocab_size",
            format!("{}", h.vocab_size),
            format!("{}", want.vocab_size),
        ),
        (
            "eos_token_id",
            format!("{}", h.eos_token_id),
            format!("{}", want.eos_token_id),
        ),
        (
            "hash.multipliers",
            format!("{:?}", h.multipliers),
            format!("{:?}", want.multipliers),
        ),
        (
            "hash.head_sizes",
            format!("{:?}", h.head_sizes),
            format!("{:?}", want.head_sizes),
        ),
    ];
    for (field, t, c) in fields {
        if t != c {
            return bad(field, t, c);
        }
    }
    Ok(())
}

impl Table {
    /// Opens and validates the table in `dir`: `table.json` if present, else a Python-tool
    /// table. With `opts.checkpoint_dir`, the table must have been packed from that checkpoint;
    /// with `opts.config_json_path`, a libple table must have that config's geometry and hash
    /// ([`check_config`]; a Python-tool table takes its hash from it). Empty paths are
    /// [`Error::InvalidArgument`].
    pub fn open(dir: &Path, opts: &TableOpenOptions) -> Result<Table> {
        non_empty(dir, "table directory")?;
        if let Some(p) = &opts.checkpoint_dir {
            non_empty(p, "checkpoint_dir")?;
        }
        if let Some(p) = &opts.config_json_path {
            non_empty(p, "config_json_path")?;
        }
        if !dir.is_dir() {
            return Err(Error::io_path(
                "opening table directory",
                dir,
                std::io::Error::new(std::io::ErrorKind::NotFound, "no such directory"),
            ));
        }
        let meta_path = dir.join(META_FILE);
        let meta = if meta_path.exists() {
            let text = read_text_capped(&meta_path, MAX_TABLE_META)?;
            let meta = TableMeta::from_json(&text, &meta_path)?;
            if let Some(p) = &opts.config_json_path {
                check_config(&meta, &read_config(p)?, dir, p)?;
            }
            meta
        } else if let Some((rows, json)) = find_python_table(dir)? {
            python_table_meta(dir, &rows, &json, opts)?
        } else if let Some(idx) = crate::format::pack_layers::read_layers(dir)? {
            let dirs: Vec<String> = idx.layers.iter().map(|l| l.dir.clone()).collect();
            return Err(Error::Format(format!(
                "{} holds the tables of {} PLE layers ({}): open one layer's directory ({})",
                dir.display(),
                idx.layers.len(),
                crate::format::pack_layers::LAYERS_FILE,
                dirs.join(", ")
            )));
        } else {
            return Err(Error::Format(format!(
                "{} holds no packed table: {META_FILE} is missing and there is no <name>{PY_ROWS_SUFFIX} with <name>{PY_ROWS_SUFFIX}.json (pack a checkpoint with `ple pack`)",
                dir.display()
            )));
        };
        let t = Table::open_with_meta(dir, meta)?;
        if let Some(ck) = &opts.checkpoint_dir {
            t.check_source(ck, &crate::format::source::fingerprint(ck)?)?;
        }
        Ok(t)
    }
}
