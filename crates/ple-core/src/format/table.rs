//! The packed table (`docs/FORMAT.md#the-packed-table`): a directory with one row file (row `r`
//! at byte `r * row_bytes`, no header, no padding) and one JSON metadata file. Opening maps the
//! rows read-only, advises MADV_RANDOM and validates every metadata field against the others and
//! against the file size. Opening a directory (which may also hold a Python-tool table) is
//! [`Table::open`], in `format/open.rs`.

use crate::error::{Error, Result};
use crate::format::files::open_regular;
use crate::model::{HashParams, MAX_EMBED_DIM, MAX_HEADS, RowFormat, RowSpec};
use crate::shard::Shard;
use serde::{Deserialize, Serialize};
use std::fs::File;
use std::path::{Path, PathBuf};

/// Version of the metadata schema this library writes and reads.
pub const FORMAT_VERSION: u32 = 1;
/// Name of the metadata file in a table directory.
pub const META_FILE: &str = "table.json";
/// Name of the row file in a table directory.
pub const ROWS_FILE: &str = "table.rows";

/// Largest row file: 2^48 bytes (256 TiB), so every byte offset fits an `i64` / `off_t` and a
/// row id times `row_bytes` never overflows.
pub const MAX_FILE_BYTES: u64 = 1 << 48;

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
    /// Index of the checkpoint's PLE layer among its PLE layers (`ple_layer_index`): the hash
    /// parameters were derived with it. Absent in tables written before 0.3: 0.
    #[serde(default)]
    pub ple_layer_index: u64,
    /// The global dequantisation scale (NVFP4 `weight_scale_2`, FP8 `weight_scale`; 1.0 for BF16 and F32).
    pub global_scale: f32,
    pub hash: HashParams,
    pub source: SourceInfo,
    /// File name of the row file, relative to the table directory.
    pub rows_file: String,
    /// A shard table (`ple pack --shard K/N`): which heads' rows the file holds. Absent for the
    /// whole table. Every other field is the whole table's (`source` too: its fingerprint
    /// identifies the whole table), except `total_rows`, the rows of this file.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shard: Option<ShardMeta>,
}

/// The head layout of shard tables this library writes and reads (`crate::shard`).
pub const SHARD_LAYOUT: &str = "round_robin";

/// What a shard table's file holds (`docs/FORMAT.md#head-shards`): the heads `head_ids` of shard
/// `index` of `count` (round-robin: `index, index + count, …`), each head's rows of the whole
/// table (`row_ranges`, in head order) one after another.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ShardMeta {
    pub index: u32,
    pub count: u32,
    /// [`SHARD_LAYOUT`]. Absent in shard tables packed with contiguous heads (before round-robin
    /// shards): those are refused, never read as the new layout.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub layout: Option<String>,
    /// The heads the file holds, in order.
    #[serde(default)]
    pub head_ids: Vec<u32>,
    /// The whole table's rows `[start, end)` of each head of `head_ids`; the file's rows are
    /// these ranges one after another.
    #[serde(default)]
    pub row_ranges: Vec<[u64; 2]>,
    /// `total_rows` of the whole table (`rows_per_shard × num_shards`).
    pub whole_total_rows: u64,
}

impl ShardMeta {
    /// The metadata of shard `s` (of 2 or more) of the whole table `whole`.
    pub fn of(whole: &TableMeta, s: Shard) -> ShardMeta {
        ShardMeta {
            index: s.index,
            count: s.count,
            layout: Some(SHARD_LAYOUT.into()),
            head_ids: s
                .heads(whole.num_heads as usize)
                .iter()
                .map(|h| h as u32)
                .collect(),
            row_ranges: s
                .row_ranges(&whole.hash, whole.total_rows)
                .into_iter()
                .map(|r| [r.start, r.end])
                .collect(),
            whole_total_rows: whole.total_rows,
        }
    }

