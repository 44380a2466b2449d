//! Thin wrappers over the OS calls the engine, the packer and the benchmarks use (statx, statfs,
//! fadvise, sync_file_range, flock, fallocate, mincore, madvise, getrusage, block-device
//! attributes, /proc). Each returns a plain value or an `io::Error`.

use std::os::fd::{AsRawFd, BorrowedFd, RawFd};
use std::path::Path;

/// The file's direct-I/O alignment (`statx` `STATX_DIOALIGN`): (memory alignment, offset
/// alignment) in bytes. `None` where the kernel or file system does not report it (or reports 0,
/// meaning direct I/O is not supported on this file).
pub fn dio_align(fd: RawFd) -> Option<(u32, u32)> {
    // struct statx is 256 bytes; stx_dio_mem_align at byte 152, stx_dio_offset_align at 156
    // (linux/stat.h). Read from a raw buffer: libc's struct keeps those fields private on gnu.
    let mut buf = [0u64; 32];
    // SAFETY: `buf` is 256 bytes, 8-aligned, the size and alignment of `struct statx`; the empty
    // path with AT_EMPTY_PATH makes statx describe `fd` itself.
    let rc = unsafe {
        libc::statx(
            fd,
            c"".as_ptr(),
            libc::AT_EMPTY_PATH,
            libc::STATX_DIOALIGN,
            buf.as_mut_ptr() as *mut libc::statx,
        )
    };
    if rc != 0 {
        return None;
    }
    let mask = buf[0] as u32;
    if mask & libc::STATX_DIOALIGN == 0 {
        return None;
    }
    let w = buf[19]; // bytes 152..160
    let (mem, off) = (w as u32, (w >> 32) as u32);
    (mem > 0 && off > 0).then_some((mem, off))
}

/// Logical block size of the block device holding `path` (sysfs), if it can be found.
pub fn logical_block_size(path: &Path) -> Option<u32> {
    read_queue_attr(path, "logical_block_size")
        .and_then(|t| t.parse().ok())
        .filter(|&b: &u32| b.is_power_of_two())
}

/// `read_ahead_kb` of the block device holding `path`, if it can be found.
pub fn read_ahead_kb(path: &Path) -> Option<u64> {
    read_queue_attr(path, "read_ahead_kb").and_then(|t| t.parse().ok())
}

/// `/sys/dev/block/MAJ:MIN/queue/NAME` of the device holding `path` (or of its parent device,
/// for a partition), trimmed.
fn read_queue_attr(path: &Path, name: &str) -> Option<String> {
    use std::os::unix::fs::MetadataExt;
    let dev = std::fs::metadata(path).ok()?.dev();
    let (maj, min) = (libc::major(dev), libc::minor(dev));
    let base = format!("/sys/dev/block/{maj}:{min}");
    [
        format!("{base}/queue/{name}"),
        format!("{base}/../queue/{name}"),
    ]
    .iter()
    .find_map(|q| std::fs::read_to_string(q).ok())
    .map(|t| t.trim().to_string())
}

/// Whether `file` lives on tmpfs (or ramfs): memory, where direct I/O has nothing to bypass.
pub fn on_memory_fs(file: &std::fs::File) -> bool {
    let mut s = std::mem::MaybeUninit::<libc::statfs>::zeroed();
    // SAFETY: fstatfs writes one `struct statfs` into the pointer it is given.
    let rc = unsafe { libc::fstatfs(file.as_raw_fd(), s.as_mut_ptr()) };
    if rc != 0 {
        return false;
    }
    // SAFETY: fstatfs succeeded and filled the struct (it was zeroed before, too).
    let t = unsafe { s.assume_init() }.f_type as u64;
    const RAMFS_MAGIC: u64 = 0x8584_58f6;
    t == libc::TMPFS_MAGIC as u64 || t == RAMFS_MAGIC
}

