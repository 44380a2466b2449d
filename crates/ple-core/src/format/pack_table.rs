//! Packing one table: a checkpoint's PLE layer (`Checkpoint`: safetensors shards or a GGUF's
//! tensor) → one row-addressable file + JSON metadata (`docs/FORMAT.md#the-packed-table`). The
//! entry that chooses what to pack is `pack.rs`.
//!
//! Crash safety: rows and metadata are written to temporary names in the output directory
//! (`.table.rows.tmp-<pid>`, `.table.json.tmp-<pid>`), synced and size-checked; then the old
//! metadata (if any) is removed, the rows are renamed into place, and the metadata is renamed
//! last, with directory syncs in between. At every instant the directory either holds no
//! `table.json` or a `table.json` that matches `table.rows`, so an interrupted pack never leaves a
//! table that opens. Files are replaced by rename, never truncated, so a `Table` that has the old
//! rows mapped keeps reading them. An exclusive `flock` on the directory keeps two packers out of
//! the same directory; temporary files left by a killed packer are removed by the next one.
//!
//! Memory: one output buffer of `buffer_bytes` plus (NVFP4) the codes and scales it is built from,
//! about 2 × `buffer_bytes` in all. Sources are read with `pread` (advised SEQUENTIAL, dropped from
//! the page cache behind the reader), the output written sequentially and flushed behind the
//! writer with `sync_file_range`, so neither side fills the page cache.

use crate::error::{Error, Result};
use crate::format::checkpoint::{Checkpoint, ShardSource};
use crate::format::files::{MAX_TABLE_META, open_regular, read_text_capped};
use crate::format::table::{META_FILE, ROWS_FILE, ShardMeta, Table, TableMeta, TableOpenOptions};
use crate::model::RowFormat;
use crate::shard::Shard;
use std::collections::HashMap;
use std::fs::File;
use std::io::Write;
use std::os::fd::{AsFd, AsRawFd};
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// Packing options (`ple_pack_options` in C).
#[derive(Clone, Debug)]
pub struct PackOptions {
    /// Rebuild whatever the directory holds (another checkpoint's table, unreadable metadata, or
    /// an identical table, which is then rewritten instead of reused).
    pub force: bool,
    /// Bytes of the output buffer (the packer's memory is about twice this).
    pub buffer_bytes: usize,
    /// Reserve the row file's full size before writing (`fallocate`), so a full disk fails at
    /// once. Filesystems without `fallocate` are written without reserving.
    pub preallocate: bool,
    /// Write only this head shard's rows (`crate::shard`; a shard table, whose `table.json`
    /// records the shard): the whole table's rows `[offset[h0], end(h1))`, re-based to 0.
    /// [`Shard::WHOLE`] (the default) writes the whole table.
    pub shard: Shard,
    /// Pack only the PLE layer with this `ple_layer_index`, into `out` itself; `None` (the
    /// default) packs every layer: `out` holds the table when the checkpoint has one, else
    /// `out/layer-K/` per layer and `out/layers.json` (`docs/FORMAT.md#several-ple-layers`).
    pub layer: Option<u64>,
}

impl Default for PackOptions {
    fn default() -> Self {
        PackOptions {
            force: false,
            buffer_bytes: 8 << 20,
            preallocate: true,
            shard: Shard::WHOLE,
            layer: None,
        }
    }
}

/// What a pack did.
#[derive(Clone, Debug, Default)]
pub struct PackReport {
    /// Bytes written to the row file (0 when reused).
    pub bytes_written: u64,
    /// The directory already held this table; nothing was written.
    pub reused: bool,
    /// Rows of the table and bytes of its row file.
    pub total_rows: u64,
    pub table_bytes: u64,
    /// Wall time of the whole pack.
    pub elapsed: Duration,
    /// The table's metadata.
    pub meta: Option<TableMeta>,
}

