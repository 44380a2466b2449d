//! The checkpoint fingerprint: which checkpoint a table was packed from
//! (`docs/FORMAT.md#the-source-fingerprint`).

use crate::error::{Error, Result};
use crate::format::files::{MAX_INDEX, non_empty, open_regular, read_capped};
use crate::format::safetensors::{
    INDEX_FILE, TensorInfo, header_bytes_of, parse_header, safetensors_files,
};
use sha2::{Digest, Sha256};
use std::os::unix::fs::FileExt;
use std::path::Path;

/// Bytes of each data sample the fingerprint hashes.
const SAMPLE: u64 = 4096;
/// Evenly spaced samples per file.
const FILE_SAMPLES: u64 = 16;

/// Hashes `n` evenly spaced `SAMPLE`-byte blocks of `[start, end)` of `f` (the whole range when
/// it is smaller than `n` blocks).
pub(crate) fn hash_samples(
    h: &mut Sha256,
    f: &std::fs::File,
    path: &Path,
    start: u64,
    end: u64,
    n: u64,
) -> Result<()> {
    let len = end.saturating_sub(start);
    let mut buf = [0u8; SAMPLE as usize];
    // Every read is at most SAMPLE bytes (`len` below is `min(SAMPLE, ..)` or SAMPLE).
    let mut read = |off: u64, len: u64, h: &mut Sha256| -> Result<()> {
        let b = &mut buf[..len as usize];
        f.read_exact_at(b, off).map_err(|e| {
            Error::Format(format!(
                "{}: cannot read data at byte {off} ({e}): truncated file?",
                path.display()
            ))
        })?;
        h.update(off.to_le_bytes());
        h.update(&*b);
        Ok(())
    };
    if len <= n * SAMPLE {
        let mut o = start;
        while o < end {
            let l = SAMPLE.min(end - o);
            read(o, l, h)?;
            o += l;
        }
    } else {
        for k in 0..n {
            read(start + k * (len - SAMPLE) / (n - 1), SAMPLE, h)?;
        }
    }
    Ok(())
}

/// Fingerprint of a checkpoint directory (a GGUF's: `gguf_source.rs`; either: `source.rs`): hex SHA-256 over the index file (if any) and, in name order, each
/// safetensors file's name, size, header and a sparse sample of its data (16 blocks of 4 KiB
/// evenly spaced over the data section, plus the first, middle and last 4 KiB of every PLE shard
/// tensor `*.ngram_embedding.shard_*`). Cheap (headers and a few hundred small reads), and it
/// changes with any tensor's dtype, shape or offsets, the files' sizes, and, with overwhelming
/// likelihood, with different weights of the same shapes (two checkpoints whose headers are
/// byte-identical still fingerprint apart).
pub fn fingerprint(dir: &Path) -> Result<String> {
    non_empty(dir, "checkpoint directory")?;
    let mut h = Sha256::new();
    let index = dir.join(INDEX_FILE);
    if index.exists() {
        let bytes = read_capped(&index, MAX_INDEX)?;
        h.update(b"index\0");
        h.update((bytes.len() as u64).to_le_bytes());
        h.update(&bytes);
    }
    for path in safetensors_files(dir)? {
        let name = path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let (f, size) = open_regular(&path)?;
        let header = header_bytes_of(&f, size, &path)?;
        h.update(b"file\0");
        h.update(name.as_bytes());
        h.update([0]);
        h.update(size.to_le_bytes());
        h.update(&header);
        h.update(b"samples\0");
        hash_samples(&mut h, &f, &path, header.len() as u64, size, FILE_SAMPLES)?;
        let parsed = parse_header(&header, size, &path)?;
        let mut ple: Vec<&TensorInfo> = parsed
            .tensors
            .iter()
            .filter(|t| t.name.contains(".ngram_embedding.shard_"))
            .collect();
        ple.sort_by(|a, b| a.name.cmp(&b.name));
        for t in ple {
            h.update(t.name.as_bytes());
            h.update([0]);
            hash_samples(&mut h, &f, &path, t.offset, t.offset + t.len, 3)?;
        }
    }
    Ok(h.finalize().iter().map(|b| format!("{b:02x}")).collect())
}
