//! The step's read engine alone against the whole pipeline: one warm decode step (8 requests of
//! one token, and 64 of one token: 128 and 1,024 rows) read by `step::Reader::read_step` on the
//! calling thread, beside the same step through `Pipeline` (submit → worker → wait →
//! `packed_rows` → release). The difference is the pipeline's own cost: the hand-off to the
//! worker, the ring protocol, the wake-up. MMAP mode on a small generated table, all pages
//! cached (read once before timing), with and without a row cache; one pool thread.
//! `cargo bench --bench reader` (add `-- --quick` for a short run).

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use ple_core::format::table::Table;
use ple_core::model::RowFormat;
use ple_core::step::{IoMode, OpenOptions, Pipeline, ReadScratch, Reader};
use ple_testkit::step::Step;
use ple_testkit::synth;
use std::hint::black_box;

fn bench(c: &mut Criterion) {
    let d = tempfile::tempdir().unwrap();
    synth::write_table(
        d.path(),
        RowFormat::Nvfp4,
        &synth::small_config(20_000, 4),
        3,
    )
    .unwrap();
    for cache_bytes in [0u64, 64 << 20] {
        let opts = OpenOptions {
            io_mode: IoMode::Mmap,
            cache_bytes,
            num_threads: 1,
            max_tokens_per_step: 64,
            ..OpenOptions::default()
        };
        let table = Table::open(d.path(), &Default::default()).unwrap();
        let mut r = Reader::open(table, &opts).unwrap();
        r.open_cache().unwrap();
        r.start_pool().unwrap();
        let p = Pipeline::open(d.path(), opts.clone()).unwrap();
        let rb = r.table().row_bytes();
        let mut seq = 0u64;
        let cache = if cache_bytes > 0 {
            "row cache"
        } else {
            "no cache"
        };
        for n in [8usize, 64] {
            let st = Step::new(n as u64, n);
            let mut out = vec![0u8; n * 16 * rb];
            let mut s = ReadScratch::default();
            // warm: pages cached, cache filled
            for _ in 0..3 {
                r.read_step(&st.tokens, &st.ctx, &mut out, &mut s, &|| false)
                    .unwrap();
                seq += 1;
                p.submit(&st.batch(), seq).unwrap();
                p.release_step(seq).unwrap();
            }
            let mut g = c.benchmark_group(format!("warm decode step {n}x1, MMAP, {cache}"));
            g.throughput(Throughput::Elements((n * 16) as u64));
            g.bench_function("Reader::read_step (no worker)", |b| {
                b.iter(|| {
                    let rec = r
                        .read_step(black_box(&st.tokens), &st.ctx, &mut out, &mut s, &|| false)
                        .unwrap();
                    black_box(rec.rows);
                })
            });
            g.bench_function("Pipeline submit, wait, packed_rows, release", |b| {
                b.iter(|| {
                    seq += 1;
                    p.submit(black_box(&st.batch()), seq).unwrap();
                    let (ptr, tokens) = p.packed_rows(seq).unwrap();
                    black_box((ptr, tokens));
                    p.release_step(seq).unwrap();
                })
            });
            g.finish();
        }
        r.stop_pool();
    }
}

criterion_group!(benches, bench);
criterion_main!(benches);