    /// The shard, as options name it.
    pub fn shard(&self) -> Shard {
        Shard {
            index: self.index,
            count: self.count,
        }
    }

    /// Checks the shard record against the table's other fields (`m.total_rows` is the file's).
    fn validate(&self, m: &TableMeta) -> Result<()> {
        let bad = |x: String| Err(Error::Format(format!("table metadata: shard: {x}")));
        let s = match Shard::new(self.index, self.count) {
            Ok(s) if self.count >= 2 => s,
            _ => {
                return bad(format!(
                    "index {} of count {} is not a shard of 2 to 16",
                    self.index, self.count
                ));
            }
        };
        if self.layout.as_deref() != Some(SHARD_LAYOUT) {
            return bad(format!(
                "a shard table of layout {}: this library reads only \"{SHARD_LAYOUT}\" shards \
                 (heads {}, {}, ...); re-pack it with `ple pack CHECKPOINT OUT --shard {}/{}`",
                self.layout
                    .as_deref()
                    .unwrap_or("contiguous (no layout field)"),
                self.index,
                self.index + self.count,
                self.index,
                self.count
            ));
        }
        let want = ShardMeta::of(
            &TableMeta {
                total_rows: self.whole_total_rows,
                shard: None,
                ..m.clone()
            },
            s,
        );
        if self.head_ids != want.head_ids {
            return bad(format!(
                "head_ids {:?}, but shard {}/{} has heads [{}]",
                self.head_ids,
                self.index,
                self.count,
                s.heads(m.num_heads as usize).describe()
            ));
        }
        if self.row_ranges != want.row_ranges {
            return bad(format!(
                "row_ranges {:?}, but heads [{}] are rows {:?} of the whole table",
                self.row_ranges,
                s.heads(m.num_heads as usize).describe(),
                want.row_ranges
            ));
        }
        let rows: u64 = self.row_ranges.iter().map(|r| r[1] - r[0]).sum();
        if m.total_rows != rows {
            return bad(format!(
                "total_rows {}, but its heads' row ranges hold {rows} rows",
                m.total_rows
            ));
        }
        Ok(())
    }
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
        let f = self.row_format;
        if let Err(m) = f.check_head_dim(hd) {
            return bad(format!("{m} ({} rows)", f.name()));
        }
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
        let heads = crate::model::heads_of(self.ngram_size, self.heads_per_ngram);
        if self.num_heads as u64 != heads {
            return bad(format!(
                "num_heads is {}, expected (ngram_size-1)*heads_per_ngram = {heads}",
                self.num_heads
            ));
        }
        if self.num_heads as usize > MAX_HEADS {
            return bad(format!(
                "num_heads {} is more than the {MAX_HEADS} heads libple serves",
                self.num_heads
            ));
        }
        // both bounded above: the product fits
        if self.num_heads as usize * hd > MAX_EMBED_DIM {
            return bad(format!(
                "num_heads {} × head_dim {hd} is wider than the {MAX_EMBED_DIM} elements libple serves",
                self.num_heads
            ));
        }
        // the hash parameters were derived for this layer: (layer + 1) × heads ≤ MAX_PRIMES
        let primes = (self.ple_layer_index as u128 + 1) * self.num_heads as u128;
        if primes > crate::model::MAX_PRIMES as u128 {
            return bad(format!(
                "ple_layer_index {} × {} heads is beyond the {} head sizes libple derives",
                self.ple_layer_index,
                self.num_heads,
                crate::model::MAX_PRIMES
            ));
        }
        self.hash.validate()?;
        if self.num_shards == 0 || self.rows_per_shard == 0 {
            return bad(format!(
                "num_shards {} / rows_per_shard {} must be positive",
                self.num_shards, self.rows_per_shard
            ));
        }
        // (a shard table: the whole table's rows; the shard record is checked below)
        let whole_rows = self
            .shard
            .as_ref()
            .map_or(self.total_rows, |s| s.whole_total_rows);
        let shard_rows = self.rows_per_shard.checked_mul(self.num_shards as u64);
        if shard_rows != Some(whole_rows) {
            let product = shard_rows.map_or("more than 2^64 - 1".into(), |n| n.to_string());
            return bad(format!(
                "total_rows is {whole_rows}, but rows_per_shard {} × num_shards {} = {product}",
                self.rows_per_shard, self.num_shards
            ));
        }
        let addressed = self.hash.addressed_rows();
        if whole_rows < addressed {
            return bad(format!(
                "total_rows {whole_rows} is less than the {addressed} rows the hash addresses"
            ));
        }
        if let Some(s) = &self.shard {
            s.validate(self)?;
        }
        if !(self.global_scale.is_finite() && self.global_scale > 0.0) {
            return bad(format!(
                "global_scale {} is not a positive finite number",
                self.global_scale
            ));
        }
        if matches!(self.row_format, RowFormat::Bf16 | RowFormat::F32) && self.global_scale != 1.0 {
            return bad(format!(
                "global_scale is {} for a {} table (must be 1.0)",
                self.global_scale,
                self.row_format.name()
            ));
        }
        if self.checked_file_bytes().is_none_or(|b| b > MAX_FILE_BYTES) {
            return bad(format!(
                "total_rows {} × row_bytes {} is more than the {MAX_FILE_BYTES} bytes a row file may have",
                self.total_rows, self.row_bytes
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

    /// Bytes the row file must have: `total_rows × row_bytes`, `None` when that overflows 64
    /// bits (such metadata does not validate).
    pub fn checked_file_bytes(&self) -> Option<u64> {
        self.total_rows.checked_mul(self.row_bytes as u64)
    }

    /// Bytes the row file must have. Exact for validated metadata (whose product is at most
    /// [`MAX_FILE_BYTES`]); saturates at `u64::MAX` for metadata that would not validate.
    pub fn file_bytes(&self) -> u64 {
        self.total_rows.saturating_mul(self.row_bytes as u64)
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
    /// The model's config.json: a libple table must have its geometry and hash (`open.rs`,
    /// `check_config`); a Python-tool table takes its hash from it (else from a config.json
    /// beside the table).
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
    /// Maps the row file named by `meta` in `dir`, checking its size.
    pub fn open_with_meta(dir: &Path, meta: TableMeta) -> Result<Table> {
        meta.validate()?;
        let rows_path = dir.join(&meta.rows_file);
        let (file, size) = open_regular(&rows_path)?;
        let want = meta.file_bytes();
        if size != want {
            return Err(Error::Format(format!(
                "{}: file size is {size} bytes, metadata says total_rows {} × row_bytes {} = {} (truncated or wrong file)",
                rows_path.display(),
                meta.total_rows,
                meta.row_bytes,
                want
            )));
        }
        // SAFETY: `file` is a regular file (checked by `open_regular`) of exactly `size` bytes,
        // mapped read-only and private to this `Table`, which owns both the file and the map.
        // The bytes are only read through `&[u8]` borrows of `self`, never written. libple's
        // packer never modifies a published row file in place (it writes a new file and renames
        // it over the old name), so a concurrent repack leaves this mapping's bytes unchanged.
        // A third party truncating the file would raise SIGBUS on access: that is outside what
        // any mmap-based reader can defend against and is documented in docs/FORMAT.md.
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

    /// Refuses the table unless it was packed from the source `ck`, whose fingerprint is `fp`.
    pub fn check_source(&self, ck: &Path, fp: &str) -> Result<()> {
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
    /// How the rows decode: format, global scale and the whole table's geometry.
    pub fn row_spec(&self) -> RowSpec {
        RowSpec {
            format: self.meta.row_format,
            global_scale: self.meta.global_scale,
            num_heads: self.meta.num_heads as usize,
            head_dim: self.meta.head_dim as usize,
        }
    }
    pub fn hash_params(&self) -> &HashParams {
        &self.meta.hash
    }
    /// The whole mapped row file: for its addresses and length (page advice, `mincore`, the
    /// guarded copies). Reading its bytes directly raises SIGBUS where the file lost them (a
    /// truncated file, a failed device read): copy rows through
    /// [`guard::copy_rows`](crate::io::mmap::guard::copy_rows) or [`Table::row`].
    pub fn bytes(&self) -> &[u8] {
        &self.map
    }
    /// A copy of row `r`, read through the SIGBUS guard (an error, not a crash, where the file
    /// lost it). Panics if `r >= total_rows` (row ids from the hasher are always in range).
    pub fn row(&self, r: u64) -> Result<Vec<u8>> {
        assert!(
            r < self.meta.total_rows,
            "row {r} of {}",
            self.meta.total_rows
        );
        let mut out = vec![0u8; self.row_bytes()];
        crate::io::mmap::guard::copy_rows(&self.map, self.row_bytes(), &[r], &mut out)?;
        Ok(out)
    }
}

/// Facts about an open table (what `ple_table_info` reports).
#[derive(Clone, Debug, PartialEq)]
pub struct TableInfo {
    /// Row format.
    pub format: RowFormat,
    /// Bytes per row (the shipped model: 90, 160, 320 or 640).
    pub row_bytes: u32,
    /// Rows in the file (padded).
    pub total_rows: u64,
    /// Rows the hash can address (sum of head sizes).
    pub addressed_rows: u64,
    /// Heads and elements per head (the shipped model: 16 and 160).
    pub num_heads: u32,
    pub head_dim: u32,
    /// N-gram order (the shipped model: 3) and vocabulary size.
    pub ngram_size: u32,
    pub vocab_size: u32,
    /// Heads per n-gram order (`num_heads = (ngram_size - 1) * heads_per_ngram`).
    pub heads_per_ngram: u32,
    /// The PLE layer's index among the checkpoint's PLE layers (`ple_layer_index`).
    pub ple_layer_index: u64,
    /// EOS / BOS token id.
    pub eos_token_id: i32,
    /// The global dequantisation scale (1.0 for bf16 and f32).
    pub global_scale: f32,
    /// Size of the row file in bytes.
    pub file_size: u64,
    /// Whether the handle's GPU waits for steps by itself (false for a table alone).
    pub device_wait_supported: bool,
    /// Name of the source checkpoint.
    pub source_name: String,
    /// Hex fingerprint of the source checkpoint.
    pub source_fingerprint: String,
    /// The head shard served (a handle's `shard` option; a table alone: the shard its file
    /// holds) and its heads `first_head + j · head_stride` for `j < shard_heads`.
    pub shard: Shard,
    pub first_head: u32,
    pub shard_heads: u32,
    pub head_stride: u32,
}

/// The facts about a table (`device_wait_supported` is false here; the pipeline sets it for a
/// handle with a GPU).
pub fn table_info(t: &Table) -> TableInfo {
    let m = t.meta();
    TableInfo {
        format: m.row_format,
        row_bytes: m.row_bytes,
        total_rows: m.total_rows,
        addressed_rows: m.hash.addressed_rows(),
        num_heads: m.num_heads,
        head_dim: m.head_dim,
        ngram_size: m.ngram_size,
        vocab_size: m.hash.vocab_size,
        heads_per_ngram: m.heads_per_ngram,
        ple_layer_index: m.ple_layer_index,
        eos_token_id: m.hash.eos_token_id,
        global_scale: m.global_scale,
        file_size: t.bytes().len() as u64,
        device_wait_supported: false,
        source_name: m.source.name.clone(),
        source_fingerprint: m.source.fingerprint.clone(),
        shard: Shard::WHOLE,
        first_head: 0,
        shard_heads: m.num_heads,
        head_stride: 1,
    }
    .with_shard(m.shard.as_ref().map_or(Shard::WHOLE, |s| s.shard()))
}

impl TableInfo {
    /// The facts with `shard` as the shard served.
    pub fn with_shard(mut self, shard: Shard) -> TableInfo {
        let heads = shard.heads(self.num_heads as usize);
        self.shard = shard;
        self.first_head = heads.first as u32;
        self.shard_heads = heads.len() as u32;
        self.head_stride = heads.step as u32;
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::ModelConfig;
    use crate::synth;
    use std::sync::mpsc;
    use std::time::Duration;

    /// A small FP8 table (32,000-odd rows) in a fresh directory.
    fn small_table() -> (tempfile::TempDir, TableMeta) {
        let d = tempfile::tempdir().unwrap();
        let m =
            synth::write_table(d.path(), RowFormat::Fp8, &synth::small_config(2000, 4), 7).unwrap();
        (d, m)
    }

    fn write_meta(dir: &Path, m: &TableMeta) {
        std::fs::write(dir.join(META_FILE), serde_json::to_string(m).unwrap()).unwrap();
    }

    /// Opens `dir` on another thread; fails the test if that takes longer than 10 s (a blocking
    /// open of a FIFO would never return).
    fn open_within_10s(dir: &Path, opts: TableOpenOptions) -> Result<()> {
        let (tx, rx) = mpsc::channel();
        let dir = dir.to_path_buf();
        std::thread::spawn(move || {
            let _ = tx.send(Table::open(&dir, &opts).map(|_| ()));
        });
        rx.recv_timeout(Duration::from_secs(10))
            .expect("Table::open hung (blocked on a FIFO?)")
    }

    fn mkfifo(p: &Path) {
        let c = std::ffi::CString::new(p.to_str().unwrap()).unwrap();
        // SAFETY: `c` is a NUL-terminated path that lives across the call.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
    }

    #[test]
    fn a_size_product_that_wraps_to_the_file_size_is_refused() {
        let (d, m) = small_table();
        let file = std::fs::metadata(d.path().join(ROWS_FILE)).unwrap().len();
        assert_eq!(file, m.total_rows * 160);
        // 5 × 2^64 is a multiple of 160, so total_rows = rows + 2^59 gives
        // total_rows × 160 ≡ file (mod 2^64): a wrapping product would match the file size.
        let mut bad = m.clone();
        bad.total_rows = m.total_rows + (1u64 << 59);
        assert_eq!(bad.total_rows.wrapping_mul(160), file);
        bad.rows_per_shard = bad.total_rows;
        bad.num_shards = 1;
        // huge heads, "addressed" by the huge row count
        bad.hash.head_sizes = vec![1 << 39; 16];
        bad.hash.offsets = (0..16).map(|h| h << 39).collect();
        assert!(bad.hash.validate().is_ok());
        let e = bad.validate().unwrap_err().to_string();
        assert!(e.contains("more than the"), "{e}");
        write_meta(d.path(), &bad);
        let e = Table::open(d.path(), &Default::default())
            .err()
            .expect("refused");
        assert!(matches!(e, Error::Format(_)), "{e}");
    }

    #[test]
    fn a_shard_product_that_misses_total_rows_is_named_in_numbers() {
        let (_d, m) = small_table();
        let mut bad = m.clone();
        bad.num_shards += 1;
        let want = format!(
            "total_rows is {}, but rows_per_shard {} × num_shards {} = {}",
            m.total_rows,
            m.rows_per_shard,
            m.num_shards + 1,
            m.rows_per_shard * (m.num_shards as u64 + 1)
        );
        assert!(bad.validate().unwrap_err().to_string().contains(&want));
        bad.rows_per_shard = u64::MAX;
        let e = bad.validate().unwrap_err().to_string();
        assert!(e.contains(" = more than 2^64 - 1"), "{e}");
        assert!(!e.contains("Some(") && !e.contains("None"), "{e}");
    }

    #[test]
    fn heads_per_ngram_that_would_wrap_to_16_is_refused() {
        let (d, m) = small_table();
        let mut bad = m.clone();
        // (3 - 1) × (2^31 + 8) = 2^32 + 16, which 32-bit arithmetic wraps to 16
        bad.heads_per_ngram = (1 << 31) + 8;
        bad.hash.heads_per_ngram = bad.heads_per_ngram;
        assert_eq!(2u32.wrapping_mul(bad.heads_per_ngram), 16);
        let e = bad.hash.validate().unwrap_err().to_string();
        assert!(
            e.contains("heads_per_ngram 2147483656 not in [1, 1024]"),
            "{e}"
        );
        assert!(bad.validate().is_err());
        write_meta(d.path(), &bad);
        assert!(Table::open(d.path(), &Default::default()).is_err());
        // and the same through config.json
        let mut v = serde_json::to_value(ModelConfig::default()).unwrap();
        v["heads_per_ngram"] = serde_json::json!(2147483656u64);
        let e = ModelConfig::from_config_json(&v).unwrap_err().to_string();
        assert!(e.contains("heads_per_ngram"), "{e}");
    }

    #[test]
    fn fifo_metadata_or_rows_is_an_error_not_a_hang() {
        let (d, m) = small_table();
        std::fs::remove_file(d.path().join(META_FILE)).unwrap();
        mkfifo(&d.path().join(META_FILE));
        let e = open_within_10s(d.path(), Default::default()).unwrap_err();
        assert!(e.to_string().contains("is a FIFO"), "{e}");
        std::fs::remove_file(d.path().join(META_FILE)).unwrap();
        write_meta(d.path(), &m);
        std::fs::remove_file(d.path().join(ROWS_FILE)).unwrap();
        mkfifo(&d.path().join(ROWS_FILE));
        let e = open_within_10s(d.path(), Default::default()).unwrap_err();
        assert!(e.to_string().contains("is a FIFO"), "{e}");
    }

    #[test]
    fn metadata_is_read_with_a_size_cap() {
        let (d, m) = small_table();
        std::fs::remove_file(d.path().join(META_FILE)).unwrap();
        std::os::unix::fs::symlink("/dev/zero", d.path().join(META_FILE)).unwrap();
        let e = open_within_10s(d.path(), Default::default()).unwrap_err();
        assert!(e.to_string().contains("character device"), "{e}");
        // valid JSON padded past the cap
        std::fs::remove_file(d.path().join(META_FILE)).unwrap();
        let mut text = serde_json::to_string(&m).unwrap();
        text.push_str(&" ".repeat(crate::format::files::MAX_TABLE_META as usize));
        std::fs::write(d.path().join(META_FILE), text).unwrap();
        let e = open_within_10s(d.path(), Default::default()).unwrap_err();
        assert!(e.to_string().contains("more than the"), "{e}");
    }

    #[test]
    fn empty_paths_are_invalid_arguments() {
        let (d, _) = small_table();
        let opts = TableOpenOptions {
            checkpoint_dir: Some(PathBuf::new()),
            ..Default::default()
        };
        let e = Table::open(d.path(), &opts).err().expect("refused");
        assert!(matches!(e, Error::InvalidArgument(_)), "{e}");
        assert!(e.to_string().contains("checkpoint_dir"), "{e}");
        let opts = TableOpenOptions {
            config_json_path: Some(PathBuf::new()),
            ..Default::default()
        };
        assert!(matches!(
            Table::open(d.path(), &opts),
            Err(Error::InvalidArgument(_))
        ));
        assert!(matches!(
            Table::open(Path::new(""), &Default::default()),
            Err(Error::InvalidArgument(_))
        ));
        assert!(matches!(
            crate::format::source::open(Path::new("")),
            Err(Error::InvalidArgument(_))
        ));
        // a table that opens is unchanged by all this
        assert!(Table::open(d.path(), &Default::default()).is_ok());
    }
}