/// Prefix of the temporary row file's name (`.table.rows.tmp-<pid>`).
pub const ROWS_TMP_PREFIX: &str = ".table.rows.tmp-";
/// Prefix of the temporary metadata file's name (`.table.json.tmp-<pid>`).
pub const META_TMP_PREFIX: &str = ".table.json.tmp-";

/// Window of the write-behind flush.
const FLUSH_WINDOW: u64 = 32 << 20;

/// Removes its paths on drop unless disarmed.
struct TempFiles(Vec<PathBuf>);

impl Drop for TempFiles {
    fn drop(&mut self) {
        for p in &self.0 {
            if let Err(e) = std::fs::remove_file(p)
                && e.kind() != std::io::ErrorKind::NotFound
            {
                log::warn!("could not remove temporary file {}: {e}", p.display());
            }
        }
    }
}

fn fadvise(f: &File, off: u64, len: u64, advice: libc::c_int) {
    // Advice only: failure changes nothing but caching.
    let _ = crate::sys::fadvise(f.as_raw_fd(), off, len, advice);
}

fn sync_range(f: &File, off: u64, len: u64, flags: libc::c_uint) {
    // Write-behind only; the final fsync is what guarantees durability.
    let _ = crate::sys::sync_file_range(f.as_fd(), off, len, flags);
}

pub(crate) fn fsync_dir(dir: &File, path: &Path) -> Result<()> {
    dir.sync_all()
        .map_err(|e| Error::io_path("syncing directory", path, e))
}

