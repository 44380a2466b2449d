//! Value parsers shared by the commands' arguments.

/// `K/N` → shard K of N (1 <= N <= 16, K < N).
pub fn parse_shard(s: &str) -> std::result::Result<ple_core::shard::Shard, String> {
    let (k, n) = s
        .split_once('/')
        .ok_or_else(|| format!("'{s}' is not K/N (shard K of N, e.g. 1/4)"))?;
    let num = |x: &str| x.trim().parse::<u32>().map_err(|e| format!("'{s}': {e}"));
    ple_core::shard::Shard::new(num(k)?, num(n)?).map_err(|e| e.to_string())
}

/// Parses `auto`, `mmap`, `direct`.
pub fn parse_io_mode(s: &str) -> std::result::Result<ple_core::step::IoMode, String> {
    use ple_core::step::IoMode;
    match s {
        "auto" => Ok(IoMode::Auto),
        "mmap" => Ok(IoMode::Mmap),
        "direct" => Ok(IoMode::Direct),
        _ => Err(format!("unknown I/O mode {s:?} (auto, mmap or direct)")),
    }
}

/// Parses `123`, `64K`, `256M`, `1G`, `1T` (powers of 1024).
pub fn parse_bytes(s: &str) -> std::result::Result<u64, String> {
    let s = s.trim();
    let (num, mul) = match s.char_indices().last() {
        Some((i, c)) if c.is_ascii_alphabetic() => {
            let m = match c.to_ascii_uppercase() {
                'K' => 1u64 << 10,
                'M' => 1 << 20,
                'G' => 1 << 30,
                'T' => 1 << 40,
                _ => return Err(format!("{s}: unknown size suffix {c:?} (use K, M, G or T)")),
            };
            (&s[..i], m)
        }
        _ => (s, 1),
    };
    let v: f64 = num.parse().map_err(|_| format!("{s}: not a size"))?;
    if !(0.0..=(1u64 << 50) as f64).contains(&v) {
        return Err(format!("{s}: out of range"));
    }
    Ok((v * mul as f64) as u64)
}
