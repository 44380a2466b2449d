//! `ple bench --engine` on a small generated table: it runs every part (prefill chunks, decode
//! with drafts, the p99 check) and its read-ahead counters add up.

mod common;

use std::process::Command;

/// The `(asked, read, dropped, cached)` of a "pair N read-ahead …: … ahead asked A read R
/// dropped D cached C hits H; …" line.
fn ahead_counts(line: &str) -> (u64, u64, u64, u64) {
    let words: Vec<&str> = line.split_whitespace().collect();
    let after = |key: &str| -> u64 {
        let i = words
            .windows(2)
            .position(|w| w[0] == key && w[1].trim_end_matches(';').parse::<u64>().is_ok())
            .unwrap_or_else(|| panic!("no {key} in {line}"));
        words[i + 1].trim_end_matches(';').parse().unwrap()
    };
    (
        after("asked"),
        after("read"),
        after("dropped"),
        after("cached"),
    )
}

#[test]
fn engine_bench_runs_and_its_read_ahead_counters_add_up() {
    let d = tempfile::tempdir().unwrap();
    let table = common::small_table(d.path());
    let out = Command::new(env!("CARGO_BIN_EXE_ple"))
        .args(["bench", table.to_str().unwrap(), "--engine"])
        .args(["--engine-prompt-tokens", "512", "--chunk-tokens", "256"])
        .args([
            "--pairs",
            "1",
            "--decode-steps",
            "3",
            "--engine-cache-mib",
            "16",
        ])
        .args(["--prefill-after-ms", "2", "--decode-after-ms", "2"])
        .args([
            "--p99-steps",
            "60",
            "--p99-rounds",
            "2",
            "--p99-gap-ms",
            "0.5",
            "--p99-distinct",
            "40",
        ])
        .output()
        .unwrap();
    let text = common::stdout_of_success(out);
    let off = text
        .lines()
        .find(|l| l.contains("read-ahead off"))
        .expect("an off run");
    assert_eq!(ahead_counts(off), (0, 0, 0, 0), "{off}");
    let on = text
        .lines()
        .find(|l| l.contains("read-ahead on"))
        .expect("an on run");
    let (asked, read, dropped, cached) = ahead_counts(on);
    assert!(asked > 0, "{on}");
    assert_eq!(asked, read + dropped + cached, "{on}");
    for part in [
        "chunks after the first: exposed wait on/off",
        "TTFT off",
        "decode (8 requests x (1 + 4 drafts)",
        // the 40 distinct steps stay in the 16 MiB row cache through the read-ahead
        "cached 8x1 step (40 distinct, 0 cache misses) every 0.5 ms, 2 rounds of 30 idle then 30 busy steps",
    ] {
        assert!(text.contains(part), "no {part:?} in:\n{text}");
    }
    // the busy steps split into those that found the reader reading and the others
    let split = text
        .lines()
        .find_map(|l| {
            l.trim()
                .strip_prefix("busy steps that found the reader reading: ")
        })
        .expect("the collision split");
    let (n, of) = split
        .split_once(" of ")
        .map(|(n, r)| (n, r.split(' ').next().unwrap()))
        .unwrap();
    assert!(n.parse::<u64>().unwrap() <= 60 && of == "60", "{split}");
}
