//! Buffered reads of rows through io_uring: MMAP mode's buffered cold read and read ahead's
//! reader, reading rows through the page cache without touching the mapping.

use crate::error::{Error, Result};
use crate::io::direct::buf::AlignedBuf;
use crate::io::direct::uring::{ReadReq, Ring, RingSetup};
use std::os::fd::AsRawFd;

/// Reads a step's rows through the page cache with io_uring: buffered reads of the row file (a
/// descriptor of its own, `POSIX_FADV_RANDOM`: no readahead past the pages named) straight into
/// the step's slot, all in flight at once, waited for. Against `posix_fadvise(WILLNEED)` per page
/// then a faulting gather, it saves a system call per page and every page fault (the mapping is
/// not touched), and the pages it reads stay cached for later steps as a fault would leave them.
pub struct BufferedReader {
    file: std::fs::File,
    /// Boxed, as in `DirectReader`: the ring's state is large and the reader sits in an enum.
    ring: Box<Ring>,
    scratch: AlignedBuf,
    reqs: Vec<ReadReq>,
    res: Vec<i32>,
    row_bytes: usize,
}

impl BufferedReader {
    /// A reader of rows of `row_bytes` of the file at `path`; None where io_uring is refused.
    pub fn open(path: &std::path::Path, row_bytes: usize) -> Option<BufferedReader> {
        let file = std::fs::File::open(path).ok()?;
        crate::sys::fadvise(file.as_raw_fd(), 0, 0, libc::POSIX_FADV_RANDOM).ok()?;
        let ring = Box::new(
            Ring::new(
                file.as_raw_fd(),
                crate::io::direct::DEPTH,
                RingSetup::default(),
            )
            .ok()?,
        );
        let scratch = AlignedBuf::default();
        Some(BufferedReader {
            file,
            ring,
            scratch,
            reqs: Vec::new(),
            res: Vec::new(),
            row_bytes,
        })
    }

    /// Reads rows `ids` through the page cache into
    /// `out` (row `i` at `out[i * rb..]`), all in flight at once: cached rows are copied by the
    /// kernel at submission, the others read (their pages then stay cached, as a fault would have
    /// left them). No page of the mapping is touched, so nothing can fault. A failed or short read
    /// (the file shorter than the table) is `Error::Io` naming the row. Returns the reads issued.
    pub fn read_rows(&mut self, ids: &[u64], out: &mut [u8]) -> Result<u64> {
        let rb = self.row_bytes;
        assert!(out.len() >= ids.len() * rb, "output holds the rows");
        self.scratch.reserve(ids.len() * rb)?;
        self.reqs.clear();
        self.reqs
            .extend(ids.iter().enumerate().map(|(i, &r)| ReadReq {
                off: r * rb as u64,
                buf_off: i * rb,
                len: rb as u32,
            }));
        self.ring
            .read_batch(&self.reqs, &mut self.scratch, &mut self.res)
            .map_err(|e| Error::io("io_uring row reads", e))?;
        for (&r, &n) in ids.iter().zip(&self.res) {
            if n < 0 || n as usize != rb {
                let what = format!(
                    "reading row {r} at offset {} of the row file (buffered, io_uring)",
                    r * rb as u64
                );
                let e = match n {
                    n if n < 0 => std::io::Error::from_raw_os_error(-n),
                    n => std::io::Error::new(
                        std::io::ErrorKind::UnexpectedEof,
                        format!(
                            "short read, {n} of {rb} bytes (the file is shorter than the table)"
                        ),
                    ),
                };
                return Err(Error::io(what, e));
            }
        }
        out[..ids.len() * rb].copy_from_slice(&self.scratch.as_slice()[..ids.len() * rb]);
        Ok(ids.len() as u64)
    }

    /// The descriptor the reads go through.
    pub fn file(&self) -> &std::fs::File {
        &self.file
    }
}

impl crate::io::source::RowSource for BufferedReader {
    /// [`BufferedReader::read_rows`]; the bytes are those asked for (how many came from storage
    /// rather than the page cache shows in the thread's I/O accounting).
    fn read(&mut self, ids: &[u64], out: &mut [u8]) -> Result<crate::io::source::ReadReport> {
        Ok(crate::io::source::ReadReport {
            reads: self.read_rows(ids, out)?,
            bytes: (ids.len() * self.row_bytes) as u64,
            hits: 0,
        })
    }

    /// WILLNEED for the rows' pages ([`willneed_rows`](crate::io::source::willneed_rows)):
    /// they are read into the page cache, where a later batch finds them.
    fn hint(&mut self, ids: &[u64]) -> Result<()> {
        crate::io::source::willneed_rows(self.file.as_raw_fd(), ids, self.row_bytes)
    }

    fn name(&self) -> &'static str {
        "buffered io_uring"
    }
}

impl Drop for BufferedReader {
    fn drop(&mut self) {
        if self.ring.poisoned() {
            // reads may still land in the scratch buffer after the ring is gone
            std::mem::take(&mut self.scratch).leak();
        }
    }
}