/// Takes an exclusive lock on the directory (released when the file is dropped). A lock held
/// by someone else for longer than [`LOCK_PATIENCE`] is another packer: an error. (Waiting that
/// long covers a brief holder: a child the host forks while a pack runs shares the pack's lock
/// until it execs.)
pub(crate) fn lock_dir(out: &Path) -> Result<File> {
    let d = File::open(out).map_err(|e| Error::io_path("opening directory", out, e))?;
    let t0 = std::time::Instant::now();
    loop {
        // the lock lives as long as the returned `File`
        let Err(e) = crate::sys::try_lock_exclusive(d.as_fd()) else {
            return Ok(d);
        };
        if e.kind() != std::io::ErrorKind::WouldBlock {
            return Err(Error::io_path("locking directory", out, e));
        }
        if t0.elapsed() >= LOCK_PATIENCE {
            return Err(Error::State(format!(
                "another packer is writing into {} (its lock was held for {} ms)",
                out.display(),
                LOCK_PATIENCE.as_millis()
            )));
        }
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
}

/// How long [`lock_dir`] waits for a held lock.
const LOCK_PATIENCE: std::time::Duration = std::time::Duration::from_millis(500);

/// Removes the temporary files (names starting with one of `prefixes`) of earlier packs that
/// were killed: the caller holds the directory lock, so no live packer owns them.
pub(crate) fn remove_stale_temps(out: &Path, prefixes: &[&str]) -> Result<()> {
    let rd = std::fs::read_dir(out).map_err(|e| Error::io_path("listing", out, e))?;
    for e in rd.flatten() {
        let name = e.file_name();
        let name = name.to_string_lossy();
        if prefixes.iter().any(|p| name.starts_with(p)) {
            log::info!("removing stale temporary file {}", e.path().display());
            std::fs::remove_file(e.path())
                .map_err(|err| Error::io_path("removing stale", &e.path(), err))?;
        }
    }
    Ok(())
}

/// Decides what to do with a table already in `out`: `Ok(true)` to reuse it, `Ok(false)` to
/// (re)build, `Err` to refuse.
fn check_existing(out: &Path, meta: &TableMeta, force: bool) -> Result<bool> {
    let p = out.join(META_FILE);
    if !p.exists() {
        return Ok(false);
    }
    let text = match read_text_capped(&p, MAX_TABLE_META) {
        Ok(t) => t,
        // An unreadable, oversized or non-regular table.json is "not libple metadata".
        Err(e) if force => {
            log::warn!(
                "{}: --force: replacing unreadable metadata ({e})",
                out.display()
            );
            return Ok(false);
        }
        Err(e) => return Err(e),
    };
    match serde_json::from_str::<TableMeta>(&text) {
        Ok(old) if old.source.fingerprint == meta.source.fingerprint => {
            if force {
                log::info!("{}: --force: rebuilding the table", out.display());
                return Ok(false);
            }
            if old == *meta {
                match Table::open(out, &TableOpenOptions::default()) {
                    Ok(_) => return Ok(true),
                    Err(e) => log::warn!(
                        "{}: the existing table of the same checkpoint does not open ({e}); rebuilding",
                        out.display()
                    ),
                }
            } else {
                log::warn!(
                    "{}: the existing table of the same checkpoint has other metadata (config.json changed?); rebuilding",
                    out.display()
                );
            }
            Ok(false)
        }
        Ok(old) => {
            if force {
                log::warn!(
                    "{}: --force: replacing the table packed from '{}'",
                    out.display(),
                    old.source.name
                );
                return Ok(false);
            }
            Err(Error::Format(format!(
                "{} already holds a table packed from '{}' (fingerprint {}); refusing to replace it with one from '{}' (fingerprint {}) without force",
                out.display(),
                old.source.name,
                old.source.fingerprint,
                meta.source.name,
                meta.source.fingerprint
            )))
        }
        Err(e) => {
            if force {
                return Ok(false);
            }
            Err(Error::Format(format!(
                "{} exists but is not libple table metadata ({e}); refusing to overwrite it without force",
                p.display()
            )))
        }
    }
}

/// Smallest `PackOptions::buffer_bytes`.
pub const MIN_BUFFER_BYTES: usize = 4096;
/// Largest `PackOptions::buffer_bytes` (1 GiB).
pub const MAX_BUFFER_BYTES: usize = 1 << 30;

/// Packs the (opened) PLE table `ck` into the table directory `out`.
pub(crate) fn pack_one(
    ck: &Checkpoint,
    out: &Path,
    opts: &PackOptions,
    progress: &mut dyn FnMut(u64, u64) -> bool,
) -> Result<PackReport> {
    let t0 = Instant::now();
    let meta = shard_meta(ck.table_meta()?, opts.shard)?;
    std::fs::create_dir_all(out).map_err(|e| Error::io_path("creating", out, e))?;
    let dir = lock_dir(out)?;
    remove_stale_temps(out, &[ROWS_TMP_PREFIX, META_TMP_PREFIX])?;
    let mut report = PackReport {
        total_rows: meta.total_rows,
        table_bytes: meta.file_bytes(),
        ..Default::default()
    };
    if check_existing(out, &meta, opts.force)? {
        log::info!(
            "{}: already holds the table of {}; reused",
            out.display(),
            ck.name
        );
        progress(meta.file_bytes(), meta.file_bytes());
        report.reused = true;
        report.elapsed = t0.elapsed();
        report.meta = Some(meta);
        return Ok(report);
    }

    let pid = std::process::id();
    let rows_tmp = out.join(format!("{ROWS_TMP_PREFIX}{pid}"));
    let meta_tmp = out.join(format!("{META_TMP_PREFIX}{pid}"));
    let temps = TempFiles(vec![rows_tmp.clone(), meta_tmp.clone()]);

    report.bytes_written = write_rows(ck, &meta, &rows_tmp, opts, progress)?;

    let json = serde_json::to_string_pretty(&meta).expect("metadata serialises");
    {
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o644)
            .open(&meta_tmp)
            .map_err(|e| Error::io_path("creating", &meta_tmp, e))?;
        f.write_all(json.as_bytes())
            .and_then(|_| f.sync_all())
            .map_err(|e| Error::io_path("writing", &meta_tmp, e))?;
    }

    // Publish: old metadata out, rows in, metadata in, each step made durable before the next.
    let meta_path = out.join(META_FILE);
    let rows_path = out.join(ROWS_FILE);
    match std::fs::remove_file(&meta_path) {
        Ok(()) => fsync_dir(&dir, out)?,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(Error::io_path("removing old", &meta_path, e)),
    }
    std::fs::rename(&rows_tmp, &rows_path)
        .map_err(|e| Error::io_path("renaming into place", &rows_path, e))?;
    fsync_dir(&dir, out)?;
    std::fs::rename(&meta_tmp, &meta_path)
        .map_err(|e| Error::io_path("renaming into place", &meta_path, e))?;
    fsync_dir(&dir, out)?;
    drop(temps);

    let t = Table::open(out, &TableOpenOptions::default())?;
    if t.meta() != &meta {
        return Err(Error::State(format!(
            "{}: the table changed while it was being published (another writer?)",
            out.display()
        )));
    }
    report.elapsed = t0.elapsed();
    report.meta = Some(meta);
    Ok(report)
}

