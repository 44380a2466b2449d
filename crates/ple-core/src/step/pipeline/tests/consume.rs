//! Step-pipeline tests, second half: dequant consumption, counters, the GPU-mode ring on the
//! CPU, close and drop (helpers from the parent module).

use super::*;

#[test]
fn dequant_cpu_consumes_and_matches_rows() {
    let format = RowFormat::Nvfp4;
    let d = make_table(format, 2000);
    let p = open(d.path(), |_| {});
    let mut rng = Rng(4);
    let b = random_batch(&mut rng, 5, 30);
    let ids = ids_of(&p, &b);
    let n = b.tokens.len();
    p.submit(&b.view(), 1).unwrap();
    let stride = 2600;
    let mut out = vec![f32::NAN; (n - 1) * stride + 2560];
    // bad arguments do not consume the step
    // SAFETY: `out` holds the step's tokens at `stride` f32 apart; the call is refused before writing.
    let e = unsafe { p.dequant_cpu(1, out.as_mut_ptr() as *mut u8, f32_out(2559)) }.unwrap_err();
    assert_eq!(e.kind(), crate::ErrorKind::InvalidArgument);
    // SAFETY: 2 bytes into `out`, a Vec of more than 2 bytes: still inside the allocation.
    let misaligned = unsafe { (out.as_mut_ptr() as *mut u8).add(2) };
    // SAFETY: refused for its misalignment before anything is written.
    let e = unsafe { p.dequant_cpu(1, misaligned, f32_out(stride)) }.unwrap_err();
    assert_eq!(e.kind(), crate::ErrorKind::InvalidArgument);
    // SAFETY: `out` holds `(n - 1) * stride + 2560` f32 and nobody else uses it.
    unsafe { p.dequant_cpu(1, out.as_mut_ptr() as *mut u8, f32_out(stride)) }.unwrap();
    let dq = dequant::Dequantizer::new(format, synth::global_scale(format), 160);
    let mut want = [0f32; 160];
    for t in 0..n {
        for h in 0..16 {
            dq.row_f32(
                &synth::expected_row(SEED, format, ids[t * 16 + h] as u64),
                &mut want,
            );
            let got = &out[t * stride + h * 160..t * stride + (h + 1) * 160];
            assert_eq!(got, &want[..], "token {t} head {h}");
        }
    }
    p.wait(1, 0).unwrap(); // consumed and complete
    // SAFETY: as above; the step is already consumed, so nothing is written.
    let e = unsafe { p.dequant_cpu(1, out.as_mut_ptr() as *mut u8, f32_out(stride)) }.unwrap_err();
    assert_eq!(e.kind(), crate::ErrorKind::State);
    let e = p
        .dequant_fuse(std::ptr::null_mut(), 1, 0, F32_OUT)
        .unwrap_err();
    assert_eq!(e.kind(), crate::ErrorKind::CudaUnavailable);
}

