//! The packed table: metadata, read-only mmap with MADV_RANDOM, validation (SPEC §6).
//! Filled in by the packing issue.

use crate::error::{Error, Result};
use std::path::Path;

/// An open, validated packed table.
pub struct Table {}

impl Table {
    /// Opens and validates the table in `dir`.
    pub fn open(dir: &Path) -> Result<Table> {
        Err(Error::Format(format!(
            "no packed table in {}",
            dir.display()
        )))
    }
}
