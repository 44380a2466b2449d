//! Hashing throughput (filled in by the hash issue).
fn main() {}
