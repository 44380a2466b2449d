//! `ple synth-table --full`: a dense table of the real model's shape (320,001,536 rows for the
//! default config), every byte of its row file pseudo-random, written at device speed.
//!
//! The row file is written in 16 MiB chunks from 4 KiB-aligned buffers with `O_DIRECT` (the page
//! cache is neither filled nor needed; a 28.8 GB file does not evict the machine's working set),
//! the next chunk generated on a second thread while the current one is written. Where `O_DIRECT`
//! is refused (tmpfs), buffered writes. The metadata is written last: a failed write leaves no
//! openable table behind.

use ple_core::error::{Error, Result};
use ple_core::format::table::{META_FILE, ROWS_FILE, TableMeta};
use ple_core::model::RowFormat;
use std::io::Write;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::Path;
use std::time::Instant;

/// Bytes per write (a multiple of 4096).
const CHUNK: usize = 16 << 20;

/// A 4 KiB-aligned heap buffer of `CHUNK` bytes.
struct Aligned {
    ptr: *mut u8,
    len: usize,
}

// SAFETY: the buffer is uniquely owned heap memory; moving it between threads moves ownership.
unsafe impl Send for Aligned {}

impl Aligned {
    fn new(len: usize) -> Aligned {
        let layout = std::alloc::Layout::from_size_align(len, 4096).expect("valid layout");
        // SAFETY: the layout has a non-zero size; a null return is handled below.
        let ptr = unsafe { std::alloc::alloc_zeroed(layout) };
        if ptr.is_null() {
            std::alloc::handle_alloc_error(layout);
        }
        Aligned { ptr, len }
    }
    fn as_mut(&mut self) -> &mut [u8] {
        // SAFETY: `ptr` owns `len` initialised (zeroed) bytes for the buffer's life; `&mut self`
        // makes this the only reference.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len) }
    }
}

impl Drop for Aligned {
    fn drop(&mut self) {
        let layout = std::alloc::Layout::from_size_align(self.len, 4096).expect("valid layout");
        // SAFETY: allocated in `new` with this layout, freed once.
        unsafe { std::alloc::dealloc(self.ptr, layout) };
    }
}

/// Fills `buf` with the pseudo-random bytes of chunk `k` (xorshift64*, seeded per chunk, so the
/// file's content depends only on `seed`).
fn fill(buf: &mut [u8], seed: u64, k: u64) {
    let mut x = ple_core::model::splitmix64(seed ^ k.wrapping_mul(0x9E37_79B9_7F4A_7C15)) | 1;
    for w in buf.chunks_exact_mut(8) {
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        w.copy_from_slice(&x.wrapping_mul(0x2545_F491_4F6C_DD1D).to_le_bytes());
    }
}

/// Writes the dense full-shape table of `format` into `dir`.
pub fn write_dense_full_table(dir: &Path, format: RowFormat, seed: u64) -> Result<TableMeta> {
    // the sparse writer lays out the metadata and sizes the row file; its metadata is replaced
    // after the rows are written
    let mut meta = ple_testkit::synth::write_sparse_full_table(dir, format)?;
    let meta_path = dir.join(META_FILE);
    std::fs::remove_file(&meta_path).map_err(|e| Error::io_path("removing", &meta_path, e))?;
    let rows_path = dir.join(ROWS_FILE);
    let total = meta.total_rows * meta.row_bytes as u64;
    let t0 = Instant::now();
    write_rows(&rows_path, total, seed)?;
    let secs = t0.elapsed().as_secs_f64();
    eprintln!(
        "wrote {:.1} GB in {secs:.1} s ({:.2} GB/s)",
        total as f64 / 1e9,
        total as f64 / 1e9 / secs
    );
    meta.source.name = "dense-full-shape".into();
    meta.source.fingerprint = format!("random-seed-{seed}");
    let json = serde_json::to_string_pretty(&meta).expect("metadata serialises");
    std::fs::write(&meta_path, json).map_err(|e| Error::io_path("writing", &meta_path, e))?;
    Ok(meta)
}

fn write_rows(path: &Path, total: u64, seed: u64) -> Result<()> {
    let direct = std::fs::OpenOptions::new()
        .write(true)
        .custom_flags(libc::O_DIRECT)
        .open(path);
    let (file, is_direct) = match direct {
        Ok(f) => (f, true),
        Err(_) => (
            std::fs::OpenOptions::new()
                .write(true)
                .open(path)
                .map_err(|e| Error::io_path("opening", path, e))?,
            false,
        ),
    };
    let chunks = total.div_ceil(CHUNK as u64);
    let mut cur = Aligned::new(CHUNK);
    let mut next = Aligned::new(CHUNK);
    fill(cur.as_mut(), seed, 0);
    for k in 0..chunks {
        let off = k * CHUNK as u64;
        let len = (total - off).min(CHUNK as u64) as usize;
        let (w, ()) = rayon::join(
            || write_chunk(&file, is_direct, &mut cur.as_mut()[..len], off),
            || {
                if k + 1 < chunks {
                    fill(next.as_mut(), seed, k + 1)
                }
            },
        );
        w.map_err(|e| Error::io_path("writing", path, e))?;
        std::mem::swap(&mut cur, &mut next);
        if k % 64 == 63 {
            eprint!("\r{:.1} / {:.1} GB", off as f64 / 1e9, total as f64 / 1e9);
            let _ = std::io::stderr().flush();
        }
    }
    eprintln!();
    file.sync_all()
        .map_err(|e| Error::io_path("syncing", path, e))
}

/// Writes `buf` at `off`: with O_DIRECT the sector-aligned head, the unaligned tail (the file's
/// last bytes) through a buffered descriptor.
fn write_chunk(
    file: &std::fs::File,
    is_direct: bool,
    buf: &mut [u8],
    off: u64,
) -> std::io::Result<()> {
    let aligned = if is_direct {
        buf.len() / 4096 * 4096
    } else {
        buf.len()
    };
    file.write_all_at(&buf[..aligned], off)?;
    if aligned < buf.len() {
        // a fresh buffered descriptor for the tail (O_DIRECT needs aligned lengths)
        let f = std::fs::OpenOptions::new().write(true).open(format!(
            "/proc/self/fd/{}",
            std::os::fd::AsRawFd::as_raw_fd(file)
        ))?;
        f.write_all_at(&buf[aligned..], off + aligned as u64)?;
    }
    Ok(())
}
