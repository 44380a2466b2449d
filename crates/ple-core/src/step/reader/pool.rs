//! The gather pool of a [`Reader`](super::Reader): a rayon pool whose threads the reader joins.

use crate::error::{Error, Result};
use crate::stats;
use crate::sync::lock;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

/// The handle's gather pool of `num_threads` threads (0: one per CPU); their join handles go to
/// `handles` (joined by `Drop`).
pub(super) fn start_pool(
    num_threads: u32,
    handles: Arc<Mutex<Vec<JoinHandle<()>>>>,
) -> Result<rayon::ThreadPool> {
    let threads = match num_threads {
        0 => std::thread::available_parallelism().map_or(1, |n| n.get()),
        n => n as usize,
    };
    rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .thread_name(|i| format!("ple-pool-{i}"))
        .start_handler(|_| {
            stats::thread_read_bytes_delta();
        })
        .exit_handler(|_| stats::close_thread_io())
        .spawn_handler(move |t| {
            let mut b = std::thread::Builder::new();
            if let Some(name) = t.name() {
                b = b.name(name.to_owned());
            }
            if let Some(size) = t.stack_size() {
                b = b.stack_size(size);
            }
            lock(&handles).push(b.spawn(|| t.run())?);
            Ok(())
        })
        .build()
        .map_err(|e| Error::io("starting the gather pool", std::io::Error::other(e)))
}
