//! Getting rows off storage: page sets and prefetch advice, the parallel gather from the mapping
//! (MMAP mode), and direct reads of the rows' blocks (DIRECT mode: `direct`, over `uring`).

pub mod buf;
pub mod cache;
pub mod direct;
pub mod gather;
pub mod guard;
pub mod prefetch;
pub mod residency;
pub mod uring;
