//! Logging: `log` records go to the host's logger if it installed one, else to `env_logger`
//! (level from `PLE_LOG`), and additionally to a callback the engine registers.
//!
//! The callback never runs on the thread that logged: records are queued (at most
//! [`QUEUE_RECORDS`]; beyond that they are counted and dropped, never waited for) and delivered by
//! one `ple-log` thread that holds no libple lock while it calls the callback. So a callback may
//! call any libple function (including `ple_wait` and `ple_close`), and a slow callback delays
//! only later log messages, never a step, a wait or a submit.

use crate::status::ple_status;
use crate::types::{PLE_LOG_WARN, ple_log_fn, ple_log_level, ple_log_level_code};
use std::ffi::{CString, c_void};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc::{Receiver, SyncSender, TrySendError, sync_channel};
use std::sync::{Condvar, Mutex, MutexGuard, OnceLock};

/// Log records queued for the callback at most; more are dropped (and counted) until it catches up.
pub(crate) const QUEUE_RECORDS: usize = 4096;

#[derive(Clone, Copy)]
struct Sink {
    /// Never None (a sink exists only while a callback is registered).
    cb: ple_log_fn,
    user: usize,
}

/// The registered callback and the delivery thread's progress.
struct State {
    sink: Option<Sink>,
    /// Records taken off the queue by the delivery thread (delivered or discarded).
    taken: u64,
    /// The delivery thread is inside a callback call.
    delivering: bool,
}

struct Delivery {
    state: Mutex<State>,
    /// Signalled when `taken` grows or a callback call ends.
    progress: Condvar,
    queue: SyncSender<(ple_log_level, CString)>,
    /// Records put on the queue.
    queued: AtomicU64,
    /// Records dropped because the queue was full (reported, then reset, by the delivery thread).
    dropped: AtomicU64,
}

static DELIVERY: OnceLock<Delivery> = OnceLock::new();
static INIT: OnceLock<()> = OnceLock::new();

thread_local! {
    /// Set on the delivery thread (a callback that re-registers must not wait for itself).
    static ON_DELIVERY_THREAD: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

fn state(d: &Delivery) -> MutexGuard<'_, State> {
    d.state.lock().unwrap_or_else(|p| p.into_inner())
}

/// The delivery queue, its thread started on first use.
fn delivery() -> &'static Delivery {
    DELIVERY.get_or_init(|| {
        let (tx, rx) = sync_channel(QUEUE_RECORDS);
        let spawned = std::thread::Builder::new()
            .name("ple-log".into())
            .spawn(move || deliver_loop(rx));
        if let Err(e) = spawned {
            // no thread: records stay queued until full, then are dropped; nothing blocks
            eprintln!("libple: cannot start the log delivery thread: {e}");
        }
        Delivery {
            state: Mutex::new(State {
                sink: None,
                taken: 0,
                delivering: false,
            }),
            progress: Condvar::new(),
            queue: tx,
            queued: AtomicU64::new(0),
            dropped: AtomicU64::new(0),
        }
    })
}

/// The delivery thread: takes each record, reads the current callback under the state lock,
/// and calls it with no lock held.
fn deliver_loop(rx: Receiver<(ple_log_level, CString)>) {
    ON_DELIVERY_THREAD.with(|f| f.set(true));
    while let Ok((level, msg)) = rx.recv() {
        let d = delivery();
        let sink = {
            let mut st = state(d);
            st.delivering = st.sink.is_some();
            st.sink
        };
        if let Some(Sink { cb: Some(cb), user }) = sink {
            let lost = d.dropped.swap(0, Ordering::Relaxed);
            if lost > 0 {
                let note = format!("libple: {lost} log messages dropped (the callback is slow)");
                if let Ok(c) = CString::new(note) {
                    cb(PLE_LOG_WARN, c.as_ptr(), user as *mut c_void);
                }
            }
            cb(level, msg.as_ptr(), user as *mut c_void);
        }
        let mut st = state(d);
        st.taken += 1;
        st.delivering = false;
        drop(st);
        d.progress.notify_all();
    }
}

struct CallbackLogger {
    fallback: Option<env_logger::Logger>,
}

/// Whether a callback is registered (a lock-free copy of `State::sink.is_some()`).
static HAS_SINK: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

fn callback_set() -> bool {
    HAS_SINK.load(Ordering::Relaxed)
}

/// The most verbose level the callback takes (a `log::LevelFilter` as usize; set with the sink).
static SINK_LEVEL: AtomicUsize = AtomicUsize::new(0);
/// The fallback (stderr) logger's level, fixed at `init` (a `log::LevelFilter` as usize);
/// `usize::MAX` while libple's logger is not the process's (the host installed its own).
static FALLBACK_LEVEL: AtomicUsize = AtomicUsize::new(usize::MAX);