/// The metadata of shard `s` of the whole table `whole` (itself for [`Shard::WHOLE`]).
pub(crate) fn shard_meta(whole: TableMeta, s: Shard) -> Result<TableMeta> {
    if s.is_whole() {
        return Ok(whole);
    }
    let s = Shard::new(s.index, s.count)?;
    let sm = ShardMeta::of(&whole, s);
    let meta = TableMeta {
        total_rows: s.file_rows(&whole.hash, whole.total_rows),
        shard: Some(sm),
        ..whole
    };
    meta.validate()?;
    Ok(meta)
}

/// Reserves `total` bytes for `f` (`fallocate`), so a full disk fails before any write.
/// Filesystems without `fallocate` are written without reserving.
fn reserve(f: &File, total: u64, tmp: &Path) -> Result<()> {
    // `total` ≤ MAX_FILE_BYTES (validated metadata) fits off_t
    let Err(e) = crate::sys::fallocate(f.as_fd(), total) else {
        return Ok(());
    };
    match e.raw_os_error() {
        Some(libc::EOPNOTSUPP) | Some(libc::ENOSYS) => Ok(()),
        _ => Err(Error::io(
            format!(
                "reserving {total} bytes for {} (is the disk full?)",
                tmp.display()
            ),
            e,
        )),
    }
}

/// The shard files, each opened once (regular files only) and advised SEQUENTIAL.
#[derive(Default)]
struct Sources(HashMap<PathBuf, File>);

impl Sources {
    fn open(&mut self, p: &Path) -> Result<&File> {
        if !self.0.contains_key(p) {
            let (f, _) = open_regular(p)?;
            fadvise(&f, 0, 0, libc::POSIX_FADV_SEQUENTIAL);
            self.0.insert(p.to_path_buf(), f);
        }
        Ok(&self.0[p])
    }
}

/// Reads `buf.len()` bytes at `off` of a shard, then drops them from the page cache.
fn read_at(f: &File, path: &Path, buf: &mut [u8], off: u64) -> Result<()> {
    f.read_exact_at(buf, off)
        .map_err(|e| Error::io_path("reading shard data of", path, e))?;
    fadvise(f, off, buf.len() as u64, libc::POSIX_FADV_DONTNEED);
    Ok(())
}

/// Write-behind of the output: starts write-back of each full window, waits for the one before
/// it, then drops it from the page cache, so the packer never fills the page cache.
#[derive(Default)]
struct WriteBehind {
    /// Start of the window not yet handed to write-back.
    flushed: u64,
    /// Everything before this is on disk and dropped from the cache.
    waited: u64,
}

impl WriteBehind {
    fn wrote(&mut self, f: &File, done: u64) {
        if done - self.flushed < FLUSH_WINDOW {
            return;
        }
        sync_range(
            f,
            self.flushed,
            done - self.flushed,
            libc::SYNC_FILE_RANGE_WRITE,
        );
        if self.flushed > self.waited {
            sync_range(
                f,
                self.waited,
                self.flushed - self.waited,
                libc::SYNC_FILE_RANGE_WAIT_BEFORE
                    | libc::SYNC_FILE_RANGE_WRITE
                    | libc::SYNC_FILE_RANGE_WAIT_AFTER,
            );
            fadvise(
                f,
                self.waited,
                self.flushed - self.waited,
                libc::POSIX_FADV_DONTNEED,
            );
            self.waited = self.flushed;
        }
        self.flushed = done;
    }
}

