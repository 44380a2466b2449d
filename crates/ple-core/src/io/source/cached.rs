//! [`Cached`]: the row cache in front of any [`RowSource`].

use super::{ReadReport, RowSource};
use crate::error::Result;
use crate::io::cache::{Lookups, ReadThroughScratch, RowCache, read_through};

/// A [`RowSource`] that looks each row up in `cache` first (where `lookups` says, for a big
/// batch), reads only the misses from `inner`, together, and inserts them
/// ([`read_through`]). Borrowed for a batch: the cache, the source and the scratch buffers live
/// with their owner between batches.
pub struct Cached<'a, S: RowSource + ?Sized> {
    cache: &'a RowCache,
    inner: &'a mut S,
    scratch: &'a mut ReadThroughScratch,
    lookups: Lookups<'a>,
}

impl<'a, S: RowSource + ?Sized> Cached<'a, S> {
    pub fn new(
        cache: &'a RowCache,
        inner: &'a mut S,
        scratch: &'a mut ReadThroughScratch,
        lookups: Lookups<'a>,
    ) -> Cached<'a, S> {
        Cached {
            cache,
            inner,
            scratch,
            lookups,
        }
    }
}

impl<S: RowSource + ?Sized> RowSource for Cached<'_, S> {
    fn read(&mut self, ids: &[u64], out: &mut [u8]) -> Result<ReadReport> {
        let inner = &mut *self.inner;
        let (r, hits) = read_through(self.cache, ids, out, self.scratch, self.lookups, |m, o| {
            inner.read(m, o)
        })?;
        Ok(ReadReport {
            hits,
            ..r.unwrap_or_default()
        })
    }

    fn hint(&mut self, ids: &[u64]) -> Result<()> {
        self.inner.hint(ids)
    }

    fn name(&self) -> &'static str {
        self.inner.name()
    }
}
