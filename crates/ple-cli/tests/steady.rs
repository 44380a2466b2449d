//! `ple bench --steady` on a small generated table, from a trace file: it runs, its figures add
//! up (JSON), the references are computed, and the plot is written.

mod common;

use std::process::Command;

#[test]
fn steady_bench_replays_a_trace_and_writes_the_plot() {
    let d = tempfile::tempdir().unwrap();
    let table = common::small_table(d.path());
    // three documents of the English streams, one per line
    let trace = d.path().join("trace.txt");
    let lines: Vec<String> = (0..3)
        .map(|i| {
            let v: Vec<String> = ple_testkit::text::stream(700, i)
                .iter()
                .map(|t| t.to_string())
                .collect();
            v.join(" ")
        })
        .collect();
    std::fs::write(&trace, lines.join("\n") + "\n").unwrap();
    let (svg, json) = (d.path().join("s.svg"), d.path().join("s.json"));
    let out = Command::new(env!("CARGO_BIN_EXE_ple"))
        .args([
            "bench",
            table.to_str().unwrap(),
            "--steady",
            "--requests",
            "8",
        ])
        .args(["--steps", "60", "--interval", "20", "--cache-bytes", "1M"])
        .args([
            "--prompt-tokens",
            "100",
            "--prefill-chunk",
            "64",
            "--sizes",
            "256K",
        ])
        .args(["--threads", "2", "--trace", trace.to_str().unwrap()])
        .args([
            "--svg",
            svg.to_str().unwrap(),
            "--json",
            json.to_str().unwrap(),
        ])
        .output()
        .unwrap();
    let text = common::stdout_of_success(out);
    assert!(
        text.contains("overall") && text.contains("LRU pages"),
        "{text}"
    );
    let v: serde_json::Value = serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
    assert_eq!(v["intervals"].as_array().unwrap().len(), 3);
    let o = &v["overall"];
    let rows = o["tokens"].as_u64().unwrap() * 16;
    let (h, m) = (
        o["cache_hits"].as_u64().unwrap(),
        o["cache_misses"].as_u64().unwrap(),
    );
    assert_eq!(
        h + m,
        rows,
        "every row of the run is a hit or a miss of the cache"
    );
    assert!(h > 0, "repeated documents hit the cache");
    // the replay of the handle's own policy at its own size sees the same sequence
    let p = v["policies"].as_array().unwrap();
    assert_eq!(p.len(), 8, "two sizes × (two policies, row LRU, page LRU)");
    let svg = std::fs::read_to_string(&svg).unwrap();
    assert!(svg.starts_with("<svg") && svg.matches("<polyline").count() == 5);
    // a trace with a token outside the vocabulary is refused with its line
    std::fs::write(&trace, "1 2 3\n4 -5 6\n").unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_ple"))
        .args(["bench", table.to_str().unwrap(), "--steady", "--steps", "5"])
        .args(["--trace", trace.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("trace.txt:2") && err.contains("-5"), "{err}");
}

/// `--shard K/N`: the rank reads 16/N rows per token, the whole table 16, on the same steps
/// (JSON); without --steady the flag is refused.
#[test]
fn steady_bench_of_a_shard_sits_beside_the_whole_table() {
    let d = tempfile::tempdir().unwrap();
    let table = common::small_table(d.path());
    let json = d.path().join("s.json");
    let out = Command::new(env!("CARGO_BIN_EXE_ple"))
        .args([
            "bench",
            table.to_str().unwrap(),
            "--steady",
            "--shard",
            "2/3",
        ])
        .args(["--requests", "8", "--steps", "40", "--prompt-tokens", "60"])
        .args(["--cache-bytes", "64K", "--threads", "2", "--no-reference"])
        .args(["--json", json.to_str().unwrap()])
        .output()
        .unwrap();
    let text = common::stdout_of_success(out);
    assert!(
        text.contains("shard 2/3: heads 2, 5, 8, 11, 14 (5 rows per token)"),
        "{text}"
    );
    let v: serde_json::Value = serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
    let s = &v["shard"];
    assert_eq!(s["rank"]["rows_per_token"], 5.0);
    assert_eq!(s["whole"]["rows_per_token"], 16.0);
    assert_eq!(s["rank"]["tokens"], s["whole"]["tokens"], "the same steps");
    assert_eq!(s["rank_over_whole"]["rows"], 5.0 / 16.0);
    let hits = |x: &serde_json::Value| x["hit_rate"].as_f64().unwrap();
    assert!((0.0..=1.0).contains(&hits(&s["rank"])) && (0.0..=1.0).contains(&hits(&s["whole"])));
    let o = Command::new(env!("CARGO_BIN_EXE_ple"))
        .args(["bench", table.to_str().unwrap(), "--shard", "1/2"])
        .output()
        .unwrap();
    assert!(!o.status.success());
    assert!(String::from_utf8_lossy(&o.stderr).contains("--steady"));
}

/// `--shards N`: every rank runs the same steps with 1/N of the cache, reads its heads' rows
/// (round-robin: 16/N each), counts every row as a hit or a miss, and the replay of its heads
/// through the same policy finds about as many misses as the rank's cache; the JSON holds the
/// per-shard figures and the most/fewest ratios.
#[test]
fn steady_bench_runs_every_shard_of_a_group() {
    let d = tempfile::tempdir().unwrap();
    let table = common::small_table(d.path());
    let json = d.path().join("s.json");
    let out = Command::new(env!("CARGO_BIN_EXE_ple"))
        .args(["bench", "steady", table.to_str().unwrap(), "--shards", "4"])
        .args(["--requests", "8", "--steps", "40", "--prompt-tokens", "60"])
        .args(["--cache-bytes", "256K", "--threads", "1"])
        .args(["--json", json.to_str().unwrap()])
        .output()
        .unwrap();
    let text = common::stdout_of_success(out);
    assert!(
        text.contains("most / fewest storage reads of a shard"),
        "{text}"
    );
    let v: serde_json::Value = serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
    let s = &v["shards"];
    assert_eq!(s["shards"], 4);
    assert_eq!(s["cache_bytes_per_rank"], 64 * 1024);
    let ranks = s["ranks"].as_array().unwrap();
    assert_eq!(ranks.len(), 4);
    let u = |x: &serde_json::Value| x.as_u64().unwrap();
    let rows: Vec<u64> = ranks.iter().map(|r| u(&r["rows"])).collect();
    assert!(rows.iter().all(|&r| r == rows[0] && r > 0), "{rows:?}");
    for (k, r) in ranks.iter().enumerate() {
        let heads: Vec<String> = (k..16).step_by(4).map(|h| h.to_string()).collect();
        assert_eq!(r["heads"], heads.join(", "));
        assert_eq!(u(&r["cache_hits"]) + u(&r["cache_misses"]), u(&r["rows"]));
        let replayed = u(&s["replayed_misses_round_robin"][k]);
        let misses = u(&r["cache_misses"]);
        assert!(
            replayed.abs_diff(misses) * 20 <= misses,
            "shard {k}: replayed {replayed} misses, the handle's cache {misses}"
        );
    }
    assert_eq!(s["replayed_misses_contiguous"].as_array().unwrap().len(), 4);
}

/// `ple bench steady DIR` and the old spelling `ple bench DIR --steady` run the same benchmark:
/// the same row-id sequence gives the same cache hits and misses per interval and the same
/// replayed policies; only the old spelling prints its one-line notice on stderr.
#[test]
fn steady_subcommand_and_the_old_spelling_run_the_same_benchmark() {
    let d = tempfile::tempdir().unwrap();
    let table = common::small_table(d.path());
    let t = table.to_str().unwrap();
    let opts = [
        "--requests",
        "8",
        "--steps",
        "40",
        "--interval",
        "20",
        "--prompt-tokens",
        "60",
        "--cache-bytes",
        "256K",
        "--threads",
        "2",
    ];
    let run = |args: &[&str], json: &std::path::Path| {
        let out = Command::new(env!("CARGO_BIN_EXE_ple"))
            .args(args)
            .args(opts)
            .args(["--json", json.to_str().unwrap()])
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr).into_owned();
        assert!(
            out.status.success(),
            "{}\n{err}",
            String::from_utf8_lossy(&out.stdout)
        );
        let v: serde_json::Value = serde_json::from_slice(&std::fs::read(json).unwrap()).unwrap();
        (v, err)
    };
    let (new, new_err) = run(&["bench", "steady", t], &d.path().join("new.json"));
    let (old, old_err) = run(&["bench", t, "--steady"], &d.path().join("old.json"));
    assert!(!new_err.contains("is now"), "{new_err}");
    let notices: Vec<&str> = old_err.lines().filter(|l| l.contains("is now")).collect();
    assert_eq!(notices.len(), 1, "{old_err}");
    assert!(notices[0].contains("ple bench steady"), "{old_err}");
    let counts = |v: &serde_json::Value| -> Vec<(u64, u64, u64)> {
        v["intervals"]
            .as_array()
            .unwrap()
            .iter()
            .map(|i| {
                let n = |k: &str| i[k].as_u64().unwrap();
                (n("tokens"), n("cache_hits"), n("cache_misses"))
            })
            .collect()
    };
    assert_eq!(counts(&new).len(), 2);
    assert_eq!(counts(&new), counts(&old));
    assert_eq!(new["policies"], old["policies"]);
    // a table directory is needed by both spellings
    let o = Command::new(env!("CARGO_BIN_EXE_ple"))
        .args(["bench", "steady"])
        .output()
        .unwrap();
    assert!(!o.status.success());
}