/// Reusable buffers: one output chunk and, for NVFP4, the codes and scales it is built from (for
/// an F16 source, `codes` holds the f16 values widened into `out`).
struct Chunk {
    rows: u64,
    out: Vec<u8>,
    codes: Vec<u8>,
    scales: Vec<u8>,
}

impl Chunk {
    fn new(meta: &TableMeta, buffer_bytes: usize) -> Chunk {
        let rb = meta.row_bytes as usize;
        let rows = (buffer_bytes / rb).max(1);
        let nvfp4 = meta.row_format == RowFormat::Nvfp4;
        let side = |b: u32| {
            if nvfp4 {
                vec![0u8; rows * b as usize]
            } else {
                Vec::new()
            }
        };
        Chunk {
            rows: rows as u64,
            out: vec![0u8; rows * rb],
            codes: side(meta.code_bytes),
            scales: side(meta.scale_bytes),
        }
    }

    /// Fills the first `n` rows of `out` with rows `r0..r0 + n` of `shard`; returns their bytes.
    fn fill(
        &mut self,
        meta: &TableMeta,
        shard: &ShardSource,
        src: &mut Sources,
        r0: u64,
        n: u64,
    ) -> Result<&[u8]> {
        let (rb, cb, sb) = (
            meta.row_bytes as usize,
            meta.code_bytes as usize,
            meta.scale_bytes as usize,
        );
        let nb = n as usize * rb;
        let w = &shard.weight;
        match &shard.scales {
            // F16 source values (a GGUF) into F32 rows: each f16 widened, exactly
            None if w.info.dtype == "F16" => {
                let sb = meta.head_dim as usize * 2;
                self.codes.resize(n as usize * sb, 0);
                let c = &mut self.codes[..n as usize * sb];
                read_at(
                    src.open(&w.path)?,
                    &w.path,
                    c,
                    w.info.offset + r0 * sb as u64,
                )?;
                for (o, h) in self.out[..nb].chunks_exact_mut(4).zip(c.chunks_exact(2)) {
                    let v = half::f16::from_le_bytes([h[0], h[1]]);
                    o.copy_from_slice(&v.to_f32().to_le_bytes());
                }
            }
            None => read_at(
                src.open(&w.path)?,
                &w.path,
                &mut self.out[..nb],
                w.info.offset + r0 * rb as u64,
            )?,
            Some(s) => {
                let c = &mut self.codes[..n as usize * cb];
                read_at(
                    src.open(&w.path)?,
                    &w.path,
                    c,
                    w.info.offset + r0 * cb as u64,
                )?;
                let sc = &mut self.scales[..n as usize * sb];
                read_at(
                    src.open(&s.path)?,
                    &s.path,
                    sc,
                    s.info.offset + r0 * sb as u64,
                )?;
                for ((o, c), s) in self.out[..nb]
                    .chunks_exact_mut(rb)
                    .zip(c.chunks_exact(cb))
                    .zip(sc.chunks_exact(sb))
                {
                    o[..cb].copy_from_slice(c);
                    o[cb..].copy_from_slice(s);
                }
            }
        }
        Ok(&self.out[..nb])
    }
}

