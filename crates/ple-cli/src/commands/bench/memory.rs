//! Page-cache control and the in-memory copy of the rows a bench touches.

use ple_core::error::{Error, Result};
use ple_core::stats;
use std::os::fd::AsRawFd;

/// An anonymous mapping the size of the table holding copies of the rows touched, at their offsets.
pub(crate) struct AnonCopy {
    ptr: *mut u8,
    len: usize,
}

impl AnonCopy {
    pub(crate) fn new(
        table: &[u8],
        row_bytes: usize,
        rows: impl Iterator<Item = u64>,
    ) -> Result<AnonCopy> {
        let len = table.len();
        // SAFETY: a null hint and MAP_ANONYMOUS create a new private mapping that aliases no
        // memory of this process; the result is checked against MAP_FAILED below.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(Error::io(
                "mmap (anonymous copy)",
                std::io::Error::last_os_error(),
            ));
        }
        // same page size as the file mapping
        // SAFETY: advice on the mapping just created, `len` bytes long; it changes no contents.
        unsafe { libc::madvise(ptr, len, libc::MADV_NOHUGEPAGE) };
        let copy = AnonCopy {
            ptr: ptr as *mut u8,
            len,
        };
        // SAFETY: `ptr` is the live mapping of `len` writable bytes just created, owned by
        // `copy` and referred to by nothing else while this slice lives.
        let dst = unsafe { std::slice::from_raw_parts_mut(copy.ptr, len) };
        for r in rows {
            let o = r as usize * row_bytes;
            // through the SIGBUS guard: a row the file lost is an error, not a crash
            ple_core::io::mmap::guard::copy_rows(
                table,
                row_bytes,
                &[r],
                &mut dst[o..o + row_bytes],
            )?;
        }
        Ok(copy)
    }
    pub(crate) fn bytes(&self) -> &[u8] {
        // SAFETY: `ptr` is a live mapping of `len` readable bytes for as long as `self`.
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }
}

// SAFETY: the copy is written only in `new`; afterwards it is read-only memory owned by the value.
unsafe impl Send for AnonCopy {}
// SAFETY: as above: after `new`, shared access only reads.
unsafe impl Sync for AnonCopy {}

impl Drop for AnonCopy {
    fn drop(&mut self) {
        // SAFETY: the mapping `new` created, unmapped once, when the value is dropped.
        unsafe { libc::munmap(self.ptr as *mut libc::c_void, self.len) };
    }
}

/// Evicts the table from the page cache: zaps every mapping's page tables, then
/// POSIX_FADV_DONTNEED. Returns the pages still resident.
pub(crate) fn evict(maps: &[&[u8]], file: &std::fs::File) -> u64 {
    for m in maps {
        // SAFETY: MADV_DONTNEED on a read-only file mapping only drops page-table entries; later
        // accesses read the file again. No step is in flight while the bench evicts.
        unsafe {
            libc::madvise(
                m.as_ptr() as *mut libc::c_void,
                m.len(),
                libc::MADV_DONTNEED,
            )
        };
    }
    // SAFETY: a plain system call on the table's open descriptor.
    unsafe { libc::fdatasync(file.as_raw_fd()) };
    let _ = ple_core::sys::fadvise(file.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED);
    stats::residency(maps[0]).0
}

/// Evicts the pages of `rows` only (every mapping's page-table entries, then the page cache of
/// those ranges): a cold step without a global eviction. Returns the pages still resident.
pub(crate) fn evict_rows(maps: &[&[u8]], file: &std::fs::File, rows: &[u64], rb: usize) -> u64 {
    let pages = ple_core::io::prefetch::PageSet::from_rows(rows, rb);
    let ps = stats::os_page_size();
    for r in &pages.ranges {
        let off = (r.first * 4096) as usize / ps * ps;
        let end = ((r.first + r.count) * 4096) as usize;
        for m in maps {
            let len = end.min(m.len()).saturating_sub(off);
            if len == 0 {
                continue;
            }
            // SAFETY: `off` is OS-page-aligned and `off..off + len` lies inside the mapping;
            // MADV_DONTNEED on a read-only file mapping only drops page-table entries (later
            // accesses read the file again). No step is in flight while the bench evicts.
            unsafe {
                libc::madvise(
                    m.as_ptr().add(off) as *mut libc::c_void,
                    len,
                    libc::MADV_DONTNEED,
                )
            };
        }
        let _ = ple_core::sys::fadvise(
            file.as_raw_fd(),
            off as u64,
            (end - off) as u64,
            libc::POSIX_FADV_DONTNEED,
        );
    }
    pages
        .pages
        .iter()
        .filter(|&&p| ple_core::sys::page_resident(maps[0], (p * 4096) as usize))
        .count() as u64
}
