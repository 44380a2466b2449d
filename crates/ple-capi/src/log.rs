//! Logging: `log` records go to the host's logger if it installed one, else to `env_logger`
//! (level from `PLE_LOG`), and additionally to a callback the engine registers.

use crate::status::ple_status;
use crate::types::ple_log_fn;
use std::ffi::{CString, c_void};
use std::sync::OnceLock;
use std::sync::RwLock;

/// C callback: `level` is 1 = error … 5 = trace; `msg` is valid only during the call.
pub type LogCallback =
    extern "C" fn(level: i32, msg: *const std::ffi::c_char, user_data: *mut c_void);

struct Sink {
    cb: LogCallback,
    user: usize,
}

static CALLBACK: RwLock<Option<Sink>> = RwLock::new(None);
static INIT: OnceLock<()> = OnceLock::new();

struct CallbackLogger {
    fallback: Option<env_logger::Logger>,
}

impl log::Log for CallbackLogger {
    fn enabled(&self, m: &log::Metadata) -> bool {
        self.fallback.as_ref().is_some_and(|f| f.enabled(m))
            || CALLBACK.read().map(|c| c.is_some()).unwrap_or(false)
    }
    fn log(&self, r: &log::Record) {
        if let Some(f) = &self.fallback {
            if f.matches(r) {
                f.log(r);
            }
        }
        if let Ok(g) = CALLBACK.read() {
            if let Some(s) = g.as_ref() {
                let text = format!("{}: {}", r.target(), r.args());
                if let Ok(c) = CString::new(text.replace('\0', " ")) {
                    (s.cb)(r.level() as i32, c.as_ptr(), s.user as *mut c_void);
                }
            }
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
            log::set_max_level(level.max(log::LevelFilter::Warn));
        }
    });
}

/// Registers (or with `None`, removes) the engine's log callback. Messages up to `max_level`
/// reach it.
pub fn set_callback(cb: Option<LogCallback>, user: *mut c_void, max_level: log::LevelFilter) {
    init();
    if let Ok(mut g) = CALLBACK.write() {
        *g = cb.map(|cb| Sink {
            cb,
            user: user as usize,
        });
    }
    if cb.is_some() && max_level > log::max_level() {
        log::set_max_level(max_level);
    }
}

/// Routes libple's log messages to `callback` (NULL removes it). `max_level` (1..5) is the most
/// verbose level delivered. Without a callback, messages go to stderr at the level named by the
/// `PLE_LOG` environment variable (default warn), unless the process installed its own Rust logger.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ple_set_log_callback(
    callback: ple_log_fn,
    max_level: i32,
    user_data: *mut c_void,
) -> ple_status {
    ffi_guard!({
        let level = match max_level {
            1 => log::LevelFilter::Error,
            2 => log::LevelFilter::Warn,
            3 => log::LevelFilter::Info,
            4 => log::LevelFilter::Debug,
            5 => log::LevelFilter::Trace,
            _ => return ple_core::invalid!("max_level {max_level} not in 1..=5"),
        };
        set_callback(callback, user_data, level);
        Ok(())
    })
}
