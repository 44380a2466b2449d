//! Progress bars of the `ple` tool (indicatif, on stderr).

use ple_core::error::Result;

/// Packs with an indicatif progress bar on stderr (bytes, rate, ETA), or `progress DONE TOTAL`
/// lines when `lines` is set.
pub fn pack_with_bar(
    checkpoint: &std::path::Path,
    out: &std::path::Path,
    opts: &ple_core::format::pack::PackOptions,
    lines: bool,
) -> Result<ple_core::format::pack::PackReport> {
    let mut bar: Option<indicatif::ProgressBar> = None;
    let mut cb = |done: u64, total: u64| -> bool {
        if lines {
            eprintln!("progress {done} {total}");
            return true;
        }
        let b = bar.get_or_insert_with(|| {
            let b = indicatif::ProgressBar::new(total);
            b.set_style(
                indicatif::ProgressStyle::with_template(
                    "{spinner} [{elapsed_precise}] [{wide_bar}] {bytes}/{total_bytes} {binary_bytes_per_sec} ETA {eta}",
                )
                .expect("valid template")
                .progress_chars("=> "),
            );
            b
        });
        b.set_position(done);
        true
    };
    let r = ple_core::format::pack::pack(checkpoint, out, opts, &mut cb);
    if let Some(b) = &bar {
        b.finish_and_clear();
    }
    r
}
