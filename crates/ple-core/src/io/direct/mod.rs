//! DIRECT reads: the row file opened `O_DIRECT`, each row read as exactly the aligned range of
//! logical blocks that covers it.
//!
//! A step's rows are sorted by offset and their block ranges merged where they overlap or touch
//! (up to [`MAX_EXTENT`] bytes per read); the merged reads go out together — through io_uring at
//! depth [`DEPTH`] ([`uring`]), or where io_uring is refused, on a pool of `pread` threads —
//! into one aligned buffer ([`buf`]), and each row is copied from there to its place in the
//! output (`out[i * row_bytes..]` for `ids[i]`, the gather's layout).
//!
//! [`DirectReader::read_rows`] takes the rows to read, whatever chose them: a row cache can sit in
//! front of it and pass only the rows it misses.

pub mod buf;
mod pread;
pub mod uring;

/// What one [`DirectReader::read_rows`] did.
pub use crate::io::source::ReadReport;

use crate::error::{Error, Result};
use buf::AlignedBuf;
use std::os::fd::AsRawFd;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use uring::{ReadReq, Ring};

/// Reads in flight (io_uring) or `pread` threads (fallback). Depth 64–128 reaches the device's
/// random-read IOPS on the drives measured (`ple bench`'s storage floor).
pub const DEPTH: usize = 128;
/// Largest merged read, bytes.
pub const MAX_EXTENT: u64 = 64 << 10;

/// How the DIRECT reads are issued.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Backend {
    /// One io_uring per handle, reads kept at depth [`DEPTH`].
    IoUring,
    /// [`DEPTH`] threads issuing `pread` (io_uring refused, or forced).
    PreadPool,
}

impl Backend {
    pub fn name(self) -> &'static str {
        match self {
            Backend::IoUring => "io_uring",
            Backend::PreadPool => "pread-pool",
        }
    }
}

enum Engine {
    Uring(Box<Ring>),
    Pread(rayon::ThreadPool),
}

/// When a reader uses the `pread` pool.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Pool {
    /// Where io_uring is refused.
    Fallback,
    /// Always (tests).
    Forced,
    /// Never: no io_uring is an error.
    Never,
}

/// One row's place in the step's reads.
#[derive(Clone, Copy)]
struct Extent {
    /// File offset of the read (aligned).
    off: u64,
    /// Bytes read (aligned).
    len: u64,
    /// Bytes the rows need from `off` (a read that returns fewer failed).
    need: u64,
    /// Buffer offset of the read.
    buf_off: usize,
    /// First row id in it (for messages).
    first_row: u64,
}

/// The DIRECT reader of one row file.
pub struct DirectReader {
    file: std::fs::File,
    path: PathBuf,
    row_bytes: u64,
    align: u64,
    engine: Engine,
    buf: AlignedBuf,
    order: Vec<u32>,
    pos: Vec<usize>,
    extents: Vec<Extent>,
    reqs: Vec<ReadReq>,
    res: Vec<i32>,
}

impl DirectReader {
    /// Opens `path` for DIRECT reads of rows of `row_bytes`. `Error::Unsupported` where direct
    /// I/O does not work on the file (tmpfs, or `O_DIRECT` refused); `force_pread` skips
    /// io_uring (tests, and where it misbehaves).
    pub fn open(path: &Path, row_bytes: usize, force_pread: bool) -> Result<DirectReader> {
        let pool = if force_pread {
            Pool::Forced
        } else {
            Pool::Fallback
        };
        DirectReader::open_with(path, row_bytes, pool)
    }

    /// [`DirectReader::open`] with io_uring only: `Error::Unsupported` where io_uring is refused
    /// (for a reader beside the mapping, not worth a pool of threads).
    pub fn open_uring_only(path: &Path, row_bytes: usize) -> Result<DirectReader> {
        DirectReader::open_with(path, row_bytes, Pool::Never)
    }

