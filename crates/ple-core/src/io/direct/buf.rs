//! Aligned heap buffers for direct I/O (`O_DIRECT` needs buffer addresses aligned to the file's
//! direct-I/O memory alignment; 4096 covers every device seen).

use crate::error::{Error, Result};

/// Alignment of every [`AlignedBuf`], bytes.
pub const BUF_ALIGN: usize = 4096;

/// A zero-initialised heap buffer whose address is a multiple of [`BUF_ALIGN`]. Its capacity only
/// grows ([`AlignedBuf::reserve`]); growing replaces the allocation (old contents are dropped).
pub struct AlignedBuf {
    ptr: *mut u8,
    cap: usize,
    /// Which allocation this is: unique in the process for each one made (0: none). An address
    /// can be reused by a later allocation; this cannot.
    id: u64,
}

/// The last allocation id handed out.
static NEXT_ID: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

// SAFETY: the buffer is uniquely owned heap memory (no interior sharing); `&AlignedBuf` only
// gives out shared slices.
unsafe impl Send for AlignedBuf {}
// SAFETY: as above: shared references only read.
unsafe impl Sync for AlignedBuf {}

impl Default for AlignedBuf {
    fn default() -> Self {
        AlignedBuf {
            ptr: std::ptr::null_mut(),
            cap: 0,
            id: 0,
        }
    }
}

impl AlignedBuf {
    /// A buffer of at least `len` bytes.
    pub fn with_capacity(len: usize) -> Result<AlignedBuf> {
        let mut b = AlignedBuf::default();
        b.reserve(len)?;
        Ok(b)
    }

    /// Makes the capacity at least `len` (rounded up to [`BUF_ALIGN`]); contents are zeroed when
    /// it grows.
    pub fn reserve(&mut self, len: usize) -> Result<()> {
        if len <= self.cap {
            return Ok(());
        }
        let cap = len.div_ceil(BUF_ALIGN) * BUF_ALIGN;
        let layout = std::alloc::Layout::from_size_align(cap, BUF_ALIGN)
            .map_err(|_| Error::OutOfMemory(format!("aligned buffer of {len} bytes")))?;
        // SAFETY: `cap > 0` (len > self.cap >= 0), so the layout has a non-zero size.
        let ptr = unsafe { std::alloc::alloc_zeroed(layout) };
        if ptr.is_null() {
            return Err(Error::OutOfMemory(format!("aligned buffer of {cap} bytes")));
        }
        self.free();
        self.ptr = ptr;
        self.cap = cap;
        self.id = NEXT_ID.fetch_add(1, std::sync::atomic::Ordering::Relaxed) + 1;
        Ok(())
    }

    /// The allocation's id (see the field): equal ids mean the same live memory.
    pub fn id(&self) -> u64 {
        self.id
    }

    /// Bytes available.
    pub fn capacity(&self) -> usize {
        self.cap
    }

    /// Start of the buffer (null while the capacity is 0).
    pub fn as_mut_ptr(&mut self) -> *mut u8 {
        self.ptr
    }

    /// The whole buffer.
    pub fn as_slice(&self) -> &[u8] {
        if self.cap == 0 {
            return &[];
        }
        // SAFETY: `ptr` owns `cap` initialised (zeroed at allocation, then written only through
        // this type) bytes; the shared borrow of `self` keeps writers out.
        unsafe { std::slice::from_raw_parts(self.ptr, self.cap) }
    }

    /// The whole buffer, writable.
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        if self.cap == 0 {
            return &mut [];
        }
        // SAFETY: as `as_slice`; `&mut self` makes this the only reference.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.cap) }
    }

    fn free(&mut self) {
        if self.cap > 0 {
            let layout =
                std::alloc::Layout::from_size_align(self.cap, BUF_ALIGN).expect("valid layout");
            // SAFETY: allocated in `reserve` with this very layout, and freed once (cap reset).
            unsafe { std::alloc::dealloc(self.ptr, layout) };
            self.cap = 0;
            self.ptr = std::ptr::null_mut();
            self.id = 0;
        }
    }

    /// Gives up the allocation without freeing it (for memory the kernel may still write into).
    pub fn leak(mut self) {
        self.cap = 0;
        self.ptr = std::ptr::null_mut();
        self.id = 0;
    }
}

impl Drop for AlignedBuf {
    fn drop(&mut self) {
        self.free();
    }
}
