//! A batch of reads through io_uring at a sustained depth.
//!
//! [`Ring::read_batch`] keeps up to `depth` reads in flight until every read of the batch has
//! completed, and returns only then: the kernel writes only into the batch's buffer, and never
//! after the call returns, unless the ring failed mid-batch ([`Ring::poisoned`]), in which case
//! the caller must leak the buffer (reads may still land in it).

use crate::io::buf::AlignedBuf;
use io_uring::{IoUring, opcode, types};
use std::os::fd::RawFd;

/// How the ring is set up (each measured by `ple bench`'s storage floor).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RingSetup {
    /// A kernel thread polls the submission queue (no `io_uring_enter` per batch; burns a CPU).
    pub sqpoll: bool,
    /// Completions are polled from the device (needs polled queues; `O_DIRECT` only).
    pub iopoll: bool,
    /// The file is registered (`IOSQE_FIXED_FILE`: no fd lookup per read).
    pub fixed_file: bool,
}

/// One read of a batch: `len` bytes at file offset `off` into `buf[buf_off..]`.
#[derive(Clone, Copy, Debug)]
pub struct ReadReq {
    pub off: u64,
    pub buf_off: usize,
    pub len: u32,
}

/// An io_uring instance for reads of one file.
pub struct Ring {
    ring: IoUring,
    depth: usize,
    fd: RawFd,
    setup: RingSetup,
    /// The registered buffer (address, length), if any: reads into it use `READ_FIXED`.
    fixed_buf: Option<(usize, usize)>,
    poisoned: bool,
}

impl Ring {
    /// A ring of `depth` entries reading `fd` (which must outlive the ring). Fails where io_uring
    /// is refused (EPERM/ENOSYS under seccomp) or a setup flag is unsupported.
    pub fn new(fd: RawFd, depth: usize, setup: RingSetup) -> std::io::Result<Ring> {
        let depth = depth.clamp(1, 4096);
        let mut b = IoUring::builder();
        if setup.sqpoll {
            b.setup_sqpoll(50);
        }
        if setup.iopoll {
            b.setup_iopoll();
        }
        let ring = b.build(depth.next_power_of_two() as u32)?;
        if setup.fixed_file {
            ring.submitter().register_files(&[fd])?;
        }
        Ok(Ring {
            ring,
            depth,
            fd,
            setup,
            fixed_buf: None,
            poisoned: false,
        })
    }

    /// Registers `buf` (reads into it then skip the per-read page pinning). The buffer must stay
    /// allocated, unmoved, while the ring lives (or until another buffer is registered).
    pub fn register_buffer(&mut self, buf: &mut AlignedBuf) -> std::io::Result<()> {
        let sub = self.ring.submitter();
        if self.fixed_buf.is_some() {
            sub.unregister_buffers()?;
            self.fixed_buf = None;
        }
        let iov = libc::iovec {
            iov_base: buf.as_mut_ptr() as *mut libc::c_void,
            iov_len: buf.capacity(),
        };
        // SAFETY: the iovec describes memory `buf` owns; the caller keeps it alive and unmoved
        // while registered (the contract above).
        unsafe { sub.register_buffers(&[iov])? };
        self.fixed_buf = Some((iov.iov_base as usize, iov.iov_len));
        Ok(())
    }

    /// Whether a batch failed with reads possibly still in flight (the ring is then unusable).
    pub fn poisoned(&self) -> bool {
        self.poisoned
    }

    /// Most reads in flight.
    pub fn depth(&self) -> usize {
        self.depth
    }

    /// Runs `reqs` (each inside `buf`), `depth` at a time; `res[i]` receives read `i`'s result
    /// (bytes read, or `-errno`). An `Err` means the ring itself failed.
    pub fn read_batch(
        &mut self,
        reqs: &[ReadReq],
        buf: &mut AlignedBuf,
        res: &mut Vec<i32>,
    ) -> std::io::Result<()> {
        if self.poisoned {
            return Err(std::io::Error::other("io_uring failed earlier"));
        }
        let cap = buf.capacity();
        assert!(
            reqs.iter().all(|r| r.buf_off + r.len as usize <= cap),
            "read outside its buffer"
        );
        res.clear();
        res.resize(reqs.len(), 0);
        let base = buf.as_mut_ptr();
        let fixed = self
            .fixed_buf
            .filter(|&(p, l)| p == base as usize && l >= cap);
        let (mut next, mut in_flight, mut done) = (0usize, 0usize, 0usize);
        while done < reqs.len() {
            while next < reqs.len() && in_flight < self.depth {
                let r = reqs[next];
                // SAFETY: pointer arithmetic inside `buf`: `buf_off + len <= cap` was checked above.
                let ptr = unsafe { base.add(r.buf_off) };
                let e = match (fixed, self.setup.fixed_file) {
                    (Some(_), true) => opcode::ReadFixed::new(types::Fixed(0), ptr, r.len, 0)
                        .offset(r.off)
                        .build(),
                    (Some(_), false) => opcode::ReadFixed::new(types::Fd(self.fd), ptr, r.len, 0)
                        .offset(r.off)
                        .build(),
                    (None, true) => opcode::Read::new(types::Fixed(0), ptr, r.len)
                        .offset(r.off)
                        .build(),
                    (None, false) => opcode::Read::new(types::Fd(self.fd), ptr, r.len)
                        .offset(r.off)
                        .build(),
                };
                let e = e.user_data(next as u64);
                // SAFETY: the entry's buffer lies inside `buf`, which the caller lends for the
                // whole call, and this function returns only once every pushed read completed
                // (or marks the ring poisoned so the caller leaks the buffer).
                if unsafe { self.ring.submission().push(&e) }.is_err() {
                    break; // submission queue full: submit first
                }
                next += 1;
                in_flight += 1;
            }
            // Wake once per batch of completions, not per read: with reads left to submit,
            // when a quarter of the depth has completed (then refill); with none left, when all
            // have (one wake-up for a decode step's reads).
            let want = if next < reqs.len() {
                in_flight.saturating_sub(self.depth * 3 / 4).max(1)
            } else {
                in_flight
            };
            match self.ring.submit_and_wait(want) {
                Ok(_) => {}
                Err(e)
                    if matches!(
                        e.raw_os_error(),
                        Some(libc::EINTR) | Some(libc::EAGAIN) | Some(libc::EBUSY)
                    ) => {}
                Err(e) => {
                    if in_flight > 0 {
                        self.poisoned = true;
                    }
                    return Err(e);
                }
            }
            for c in self.ring.completion() {
                res[c.user_data() as usize] = c.result();
                in_flight -= 1;
                done += 1;
            }
        }
        Ok(())
    }
}
