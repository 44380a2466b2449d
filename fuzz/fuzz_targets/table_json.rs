#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    ple_fuzz::table_json(data);
});
