//! [`PreadRows`]: a row per `pread`, through the page cache (the backend of last resort, where
//! io_uring is refused).

use super::{ReadReport, RowSource};
use crate::error::{Error, Result};
use std::os::unix::fs::FileExt;

/// Reads rows with one `pread` each from its own descriptor of the row file.
pub struct PreadRows {
    file: std::fs::File,
    row_bytes: usize,
}

impl PreadRows {
    /// A reader of the row file at `path` (rows of `row_bytes`).
    pub fn open(path: &std::path::Path, row_bytes: usize) -> Result<PreadRows> {
        let file = std::fs::File::open(path).map_err(|e| Error::io_path("opening", path, e))?;
        Ok(PreadRows::new(file, row_bytes))
    }

    /// A reader of rows of `row_bytes` through `file`.
    pub fn new(file: std::fs::File, row_bytes: usize) -> PreadRows {
        PreadRows { file, row_bytes }
    }
}

impl RowSource for PreadRows {
    fn read(&mut self, ids: &[u64], out: &mut [u8]) -> Result<ReadReport> {
        let rb = self.row_bytes;
        if out.len() < ids.len() * rb {
            return crate::invalid!("output too small for {} rows", ids.len());
        }
        for (&id, o) in ids.iter().zip(out.chunks_exact_mut(rb)) {
            self.file
                .read_exact_at(o, id * rb as u64)
                .map_err(|e| Error::io(format!("reading row {id}"), e))?;
        }
        Ok(ReadReport {
            reads: ids.len() as u64,
            bytes: (ids.len() * rb) as u64,
            hits: 0,
        })
    }

    /// WILLNEED for the rows' pages ([`willneed_rows`](super::willneed_rows)).
    fn hint(&mut self, ids: &[u64]) -> Result<()> {
        use std::os::fd::AsRawFd;
        super::willneed_rows(self.file.as_raw_fd(), ids, self.row_bytes)
    }

    fn name(&self) -> &'static str {
        "pread"
    }
}
