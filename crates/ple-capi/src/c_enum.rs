//! `c_enum!`: a C enum's values declared once, with the conversions to and from the core's
//! typed values.

/// Declares a C enum once: its values, with their docs, and the core value each stands for.
///
/// ```text
/// c_enum! {
///     /// The values of `ple_x` (doc of the C enum).
///     enum ple_x_code: ple_x, CoreType {
///         /// Doc of the value.
///         PLE_X_A = 0 => (CoreType::A),
///         PLE_X_B = 1,                   // no core value: `from_c` gives None for it
///     }
/// }
/// ```
///
/// expands to the `#[repr(C)]` enum (which build.rs also writes out, from this same text, for
/// cbindgen: the header gets `typedef enum ple_x_code {...}` beside the `ple_x` typedef), a
/// `ple_x` constant per value (Rust callers use these, C the enumerators), and on the enum:
/// `name` (the value's name as a C string), `from_c` (the core value of a C value, None when it
/// is not one) and `to_c` (the C value of a core value; the match is exhaustive over the core
/// type, so a core variant without a C value does not compile).
macro_rules! c_enum {
    (
        $(#[doc = $edoc:literal])*
        enum $enum:ident: $ty:ident, $core:ty {
            $($(#[doc = $doc:literal])* $name:ident = $val:literal $(=> $core_v:tt)?,)*
        }
    ) => {
        $(#[doc = $edoc])*
        #[repr(C)]
        #[derive(Clone, Copy, Debug, PartialEq, Eq)]
        pub enum $enum {
            $($(#[doc = $doc])* $name = $val,)*
        }

        $($(#[doc = $doc])* pub const $name: $ty = $enum::$name as $ty;)*

        #[allow(unused_parens, reason = "the core values come in parentheses")]
        impl $enum {
            /// Every value, in declaration order.
            pub const ALL: &'static [$ty] = &[$($name),*];

            /// The name of a value (`"PLE_..."`), or None when `v` is not one of the values.
            pub fn name(v: $ty) -> Option<&'static std::ffi::CStr> {
                match v {
                    $($name => Some(
                        match std::ffi::CStr::from_bytes_with_nul(
                            concat!(stringify!($name), "\0").as_bytes(),
                        ) {
                            Ok(s) => s,
                            Err(_) => unreachable!(),
                        },
                    ),)*
                    _ => None,
                }
            }

            /// The core value `v` stands for (None: not a value, or one without a core value).
            pub fn from_c(v: $ty) -> Option<$core> {
                match v {
                    $($($name => Some($core_v),)?)*
                    _ => None,
                }
            }

            /// The C value of a core value.
            pub fn to_c(c: $core) -> $ty {
                match c {
                    $($($core_v => $name,)?)*
                }
            }
        }
    };
}
pub(crate) use c_enum;

#[cfg(test)]
mod tests {
    use crate::types::*;
    use ple_core::dequant::Dtype;
    use ple_core::io::direct::Backend;
    use ple_core::model::RowFormat;
    use ple_core::step::{IoMode, PrefetchPolicy, RingFullPolicy, WaitMode};

    /// Every value of a `c_enum!` has a distinct value and its own name, and the values that
    /// stand for a core value convert there and back.
    macro_rules! check_enum {
        ($e:ident, $core_values:expr) => {{
            let mut seen = std::collections::HashSet::new();
            for &v in $e::ALL {
                assert!(seen.insert(v), "{}: value {v} twice", stringify!($e));
                let name = $e::name(v).unwrap().to_str().unwrap();
                assert!(name.starts_with("PLE_"), "{name}");
                if let Some(c) = $e::from_c(v) {
                    assert_eq!($e::to_c(c), v, "{name}");
                }
            }
            for c in $core_values {
                assert_eq!($e::from_c($e::to_c(c)), Some(c));
            }
            assert_eq!($e::name(12345), None);
            assert_eq!($e::from_c(12345), None);
        }};
    }

    #[test]
    fn c_enums_are_consistent() {
        use ple_core::ErrorKind as K;
        check_enum!(
            ple_format_code,
            [
                RowFormat::Nvfp4,
                RowFormat::Fp8,
                RowFormat::Bf16,
                RowFormat::F32
            ]
        );
        check_enum!(ple_dtype_code, [Dtype::F32, Dtype::F16, Dtype::Bf16]);
        use PrefetchPolicy as P;
        check_enum!(ple_prefetch_policy_code, [P::Auto, P::Always, P::Never]);
        check_enum!(
            ple_io_mode_code,
            [IoMode::Auto, IoMode::Mmap, IoMode::Direct]
        );
        let backends = [None, Some(Backend::IoUring), Some(Backend::PreadPool)];
        check_enum!(ple_io_backend_code, backends);
        check_enum!(
            ple_ring_full_policy_code,
            [RingFullPolicy::Wait, RingFullPolicy::Error]
        );
        use WaitMode as W;
        check_enum!(
            ple_wait_mode_code,
            [W::Auto, W::Host, W::StreamOp, W::SpinKernel]
        );
        let levels = [
            log::Level::Error,
            log::Level::Warn,
            log::Level::Info,
            log::Level::Debug,
        ];
        check_enum!(
            ple_log_level_code,
            levels.into_iter().chain([log::Level::Trace])
        );
        use crate::status::ple_status_code as S;
        let kinds = [K::InvalidArgument, K::Io, K::Format, K::Timeout, K::State];
        let more = [
            K::CudaUnavailable,
            K::Cuda,
            K::Unsupported,
            K::Panic,
            K::OutOfMemory,
        ];
        check_enum!(S, kinds.into_iter().chain(more));
        // the values the header documents
        assert_eq!((PLE_FORMAT_NVFP4, PLE_IO_DIRECT, PLE_LOG_TRACE), (1, 2, 5));
        assert_eq!(S::ALL.len(), 11);
        assert_eq!(S::from_c(crate::status::PLE_OK), None);
        assert_eq!(S::name(-10).unwrap(), c"PLE_E_OUT_OF_MEMORY");
    }
}