    fn open_with(path: &Path, row_bytes: usize, pool: Pool) -> Result<DirectReader> {
        let file = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_DIRECT)
            .open(path)
            .map_err(|e| match e.raw_os_error() {
                Some(libc::EINVAL) | Some(libc::EOPNOTSUPP) => Error::Unsupported(format!(
                    "direct I/O on {}: O_DIRECT refused ({e})",
                    path.display()
                )),
                _ => Error::io_path("opening (O_DIRECT)", path, e),
            })?;
        if crate::sys::on_memory_fs(&file) {
            return Err(Error::Unsupported(format!(
                "direct I/O on {}: the file is on tmpfs (memory; nothing to read directly)",
                path.display()
            )));
        }
        let align = crate::sys::dio_align(file.as_raw_fd())
            .map(|(m, o)| m.max(o))
            .or_else(|| crate::sys::logical_block_size(path))
            .unwrap_or(4096)
            .max(512) as u64;
        if align as usize > crate::io::direct::buf::BUF_ALIGN {
            return Err(Error::Unsupported(format!(
                "direct I/O on {}: alignment {align} B above {} B",
                path.display(),
                crate::io::direct::buf::BUF_ALIGN
            )));
        }
        let forced = pool == Pool::Forced || std::env::var_os("PLE_IO_FORCE_PREAD").is_some();
        let uring = if forced && pool != Pool::Never {
            None
        } else {
            match Ring::for_reads(file.as_raw_fd(), DEPTH) {
                Ok(r) => Some(r),
                Err(e) => {
                    log::info!("io_uring unavailable ({e}): DIRECT reads use a pread pool");
                    None
                }
            }
        };
        let engine = match uring {
            Some(r) => Engine::Uring(Box::new(r)),
            None if pool == Pool::Never => {
                return Err(Error::Unsupported(format!(
                    "direct I/O on {}: io_uring refused",
                    path.display()
                )));
            }
            None => Engine::Pread(
                rayon::ThreadPoolBuilder::new()
                    .num_threads(DEPTH)
                    // (64 KiB overflowed in debug builds; only the pages touched are resident)
                    .stack_size(256 << 10)
                    .thread_name(|i| format!("ple-pread-{i}"))
                    .build()
                    .map_err(|e| Error::io("starting the pread pool", std::io::Error::other(e)))?,
            ),
        };
        let mut r = DirectReader {
            file,
            path: path.to_path_buf(),
            row_bytes: row_bytes as u64,
            align,
            engine,
            buf: AlignedBuf::default(),
            order: Vec::new(),
            pos: Vec::new(),
            extents: Vec::new(),
            reqs: Vec::new(),
            res: Vec::new(),
        };
        r.probe()?;
        Ok(r)
    }

    /// Reads the first block: a file system that opens `O_DIRECT` but fails its reads
    /// (EINVAL) is `Unsupported` here, not at the first step.
    fn probe(&mut self) -> Result<()> {
        if self.file_len() == 0 {
            return Ok(());
        }
        self.buf.reserve(self.align as usize)?;
        self.reqs.clear();
        self.reqs.push(ReadReq {
            off: 0,
            buf_off: 0,
            len: self.align as u32,
        });
        self.submit()?;
        match self.res[0] {
            n if n > 0 => Ok(()),
            n => Err(Error::Unsupported(format!(
                "direct I/O on {}: the first read failed ({})",
                self.path.display(),
                std::io::Error::from_raw_os_error(-n)
            ))),
        }
    }

    /// How reads are issued.
    pub fn backend(&self) -> Backend {
        match self.engine {
            Engine::Uring(_) => Backend::IoUring,
            Engine::Pread(_) => Backend::PreadPool,
        }
    }

    /// The read alignment (bytes): offsets and lengths are multiples of it.
    pub fn align(&self) -> u64 {
        self.align
    }

    fn file_len(&self) -> u64 {
        self.file.metadata().map_or(0, |m| m.len())
    }

    /// Reads rows `ids` (each `< total rows`, checked by the caller) into `out`, row `i` at
    /// `out[i * row_bytes..]`. A failed or short read fails the call with `Error::Io` naming the
    /// row, the offset and the errno; the reader serves later calls.
    pub fn read_rows(&mut self, ids: &[u64], out: &mut [u8]) -> Result<ReadReport> {
        let rb = self.row_bytes;
        if out.len() < ids.len() * rb as usize {
            return crate::invalid!("staging too small for {} rows", ids.len());
        }
        if ids.is_empty() {
            return Ok(ReadReport::default());
        }
        let total = self.plan(ids);
        self.buf.reserve(total)?;
        self.submit()?;
        let mut rep = ReadReport::default();
        for (e, &n) in self.extents.iter().zip(&self.res) {
            rep.reads += 1;
            rep.bytes += e.len;
            if n < 0 {
                return Err(Error::io(
                    format!(
                        "reading row {} at offset {} ({} bytes, O_DIRECT) of {}",
                        e.first_row,
                        e.off,
                        e.len,
                        self.path.display()
                    ),
                    std::io::Error::from_raw_os_error(-n),
                ));
            }
            if (n as u64) < e.need {
                return Err(Error::io(
                    format!(
                        "reading row {} at offset {} of {}: short read, {n} of {} bytes (the \
                         file is shorter than the table)",
                        e.first_row,
                        e.off,
                        self.path.display(),
                        e.need
                    ),
                    std::io::Error::from(std::io::ErrorKind::UnexpectedEof),
                ));
            }
        }
        let src = self.buf.as_slice();
        let rb = rb as usize;
        for (o, &p) in out.chunks_exact_mut(rb).zip(&self.pos) {
            o.copy_from_slice(&src[p..p + rb]);
        }
        Ok(rep)
    }

    /// Sorts the rows by offset, merges their aligned block ranges into `extents`, and lays the
    /// reads out in the buffer (`reqs`, `pos[i]` = buffer offset of row `ids[i]`). Returns the
    /// buffer bytes needed.
    fn plan(&mut self, ids: &[u64]) -> usize {
        let (rb, a) = (self.row_bytes, self.align);
        self.order.clear();
        self.order.extend(0..ids.len() as u32);
        self.order.sort_unstable_by_key(|&i| ids[i as usize]);
        self.pos.clear();
        self.pos.resize(ids.len(), 0);
        self.extents.clear();
        let mut buf_end = 0usize;
        for &i in &self.order {
            let r = ids[i as usize];
            let (off, end) = (r * rb, r * rb + rb);
            let (s, e) = (off / a * a, end.div_ceil(a) * a);
            match self.extents.last_mut() {
                Some(x) if s <= x.off + x.len && e - x.off <= MAX_EXTENT => {
                    let grow = e.saturating_sub(x.off + x.len);
                    x.len += grow;
                    buf_end += grow as usize;
                    x.need = x.need.max(end - x.off);
                }
                _ => {
                    self.extents.push(Extent {
                        off: s,
                        len: e - s,
                        need: end - s,
                        buf_off: buf_end,
                        first_row: r,
                    });
                    buf_end += (e - s) as usize;
                }
            }
            let x = self.extents.last().expect("pushed");
            self.pos[i as usize] = x.buf_off + (off - x.off) as usize;
        }
        self.reqs.clear();
        self.reqs.extend(self.extents.iter().map(|x| ReadReq {
            off: x.off,
            buf_off: x.buf_off,
            len: x.len as u32,
        }));
        buf_end
    }

    /// Runs `reqs` into `buf`; `res[i]` gets read `i`'s result (bytes or -errno).
    fn submit(&mut self) -> Result<()> {
        match &mut self.engine {
            Engine::Uring(ring) => ring
                .read_batch(&self.reqs, &mut self.buf, &mut self.res)
                .map_err(|e| Error::io("io_uring_enter", e)),
            Engine::Pread(pool) => {
                pread::pread_all(pool, &self.file, &self.reqs, &mut self.buf, &mut self.res);
                Ok(())
            }
        }
    }
}

impl Drop for DirectReader {
    fn drop(&mut self) {
        if let Engine::Uring(r) = &self.engine {
            if r.poisoned() {
                // reads may still land in the buffer after the ring is gone: never free it
                std::mem::take(&mut self.buf).leak();
            }
        }
    }
}

impl crate::io::source::RowSource for DirectReader {
    fn read(&mut self, ids: &[u64], out: &mut [u8]) -> Result<ReadReport> {
        self.read_rows(ids, out)
    }

    fn name(&self) -> &'static str {
        self.backend().name()
    }
}

#[cfg(test)]
mod tests;
