//! MMAP mode: the rows are read from the mapped row file. [`advice`] decides and issues page
//! advice (`posix_fadvise(WILLNEED)` of a step's sorted page set; residency samples) and the
//! buffered io_uring reads of cold rows; [`gather`] copies the rows out of the mapping, through
//! [`guard`] (a SIGBUS in the copy is an error, not a crash); [`residency`] keeps the table's
//! page-cache footprint under a cap.

pub mod advice;
pub mod gather;
pub mod guard;
pub mod residency;
