//! Packing every PLE layer of a checkpoint (`docs/FORMAT.md#several-ple-layers`): one table per
//! layer in `out/layer-K/` (K its `ple_layer_index`), each packed like a single table, then the
//! index `out/layers.json`, written last (temporary name, synced, renamed): a set without
//! `layers.json` is incomplete, and the index is removed before any layer is rewritten.

use crate::error::{Error, Result};
use crate::format::checkpoint::PleLayer;
use crate::format::files::{MAX_TABLE_META, read_text_capped};
use crate::format::pack_table::{
    PackOptions, PackReport, fsync_dir, lock_dir, pack_one, remove_stale_temps, shard_meta,
};
use crate::format::source::Source;
use crate::format::table::{META_FILE, ROWS_FILE, SourceInfo};
use serde::{Deserialize, Serialize};
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;
use std::time::Instant;

/// The index of a multi-layer table set.
pub const LAYERS_FILE: &str = "layers.json";
/// Its version.
pub const LAYERS_VERSION: u32 = 1;
/// Prefix of its temporary file's name while it is written (`.layers.json.tmp-<pid>`).
pub const LAYERS_TMP_PREFIX: &str = ".layers.json.tmp-";

/// `out/layers.json`: which table serves which PLE layer.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LayersIndex {
    pub format_version: u32,
    /// The checkpoint every layer was packed from.
    pub source: SourceInfo,
    /// By `ple_layer_index`.
    pub layers: Vec<LayerEntry>,
}

/// One layer of a [`LayersIndex`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LayerEntry {
    /// The layer's index among the PLE layers (its hash depends on it).
    pub ple_layer_index: u64,
    /// Its table directory, relative to the set's (`layer-K`).
    pub dir: String,
    /// The checkpoint prefix of its shards.
    pub prefix: String,
    /// The decoder layer holding it (0-based), where the tensor names say.
    pub decoder_layer: Option<u64>,
}

/// The table directory of layer `k` inside a set.
pub fn layer_dir_name(k: u64) -> String {
    format!("layer-{k}")
}

/// The index of the table set in `dir`, if `dir` holds one.
pub fn read_layers(dir: &Path) -> Result<Option<LayersIndex>> {
    let p = dir.join(LAYERS_FILE);
    if !p.exists() {
        return Ok(None);
    }
    let text = read_text_capped(&p, MAX_TABLE_META)?;
    let idx: LayersIndex = serde_json::from_str(&text)
        .map_err(|e| Error::Format(format!("{}: not a libple layer index: {e}", p.display())))?;
    if idx.format_version != LAYERS_VERSION {
        return Err(Error::Format(format!(
            "{}: format_version {} (this libple reads {LAYERS_VERSION})",
            p.display(),
            idx.format_version
        )));
    }
    Ok(Some(idx))
}

/// Before a single table is packed into `out`: a layer set there (`layers.json`) is refused, or
/// with `force` removed (its index first, then the layer directories it lists).
pub(crate) fn replace_set(out: &Path, force: bool) -> Result<()> {
    let Some(idx) = read_layers(out)? else {
        return Ok(());
    };
    if !force {
        return Err(Error::Format(format!(
            "{} holds the tables of {} PLE layers ({LAYERS_FILE}); refusing to put a single table there without force",
            out.display(),
            idx.layers.len()
        )));
    }
    let p = out.join(LAYERS_FILE);
    std::fs::remove_file(&p).map_err(|e| Error::io_path("removing", &p, e))?;
    for l in &idx.layers {
        // only the directories this packer names (`layer-K`), never a path from elsewhere
        if l.dir == layer_dir_name(l.ple_layer_index) {
            let d = out.join(&l.dir);
            match std::fs::remove_dir_all(&d) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                    return Err(Error::io_path("removing", &d, e));
                }
                _ => {}
            }
        }
    }
    Ok(())
}

/// Packs each of `layers` of `checkpoint` (read as `src`) into `out/layer-K/`, then writes `out/layers.json`.
pub(crate) fn pack_layers(
    checkpoint: &Path,
    src: &Source,
    layers: &[PleLayer],
    out: &Path,
    opts: &PackOptions,
    progress: &mut dyn FnMut(u64, u64) -> bool,
) -> Result<PackReport> {
    let t0 = Instant::now();
    // every layer is opened and checked before anything is written
    let cks = layers
        .iter()
        .map(|l| src.open_layer(Some(l.index)))
        .collect::<Result<Vec<_>>>()?;
    let mut total = 0u64;
    for ck in &cks {
        total = total.saturating_add(shard_meta(ck.table_meta()?, opts.shard)?.file_bytes());
    }
    std::fs::create_dir_all(out).map_err(|e| Error::io_path("creating", out, e))?;
    let dir = lock_dir(out)?;
    remove_stale_temps(out, &[LAYERS_TMP_PREFIX])?;
    let single = out.join(META_FILE);
    if single.exists() {
        if !opts.force {
            return Err(Error::Format(format!(
                "{} holds a single table ({META_FILE}); refusing to replace it with the {} PLE layers of {} without force",
                out.display(),
                layers.len(),
                checkpoint.display()
            )));
        }
        for f in [META_FILE, ROWS_FILE] {
            match std::fs::remove_file(out.join(f)) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                    return Err(Error::io_path("removing", &out.join(f), e));
                }
                _ => {}
            }
        }
    }
    let index_path = out.join(LAYERS_FILE);
    match std::fs::remove_file(&index_path) {
        Ok(()) => fsync_dir(&dir, out)?,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(Error::io_path("removing old", &index_path, e)),
    }
    let mut report = PackReport {
        reused: true,
        ..Default::default()
    };
    let mut before = 0u64;
    let mut entries = Vec::with_capacity(layers.len());
    for (l, ck) in layers.iter().zip(&cks) {
        let name = layer_dir_name(l.index);
        let r = pack_one(ck, &out.join(&name), opts, &mut |d, _| {
            progress(before.saturating_add(d), total)
        })?;
        before = before.saturating_add(r.table_bytes);
        report.bytes_written += r.bytes_written;
        report.reused &= r.reused;
        report.total_rows += r.total_rows;
        report.table_bytes += r.table_bytes;
        entries.push(LayerEntry {
            ple_layer_index: l.index,
            dir: name,
            prefix: l.prefix.clone(),
            decoder_layer: l.decoder_layer,
        });
    }
    let index = LayersIndex {
        format_version: LAYERS_VERSION,
        source: SourceInfo {
            name: cks[0].name.clone(),
            fingerprint: cks[0].fingerprint.clone(),
        },
        layers: entries,
    };
    let tmp = out.join(format!("{LAYERS_TMP_PREFIX}{}", std::process::id()));
    let json = serde_json::to_string_pretty(&index).expect("the index serialises");
    let written = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o644)
        .open(&tmp)
        .and_then(|mut f| f.write_all(json.as_bytes()).and_then(|_| f.sync_all()));
    if let Err(e) = written {
        let _ = std::fs::remove_file(&tmp);
        return Err(Error::io_path("writing", &tmp, e));
    }
    std::fs::rename(&tmp, &index_path)
        .map_err(|e| Error::io_path("renaming into place", &index_path, e))?;
    fsync_dir(&dir, out)?;
    report.elapsed = t0.elapsed();
    Ok(report)
}
