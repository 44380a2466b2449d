//! Library and ABI versions.

use crate::types::PLE_ABI_VERSION;
use std::ffi::{CStr, c_char};

/// The library version as "MAJOR.MINOR.PATCH" (static storage; never NULL).
#[unsafe(no_mangle)]
pub extern "C" fn ple_version_string() -> *const c_char {
    static V: &CStr =
        match CStr::from_bytes_with_nul(concat!(env!("CARGO_PKG_VERSION"), "\0").as_bytes()) {
            Ok(s) => s,
            Err(_) => c"?",
        };
    V.as_ptr()
}

/// The ABI version of the loaded library (`PLE_ABI_VERSION` of the header it was built with).
/// Compare with the header's `PLE_ABI_VERSION` at start-up.
#[unsafe(no_mangle)]
pub extern "C" fn ple_abi_version() -> u32 {
    PLE_ABI_VERSION
}

#[cfg(test)]
mod tests {
    use crate::boundary::*;
    use crate::status::*;
    use crate::types::*;
    use crate::version::*;
    use std::ffi::CStr;

    #[test]
    fn header_versions_agree_with_cargo() {
        assert_eq!(
            PLE_VERSION_MAJOR.to_string(),
            env!("CARGO_PKG_VERSION_MAJOR")
        );
        assert_eq!(
            PLE_VERSION_MINOR.to_string(),
            env!("CARGO_PKG_VERSION_MINOR")
        );
        assert_eq!(
            PLE_VERSION_PATCH.to_string(),
            env!("CARGO_PKG_VERSION_PATCH")
        );
        // SAFETY: ple_version_string returns a static NUL-terminated string.
        let v = unsafe { CStr::from_ptr(ple_version_string()) }
            .to_str()
            .unwrap();
        assert_eq!(v, env!("CARGO_PKG_VERSION"));
        assert_eq!(ple_abi_version(), PLE_ABI_VERSION);
    }

    #[test]
    fn panics_become_status() {
        let s = ffi_guard!({
            if PLE_OK == 0 {
                panic!("boom {}", 42);
            }
            Ok(())
        });
        assert_eq!(s, PLE_E_PANIC);
        // SAFETY: the last-error text is NUL-terminated and lives until the next libple call.
        let m = unsafe { CStr::from_ptr(ple_last_error_message()) }
            .to_str()
            .unwrap();
        assert!(m.contains("boom 42"), "{m}");
    }

    #[test]
    fn statuses_have_names() {
        for s in [
            PLE_OK,
            PLE_E_INVALID_ARGUMENT,
            PLE_E_IO,
            PLE_E_FORMAT,
            PLE_E_TIMEOUT,
            PLE_E_STATE,
            PLE_E_CUDA_UNAVAILABLE,
            PLE_E_CUDA,
            PLE_E_UNSUPPORTED,
            PLE_E_PANIC,
            PLE_E_OUT_OF_MEMORY,
        ] {
            // SAFETY: ple_status_name returns a static NUL-terminated string.
            let n = unsafe { CStr::from_ptr(ple_status_name(s)) }
                .to_str()
                .unwrap();
            assert!(n.starts_with("PLE_"), "{s} -> {n}");
        }
    }
}

#[cfg(test)]
mod header_drift {
    /// The committed `include/ple.h` must be exactly what cbindgen generates from this file.
    #[test]
    fn committed_header_matches_generated() {
        let generated = include_str!(concat!(env!("OUT_DIR"), "/ple.h"));
        let committed =
            std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../../include/ple.h"))
                .expect("include/ple.h is missing");
        assert!(
            committed == generated,
            "include/ple.h differs from the header generated from crates/ple-capi/src: run scripts/update-header.sh and commit it"
        );
    }
}