/// Whether a record at `level` goes to the callback.
fn callback_takes(level: log::Level) -> bool {
    callback_set() && (level as usize) <= SINK_LEVEL.load(Ordering::Relaxed)
}

impl log::Log for CallbackLogger {
    fn enabled(&self, m: &log::Metadata) -> bool {
        self.fallback.as_ref().is_some_and(|f| f.enabled(m)) || callback_takes(m.level())
    }
    fn log(&self, r: &log::Record) {
        if let Some(f) = &self.fallback {
            if f.matches(r) {
                f.log(r);
            }
        }
        if !callback_takes(r.level()) {
            return;
        }
        let text = format!("{}: {}", r.target(), r.args());
        let Ok(c) = CString::new(text.replace('\0', " ")) else {
            return;
        };
        let d = delivery();
        match d.queue.try_send((ple_log_level_code::to_c(r.level()), c)) {
            Ok(()) => {
                d.queued.fetch_add(1, Ordering::SeqCst);
            }
            Err(TrySendError::Full(_)) => {
                d.dropped.fetch_add(1, Ordering::Relaxed);
            }
            Err(TrySendError::Disconnected(_)) => {}
        }
    }
    fn flush(&self) {}
}

/// Installs our logger once, unless the host process already has one.
pub fn init() {
    INIT.get_or_init(|| {
        let fallback =
            env_logger::Builder::from_env(env_logger::Env::new().filter_or("PLE_LOG", "warn"))
                .build();
        let level = fallback.filter();
        let logger = CallbackLogger {
            fallback: Some(fallback),
        };
        if log::set_boxed_logger(Box::new(logger)).is_ok() {
            FALLBACK_LEVEL.store(level as usize, Ordering::Relaxed);
            log::set_max_level(level.max(log::LevelFilter::Warn));
        }
    });
}

/// Registers (or with `None`, removes) the engine's log callback. Messages up to `max_level`
/// reach it. Records queued before the call are delivered to the previous callback first, and
/// when it returns the previous callback is not running and will not be called again — unless
/// the call comes from a callback (the delivery thread), which then swaps without waiting.
pub fn set_callback(cb: ple_log_fn, user: *mut c_void, max_level: log::LevelFilter) {
    init();
    let d = delivery();
    let mut st = state(d);
    if !ON_DELIVERY_THREAD.with(|f| f.get()) {
        // (`queued` grows only after a send, so records logged during this wait are not awaited)
        let target = d.queued.load(Ordering::SeqCst);
        while st.taken < target || st.delivering {
            st = d.progress.wait(st).unwrap_or_else(|p| p.into_inner());
        }
    }
    st.sink = cb.map(|cb| Sink {
        cb: Some(cb),
        user: user as usize,
    });
    HAS_SINK.store(cb.is_some(), Ordering::Relaxed);
    // drops are reported to the callback that was too slow, not to its successor
    d.dropped.store(0, Ordering::Relaxed);
    drop(st);
    SINK_LEVEL.store(max_level as usize, Ordering::Relaxed);
    // the global filter passes what either the stderr logger or the callback takes; lowering it
    // again matters only for speed (`callback_takes` filters each record)
    let fallback = FALLBACK_LEVEL.load(Ordering::Relaxed);
    if fallback == usize::MAX {
        return; // the host's logger: its filter is the host's
    }
    let fallback = fallback.max(log::LevelFilter::Warn as usize);
    let want = if cb.is_some() {
        fallback.max(max_level as usize)
    } else {
        fallback
    };
    if let Some(f) = log::LevelFilter::iter().find(|f| *f as usize == want) {
        log::set_max_level(f);
    }
}

/// Routes libple's log messages to `callback` (NULL removes it). `max_level` (`PLE_LOG_*`) is the most
/// verbose level delivered. Without a callback, messages go to stderr at the level named by the
/// `PLE_LOG` environment variable (default warn), unless the process installed its own Rust logger.
///
/// The callback runs on libple's own `ple-log` thread, shortly after the message was logged,
/// never inside another libple call and never while libple holds a lock: it may call any libple
/// function, `ple_wait` and `ple_close` included. A slow callback delays only later messages (at
/// most 4,096 wait; more are dropped and their number reported). When `ple_set_log_callback`
/// returns (called from any thread but the callback itself), messages logged before it were
/// delivered to the old callback, which is no longer running and will not be called again.
///
/// # Safety
/// `callback`, if not NULL, must be a function safe to call from another thread with `user_data`
/// until it is replaced or removed.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ple_set_log_callback(
    callback: ple_log_fn,
    max_level: ple_log_level,
    user_data: *mut c_void,
) -> ple_status {
    ffi_guard!({
        let Some(level) = ple_log_level_code::from_c(max_level) else {
            return ple_core::invalid!("max_level {max_level} is not a PLE_LOG_* value (1..=5)");
        };
        let level = level.to_level_filter();
        set_callback(callback, user_data, level);
        Ok(())
    })
}
