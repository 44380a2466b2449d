//! A batch of reads through io_uring at a sustained depth.
//!
//! [`Ring::read_batch`] keeps up to `depth` reads in flight until every read of the batch has
//! completed, and returns only then: the kernel writes only into the batch's buffer, and never
//! after the call returns, unless the ring failed mid-batch ([`Ring::poisoned`]), in which case
//! the caller must leak the buffer (reads may still land in it).

use crate::io::direct::buf::AlignedBuf;
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
    /// The batch's buffer is registered (`READ_FIXED`: no page pinning per read), and registered
    /// again when the caller's buffer changes; where registration is refused (`RLIMIT_MEMLOCK`)
    /// the reads go unregistered.
    pub fixed_buf: bool,
    /// `COOP_TASKRUN`: completions are not pushed to the task by an interrupt-like wake-up;
    /// they run when the task next enters the kernel.
    pub coop_taskrun: bool,
    /// A batch's first [`EARLY_SUBMIT`] reads are submitted on their own, before the rest are
    /// queued.
    pub early_submit: bool,
    /// `SINGLE_ISSUER | DEFER_TASKRUN`: completions are processed only in `io_uring_enter`
    /// waits, in batches. Such a ring serves only the thread that created it: a batch from
    /// another thread first replaces the ring with one of its own.
    pub defer_taskrun: bool,
}

/// Reads a batch submits first, on their own ([`RingSetup::early_submit`]).
pub const EARLY_SUBMIT: usize = 8;

impl RingSetup {
    /// What DIRECT reads use: on the loop device of docs/PERFORMANCE-LOG.md (512 B reads at QD 64,
    /// `ple bench`'s storage floor) it costs ~0.7× the CPU per read of a plain ring.
    pub const READS: RingSetup = RingSetup {
        sqpoll: false,
        iopoll: false,
        fixed_file: true,
        fixed_buf: true,
        coop_taskrun: false,
        defer_taskrun: true,
        early_submit: true,
    };
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
    /// The allocation id ([`AlignedBuf::id`]) of the registered buffer, if any: reads into that
    /// allocation use `READ_FIXED`.
    fixed_buf: Option<u64>,
    /// The allocation whose registration was refused (not retried while the caller keeps it).
    refused_buf: Option<u64>,
    /// The thread that created the ring (a `defer_taskrun` ring accepts only its batches).
    /// A `ThreadId`, not a tid: ids are never reused, and reading one makes no system call.
    owner: std::thread::ThreadId,
    poisoned: bool,
}

impl Ring {
    /// A ring of `depth` entries reading `fd` (which must outlive the ring). Fails where io_uring
    /// is refused (EPERM/ENOSYS under seccomp) or a setup flag is unsupported.
    pub fn new(fd: RawFd, depth: usize, setup: RingSetup) -> std::io::Result<Ring> {
        let depth = depth.clamp(1, 4096);
        Ok(Ring {
            ring: Ring::build(fd, depth, setup)?,
            depth,
            fd,
            setup,
            fixed_buf: None,
            refused_buf: None,
            owner: std::thread::current().id(),
            poisoned: false,
        })
    }

    /// A ring for reads: [`RingSetup::READS`], else (older kernels refuse `DEFER_TASKRUN`,
    /// before 6.1) a plain ring.
    pub fn for_reads(fd: RawFd, depth: usize) -> std::io::Result<Ring> {
        Ring::new(fd, depth, RingSetup::READS).or_else(|e| {
            log::debug!(
                "io_uring set-up {:?} refused ({e}): a plain ring",
                RingSetup::READS
            );
            Ring::new(fd, depth, RingSetup::default())
        })
    }

    fn build(fd: RawFd, depth: usize, setup: RingSetup) -> std::io::Result<IoUring> {
        let mut b = IoUring::builder();
        if setup.sqpoll {
            b.setup_sqpoll(50);
        }
        if setup.iopoll {
            b.setup_iopoll();
        }
        if setup.coop_taskrun {
            b.setup_coop_taskrun();
        }
        if setup.defer_taskrun {
            b.setup_single_issuer().setup_defer_taskrun();
        }
        let ring = b.build(depth.next_power_of_two() as u32)?;
        if setup.fixed_file {
            ring.submitter().register_files(&[fd])?;
        }
        Ok(ring)
    }

