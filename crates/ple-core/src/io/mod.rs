//! Getting rows off storage: [`source`] the one read interface ([`source::RowSource`], a
//! backend per file, the row cache in front of any); one folder per mode, the row cache beside
//! them:
//! - [`mmap`]: MMAP mode — page advice (WILLNEED for a step's page set, residency samples), the
//!   parallel gather from the mapping, the SIGBUS guard of that copy, the residency cap.
//! - [`direct`]: DIRECT mode — `O_DIRECT` reads of the rows' sectors over io_uring (or a pread
//!   pool), into sector-aligned buffers.
//! - [`cache`]: the row cache both modes read through (index, eviction policies, cache-line
//!   hints, batch lookup, gather and read-through).

pub mod cache;
pub mod direct;
pub mod mmap;
pub mod source;

// The paths the other crates of the workspace use until they move to the ones above (kept so a
// parallel change there still builds; nothing in this crate uses them).
#[doc(hidden)]
pub use direct::{buf, uring};
#[doc(hidden)]
pub use mmap::advice as prefetch;
#[doc(hidden)]
pub use mmap::{gather, guard, residency};
