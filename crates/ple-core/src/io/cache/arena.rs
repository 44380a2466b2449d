//! The memory the row cache's lookups read: every shard's index and slots, one anonymous
//! mapping whose words start on a 2 MiB boundary, advised `MADV_HUGEPAGE` ([`Pages::Huge`]).
//!
//! A lookup reads two random places of a structure of hundreds of MiB (an index line, then a
//! slot), so with 4 KiB pages nearly every lookup of a real step misses the TLB twice, and on a
//! virtual machine each miss is a two-dimensional page walk. With 2 MiB pages a 256 MiB cache is
//! 128 TLB entries, which the CPU's second-level TLB holds. Where transparent huge pages are
//! disabled (`never`) the advice changes nothing and the cache works as with 4 KiB pages.
//!
//! The mapping is 2 MiB longer than the words, so that they can start on a boundary; the slack
//! is never touched and takes no memory. Its pages are zero when mapped: the caller writes the
//! words' initial values.

use crate::error::{Error, Result};
use std::ops::Deref;
use std::ptr::NonNull;
use std::sync::atomic::AtomicU64;

/// The page size the cache's memory is advised for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Pages {
    /// 2 MiB pages where the kernel gives them (the default).
    #[default]
    Huge,
    /// The base page size (no advice): for side-by-side measurements.
    Base,
}

/// Alignment of the words: the x86-64 and aarch64 (4 KiB granule) huge page size.
const HUGE: usize = 2 << 20;

/// An anonymous mapping holding `words` zeroed [`AtomicU64`]s from a 2 MiB boundary.
pub(super) struct Arena {
    map: memmap2::MmapMut,
    /// Byte offset of word 0 in `map` (a multiple of the base page size).
    start: usize,
    words: usize,
    /// Whether the kernel took the huge-page advice.
    advised: bool,
}

impl Arena {
    /// Maps `words` words (`words` > 0), advised as `pages` says.
    pub(super) fn new(words: usize, pages: Pages) -> Result<Arena> {
        let oom = |e: std::io::Error| {
            Error::OutOfMemory(format!("row cache: mapping {words} words failed: {e}"))
        };
        let bytes = words
            .checked_mul(8)
            .and_then(|b| b.checked_add(HUGE))
            .ok_or_else(|| Error::OutOfMemory(format!("row cache: {words} words")))?;
        let map = memmap2::MmapOptions::new()
            .len(bytes)
            .map_anon()
            .map_err(oom)?;
        let addr = map.as_ptr() as usize;
        let start = addr.next_multiple_of(HUGE) - addr;
        // only advice: a kernel without transparent huge pages refuses it (EINVAL), and the
        // cache then runs on base pages
        let advised = pages == Pages::Huge
            && map
                .advise_range(memmap2::Advice::HugePage, start, words * 8)
                .map_err(|e| log::debug!("row cache: MADV_HUGEPAGE refused ({e}): base pages"))
                .is_ok();
        Ok(Arena {
            map,
            start,
            words,
            advised,
        })
    }

    /// The view of words `at .. at + len` (within the arena). The view is valid while the arena
    /// lives: its owner keeps the arena beside every view and drops the views first.
    pub(super) fn words(&self, at: usize, len: usize) -> Words {
        assert!(
            at.checked_add(len).is_some_and(|end| end <= self.words),
            "row cache arena: words {at}+{len} of {}",
            self.words
        );
        // SAFETY: `start + 8 × at` lies inside the mapping (checked above: at + len ≤ words,
        // and the mapping holds start + 8 × words bytes), so the pointer is in bounds and
        // non-null; it is 8-aligned because the mapping is page-aligned and start is a multiple
        // of the page size.
        let ptr = unsafe { self.map.as_ptr().add(self.start + 8 * at) } as *mut AtomicU64;
        Words {
            ptr: NonNull::new(ptr).expect("a mapping is not at address 0"),
            len,
        }
    }

    /// Whether the kernel took the huge-page advice (without it no page is huge).
    pub(super) fn advised(&self) -> bool {
        self.advised
    }

    /// The address of word 0 (2 MiB-aligned) and the mapped bytes from there (for tests and
    /// `/proc/self/smaps` look-ups).
    pub(super) fn span(&self) -> (usize, usize) {
        (self.map.as_ptr() as usize + self.start, self.words * 8)
    }
}

/// A run of an [`Arena`]'s words, read and written as a slice of atomics.
pub(super) struct Words {
    ptr: NonNull<AtomicU64>,
    len: usize,
}

// SAFETY: a Words is a shared view of atomics (`AtomicU64` is Sync): handing it to or sharing it
// with another thread gives that thread only `&[AtomicU64]`, which is thread-safe by itself.
unsafe impl Send for Words {}
// SAFETY: as for Send: every access through a shared Words is an atomic operation.
unsafe impl Sync for Words {}

impl Deref for Words {
    type Target = [AtomicU64];
    #[inline(always)]
    fn deref(&self) -> &[AtomicU64] {
        // SAFETY: `ptr .. ptr + len` words lie inside a live arena mapping (Arena::words checked
        // the bounds; the arena outlives every view: see Arena::words), they are 8-aligned, any
        // bit pattern (the zeroed pages included) is a valid AtomicU64, and the memory is only
        // ever accessed through atomics, so shared references to it may coexist.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::Ordering::Relaxed;

    #[test]
    fn words_start_on_a_huge_page_boundary_advised_huge_and_zeroed() {
        let a = Arena::new(3 << 20, Pages::Huge).unwrap();
        let (addr, bytes) = a.span();
        assert_eq!(addr % HUGE, 0);
        assert_eq!(bytes, 24 << 20);
        let w = a.words(0, 3 << 20);
        assert!(w.iter().all(|x| x.load(Relaxed) == 0));
        w.iter().for_each(|x| x.store(u64::MAX, Relaxed));
        let (flags, huge) = crate::sys::smaps_of(addr).unwrap();
        // a kernel with transparent huge pages takes the advice (whatever its mode) and marks
        // the mapping; one without refuses it, and the cache runs on base pages
        let thp = std::fs::read_to_string("/sys/kernel/mm/transparent_hugepage/enabled")
            .unwrap_or_default();
        assert_eq!(a.advised, !thp.is_empty(), "THP: {thp:?}");
        assert_eq!(
            flags.split(' ').any(|f| f == "hg"),
            a.advised,
            "the VMA's flags: {flags}"
        );
        eprintln!(
            "THP {}: {} KiB of the 24 MiB on huge pages",
            thp.trim(),
            huge >> 10
        );
        // base pages: no advice
        let b = Arena::new(1 << 20, Pages::Base).unwrap();
        let (flags, _) = crate::sys::smaps_of(b.span().0).unwrap();
        assert!(!flags.split(' ').any(|f| f == "hg"), "{flags}");
    }

    #[test]
    fn views_are_bounded_and_disjoint() {
        let a = Arena::new(100, Pages::Base).unwrap();
        let (x, y) = (a.words(0, 40), a.words(40, 60));
        x.iter().for_each(|w| w.store(1, Relaxed));
        y.iter().for_each(|w| w.store(2, Relaxed));
        assert!(x.iter().all(|w| w.load(Relaxed) == 1));
        assert!(y.iter().all(|w| w.load(Relaxed) == 2));
        let past = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| a.words(40, 61)));
        assert!(past.is_err(), "a view past the end is refused");
    }
}
