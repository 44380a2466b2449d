//! Opening a table directory: a libple table (`table.json` + rows) or, failing that, a table made
//! by the Python tool (`<name>.packed_u8` + `<name>.packed_u8.json`, see `python_table.rs`).
//!
//! This is the one place that knows both kinds, so `table.rs` depends on neither the checkpoint
//! reader nor the Python-tool adapter.

use crate::error::{Error, Result};
use crate::format::files::{MAX_TABLE_META, non_empty, read_text_capped};
use crate::format::python_table::{PY_ROWS_SUFFIX, find_python_table, python_table_meta};
use crate::format::table::{META_FILE, Table, TableMeta, TableOpenOptions};
use std::path::Path;

impl Table {
    /// Opens and validates the table in `dir`: `table.json` if present, else a Python-tool
    /// table. With `opts.checkpoint_dir`, the table must have been packed from that checkpoint.
    /// Empty paths are [`Error::InvalidArgument`].
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
            TableMeta::from_json(&text, &meta_path)?
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
            t.check_source(ck)?;
        }
        Ok(t)
    }
}
