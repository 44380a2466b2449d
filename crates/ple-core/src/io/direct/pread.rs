//! The pread pool backend of [`DirectReader`](super::DirectReader): [`DEPTH`](super::DEPTH)
//! threads, each with one `pread` in flight (where io_uring is refused, or forced).

use super::buf::AlignedBuf;
use super::uring::ReadReq;
use std::os::fd::AsRawFd;

/// The buffer's base address, shareable with the pool's threads.
#[derive(Clone, Copy)]
struct BufPtr(*mut u8);
// SAFETY: each pread task writes only its own request's disjoint range of the buffer, and the
// scope below ends (every task done) before the buffer is used again.
unsafe impl Send for BufPtr {}
// SAFETY: as above.
unsafe impl Sync for BufPtr {}

/// `pread` of every request on `pool`'s threads (one request in flight per thread).
pub(super) fn pread_all(
    pool: &rayon::ThreadPool,
    file: &std::fs::File,
    reqs: &[ReadReq],
    buf: &mut AlignedBuf,
    res: &mut Vec<i32>,
) {
    use rayon::prelude::*;
    let cap = buf.capacity();
    assert!(reqs.iter().all(|r| r.buf_off + r.len as usize <= cap));
    let base = BufPtr(buf.as_mut_ptr());
    let fd = file.as_raw_fd();
    res.clear();
    res.resize(reqs.len(), 0);
    pool.install(|| {
        res.par_iter_mut()
            .zip(reqs.par_iter())
            .with_max_len(1)
            .for_each(|(out, r)| {
                let b = base;
                // SAFETY: `buf_off + len <= cap` (asserted above): the range lies in the buffer,
                // requests' ranges are disjoint (laid out back to back by `plan`), and the
                // buffer outlives `install`, which returns once every task finished.
                let n = unsafe {
                    libc::pread(
                        fd,
                        b.0.add(r.buf_off) as *mut libc::c_void,
                        r.len as usize,
                        r.off as libc::off_t,
                    )
                };
                *out = if n < 0 {
                    -std::io::Error::last_os_error()
                        .raw_os_error()
                        .unwrap_or(libc::EIO)
                } else {
                    n as i32
                };
            });
    });
}
