//! Getting rows off storage: page sets and prefetch advice, the parallel gather.

pub mod cache;
pub mod gather;
pub mod prefetch;
