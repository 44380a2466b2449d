//! The fuzz targets on a stable toolchain: a seeded mutator (no coverage feedback) runs each
//! target's body for a time budget and reports executions. A panic is a crash: its input is
//! written to `fuzz/artifacts/<target>/` and the driver exits 1.
//!
//! `fuzz-stable --target NAME --seconds N [--seed S]`, `fuzz-stable --seeds DIR` (writes the
//! seed corpora), `fuzz-stable --replay NAME FILE...` (runs inputs once, e.g. a saved crash).

use ple_fuzz::seeds::{TARGETS, run, seeds};
use std::time::{Duration, Instant};

/// xorshift64*: a fixed seed gives the same input sequence on every run.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
}

/// Numbers that break size arithmetic, spliced over digits of JSON inputs.
const EXTREMES: [&str; 10] = [
    "0",
    "-1",
    "1",
    "4294967295",
    "4294967296",
    "2147483656",
    "18446744073709551615",
    "18446744073709551616",
    "1e309",
    "576460752303423488",
];

fn mutate(rng: &mut Rng, input: &mut Vec<u8>, pool: &[Vec<u8>]) {
    for _ in 0..1 + rng.below(3) {
        let n = input.len();
        match rng.below(8) {
            0 if n > 0 => input[rng.below(n)] ^= 1 << rng.below(8),
            1 if n > 0 => input[rng.below(n)] = rng.next() as u8,
            2 => input.insert(rng.below(n + 1), rng.next() as u8),
            3 if n > 0 => {
                let a = rng.below(n);
                let b = (a + 1 + rng.below(16)).min(n);
                input.drain(a..b);
            }
            4 if n > 0 => {
                // replace a run of digits by an extreme number
                let start = rng.below(n);
                if let Some(a) = (start..n).find(|&i| input[i].is_ascii_digit()) {
                    let b = (a..n).find(|&i| !input[i].is_ascii_digit()).unwrap_or(n);
                    let x = EXTREMES[rng.below(EXTREMES.len())].as_bytes();
                    input.splice(a..b, x.iter().copied());
                }
            }
            5 if !pool.is_empty() => {
                let other = &pool[rng.below(pool.len())];
                if !other.is_empty() {
                    let a = rng.below(other.len());
                    let b = (a + rng.below(64)).min(other.len());
                    let at = rng.below(n + 1);
                    input.splice(at..at, other[a..b].iter().copied());
                }
            }
            6 if n > 8 => {
                // rewrite a little-endian u32/u64 length field near the start
                let at = rng.below(8.min(n - 4));
                let v = [0u32, 1, u32::MAX, 1 << 31, rng.next() as u32][rng.below(5)];
                input[at..at + 4].copy_from_slice(&v.to_le_bytes());
            }
            7 if n > 1 && rng.below(8) == 0 => input.truncate(rng.below(n)),
            _ => input.push(rng.next() as u8),
        }
    }
}

fn crash(target: &str, data: &[u8]) -> ! {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("artifacts")
        .join(target);
    std::fs::create_dir_all(&dir).expect("artifacts directory");
    let h = data.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &b| {
        (h ^ b as u64).wrapping_mul(0x100_0000_01b3)
    });
    let p = dir.join(format!("crash-{h:016x}"));
    std::fs::write(&p, data).expect("write crash");
    eprintln!(
        "fuzz-stable: {target}: CRASH, input saved to {}",
        p.display()
    );
    std::process::exit(1);
}

fn fuzz(target: &str, seconds: u64, seed: u64) {
    let mut pool = seeds(target);
    let mut rng = Rng(seed | 1);
    let t0 = Instant::now();
    let mut execs = 0u64;
    let mut accepted = 0u64;
    while t0.elapsed() < Duration::from_secs(seconds) {
        let mut input = pool[rng.below(pool.len())].clone();
        mutate(&mut rng, &mut input, &pool);
        let ok = match std::panic::catch_unwind(|| run(target, &input)) {
            Ok(ok) => ok == Some(true),
            Err(_) => crash(target, &input),
        };
        accepted += u64::from(ok);
        execs += 1;
        // Keep accepted mutants (and a few others) as parents: acceptance is the only feedback
        // without coverage instrumentation. The pool is bounded.
        if (ok || rng.below(256) == 0) && input.len() < 1 << 17 {
            if pool.len() < 256 {
                pool.push(input);
            } else {
                let i = rng.below(pool.len());
                pool[i] = input;
            }
        }
    }
    let s = t0.elapsed().as_secs_f64();
    println!(
        "fuzz-stable: {target}: {execs} executions in {s:.0} s ({:.0}/s), {accepted} accepted, seed {seed}, 0 crashes",
        execs as f64 / s
    );
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let get = |k: &str| {
        args.iter()
            .position(|a| a == k)
            .and_then(|i| args.get(i + 1).cloned())
    };
    std::panic::set_hook(Box::new(|info| eprintln!("panic: {info}")));
    if let Some(dir) = get("--seeds") {
        for t in TARGETS {
            let d = std::path::Path::new(&dir).join(t);
            std::fs::create_dir_all(&d).expect("corpus directory");
            for (i, s) in seeds(t).iter().enumerate() {
                std::fs::write(d.join(format!("seed-{i}")), s).expect("write seed");
            }
        }
        return;
    }
    if let Some(t) = get("--replay") {
        let i = args.iter().position(|a| a == "--replay").expect("flag") + 2;
        for f in &args[i..] {
            let data = std::fs::read(f).expect("read input");
            let ok = run(&t, &data).unwrap_or_else(|| panic!("unknown target {t}"));
            println!("fuzz-stable: {t}: {f}: no crash (accepted: {ok})");
        }
        return;
    }
    let seconds = get("--seconds").map_or(10, |s| s.parse().expect("--seconds N"));
    let seed = get("--seed").map_or(1, |s| s.parse().expect("--seed S"));
    match get("--target") {
        Some(t) if TARGETS.contains(&t.as_str()) => fuzz(&t, seconds, seed),
        Some(t) => panic!("unknown target {t} (one of {TARGETS:?})"),
        None => TARGETS.iter().for_each(|t| fuzz(t, seconds, seed)),
    }
}