/// Streams every shard into `tmp`, syncs it and checks its size. Returns the bytes written.
fn write_rows(
    ck: &Checkpoint,
    meta: &TableMeta,
    tmp: &Path,
    opts: &PackOptions,
    progress: &mut dyn FnMut(u64, u64) -> bool,
) -> Result<u64> {
    let total = meta.file_bytes();
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o644)
        .open(tmp)
        .map_err(|e| Error::io_path("creating", tmp, e))?;
    if opts.preallocate && total > 0 {
        reserve(&f, total, tmp)?;
    }
    if !progress(0, total) {
        return Err(Error::State("cancelled".into()));
    }
    let mut chunk = Chunk::new(meta, opts.buffer_bytes);
    let mut sources = Sources::default();
    let mut behind = WriteBehind::default();
    let mut done = 0u64;
    // the whole table's rows the file holds, in file order (a shard table: its heads' ranges)
    let ranges: Vec<(u64, u64)> = match &meta.shard {
        None => vec![(0, meta.total_rows)],
        Some(s) => s.row_ranges.iter().map(|r| (r[0], r[1])).collect(),
    };
    for (lo, hi) in ranges {
        // the checkpoint shards holding rows of [lo, hi)
        let first_shard = (lo / ck.rows_per_shard) as usize;
        for (i, shard) in ck.shards.iter().enumerate().skip(first_shard) {
            // this checkpoint shard's rows inside [lo, hi), relative to its first row
            let first = i as u64 * ck.rows_per_shard;
            if first >= hi {
                break;
            }
            let mut r0 = lo.saturating_sub(first).min(ck.rows_per_shard);
            let end = hi.saturating_sub(first).min(ck.rows_per_shard);
            while r0 < end {
                let n = chunk.rows.min(end - r0);
                let bytes = chunk.fill(meta, shard, &mut sources, r0, n)?;
                f.write_all(bytes)
                    .map_err(|e| Error::io_path(&format!("writing (shard {i}) to"), tmp, e))?;
                done += bytes.len() as u64;
                r0 += n;
                behind.wrote(&f, done);
                if !progress(done, total) {
                    return Err(Error::State("cancelled".into()));
                }
            }
        }
    }
    f.flush().map_err(|e| Error::io_path("writing", tmp, e))?;
    f.sync_all()
        .map_err(|e| Error::io_path("syncing", tmp, e))?;
    fadvise(&f, 0, 0, libc::POSIX_FADV_DONTNEED);
    let size = f
        .metadata()
        .map_err(|e| Error::io_path("stat", tmp, e))?
        .len();
    if size != total || done != total {
        return Err(Error::Format(format!(
            "{}: wrote {done} bytes, file has {size}, expected {total}",
            tmp.display()
        )));
    }
    Ok(done)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, Instant};

    /// A child forked while a pack holds the lock shares it until it execs or exits: the next
    /// pack waits it out instead of failing.
    #[test]
    fn a_briefly_inherited_lock_is_waited_for() {
        let d = tempfile::tempdir().unwrap();
        let first = lock_dir(d.path()).unwrap();
        // SAFETY: the child only sleeps and exits (async-signal-safe calls), as a forked
        // child of a multi-threaded process must.
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0);
        if pid == 0 {
            let ts = libc::timespec {
                tv_sec: 0,
                tv_nsec: 150_000_000,
            };
            // SAFETY: nanosleep reads `ts` (alive) and may write nothing (null remainder).
            unsafe { libc::nanosleep(&ts, std::ptr::null_mut()) };
            // SAFETY: _exit ends the child without running the parent's destructors.
            unsafe { libc::_exit(0) };
        }
        drop(first); // the child still holds the lock's open file description
        let t0 = Instant::now();
        let second = lock_dir(d.path());
        let waited = t0.elapsed();
        let mut status = 0;
        // SAFETY: waits for our own child; `status` is a valid place for its exit status.
        assert_eq!(unsafe { libc::waitpid(pid, &mut status, 0) }, pid);
        assert!(second.is_ok(), "{:?}", second.err());
        assert!(waited >= Duration::from_millis(50), "{waited:?}");
    }

    /// A lock held past the patience is another packer's: a State error naming the directory.
    #[test]
    fn a_held_lock_fails_after_the_patience() {
        let d = tempfile::tempdir().unwrap();
        let _held = lock_dir(d.path()).unwrap();
        let t0 = Instant::now();
        match lock_dir(d.path()) {
            Err(Error::State(m)) => assert!(m.contains("another packer"), "{m}"),
            other => panic!("{:?}", other.map(|_| ())),
        }
        assert!(t0.elapsed() >= LOCK_PATIENCE);
    }
}
