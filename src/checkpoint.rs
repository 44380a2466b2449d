//! Reading safetensors checkpoints (SPEC §4): the index, shard headers, the PLE shards.

use crate::error::{Error, Result};
use sha2::{Digest, Sha256};
use std::io::Read;
use std::path::{Path, PathBuf};

/// Name of the index file of a sharded checkpoint.
pub const INDEX_FILE: &str = "model.safetensors.index.json";
/// Name of a single-file checkpoint.
pub const SINGLE_FILE: &str = "model.safetensors";

/// The safetensors files of a checkpoint, sorted by name: those the index names, or the single file.
pub fn safetensors_files(dir: &Path) -> Result<Vec<PathBuf>> {
    let index = dir.join(INDEX_FILE);
    if index.exists() {
        let text =
            std::fs::read_to_string(&index).map_err(|e| Error::io_path("reading", &index, e))?;
        let v: serde_json::Value = serde_json::from_str(&text)
            .map_err(|e| Error::Format(format!("{}: invalid JSON: {e}", index.display())))?;
        let map = v
            .get("weight_map")
            .and_then(|m| m.as_object())
            .ok_or_else(|| Error::Format(format!("{}: no 'weight_map' object", index.display())))?;
        let mut files: Vec<PathBuf> = Vec::new();
        for (name, f) in map {
            let f = f.as_str().ok_or_else(|| {
                Error::Format(format!(
                    "{}: weight_map['{name}'] is not a file name",
                    index.display()
                ))
            })?;
            if f.contains('/') || f.starts_with('.') {
                return Err(Error::Format(format!(
                    "{}: weight_map['{name}'] = '{f}' is not a plain file name",
                    index.display()
                )));
            }
            files.push(dir.join(f));
        }
        files.sort();
        files.dedup();
        Ok(files)
    } else if dir.join(SINGLE_FILE).exists() {
        Ok(vec![dir.join(SINGLE_FILE)])
    } else if !dir.is_dir() {
        Err(Error::io_path(
            "opening checkpoint",
            dir,
            std::io::Error::new(std::io::ErrorKind::NotFound, "no such directory"),
        ))
    } else {
        Err(Error::Format(format!(
            "{}: neither {INDEX_FILE} nor {SINGLE_FILE} found",
            dir.display()
        )))
    }
}

/// Reads the 8-byte length and the JSON header of a safetensors file (bounded: never the data).
pub fn read_header_bytes(path: &Path) -> Result<Vec<u8>> {
    let mut f = std::fs::File::open(path).map_err(|e| Error::io_path("opening", path, e))?;
    let size = f
        .metadata()
        .map_err(|e| Error::io_path("stat", path, e))?
        .len();
    let mut len = [0u8; 8];
    f.read_exact(&mut len).map_err(|_| {
        Error::Format(format!(
            "{}: shorter than the 8-byte safetensors header length",
            path.display()
        ))
    })?;
    let n = u64::from_le_bytes(len);
    if n > 100 << 20 || 8 + n > size {
        return Err(Error::Format(format!(
            "{}: header length {n} runs past the end of the {size}-byte file (truncated or not safetensors)",
            path.display()
        )));
    }
    let mut buf = vec![0u8; 8 + n as usize];
    buf[..8].copy_from_slice(&len);
    f.read_exact(&mut buf[8..])
        .map_err(|e| Error::io_path("reading header of", path, e))?;
    Ok(buf)
}

/// Fingerprint of a checkpoint: hex SHA-256 over the index file (if any) and, in name order, each
/// safetensors file's name, size and header. Cheap (headers only) and changes with any tensor's
/// dtype, shape or offsets, or with the files' sizes.
pub fn fingerprint(dir: &Path) -> Result<String> {
    let mut h = Sha256::new();
    let index = dir.join(INDEX_FILE);
    if index.exists() {
        let bytes = std::fs::read(&index).map_err(|e| Error::io_path("reading", &index, e))?;
        h.update(b"index\0");
        h.update((bytes.len() as u64).to_le_bytes());
        h.update(&bytes);
    }
    for f in safetensors_files(dir)? {
        let name = f
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let size = std::fs::metadata(&f)
            .map_err(|e| Error::io_path("stat", &f, e))?
            .len();
        let header = read_header_bytes(&f)?;
        h.update(b"file\0");
        h.update(name.as_bytes());
        h.update([0]);
        h.update(size.to_le_bytes());
        h.update(&header);
    }
    Ok(h.finalize().iter().map(|b| format!("{b:02x}")).collect())
}
