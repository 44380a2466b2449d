//! The packed table (SPEC §6): a directory with one row file (row `r` at byte `r * row_bytes`, no
//! header, no padding) and one JSON metadata file. Opening maps the rows read-only, advises
//! MADV_RANDOM and validates every metadata field against the others and against the file size.

use crate::error::{Error, Result};
use crate::model::{HashParams, RowFormat};
use serde::{Deserialize, Serialize};
use std::fs::File;
use std::path::{Path, PathBuf};

/// Version of the metadata schema this library writes and reads.
pub const FORMAT_VERSION: u32 = 1;
/// Name of the metadata file in a table directory.
pub const META_FILE: &str = "table.json";
/// Name of the row file in a table directory.
pub const ROWS_FILE: &str = "table.rows";

/// Where the table came from.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SourceInfo {
    /// Checkpoint name (its directory name, or the snapshot name of a Python-tool table).
    pub name: String,
    /// Hex SHA-256 over the checkpoint's index file and the headers of its shards.
    pub fingerprint: String,
}

/// The metadata JSON of a table (`table.json`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TableMeta {
    pub format_version: u32,
    pub row_format: RowFormat,
    pub row_bytes: u32,
    pub code_bytes: u32,
    pub scale_bytes: u32,
    /// Rows in the row file: rows_per_shard × num_shards (≥ the rows the hash addresses).
    pub total_rows: u64,
    pub rows_per_shard: u64,
    pub num_shards: u32,
    pub head_dim: u32,
    pub num_heads: u32,
    pub ngram_size: u32,
    pub heads_per_ngram: u32,
    /// The global dequantisation scale (NVFP4 `weight_scale_2`, FP8 `weight_scale`; 1.0 for BF16).
    pub global_scale: f32,
    pub hash: HashParams,
    pub source: SourceInfo,
    /// File name of the row file, relative to the table directory.
    pub rows_file: String,
}

impl TableMeta {
    /// Checks every field against the others. Messages name the field and both values.
    pub fn validate(&self) -> Result<()> {
        let bad = |m: String| Err(Error::Format(format!("table metadata: {m}")));
        if self.format_version != FORMAT_VERSION {
            return bad(format!(
                "format_version is {}, this library reads {FORMAT_VERSION}",
                self.format_version
            ));
        }
        let hd = self.head_dim as usize;
        if hd == 0 || hd % 16 != 0 {
            return bad(format!(
                "head_dim {} is not a positive multiple of 16",
                self.head_dim
            ));
        }
        let f = self.row_format;
        if self.row_bytes as usize != f.row_bytes(hd) {
            return bad(format!(
                "row_bytes is {}, but {} rows of head_dim {hd} have {}",
                self.row_bytes,
                f.name(),
                f.row_bytes(hd)
            ));
        }
        if self.code_bytes as usize != f.code_bytes(hd) {
            return bad(format!(
                "code_bytes is {}, expected {} for {}",
                self.code_bytes,
                f.code_bytes(hd),
                f.name()
            ));
        }
        if self.scale_bytes as usize != f.scale_bytes(hd) {
            return bad(format!(
                "scale_bytes is {}, expected {} for {}",
                self.scale_bytes,
                f.scale_bytes(hd),
                f.name()
            ));
        }
        if self.ngram_size != self.hash.ngram_size {
            return bad(format!(
                "ngram_size is {} but hash.ngram_size is {}",
                self.ngram_size, self.hash.ngram_size
            ));
        }
        if self.heads_per_ngram != self.hash.heads_per_ngram {
            return bad(format!(
                "heads_per_ngram is {} but hash.heads_per_ngram is {}",
                self.heads_per_ngram, self.hash.heads_per_ngram
            ));
        }
        let heads = (self.ngram_size.saturating_sub(1)) * self.heads_per_ngram;
        if self.num_heads != heads {
            return bad(format!(
                "num_heads is {}, expected (ngram_size-1)*heads_per_ngram = {heads}",
                self.num_heads
            ));
        }
        if self.num_heads as usize != crate::model::NUM_HEADS || hd != crate::model::HEAD_DIM {
            return bad(format!(
                "num_heads {} × head_dim {} is not the model's 16 × 160 (the only shape the API serves)",
                self.num_heads, self.head_dim
            ));
        }
        self.hash.validate()?;
        if self.num_shards == 0 || self.rows_per_shard == 0 {
            return bad(format!(
                "num_shards {} / rows_per_shard {} must be positive",
                self.num_shards, self.rows_per_shard
            ));
        }
        let shard_rows = self.rows_per_shard.checked_mul(self.num_shards as u64);
        if shard_rows != Some(self.total_rows) {
            return bad(format!(
                "total_rows is {}, but rows_per_shard {} × num_shards {} = {:?}",
                self.total_rows, self.rows_per_shard, self.num_shards, shard_rows
            ));
        }
        let addressed = self.hash.addressed_rows();
        if self.total_rows < addressed {
            return bad(format!(
                "total_rows {} is less than the {addressed} rows the hash addresses",
                self.total_rows
            ));
        }
        if !(self.global_scale.is_finite() && self.global_scale > 0.0) {
            return bad(format!(
                "global_scale {} is not a positive finite number",
                self.global_scale
            ));
        }
        if self.row_format == RowFormat::Bf16 && self.global_scale != 1.0 {
            return bad(format!(
                "global_scale is {} for a bf16 table (must be 1.0)",
                self.global_scale
            ));
        }
        if self.rows_file.is_empty()
            || self.rows_file.contains('/')
            || self.rows_file.starts_with('.')
        {
            return bad(format!(
                "rows_file '{}' is not a plain file name",
                self.rows_file
            ));
        }
        Ok(())
    }

