//! MMAP mode: the rows are read from the mapped row file. [`advice`] builds a step's page set and
//! issues page advice (`posix_fadvise(WILLNEED)`; residency samples tell when it is needed);
//! [`buffered`] reads cold rows through the page cache with io_uring instead of faulting them
//! in; [`gather`] copies the rows out of the mapping, through
//! [`guard`] (a SIGBUS in the copy is an error, not a crash); [`residency`] keeps the table's
//! page-cache footprint under a cap.

pub mod advice;
pub mod buffered;
pub mod gather;
pub mod guard;
pub mod residency;
