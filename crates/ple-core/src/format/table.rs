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
            if let Some((rows, json)) = find_python_table(dir)? {
                let meta = python_table_meta(dir, &rows, &json, opts)?;
                let t = Table::open_with_meta(dir, meta)?;
                if let Some(ck) = &opts.checkpoint_dir {
                    t.check_source(ck)?;
                }
                return Ok(t);
            }
            return Err(Error::Format(format!(
                "{} holds no packed table: {META_FILE} is missing and there is no <name>{PY_ROWS_SUFFIX} with <name>{PY_ROWS_SUFFIX}.json (pack a checkpoint with `ple pack`)",
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
        let fp = crate::format::checkpoint::fingerprint(ck)?;
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

/// Suffix of a row file made by the Python tool (`<name>.packed_u8`, metadata in `<name>.packed_u8.json`).
pub const PY_ROWS_SUFFIX: &str = ".packed_u8";

/// Looks for a Python-tool table in `dir`: exactly one `<name>.packed_u8` with its `.json`.
fn find_python_table(dir: &Path) -> Result<Option<(PathBuf, PathBuf)>> {
    let rd = std::fs::read_dir(dir).map_err(|e| Error::io_path("listing", dir, e))?;
    let mut found = Vec::new();
    let mut orphans = Vec::new();
    for e in rd.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        if name.ends_with(PY_ROWS_SUFFIX) && !name.starts_with('.') {
            let json = dir.join(format!("{name}.json"));
            if json.is_file() {
                found.push((e.path(), json));
            } else {
                orphans.push(name);
            }
        }
    }
    found.sort();
    match found.len() {
        0 if !orphans.is_empty() => Err(Error::Format(format!(
            "{}: {} has no metadata file {}.json (incomplete Python-tool table)",
            dir.display(),
            orphans[0],
            orphans[0]
        ))),
        0 => Ok(None),
        1 => Ok(found.pop()),
        _ => Err(Error::Format(format!(
            "{}: several Python-tool tables ({}); open a directory holding one",
            dir.display(),
            found
                .iter()
                .map(|(p, _)| p
                    .file_name()
                    .unwrap_or_default()
                    .to_string_lossy()
                    .into_owned())
                .collect::<Vec<_>>()
                .join(", ")
        ))),
    }
}

/// The row format a Python-tool dtype/format string names.
fn python_format_hint(s: &str) -> Option<RowFormat> {
    match s.to_ascii_lowercase().as_str() {
        "u8" | "uint8" | "nvfp4" => Some(RowFormat::Nvfp4),
        "f8_e4m3" | "fp8" | "fp8_e4m3" | "float8_e4m3fn" | "e4m3" => Some(RowFormat::Fp8),
        "bf16" | "bfloat16" => Some(RowFormat::Bf16),
        _ => None,
    }
}

/// Converts a Python-tool table's JSON (`rows_per_shard, num_shards, row_width, codes_width,
/// scales_width, total_rows, snapshot`; optionally `shard_dtype`/`storage_dtype`/`dtype`/
/// `row_format`/`kind` and `global_scale`) into [`TableMeta`].
///
/// The Python tool stores neither the hash parameters nor the global scale; they come from the
/// checkpoint. The rule:
/// 1. The checkpoint is `opts.checkpoint_dir`, else the directory of the config.json in use
///    (`opts.config_json_path`, else `config.json` beside the table) when it holds safetensors
///    (`model.safetensors.index.json` or `model.safetensors`).
/// 2. With a checkpoint: its hash parameters (hash tensors and/or config.json, checked as when
///    packing), its global scale and its fingerprint are used; the table's `snapshot` must equal
///    the checkpoint's directory name and its shape (format, rows_per_shard, num_shards) must
///    match, else the table is refused as packed from another checkpoint.
/// 3. Without one: hash parameters derived from config.json (missing → Format error); the global
///    scale from a `global_scale` number in the table's JSON (1.0 for bf16), else a Format error
///    asking for the checkpoint. The source fingerprint is then empty (unknown).
///
/// A `global_scale` in the JSON and the checkpoint's must agree.
fn python_table_meta(
    dir: &Path,
    rows: &Path,
    json: &Path,
    opts: &TableOpenOptions,
) -> Result<TableMeta> {
    let jd = json.display();
    let text = std::fs::read_to_string(json).map_err(|e| Error::io_path("reading", json, e))?;
    let v: serde_json::Value = serde_json::from_str(&text)
        .map_err(|e| Error::Format(format!("{jd}: invalid JSON: {e}")))?;
    let int = |k: &str| -> Result<u64> {
        v.get(k).and_then(|x| x.as_u64()).ok_or_else(|| {
            Error::Format(format!(
                "{jd}: field '{k}' is missing or not a non-negative integer"
            ))
        })
    };
    let rows_per_shard = int("rows_per_shard")?;
    let num_shards = u32::try_from(int("num_shards")?)
        .map_err(|_| Error::Format(format!("{jd}: num_shards too large")))?;
    let row_width = int("row_width")?;
    let codes_width = int("codes_width")?;
    let scales_width = int("scales_width")?;
    let total_rows = int("total_rows")?;
    let snapshot = v
        .get("snapshot")
        .and_then(|x| x.as_str())
        .ok_or_else(|| Error::Format(format!("{jd}: field 'snapshot' is missing or not a string")))?
        .to_string();
    if codes_width.checked_add(scales_width) != Some(row_width) || row_width > u32::MAX as u64 {
        return Err(Error::Format(format!(
            "{jd}: row_width {row_width} != codes_width {codes_width} + scales_width {scales_width}"
        )));
    }
    let json_scale = match v.get("global_scale") {
        None | Some(serde_json::Value::Null) => None,
        Some(x) => Some(
            x.as_f64()
                .ok_or_else(|| Error::Format(format!("{jd}: global_scale {x} is not a number")))?
                as f32,
        ),
    };

    // Where config.json and the checkpoint are.
    let config_path = opts
        .config_json_path
        .clone()
        .unwrap_or_else(|| dir.join(crate::format::checkpoint::CONFIG_FILE));
    let ck_dir = opts.checkpoint_dir.clone().or_else(|| {
        let d = config_path.parent()?;
        (d.join(crate::format::checkpoint::INDEX_FILE).is_file()
            || d.join(crate::format::checkpoint::SINGLE_FILE).is_file())
        .then(|| d.to_path_buf())
    });
    let config = if config_path.is_file() {
        Some(crate::format::checkpoint::read_config(&config_path)?)
    } else if ck_dir.is_none() {
        return Err(Error::Format(format!(
            "{} is a Python-tool table ({}), which carries no hash parameters, and there is no config.json at {}: pass the checkpoint's config.json (config_json_path, `--config`)",
            dir.display(),
            rows.file_name().unwrap_or_default().to_string_lossy(),
            config_path.display()
        )));
    } else {
        None
    };
    let ck = match &ck_dir {
        Some(d) => Some(crate::format::checkpoint::Checkpoint::open(d)?),
        None => None,
    };
    let cfg = match (&config, &ck) {
        (Some(c), _) => c.clone(),
        (None, Some(k)) => k.config.clone().unwrap_or_default(),
        (None, None) => unreachable!("checked above"),
    };
    let hd = cfg.head_dim();

    // Row format: dtype/format hints, else the widths.
    let mut hint: Option<(&str, RowFormat)> = None;
    for k in [
        "shard_dtype",
        "storage_dtype",
        "dtype",
        "row_format",
        "kind",
    ] {
        if let Some(s) = v.get(k).and_then(|x| x.as_str()) {
            let f = python_format_hint(s).ok_or_else(|| {
                Error::Format(format!("{jd}: {k} '{s}' is not a known PLE storage format"))
            })?;
            if let Some((k0, f0)) = hint
                && f0 != f
            {
                return Err(Error::Format(format!(
                    "{jd}: {k0} says {} but {k} '{s}' says {}",
                    f0.name(),
                    f.name()
                )));
            }
            hint = Some((k, f));
        }
    }
    let widths = |f: RowFormat| (f.code_bytes(hd) as u64, f.scale_bytes(hd) as u64);
    let format = match hint {
        Some((_, f)) => f,
        None => [RowFormat::Nvfp4, RowFormat::Fp8, RowFormat::Bf16]
            .into_iter()
            .find(|&f| widths(f) == (codes_width, scales_width))
            .ok_or_else(|| {
                Error::Format(format!(
                    "{jd}: codes_width {codes_width} + scales_width {scales_width} match no row format for head_dim {hd}"
                ))
            })?,
    };
    if widths(format) != (codes_width, scales_width) {
        return Err(Error::Format(format!(
            "{jd}: a {} row of head_dim {hd} has codes_width {} and scales_width {}, the table says {codes_width} and {scales_width}",
            format.name(),
            widths(format).0,
            widths(format).1
        )));
    }

    let (hash, global_scale, fingerprint) = match &ck {
        Some(k) => {
            if k.name != snapshot {
                return Err(Error::Format(format!(
                    "{} was packed from snapshot '{snapshot}', not from checkpoint {} ('{}')",
                    rows.display(),
                    k.dir.display(),
                    k.name
                )));
            }
            if k.format != format
                || k.rows_per_shard != rows_per_shard
                || k.num_shards != num_shards
            {
                return Err(Error::Format(format!(
                    "{}: {num_shards} × {rows_per_shard} rows of {} do not match checkpoint {} ({} × {} rows of {})",
                    rows.display(),
                    format.name(),
                    k.dir.display(),
                    k.num_shards,
                    k.rows_per_shard,
                    k.format.name()
                )));
            }
            if let Some(c) = &config
                && HashParams::derive(c) != k.hash
            {
                return Err(Error::Format(format!(
                    "{} derives other hash parameters than checkpoint {} holds",
                    config_path.display(),
                    k.dir.display()
                )));
            }
            if let Some(s) = json_scale
                && s != k.global_scale
            {
                return Err(Error::Format(format!(
                    "{jd}: global_scale {s} differs from the checkpoint's {}",
                    k.global_scale
                )));
            }
            (k.hash.clone(), k.global_scale, k.fingerprint.clone())
        }
        None => {
            let scale = match (json_scale, format) {
                (Some(s), _) => s,
                (None, RowFormat::Bf16) => 1.0,
                (None, f) => {
                    return Err(Error::Format(format!(
                        "{}: a {} Python-tool table does not store its global scale: use the config.json inside the checkpoint directory (the scale is then read from the safetensors), pass checkpoint_dir, or add \"global_scale\": <value> to {jd}",
                        dir.display(),
                        f.name()
                    )));
                }
            };
            (HashParams::derive(&cfg), scale, String::new())
        }
    };
    let meta = TableMeta {
        format_version: FORMAT_VERSION,
        row_format: format,
        row_bytes: row_width as u32,
        code_bytes: codes_width as u32,
        scale_bytes: scales_width as u32,
        total_rows,
        rows_per_shard,
        num_shards,
        head_dim: hd as u32,
        num_heads: cfg.num_heads() as u32,
        ngram_size: hash.ngram_size,
        heads_per_ngram: hash.heads_per_ngram,
        global_scale,
        hash,
        source: SourceInfo {
            name: snapshot,
            fingerprint,
        },
        rows_file: rows
            .file_name()
            .unwrap_or_default()
            .to_string_lossy()
            .into_owned(),
    };
    meta.validate()
        .map_err(|e| Error::Format(format!("{jd}: {e}")))?;
    Ok(meta)
}

/// Facts about an open table (what `ple_table_info` reports).
#[derive(Clone, Debug, PartialEq)]
pub struct TableInfo {
    /// Row format.
    pub format: RowFormat,
    /// Bytes per row (90, 160 or 320).
    pub row_bytes: u32,
    /// Rows in the file (padded).
    pub total_rows: u64,
    /// Rows the hash can address (sum of head sizes).
    pub addressed_rows: u64,
    /// Heads (16) and elements per head (160).
    pub num_heads: u32,
    pub head_dim: u32,
    /// N-gram order (3) and vocabulary size.
    pub ngram_size: u32,
    pub vocab_size: u32,
    /// EOS / BOS token id.
    pub eos_token_id: i32,
    /// The global dequantisation scale (1.0 for bf16).
    pub global_scale: f32,
    /// Size of the row file in bytes.
    pub file_size: u64,
    /// Whether the handle's GPU waits for steps by itself (false for a table alone).
    pub device_wait_supported: bool,
    /// Name of the source checkpoint.
    pub source_name: String,
    /// Hex fingerprint of the source checkpoint.
    pub source_fingerprint: String,
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
        eos_token_id: m.hash.eos_token_id,
        global_scale: m.global_scale,
        file_size: t.bytes().len() as u64,
        device_wait_supported: false,
        source_name: m.source.name.clone(),
        source_fingerprint: m.source.fingerprint.clone(),
    }
}
