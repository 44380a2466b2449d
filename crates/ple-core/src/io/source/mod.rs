//! The one read interface: a [`RowSource`] reads a batch of row ids into a buffer (row `i` of
//! the batch at `out[i * row_bytes..]`, the gather's layout) and may take a hint of ids to be
//! read later. One backend per file:
//! - [`DirectReader`](crate::io::direct::DirectReader) (`direct/`): `O_DIRECT` sector reads,
//!   issued through io_uring (`direct/uring.rs`) or a pread pool (`direct/pread.rs`);
//! - [`BufferedReader`](crate::io::mmap::buffered::BufferedReader): buffered io_uring reads
//!   through the page cache (the mapping untouched);
//! - [`PreadRows`]: one `pread` per row (where io_uring is refused).
//!
//! [`Cached`] puts the row cache in front of any of them: only the rows it misses reach the
//! source, and those are inserted. Which backend a handle reads with is decided once, at open
//! (`step::plan`). MMAP mode's step gather is not a source: it copies out of the mapping on the
//! gather pool, overlapped with its page advice (`io::mmap::gather`), and its row cache path
//! interleaves lookups and copies row by row (`io::cache::gather_cached`).

mod cached;
mod pread;

pub use cached::Cached;
pub use pread::PreadRows;

use crate::error::Result;

/// What one [`RowSource::read`] did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ReadReport {
    /// Read requests issued to storage (after merging; 0 when every row was cached).
    pub reads: u64,
    /// Bytes those reads asked for.
    pub bytes: u64,
    /// Rows served by a row cache in front of the source ([`Cached`]), not read.
    pub hits: u64,
}

/// A source of rows (see the module doc). `&mut self`: a source keeps its buffers and its
/// queue between batches and is driven by one thread at a time.
pub trait RowSource {
    /// Reads rows `ids` (each inside the row file, checked by the caller) into `out`, row `i`
    /// at `out[i * row_bytes..]` (`out` holds at least `ids.len()` rows). A failed or short
    /// read fails the call with `Error::Io` naming the row; the source serves later calls.
    fn read(&mut self, ids: &[u64], out: &mut [u8]) -> Result<ReadReport>;

    /// Rows likely read soon: a source that can start them early does (page advice); the
    /// default ignores the hint. A failure only loses the warming.
    fn hint(&mut self, _ids: &[u64]) -> Result<()> {
        Ok(())
    }

    /// The backend's name, as `ple_info` and the logs give it.
    fn name(&self) -> &'static str;
}

/// `POSIX_FADV_WILLNEED` for the OS pages of rows `ids` (of `row_bytes`) of the file `fd`, one
/// call per run of adjacent pages: the page-cache backends' [`RowSource::hint`]. The kernel
/// starts the reads and returns; the pages then serve a later read without waiting for storage.
pub(crate) fn willneed_rows(fd: std::os::fd::RawFd, ids: &[u64], row_bytes: usize) -> Result<()> {
    let ps = crate::sys::os_page_size() as u64;
    let rb = row_bytes as u64;
    let mut pages: Vec<(u64, u64)> = ids
        .iter()
        .map(|&r| (r * rb / ps, (r * rb + rb).div_ceil(ps)))
        .collect();
    pages.sort_unstable();
    let mut run: Option<(u64, u64)> = None;
    let advise = |(a, b): (u64, u64)| {
        crate::sys::fadvise(fd, a * ps, (b - a) * ps, libc::POSIX_FADV_WILLNEED)
            .map_err(|e| crate::error::Error::io("posix_fadvise(WILLNEED) of rows", e))
    };
    for (a, b) in pages {
        run = match run {
            Some((s, e)) if a <= e => Some((s, e.max(b))),
            Some(r) => {
                advise(r)?;
                Some((a, b))
            }
            None => Some((a, b)),
        };
    }
    run.map_or(Ok(()), advise)
}

impl<S: RowSource + ?Sized> RowSource for Box<S> {
    fn read(&mut self, ids: &[u64], out: &mut [u8]) -> Result<ReadReport> {
        (**self).read(ids, out)
    }
    fn hint(&mut self, ids: &[u64]) -> Result<()> {
        (**self).hint(ids)
    }
    fn name(&self) -> &'static str {
        (**self).name()
    }
}

#[cfg(test)]
mod tests;
