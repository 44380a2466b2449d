//! Writes a stream of the test kit's corpus (real English text, see `ple_testkit::corpus`) as
//! little-endian i32 token ids, for engines benched outside this workspace
//! (`integrations/llama.cpp/bench.sh` feeds it to llama.cpp):
//!
//!   cargo run --release -p ple-testkit --example corpus_tokens -- VOCAB_SIZE EOS SEED LEN OUT
use std::io::Write;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let a: Vec<String> = std::env::args().skip(1).collect();
    if a.len() != 5 {
        return Err("usage: corpus_tokens VOCAB_SIZE EOS SEED LEN OUT".into());
    }
    let (vocab, eos): (u32, i32) = (a[0].parse()?, a[1].parse()?);
    let (seed, len): (u64, usize) = (a[2].parse()?, a[3].parse()?);
    if eos < 0 || eos as u32 >= vocab {
        return Err(format!("EOS {eos} is not a token of a {vocab}-token vocabulary").into());
    }
    let tokens = ple_testkit::corpus::Corpus::new(vocab, eos).stream(seed, len);
    let bytes: Vec<u8> = tokens.iter().flat_map(|t| t.to_le_bytes()).collect();
    let tmp = format!("{}.tmp", a[4]);
    std::fs::File::create(&tmp)?.write_all(&bytes)?;
    std::fs::rename(&tmp, &a[4])?;
    Ok(())
}