#[test]
fn stats_count_steps_pages_and_prefetch() {
    let format = RowFormat::Nvfp4;
    let d = make_table(format, 3000);
    // (WILLNEED for every step: with the default direct reads of cold rows, a step's pages are
    // advised only when no other step waits, which back-to-back submits make a race)
    let p = open(d.path(), |o| {
        o.prefetch_policy = PrefetchPolicy::Always;
        o.cold_reads = crate::step::ColdReads::Willneed;
    });
    let prefill = B::new(&[(1, 0, (100..140).collect())], None); // span of 40 > 8
    let verify = B::new(
        &[(2, 0, vec![1, 2, 3, 4, 5, 6, 7, 8]), (3, 0, vec![9])],
        None,
    ); // decode
    let single = B::new(&[(4, 0, vec![77])], None);
    let mut all_pages = 0;
    // unique pages counted independently (first and last 4 KiB page of each 90-byte row)
    let pages = |ids: &[i64]| {
        let mut v: Vec<u64> = ids
            .iter()
            .flat_map(|&r| [r as u64 * 90 / 4096, (r as u64 * 90 + 89) / 4096])
            .collect();
        v.sort();
        v.dedup();
        v.len() as u64
    };
    for (seq, b) in [(1, &prefill), (2, &verify), (3, &single)] {
        all_pages += pages(&ids_of(&p, b));
        p.submit(&b.view(), seq).unwrap();
        p.release_step(seq).unwrap();
    }
    let s = p.stats();
    assert_eq!((s.prefill_steps, s.decode_steps), (1, 2));
    assert_eq!((s.prefill_tokens, s.decode_tokens), (40, 10));
    assert_eq!((s.prefill_rows, s.decode_rows), (640, 160));
    assert_eq!(s.unique_pages, all_pages);
    assert_eq!(s.prefetch_steps, 3);
    assert_eq!(s.pages_prefetched, all_pages);
    assert!(s.hash_ns > 0 && s.gather_ns > 0 && s.prefill_step_ns > 0 && s.decode_step_ns > 0);
    assert_eq!(s.copy_ns, 0);
    let file = p.table().bytes().len() as u64;
    assert_eq!(s.table_pages, file.div_ceil(stats::os_page_size() as u64));
    assert!(s.resident_pages > 0 && s.resident_pages <= s.table_pages);
    assert!(s.mem_available_bytes > 0);
    drop(p);

    // NEVER: no prefetch whatever the size; distinct pages still counted — for a step big
    // enough for the pool, on the worker thread while the pool gathers; for a small one after
    // it is published
    let q = open(d.path(), |o| o.prefetch_policy = PrefetchPolicy::Never);
    let big = B::new(
        &[(5, 0, (0..100).map(|i| (i * 7919) % 150_000).collect())],
        None,
    );
    assert!(big.tokens.len() * 16 >= gather::PARALLEL_MIN_ROWS);
    let mut want_pages = 0;
    for (seq, b) in [(1, &prefill), (2, &big), (3, &single)] {
        want_pages += pages(&ids_of(&q, b));
        q.submit(&b.view(), seq).unwrap();
        check_rows(&q, seq, &ids_of(&q, b), format);
        q.release_step(seq).unwrap();
    }
    let s = q.stats();
    assert_eq!((s.prefetch_steps, s.pages_prefetched), (0, 0));
    assert_eq!(s.unique_pages, want_pages);
    assert!(s.queue_ns <= s.prefill_step_ns + s.decode_step_ns);
    drop(q);

    // AUTO: small steps never; big steps only when their pages are not cached
    let q = open(d.path(), |o| o.prefetch_min_rows = 100);
    q.submit(&single.view(), 1).unwrap();
    q.submit(&prefill.view(), 2).unwrap(); // the table was just written: cached
    q.wait(2, 0).unwrap();
    assert_eq!(q.stats().prefetch_steps, 0);
    drop(q);
    let rows = std::fs::File::open(d.path().join(crate::format::table::ROWS_FILE)).unwrap();
    use std::os::fd::AsRawFd;
    // SAFETY: posix_fadvise takes any fd and range; `rows` is an open file.
    unsafe { libc::posix_fadvise(rows.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
    let q = open(d.path(), |o| o.prefetch_min_rows = 100);
    if q.stats().resident_pages > 0 {
        eprintln!("(page cache could not be evicted here: cold AUTO case not checked)");
        return;
    }
    // 100 tokens = 1,600 rows: the prefetch is overlapped with the pool's gather
    let cold = B::new(&[(5, 0, (200..300).collect())], None);
    q.submit(&cold.view(), 1).unwrap();
    check_rows(&q, 1, &ids_of(&q, &cold), format);
    let s = q.stats();
    assert_eq!(s.prefetch_steps, 1);
    assert_eq!(s.pages_prefetched, pages(&ids_of(&q, &cold)));
    if stats::thread_read_bytes().is_some() {
        assert!(
            s.storage_read_bytes >= 4096 * s.pages_prefetched / 2,
            "{s:?}"
        );
    }
}

#[test]
fn table_info_describes_the_table() {
    let d = make_table(RowFormat::Fp8, 2000);
    let p = open(d.path(), |_| {});
    let i = p.table_info();
    let m = p.table().meta();
    assert_eq!(i.format, RowFormat::Fp8);
    assert_eq!((i.row_bytes, i.total_rows), (160, m.total_rows));
    assert_eq!(i.addressed_rows, m.hash.addressed_rows());
    assert_eq!((i.num_heads, i.head_dim, i.ngram_size), (16, 160, 3));
    assert_eq!((i.vocab_size, i.eos_token_id), (248_320, EOS));
    assert_eq!(i.global_scale, synth::global_scale(RowFormat::Fp8));
    assert_eq!(i.file_size, m.total_rows * 160);
    assert_eq!(i.source_name, m.source.name);
}

#[test]
fn drop_with_steps_in_flight_returns() {
    let d = make_table(RowFormat::Nvfp4, 2000);
    let mut rng = Rng(2);
    let p = open(d.path(), |o| o.max_in_flight = 4);
    p.hooks().delay_us.store(100_000, Ordering::Relaxed);
    for seq in 1..=4 {
        p.submit(&random_batch(&mut rng, 4, 50).view(), seq)
            .unwrap();
    }
    drop(p); // the running step finishes, queued ones are abandoned, threads joined
    // and one with a step mid-gather (no delay)
    let p = open(d.path(), |_| {});
    p.submit(&random_batch(&mut rng, 8, 60).view(), 1).unwrap();
    drop(p);
}

#[test]
fn threads_with_separate_handles() {
    let format = RowFormat::Nvfp4;
    let d = make_table(format, 3000);
    std::thread::scope(|s| {
        for t in 0..6u64 {
            let dir = d.path();
            s.spawn(move || {
                let p = open(dir, |o| {
                    o.num_threads = 1 + (t as u32 % 2);
                    o.max_in_flight = 1 + (t as u32 % 3);
                });
                let mut rng = Rng(100 + t);
                for seq in 1..=40u64 {
                    let n = 1 + rng.below(6) as usize;
                    let b = random_batch(&mut rng, n, 40);
                    let ids = ids_of(&p, &b);
                    p.submit(&b.view(), seq).unwrap();
                    check_rows(&p, seq, &ids, format);
                    p.release_step(seq).unwrap();
                }
            });
        }
    });
}

#[test]
fn one_handle_shared_by_a_submitter_and_waiters() {
    let format = RowFormat::Fp8;
    let d = make_table(format, 2000);
    let p = open(d.path(), |o| o.max_in_flight = 3);
    let mut rng = Rng(6);
    let batches: Vec<B> = (0..60).map(|_| random_batch(&mut rng, 3, 20)).collect();
    let ids: Vec<Vec<i64>> = batches.iter().map(|b| ids_of(&p, b)).collect();
    std::thread::scope(|s| {
        let p = &p;
        let ids = &ids;
        // a consumer thread waits on each step and checks and releases it
        s.spawn(move || {
            for (i, ids) in ids.iter().enumerate() {
                let seq = i as u64 + 1;
                loop {
                    match p.wait(seq, 0) {
                        Ok(()) => break,
                        Err(e) if e.kind() == crate::ErrorKind::State => std::thread::yield_now(),
                        Err(e) => panic!("{e}"),
                    }
                }
                check_rows(p, seq, ids, format);
                p.release_step(seq).unwrap();
            }
        });
        for (i, b) in batches.iter().enumerate() {
            p.submit(&b.view(), i as u64 + 1).unwrap();
        }
    });
}

/// The GPU mode's ring (`seq % slots`, forced on the CPU here: the GPU side itself needs a
/// driver) serves the right rows through wraparound with sparse seqs, refuses or waits for an
/// occupied target slot, and never overwrites an unconsumed step.
#[test]
fn seq_mod_slots_ring_wraps_refuses_and_waits() {
    let format = RowFormat::Fp8;
    let d = make_table(format, 2000);
    let mut rng = Rng(5);
    FORCE_SLOT_BY_SEQ.with(|f| f.set(true));
    let p = open(d.path(), |o| {
        o.max_in_flight = 3;
        o.ring_full_policy = RingFullPolicy::Error;
    });
    let p_wait = open(d.path(), |o| o.max_in_flight = 2);
    FORCE_SLOT_BY_SEQ.with(|f| f.set(false));
    assert!(p.sh.completion.slot_by_seq() && p_wait.sh.completion.slot_by_seq());

    let bs: Vec<B> = (0..4).map(|_| random_batch(&mut rng, 2, 5)).collect();
    p.submit(&bs[0].view(), 1).unwrap(); // slot 1
    p.submit(&bs[1].view(), 2).unwrap(); // slot 2
    // seq 4 needs slot 1, still held by step 1, although slot 0 is free
    let e = p.submit(&bs[3].view(), 4).unwrap_err();
    assert_eq!(e.kind(), crate::ErrorKind::State);
    assert!(e.to_string().contains("ring full: slot 1"), "{e}");
    p.submit(&bs[2].view(), 3).unwrap(); // slot 0
    p.release_step(1).unwrap();
    p.submit(&bs[3].view(), 4).unwrap(); // slot 1 again
    for (seq, b) in [(2u64, &bs[1]), (3, &bs[2]), (4, &bs[3])] {
        check_rows(&p, seq, &ids_of(&p, b), format);
    }
    p.wait(1, 0).unwrap(); // released: complete (see gpu_tests.rs for the wait semantics)

    // sparse seqs through many wraparounds (3i + 1 alternates slots 1, 0 with 2 slots)
    let mut pending: VecDeque<(u64, Vec<i64>)> = VecDeque::new();
    for i in 0..100u64 {
        let seq = 3 * i + 1;
        let (nreq, len) = (1 + rng.below(4) as usize, 1 + rng.below(3));
        let b = random_batch(&mut rng, nreq, len);
        let ids = ids_of(&p_wait, &b);
        p_wait.submit(&b.view(), seq).unwrap();
        pending.push_back((seq, ids));
        if pending.len() == 2 {
            let (s, ids) = pending.pop_front().unwrap();
            check_rows(&p_wait, s, &ids, format);
            p_wait.release_step(s).unwrap();
        }
    }
    // PLE_RING_WAIT: seq s + 2 maps to the slot of the unconsumed step s (the other slot is
    // free): the submit waits until another thread releases step s
    let (s, ids) = pending.pop_front().unwrap();
    let b = random_batch(&mut rng, 1, 1);
    let next_ids = ids_of(&p_wait, &b);
    std::thread::scope(|sc| {
        sc.spawn(|| {
            std::thread::sleep(Duration::from_millis(50));
            check_rows(&p_wait, s, &ids, format);
            p_wait.release_step(s).unwrap();
        });
        p_wait.submit(&b.view(), s + 2).unwrap(); // blocks until step s is released
    });
    check_rows(&p_wait, s + 2, &next_ids, format);
}

/// A handle opened without a CUDA device answers every GPU entry point with
/// CUDA_UNAVAILABLE, and reports no device waits.
#[test]
fn cpu_handle_gpu_entry_points_are_cuda_unavailable() {
    let d = make_table(RowFormat::Nvfp4, 2000);
    let p = open(d.path(), |_| {});
    assert!(p.sh.gpu.is_none());
    let null = std::ptr::null_mut();
    let errs = [
        p.graph_prepare(null, 1).unwrap_err(),
        p.dequant_fuse_graph(null, 8, 0x1000, F32_OUT).unwrap_err(),
        p.check_device().unwrap_err(),
        p.dequant_fuse(null, 1, 0x1000, F32_OUT).unwrap_err(),
    ];
    for e in errs {
        assert_eq!(e.kind(), crate::ErrorKind::CudaUnavailable, "{e}");
        assert!(e.to_string().contains("cuda_device = -1"), "{e}");
    }
    assert!(!p.table_info().device_wait_supported);
}

/// `cuda_device = 0` on a machine without a CUDA driver: `Pipeline::open` and `ple_open` fail
/// with CUDA_UNAVAILABLE and a message that says what to do. (Skipped where a driver loads.)
#[test]
fn cuda_device_without_driver_is_cuda_unavailable() {
    if crate::dequant::gpu::probe_driver().is_ok() {
        eprintln!("a CUDA driver is present: not checking the no-driver error");
        return;
    }
    let d = make_table(RowFormat::Nvfp4, 2000);
    let o = OpenOptions {
        max_tokens_per_step: 64,
        num_threads: 1,
        cuda_device: 0,
        ..OpenOptions::default()
    };
    let e = Pipeline::open(d.path(), o.clone())
        .err()
        .expect("open must fail");
    assert_eq!(e.kind(), crate::ErrorKind::CudaUnavailable, "{e}");

    assert!(e.to_string().contains("libcuda"), "{e}");
    assert!(e.to_string().contains("cuda_device = -1"), "{e}");
}

#[test]
fn pipeline_is_send_and_sync() {
    fn check<T: Send + Sync>() {}
    check::<Pipeline>();
}

/// `shutdown` (from `ple_close`) wakes every blocked call, whatever its timeout: a wait, the wait
/// inside a dequant, and a submit parked on a full ring all return `Error::State` at once.
#[test]
fn shutdown_wakes_every_blocked_call() {
    let d = make_table(RowFormat::Nvfp4, 2000);
    let p = Arc::new(open(d.path(), |o| {
        o.max_in_flight = 1;
        o.wait_timeout_us = u64::MAX;
    }));
    p.hooks().delay_us.store(3_000_000, Ordering::Relaxed);
    let mut rng = Rng(3);
    let b = random_batch(&mut rng, 1, 1);
    p.submit(&b.view(), 1).unwrap();
    let t = Instant::now();
    let waiters: Vec<_> = (0..3)
        .map(|k| {
            let (p, b) = (p.clone(), b.clone());
            std::thread::spawn(move || match k {
                0 => p.wait(1, u64::MAX),
                1 => {
                    let mut out = vec![0f32; 2560];
                    // SAFETY: `out` holds the one token's row.
                    unsafe { p.dequant_cpu(1, out.as_mut_ptr() as *mut u8, F32_OUT) }
                }
                _ => p.submit(&b.view(), 2),
            })
        })
        .collect();
    std::thread::sleep(Duration::from_millis(200));
    p.shutdown();
    for w in waiters {
        let e = w.join().unwrap().unwrap_err();
        assert_eq!(e.kind(), crate::ErrorKind::State, "{e}");
    }
    let el = t.elapsed();
    assert!(
        el < Duration::from_millis(2_000),
        "woken after {el:?}, step takes 3 s"
    );
}

/// `poll` never blocks: `Timeout` while the step runs, `Ok` once it is done, and it is not counted
/// as a timeout.
#[test]
fn poll_does_not_wait() {
    let d = make_table(RowFormat::Nvfp4, 2000);
    let p = open(d.path(), |_| {});
    p.hooks().delay_us.store(300_000, Ordering::Relaxed);
    let mut rng = Rng(4);
    let b = random_batch(&mut rng, 1, 1);
    p.submit(&b.view(), 1).unwrap();
    let t = Instant::now();
    assert_eq!(p.poll(1).unwrap_err().kind(), crate::ErrorKind::Timeout);
    assert!(t.elapsed() < Duration::from_millis(100));
    p.wait(1, u64::MAX).unwrap();
    p.poll(1).unwrap();
    assert_eq!(p.poll(9).unwrap_err().kind(), crate::ErrorKind::State);
    assert_eq!(p.stats().timeouts, 0);
}