    /// Bytes the row file must have.
    pub fn file_bytes(&self) -> u64 {
        self.total_rows * self.row_bytes as u64
    }

    /// Parses and validates metadata JSON text.
    pub fn from_json(text: &str, what: &Path) -> Result<TableMeta> {
        let m: TableMeta = serde_json::from_str(text).map_err(|e| {
            Error::Format(format!("{}: not valid table metadata: {e}", what.display()))
        })?;
        m.validate()?;
        Ok(m)
    }
}

/// Options for [`Table::open`].
#[derive(Clone, Debug, Default)]
pub struct TableOpenOptions {
    /// For tables made by the Python tool: the checkpoint's config.json (else looked for beside the table).
    pub config_json_path: Option<PathBuf>,
    /// If set, the table must have been packed from this checkpoint (fingerprints compared).
    pub checkpoint_dir: Option<PathBuf>,
}

/// An open, validated packed table. The rows stay file-backed (reclaimable page cache).
pub struct Table {
    meta: TableMeta,
    dir: PathBuf,
    rows_path: PathBuf,
    file: File,
    map: memmap2::Mmap,
}

impl Table {
    /// Opens and validates the libple table in `dir`.
    pub fn open(dir: &Path, opts: &TableOpenOptions) -> Result<Table> {
        let meta_path = dir.join(META_FILE);
        if !dir.is_dir() {
            return Err(Error::io_path(
                "opening table directory",
                dir,
                std::io::Error::new(std::io::ErrorKind::NotFound, "no such directory"),
            ));
        }
        if !meta_path.exists() {
            return Err(Error::Format(format!(
                "{} holds no packed table: {META_FILE} is missing (pack a checkpoint with `ple pack`)",
                dir.display()
            )));
        }
        let text = std::fs::read_to_string(&meta_path)
            .map_err(|e| Error::io_path("reading", &meta_path, e))?;
        let meta = TableMeta::from_json(&text, &meta_path)?;
        let t = Table::open_with_meta(dir, meta)?;
        if let Some(ck) = &opts.checkpoint_dir {
            t.check_source(ck)?;
        }
        Ok(t)
    }

    /// Maps the row file named by `meta` in `dir`, checking its size.
    pub fn open_with_meta(dir: &Path, meta: TableMeta) -> Result<Table> {
        meta.validate()?;
        let rows_path = dir.join(&meta.rows_file);
        let file = File::open(&rows_path)
            .map_err(|e| Error::io_path("opening row file", &rows_path, e))?;
        let size = file
            .metadata()
            .map_err(|e| Error::io_path("stat", &rows_path, e))?
            .len();
        if size != meta.file_bytes() {
            return Err(Error::Format(format!(
                "{}: file size is {size} bytes, metadata says total_rows {} × row_bytes {} = {} (truncated or wrong file)",
                rows_path.display(),
                meta.total_rows,
                meta.row_bytes,
                meta.file_bytes()
            )));
        }
        // SAFETY: the mapping is read-only; the packer never modifies a published file in place
        // (it writes a new file and renames it), so the bytes under this mapping do not change.
        let map = unsafe { memmap2::MmapOptions::new().map(&file) }
            .map_err(|e| Error::io_path("mmap", &rows_path, e))?;
        map.advise(memmap2::Advice::Random)
            .map_err(|e| Error::io_path("madvise(MADV_RANDOM)", &rows_path, e))?;
        Ok(Table {
            meta,
            dir: dir.to_path_buf(),
            rows_path,
            file,
            map,
        })
    }

    /// Refuses the table unless it was packed from the checkpoint in `ck`.
    pub fn check_source(&self, ck: &Path) -> Result<()> {
        let fp = crate::checkpoint::fingerprint(ck)?;
        if fp != self.meta.source.fingerprint {
            return Err(Error::Format(format!(
                "table {} was packed from '{}' (fingerprint {}), not from {} (fingerprint {fp})",
                self.dir.display(),
                self.meta.source.name,
                self.meta.source.fingerprint,
                ck.display()
            )));
        }
        Ok(())
    }

    pub fn meta(&self) -> &TableMeta {
        &self.meta
    }
    pub fn dir(&self) -> &Path {
        &self.dir
    }
    pub fn rows_path(&self) -> &Path {
        &self.rows_path
    }
    pub fn file(&self) -> &File {
        &self.file
    }
    pub fn format(&self) -> RowFormat {
        self.meta.row_format
    }
    pub fn row_bytes(&self) -> usize {
        self.meta.row_bytes as usize
    }
    pub fn global_scale(&self) -> f32 {
        self.meta.global_scale
    }
    pub fn hash_params(&self) -> &HashParams {
        &self.meta.hash
    }
    /// The whole mapped row file.
    pub fn bytes(&self) -> &[u8] {
        &self.map
    }
    /// Row `r` (panics if `r >= total_rows`; row ids from the hasher are always in range).
    pub fn row(&self, r: u64) -> &[u8] {
        let rb = self.row_bytes();
        let o = r as usize * rb;
        &self.map[o..o + rb]
    }
}