/// A byte offset or length as `off_t`, clamped (offsets of valid tables are below 2^48).
pub fn off_t(v: u64) -> libc::off_t {
    libc::off_t::try_from(v).unwrap_or(libc::off_t::MAX)
}

/// `posix_fadvise(fd, off, len, advice)`.
pub fn fadvise(fd: RawFd, off: u64, len: u64, advice: libc::c_int) -> std::io::Result<()> {
    // SAFETY: a plain system call on integers; an invalid fd is reported as EBADF.
    let rc = unsafe { libc::posix_fadvise(fd, off_t(off), off_t(len), advice) };
    if rc != 0 {
        return Err(std::io::Error::from_raw_os_error(rc));
    }
    Ok(())
}

/// `sync_file_range(fd, off, len, flags)`: starts (`SYNC_FILE_RANGE_WRITE`) or waits for
/// (`SYNC_FILE_RANGE_WAIT_*`) write-back of bytes `off..off + len`. No durability promise: that
/// is `fsync`'s.
pub fn sync_file_range(
    fd: BorrowedFd<'_>,
    off: u64,
    len: u64,
    flags: libc::c_uint,
) -> std::io::Result<()> {
    // SAFETY: sync_file_range touches no memory of ours; `fd` is open for the whole call (a
    // borrow), and bad ranges or flags are rejected by the kernel with an error.
    let rc = unsafe { libc::sync_file_range(fd.as_raw_fd(), off_t(off), off_t(len), flags) };
    if rc != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// `flock(fd, LOCK_EX | LOCK_NB)`: an exclusive advisory lock on the open file description of
/// `fd`, held until its last descriptor closes. `ErrorKind::WouldBlock` while another open file
/// description holds it.
pub fn try_lock_exclusive(fd: BorrowedFd<'_>) -> std::io::Result<()> {
    // SAFETY: flock takes a descriptor and flags and touches no memory; `fd` is open for the
    // whole call (a borrow).
    if unsafe { libc::flock(fd.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// `fallocate(fd, 0, 0, len)`: allocates the first `len` bytes of the file (extending its size),
/// so a later write there cannot fail for space. `EOPNOTSUPP` where the file system lacks it.
pub fn fallocate(fd: BorrowedFd<'_>, len: u64) -> std::io::Result<()> {
    // SAFETY: fallocate touches no memory of ours; `fd` is open for the whole call (a borrow),
    // and a length beyond `off_t` is clamped by `off_t` (the kernel then refuses it).
    if unsafe { libc::fallocate(fd.as_raw_fd(), 0, 0, off_t(len)) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// Whether the OS page of `map` holding byte `at` is in the page cache (`mincore` of one page).
/// `false` for an offset outside the mapping or a failed call.
pub fn page_resident(map: &[u8], at: usize) -> bool {
    if at >= map.len() {
        return false;
    }
    let ps = os_page_size();
    let start = at / ps * ps;
    let mut v = [0u8; 1];
    // SAFETY: `start` is OS-page-aligned and inside the mapping (the mapping starts on a page
    // boundary and `start <= at < len`); one page is asked for and one result byte provided.
    let rc = unsafe {
        libc::mincore(
            map.as_ptr().add(start) as *mut libc::c_void,
            1,
            v.as_mut_ptr(),
        )
    };
    rc == 0 && v[0] & 1 == 1
}

/// `getrusage(who)`, or None where it fails.
fn rusage(who: libc::c_int) -> Option<libc::rusage> {
    let mut ru = std::mem::MaybeUninit::<libc::rusage>::zeroed();
    // SAFETY: getrusage writes one `struct rusage` into the pointer it is given.
    let rc = unsafe { libc::getrusage(who, ru.as_mut_ptr()) };
    // SAFETY: it succeeded, so the struct is filled (and it was zeroed before).
    (rc == 0).then(|| unsafe { ru.assume_init() })
}

/// Page faults (minor, major) of the calling thread so far (`RUSAGE_THREAD`; 0s if unavailable).
pub fn thread_faults() -> (u64, u64) {
    rusage(libc::RUSAGE_THREAD).map_or((0, 0), |r| (r.ru_minflt as u64, r.ru_majflt as u64))
}

/// CPU time (user + system) of the whole process so far, nanoseconds.
pub fn process_cpu_ns() -> u64 {
    let tv = |t: libc::timeval| t.tv_sec as u64 * 1_000_000_000 + t.tv_usec as u64 * 1000;
    rusage(libc::RUSAGE_SELF).map_or(0, |r| tv(r.ru_utime) + tv(r.ru_stime))
}

/// Process-wide `read_bytes` (`/proc/self/io`), for benchmarks.
pub fn process_read_bytes() -> Option<u64> {
    parse_read_bytes(&std::fs::read_to_string("/proc/self/io").ok()?)
}

/// The `read_bytes:` field of a `/proc/<pid>/io` (or `/proc/thread-self/io`) text.
pub(crate) fn parse_read_bytes(text: &str) -> Option<u64> {
    text.lines()
        .find_map(|l| l.strip_prefix("read_bytes:"))
        .and_then(|v| v.trim().parse().ok())
}

/// MemAvailable from /proc/meminfo, bytes (0 if unreadable).
pub fn mem_available_bytes() -> u64 {
    meminfo_bytes("MemAvailable:")
}

/// MemTotal from /proc/meminfo, bytes (0 if unreadable).
pub fn mem_total_bytes() -> u64 {
    meminfo_bytes("MemTotal:")
}

/// The /proc/meminfo field `key` (with its colon), bytes (0 if unreadable).
fn meminfo_bytes(key: &str) -> u64 {
    std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|t| {
            t.lines()
                .find_map(|l| l.strip_prefix(key))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        })
        .map_or(0, |kb| kb * 1024)
}

/// What `/proc/self/smaps` says of the mapping holding `addr`: its `VmFlags` (e.g. `hg` for
/// `MADV_HUGEPAGE`) and its `AnonHugePages` in bytes; None if no mapping holds it or the file is
/// unreadable.
pub fn smaps_of(addr: usize) -> Option<(String, u64)> {
    let text = std::fs::read_to_string("/proc/self/smaps").ok()?;
    let mut found: Option<(String, u64)> = None;
    for line in text.lines() {
        // a mapping's first line: "lo-hi perms offset dev inode [path]"
        let head = line.split_whitespace().next().unwrap_or("");
        if let Some((lo, hi)) = head.split_once('-') {
            if let (Ok(lo), Ok(hi)) = (usize::from_str_radix(lo, 16), usize::from_str_radix(hi, 16))
            {
                if found.is_some() {
                    break;
                }
                if lo <= addr && addr < hi {
                    found = Some((String::new(), 0));
                }
                continue;
            }
        }
        if let Some((flags, huge)) = found.as_mut() {
            if let Some(f) = line.strip_prefix("VmFlags:") {
                *flags = f.trim().to_string();
            } else if let Some(kb) = line.strip_prefix("AnonHugePages:") {
                *huge = kb
                    .trim()
                    .trim_end_matches("kB")
                    .trim()
                    .parse::<u64>()
                    .ok()?
                    * 1024;
            }
        }
    }
    found
}

/// The system page size.
pub fn os_page_size() -> usize {
    // SAFETY: sysconf has no preconditions.
    let p = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    if p > 0 { p as usize } else { 4096 }
}

/// (resident, total) pages of a mapping (`mincore`), in OS pages.
pub fn residency(map: &[u8]) -> (u64, u64) {
    let total = map.len().div_ceil(os_page_size()) as u64;
    let mut resident = 0u64;
    if !scan_resident(map, |_| resident += 1) {
        return (0, total);
    }
    (resident, total)
}

/// Calls `f(page)` for every OS page of `map` in the page cache (`mincore`, 1 Mi pages per
/// call); false if a call failed (then `f` saw only part of them).
pub fn scan_resident(map: &[u8], mut f: impl FnMut(usize)) -> bool {
    let ps = os_page_size();
    let total = map.len().div_ceil(ps);
    const CHUNK: usize = 1 << 20;
    let mut vec = vec![0u8; CHUNK.min(total)];
    let mut p = 0usize;
    while p < total {
        let n = CHUNK.min(total - p);
        // SAFETY: the range lies inside the mapping (page-aligned start: mappings are), `vec`
        // holds one byte per page of it.
        let rc = unsafe {
            libc::mincore(
                map.as_ptr().add(p * ps) as *mut libc::c_void,
                (n * ps).min(map.len() - p * ps),
                vec.as_mut_ptr(),
            )
        };
        if rc != 0 {
            return false;
        }
        for (i, &b) in vec[..n].iter().enumerate() {
            if b & 1 != 0 {
                f(p + i);
            }
        }
        p += n;
    }
    true
}

/// Whether any OS page of `map` (a page-aligned part of a mapping) is in the page cache.
pub fn any_resident(map: &[u8]) -> bool {
    let mut any = false;
    scan_resident(map, |_| any = true) && any
}

/// Frees the page cache of bytes `off..off + len` of the file mapped (whole, from offset 0) at
/// `map` with descriptor `fd`: `MADV_DONTNEED` unmaps them from this process (the pages stay
/// cached while mapped), then `POSIX_FADV_DONTNEED` drops the clean pages from the page cache.
/// `off` is OS-page-aligned; the range is clipped to the mapping. The data is unchanged: a
/// later access reads it from the file again.
pub fn drop_cached(map: &[u8], fd: RawFd, off: usize, len: usize) -> std::io::Result<()> {
    if off >= map.len() {
        return Ok(());
    }
    let len = len.min(map.len() - off);
    // SAFETY: `off` is page-aligned and `off..off + len` lies inside the mapping. On a shared,
    // read-only file mapping MADV_DONTNEED only drops this process's page-table entries: a
    // thread reading the range concurrently faults the same file bytes back in (no zero fill,
    // which only private anonymous memory gets), so no reference into the mapping is
    // invalidated and no byte it reads changes.
    let rc = unsafe {
        libc::madvise(
            map.as_ptr().add(off) as *mut libc::c_void,
            len,
            libc::MADV_DONTNEED,
        )
    };
    if rc != 0 {
        return Err(std::io::Error::last_os_error());
    }
    fadvise(fd, off as u64, len as u64, libc::POSIX_FADV_DONTNEED)
}

/// CPU time (ns, from `/proc/self/task/*/schedstat`) of this process's threads whose name starts
/// with one of `prefixes` (0 where schedstat is unavailable).
pub fn threads_cpu_ns(prefixes: &[&str]) -> u64 {
    let Ok(dir) = std::fs::read_dir("/proc/self/task") else {
        return 0;
    };
    dir.flatten()
        .filter_map(|t| {
            let comm = std::fs::read_to_string(t.path().join("comm")).ok()?;
            prefixes
                .iter()
                .any(|p| comm.starts_with(p))
                .then(|| std::fs::read_to_string(t.path().join("schedstat")).ok())
                .flatten()
        })
        .filter_map(|s| s.split_whitespace().next()?.parse::<u64>().ok())
        .sum()
}

/// CPU time of the calling thread so far, (user, system) nanoseconds. The kernel splits the
/// (exact) total between the two by its tick samples: trust the split over seconds, not a step.
pub fn thread_user_sys_ns() -> (u64, u64) {
    let tv = |t: libc::timeval| t.tv_sec as u64 * 1_000_000_000 + t.tv_usec as u64 * 1000;
    rusage(libc::RUSAGE_THREAD).map_or((0, 0), |r| (tv(r.ru_utime), tv(r.ru_stime)))
}

/// CPU time (user + system) of the calling thread so far, nanoseconds.
pub fn thread_cpu_ns() -> u64 {
    let (user, sys) = thread_user_sys_ns();
    user + sys
}