    /// Registers `buf` (reads into it then skip the per-read page pinning), replacing any buffer
    /// registered before. The kernel keeps the pages of that allocation pinned until they are
    /// unregistered; `READ_FIXED` is used only for the allocation with the registered id, so a
    /// later allocation at the same address is never read into through the old pages.
    fn register_buffer(&mut self, buf: &mut AlignedBuf) -> std::io::Result<()> {
        let sub = self.ring.submitter();
        if self.fixed_buf.is_some() {
            sub.unregister_buffers()?;
            self.fixed_buf = None;
        }
        let iov = libc::iovec {
            iov_base: buf.as_mut_ptr() as *mut libc::c_void,
            iov_len: buf.capacity(),
        };
        // SAFETY: the iovec describes the live allocation `buf` owns; the kernel pins its pages
        // (they stay valid memory even after `buf` frees them), and reads target them only while
        // the caller lends that same allocation to `read_batch` (id checked there).
        unsafe { sub.register_buffers(&[iov])? };
        self.fixed_buf = Some(buf.id());
        Ok(())
    }

    /// Makes the ring fit the calling thread and `buf`: a `defer_taskrun` ring created by
    /// another thread is replaced (no read is in flight between batches), and with `fixed_buf`
    /// the buffer is registered unless it already is or was refused.
    fn prepare(&mut self, buf: &mut AlignedBuf) -> std::io::Result<()> {
        let me = std::thread::current().id();
        if self.setup.defer_taskrun && self.owner != me {
            self.ring = Ring::build(self.fd, self.depth, self.setup)?;
            self.owner = me;
            self.fixed_buf = None;
        }
        let id = buf.id();
        let want = self.setup.fixed_buf && id != 0;
        if want && self.fixed_buf != Some(id) && self.refused_buf != Some(id) {
            if let Err(e) = self.register_buffer(buf) {
                log::debug!(
                    "io_uring buffer of {} B not registered ({e})",
                    buf.capacity()
                );
                self.refused_buf = Some(id);
            }
        }
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
        self.prepare(buf)?;
        let cap = buf.capacity();
        assert!(
            reqs.iter().all(|r| r.buf_off + r.len as usize <= cap),
            "read outside its buffer"
        );
        res.clear();
        res.resize(reqs.len(), 0);
        let base = buf.as_mut_ptr();
        let fixed = self.fixed_buf.filter(|&id| id == buf.id());
        let (mut next, mut in_flight, mut done) = (0usize, 0usize, 0usize);
        let early = if self.setup.early_submit {
            EARLY_SUBMIT
        } else {
            0
        };
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
                if next == early && next < reqs.len() {
                    // the first reads go out now: the device works on them while the rest are
                    // prepared and submitted (one submission would hold them all back)
                    self.enter(0, in_flight)?;
                }
            }
            // Wake once per batch of completions, not per read: with reads left to submit,
            // when a quarter of the depth has completed (then refill); with none left, when all
            // have (one wake-up for a decode step's reads).
            let want = if next < reqs.len() {
                in_flight.saturating_sub(self.depth * 3 / 4).max(1)
            } else {
                in_flight
            };
            self.enter(want, in_flight)?;
            for c in self.ring.completion() {
                res[c.user_data() as usize] = c.result();
                in_flight -= 1;
                done += 1;
            }
        }
        Ok(())
    }

    /// Submits what is queued and waits for `want` completions. Interrupted or busy calls are
    /// not errors (the caller's loop enters again); another failure with reads in flight
    /// poisons the ring.
    fn enter(&mut self, want: usize, in_flight: usize) -> std::io::Result<()> {
        match self.ring.submit_and_wait(want) {
            Ok(_) => Ok(()),
            Err(e)
                if matches!(
                    e.raw_os_error(),
                    Some(libc::EINTR) | Some(libc::EAGAIN) | Some(libc::EBUSY)
                ) =>
            {
                Ok(())
            }
            Err(e) => {
                if in_flight > 0 {
                    self.poisoned = true;
                }
                Err(e)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsRawFd;
    use std::os::unix::fs::OpenOptionsExt;

    /// A file of known bytes (`byte(i)` at offset i) opened `O_DIRECT`, or None where the
    /// temporary directory refuses direct I/O.
    fn file(len: usize) -> Option<(tempfile::TempDir, std::fs::File)> {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("f");
        std::fs::write(&p, (0..len).map(byte).collect::<Vec<u8>>()).unwrap();
        let f = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_DIRECT)
            .open(&p)
            .ok()?;
        Some((d, f))
    }

    fn byte(i: usize) -> u8 {
        (crate::model::splitmix64(i as u64 / 8) >> (i % 8 * 8)) as u8
    }

    /// Reads blocks `blocks` (512 B each) into `buf` and checks every byte against the file.
    fn check(ring: &mut Ring, buf: &mut AlignedBuf, blocks: &[u64]) {
        let reqs: Vec<ReadReq> = (blocks.iter().enumerate())
            .map(|(i, &b)| ReadReq {
                off: b * 512,
                buf_off: i * 512,
                len: 512,
            })
            .collect();
        let mut res = Vec::new();
        ring.read_batch(&reqs, buf, &mut res).unwrap();
        assert!(res.iter().all(|&r| r == 512), "{res:?}");
        for (i, &b) in blocks.iter().enumerate() {
            let got = &buf.as_slice()[i * 512..(i + 1) * 512];
            let want: Vec<u8> = (b as usize * 512..(b as usize + 1) * 512)
                .map(byte)
                .collect();
            assert_eq!(got, &want[..], "block {b}");
        }
    }

    /// The reads' set-up returns the file's bytes from the creating thread, from another thread
    /// (a `DEFER_TASKRUN` ring is rebuilt there), and into a newly allocated buffer (registered
    /// again; the old registration is never used for it, even at the same address).
    #[test]
    fn reads_setup_reads_right_across_threads_and_buffers() {
        let Some((_d, f)) = file(512 * 1024) else {
            return; // no O_DIRECT where the tests run: DIRECT tests cover this elsewhere
        };
        let Ok(mut ring) = Ring::new(f.as_raw_fd(), 64, RingSetup::READS) else {
            return; // kernel before 6.1: `for_reads` falls back to a plain ring
        };
        let blocks: Vec<u64> = (0..300).map(|i| (i * 337 + 5) % 1024).collect();
        let mut buf = AlignedBuf::with_capacity(300 * 512).unwrap();
        check(&mut ring, &mut buf, &blocks);
        let first = ring.fixed_buf;
        assert_eq!(first, Some(buf.id()), "the buffer is registered");
        let main = std::thread::current().id();
        assert_eq!(ring.owner, main);
        let ring = std::thread::scope(|s| {
            s.spawn(|| {
                check(&mut ring, &mut buf, &blocks[..100]);
                assert_eq!(
                    ring.owner,
                    std::thread::current().id(),
                    "rebuilt for the new thread"
                );
                assert_ne!(ring.owner, main);
                ring
            })
            .join()
            .unwrap()
        });
        let mut ring = ring;
        for round in 0..4 {
            // a new allocation each round, dropped first so that its address may be reused;
            // 40 MiB: above the allocator's largest mmap threshold, so each one is a fresh
            // mapping (new pages) even where the address repeats
            drop(std::mem::take(&mut buf));
            buf = AlignedBuf::with_capacity(40 << 20).unwrap();
            let rev: Vec<u64> = blocks.iter().rev().map(|b| (b + round) % 1024).collect();
            check(&mut ring, &mut buf, &rev);
            assert_eq!(ring.fixed_buf, Some(buf.id()));
        }
    }
}
