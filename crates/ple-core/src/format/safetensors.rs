//! The safetensors reader: the index file, the 8-byte length + JSON header of each file, and the
//! small tensors (scales, hash tensors) read whole. Layout: `docs/FORMAT.md#safetensors-checkpoints`.
//!
//! Headers are parsed by hand (not into a map) so a tensor named twice is an error, not silently
//! one of the two. Every tensor's `data_offsets` are checked against the file size and against
//! each other (no two tensors share a byte), so a truncated or crafted file is an
//! [`Error::Format`] here, not a short read or duplicated data later.

use crate::error::{Error, Result};
use crate::format::files::{MAX_INDEX, open_regular, read_text_capped};
use serde::Deserialize;
use std::collections::BTreeMap;
use std::io::Read;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

/// Name of the index file of a sharded checkpoint.
pub const INDEX_FILE: &str = "model.safetensors.index.json";
/// Name of a single-file checkpoint.
pub const SINGLE_FILE: &str = "model.safetensors";
/// Largest safetensors JSON header accepted (the format's own limit).
const MAX_HEADER: u64 = 100 << 20;
/// Largest tensor read whole into memory (scales, hash tensors).
const MAX_SMALL_TENSOR: u64 = 1 << 20;

/// Parses the index file and returns its `weight_map` (tensor name → file name).
pub fn read_index(dir: &Path) -> Result<BTreeMap<String, String>> {
    let index = dir.join(INDEX_FILE);
    let text = read_text_capped(&index, MAX_INDEX)?;
    parse_index(&text, &index)
}

/// Parses the text of an index file (`what` names it in errors).
pub fn parse_index(text: &str, what: &Path) -> Result<BTreeMap<String, String>> {
    let index = what;
    let v: serde_json::Value = serde_json::from_str(text)
        .map_err(|e| Error::Format(format!("{}: invalid JSON: {e}", index.display())))?;
    let map = v
        .get("weight_map")
        .and_then(|m| m.as_object())
        .ok_or_else(|| Error::Format(format!("{}: no 'weight_map' object", index.display())))?;
    let mut out = BTreeMap::new();
    for (name, f) in map {
        let f = f.as_str().ok_or_else(|| {
            Error::Format(format!(
                "{}: weight_map['{name}'] is not a file name",
                index.display()
            ))
        })?;
        if f.is_empty() || f.contains('/') || f.starts_with('.') {
            return Err(Error::Format(format!(
                "{}: weight_map['{name}'] = '{f}' is not a plain file name",
                index.display()
            )));
        }
        out.insert(name.clone(), f.to_string());
    }
    Ok(out)
}

/// The safetensors files of a checkpoint, sorted by name: those the index names, or the single file.
pub fn safetensors_files(dir: &Path) -> Result<Vec<PathBuf>> {
    let index = dir.join(INDEX_FILE);
    if index.exists() {
        let mut files: Vec<PathBuf> = read_index(dir)?.values().map(|f| dir.join(f)).collect();
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
    let (f, size) = open_regular(path)?;
    header_bytes_of(&f, size, path)
}

/// Reads the length and header from the open file `f` of `size` bytes.
pub(crate) fn header_bytes_of(mut f: &std::fs::File, size: u64, path: &Path) -> Result<Vec<u8>> {
    let mut len = [0u8; 8];
    f.read_exact(&mut len).map_err(|_| {
        Error::Format(format!(
            "{}: shorter than the 8-byte safetensors header length",
            path.display()
        ))
    })?;
    let n = u64::from_le_bytes(len);
    if n > MAX_HEADER || n > size.saturating_sub(8) {
        return Err(Error::Format(format!(
            "{}: header length {n} runs past the end of the {size}-byte file (truncated or not safetensors)",
            path.display()
        )));
    }
    // n ≤ MAX_HEADER (100 MiB), so it fits a usize.
    let mut buf = vec![0u8; 8 + n as usize];
    buf[..8].copy_from_slice(&len);
    f.read_exact(&mut buf[8..])
        .map_err(|e| Error::io_path("reading header of", path, e))?;
    Ok(buf)
}

/// Bytes per element of a safetensors dtype (None for sub-byte or unknown dtypes).
pub fn dtype_size(dtype: &str) -> Option<u64> {
    Some(match dtype {
        "BOOL" | "U8" | "I8" | "F8_E4M3" | "F8_E5M2" | "F8_E8M0" => 1,
        "U16" | "I16" | "F16" | "BF16" => 2,
        "U32" | "I32" | "F32" => 4,
        "U64" | "I64" | "F64" | "C64" => 8,
        _ => return None,
    })
}

/// One tensor of a safetensors file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TensorInfo {
    pub name: String,
    pub dtype: String,
    pub shape: Vec<u64>,
    /// Absolute byte offset of the tensor's data in its file.
    pub offset: u64,
    /// Bytes of data.
    pub len: u64,
}

impl TensorInfo {
    /// Number of elements (product of the shape; 1 for a scalar).
    pub fn numel(&self) -> Option<u64> {
        self.shape.iter().try_fold(1u64, |a, &d| a.checked_mul(d))
    }
}

/// The parsed header of one safetensors file; tensors in header order.
#[derive(Clone, Debug)]
pub struct SafetensorsHeader {
    pub path: PathBuf,
    pub file_size: u64,
    /// Offset of the data section (8 + header length).
    pub data_start: u64,
    pub tensors: Vec<TensorInfo>,
}

impl SafetensorsHeader {
    /// The tensor called `name`, if the file has it.
    pub fn get(&self, name: &str) -> Option<&TensorInfo> {
        self.tensors.iter().find(|t| t.name == name)
    }
}

/// Header entries in file order, keeping duplicates (serde_json's maps would silently keep one).
struct Entries(Vec<(String, serde_json::Value)>);

impl<'de> Deserialize<'de> for Entries {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        struct V;
        impl<'de> serde::de::Visitor<'de> for V {
            type Value = Entries;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a JSON object of tensors")
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                mut m: A,
            ) -> std::result::Result<Entries, A::Error> {
                let mut v = Vec::new();
                while let Some((k, val)) = m.next_entry::<String, serde_json::Value>()? {
                    v.push((k, val));
                }
                Ok(Entries(v))
            }
        }
        d.deserialize_map(V)
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawTensor {
    dtype: String,
    shape: Vec<u64>,
    data_offsets: [u64; 2],
}

/// Reads and validates the header of a safetensors file: JSON well-formed, no duplicate names,
/// every tensor's `data_offsets` ordered, inside the file, not overlapping another tensor's, and
/// (for known dtypes) matching its shape.
pub fn read_header(path: &Path) -> Result<SafetensorsHeader> {
    let (f, file_size) = open_regular(path)?;
    let bytes = header_bytes_of(&f, file_size, path)?;
    parse_header(&bytes, file_size, path)
}

/// Validates `bytes` (the 8-byte length and the JSON header, as [`read_header_bytes`] returns
/// them) of a safetensors file of `file_size` bytes; `path` names the file in errors.
pub fn parse_header(bytes: &[u8], file_size: u64, path: &Path) -> Result<SafetensorsHeader> {
    let bad = |m: String| Error::Format(format!("{}: {m}", path.display()));
    let Some(json) = bytes.get(8..) else {
        return Err(bad(
            "shorter than the 8-byte safetensors header length".into()
        ));
    };
    let data_start = bytes.len() as u64;
    let data_len = file_size.checked_sub(data_start).ok_or_else(|| {
        bad(format!(
            "the {data_start}-byte header runs past the end of the {file_size}-byte file"
        ))
    })?;
    let entries: Entries = serde_json::from_slice(json)
        .map_err(|e| bad(format!("safetensors header is not valid JSON: {e}")))?;
    let mut seen = std::collections::HashSet::new();
    let mut tensors = Vec::with_capacity(entries.0.len());
    for (name, v) in entries.0 {
        if name == "__metadata__" {
            continue;
        }
        if !seen.insert(name.clone()) {
            return Err(bad(format!(
                "tensor '{name}' appears twice in the header (duplicate)"
            )));
        }
        let raw: RawTensor = serde_json::from_value(v)
            .map_err(|e| bad(format!("header entry of tensor '{name}' is malformed: {e}")))?;
        tensors.push(check_tensor_entry(name, raw, data_start, data_len).map_err(bad)?);
    }
    check_no_overlap(&tensors, data_start).map_err(bad)?;
    Ok(SafetensorsHeader {
        path: path.to_path_buf(),
        file_size,
        data_start,
        tensors,
    })
}

/// Checks one header entry's offsets against the data section and its shape; returns the tensor
/// with its absolute offset.
fn check_tensor_entry(
    name: String,
    raw: RawTensor,
    data_start: u64,
    data_len: u64,
) -> std::result::Result<TensorInfo, String> {
    let [b, e] = raw.data_offsets;
    if b > e {
        return Err(format!(
            "tensor '{name}' has data_offsets [{b}, {e}] (begin after end)"
        ));
    }
    if e > data_len {
        return Err(format!(
            "tensor '{name}' ends at data byte {e} but the file holds only {data_len} data bytes (truncated file)"
        ));
    }
    let t = TensorInfo {
        name,
        dtype: raw.dtype,
        shape: raw.shape,
        // b ≤ e ≤ data_len = file_size - data_start, so the sum cannot overflow.
        offset: data_start + b,
        len: e - b,
    };
    if let Some(sz) = dtype_size(&t.dtype) {
        let want = t.numel().and_then(|n| n.checked_mul(sz));
        if want != Some(t.len) {
            let want = want.map_or("more than 2^64 - 1".into(), |n| n.to_string());
            return Err(format!(
                "tensor '{}' ({} {:?}) needs {want} bytes but its data_offsets span {}",
                t.name, t.dtype, t.shape, t.len
            ));
        }
    }
    Ok(t)
}

/// Refuses two tensors whose data ranges share a byte (the packer would copy the same bytes
/// twice, as two different tensors).
fn check_no_overlap(tensors: &[TensorInfo], data_start: u64) -> std::result::Result<(), String> {
    let mut spans: Vec<&TensorInfo> = tensors.iter().filter(|t| t.len > 0).collect();
    spans.sort_by_key(|t| (t.offset, t.len));
    for w in spans.windows(2) {
        let (a, b) = (w[0], w[1]);
        // offset + len ≤ file_size for every tensor (checked above), so no sum overflows.
        if b.offset < a.offset + a.len {
            let rel = |t: &TensorInfo| (t.offset - data_start, t.offset - data_start + t.len);
            let ((a0, a1), (b0, b1)) = (rel(a), rel(b));
            return Err(format!(
                "tensors '{}' (data bytes {a0}..{a1}) and '{}' (data bytes {b0}..{b1}) overlap",
                a.name, b.name
            ));
        }
    }
    Ok(())
}

/// A tensor and the file that holds it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TensorRef {
    pub path: PathBuf,
    pub info: TensorInfo,
}

impl TensorRef {
    /// Reads a small tensor's bytes (scales, hash tensors; at most 1 MiB).
    pub fn read_small(&self) -> Result<Vec<u8>> {
        if self.info.len > MAX_SMALL_TENSOR {
            return Err(Error::Format(format!(
                "tensor '{}' in {} has {} bytes, too large for a scale or hash tensor",
                self.info.name,
                self.path.display(),
                self.info.len
            )));
        }
        let (f, _) = open_regular(&self.path)?;
        // len ≤ MAX_SMALL_TENSOR (1 MiB), so it fits a usize.
        let mut buf = vec![0u8; self.info.len as usize];
        f.read_exact_at(&mut buf, self.info.offset)
            .map_err(|e| Error::io_path("reading tensor data of", &self.path, e))?;
        Ok(buf)
    }

    /// The tensor's name, dtype, shape and file, for messages.
    pub fn describe(&self) -> String {
        format!(
            "tensor '{}' ({} {:?}) in {}",
            self.info.name,
            self.info.dtype,
            self.info.shape,
            self.path
                .file_name()
                .map(|n| n.to_string_lossy())
                .unwrap_or_default()
        )
    }

    /// Reads a scalar scale (F32, BF16 or F16 of shape `[]` or `[1]`), which must be positive
    /// and finite.
    pub fn scalar_f32(&self) -> Result<f32> {
        as_scalar_f32(self)
    }

    /// Reads a 1-D tensor of any integer dtype as non-negative `u64`s; with `want_len`, its
    /// shape must be `[want_len]`.
    pub fn ints(&self, want_len: Option<usize>) -> Result<Vec<u64>> {
        as_ints(self, want_len)
    }
}

fn as_scalar_f32(t: &TensorRef) -> Result<f32> {
    let ok_shape = t.info.shape.is_empty() || t.info.shape == [1];
    if !ok_shape || !matches!(t.info.dtype.as_str(), "F32" | "BF16" | "F16") {
        return Err(Error::Format(format!(
            "{}: expected a scalar global scale, F32 (or BF16/F16) of shape [] or [1]",
            t.describe()
        )));
    }
    let b = t.read_small()?;
    let short = || {
        Error::Format(format!(
            "{}: {} bytes of data for a scalar",
            t.describe(),
            b.len()
        ))
    };
    let v = match t.info.dtype.as_str() {
        "F32" => f32::from_le_bytes(b.get(..4).ok_or_else(short)?.try_into().expect("4 bytes")),
        "BF16" => {
            half::bf16::from_le_bytes(b.get(..2).ok_or_else(short)?.try_into().expect("2 bytes"))
                .to_f32()
        }
        _ => half::f16::from_le_bytes(b.get(..2).ok_or_else(short)?.try_into().expect("2 bytes"))
            .to_f32(),
    };
    if !(v.is_finite() && v > 0.0) {
        return Err(Error::Format(format!(
            "{}: global scale {v} is not a positive finite number",
            t.describe()
        )));
    }
    Ok(v)
}

fn as_ints(t: &TensorRef, want_len: Option<usize>) -> Result<Vec<u64>> {
    let sz = match t.info.dtype.as_str() {
        "I64" | "U64" => 8,
        "I32" | "U32" => 4,
        "I16" | "U16" => 2,
        "I8" | "U8" => 1,
        _ => {
            return Err(Error::Format(format!(
                "{}: expected an integer dtype (I64, I32, U64, …)",
                t.describe()
            )));
        }
    };
    if t.info.shape.len() != 1 || want_len.is_some_and(|n| t.info.shape[0] != n as u64) {
        return Err(Error::Format(format!(
            "{}: expected shape [{}]",
            t.describe(),
            want_len.map(|n| n.to_string()).unwrap_or("n".into())
        )));
    }
    let b = t.read_small()?;
    let signed = t.info.dtype.starts_with('I');
    let mut out = Vec::with_capacity(b.len() / sz);
    for c in b.chunks_exact(sz) {
        let mut w = [0u8; 8];
        w[..sz].copy_from_slice(c);
        let mut v = u64::from_le_bytes(w);
        if signed && sz < 8 && c[sz - 1] & 0x80 != 0 {
            v |= !0u64 << (sz * 8);
        }
        if signed && (v as i64) < 0 {
            return Err(Error::Format(format!(
                "{}: negative value {}",
                t.describe(),
                v as i64
            )));
        }
        out.push(v);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tensor_file(dtype: &str, shape: Vec<u64>, data: &[u8]) -> (tempfile::TempDir, TensorRef) {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("x.safetensors");
        std::fs::write(&p, [&[0u8; 16][..], data].concat()).unwrap();
        let r = TensorRef {
            path: p,
            info: TensorInfo {
                name: "m.ple_embedding.ngram_heads_offsets".into(),
                dtype: dtype.into(),
                shape,
                offset: 16,
                len: data.len() as u64,
            },
        };
        (d, r)
    }

    #[test]
    fn hash_tensors_of_any_integer_dtype() {
        let vals = [0u64, 7, 1 << 20];
        let le = |w: usize| -> Vec<u8> {
            vals.iter()
                .flat_map(|v| v.to_le_bytes()[..w].to_vec())
                .collect()
        };
        for (dt, w) in [("I64", 8), ("U64", 8), ("I32", 4), ("U32", 4)] {
            let (_d, t) = tensor_file(dt, vec![3], &le(w));
            assert_eq!(as_ints(&t, Some(3)).unwrap(), vals, "{dt}");
        }
        let (_d, t) = tensor_file("I16", vec![2], &[5, 0, 0xFF, 0x7F]);
        assert_eq!(as_ints(&t, Some(2)).unwrap(), vec![5, 0x7FFF]);
        // negative values, float dtypes and wrong lengths are errors naming the tensor
        let (_d, t) = tensor_file("I32", vec![1], &(-3i32).to_le_bytes());
        let e = as_ints(&t, Some(1)).unwrap_err().to_string();
        assert!(
            e.contains("negative value -3") && e.contains("ngram_heads_offsets"),
            "{e}"
        );
        let (_d, t) = tensor_file("F32", vec![1], &1f32.to_le_bytes());
        assert!(
            as_ints(&t, Some(1))
                .unwrap_err()
                .to_string()
                .contains("integer dtype")
        );
        let (_d, t) = tensor_file("I64", vec![3], &le(8));
        assert!(
            as_ints(&t, Some(16))
                .unwrap_err()
                .to_string()
                .contains("expected shape [16]")
        );
    }

    #[test]
    fn scalar_scales_in_f32_bf16_f16() {
        let (_d, t) = tensor_file("F32", vec![], &0.375f32.to_le_bytes());
        assert_eq!(as_scalar_f32(&t).unwrap(), 0.375);
        let (_d, t) = tensor_file("BF16", vec![1], &half::bf16::from_f32(0.5).to_le_bytes());
        assert_eq!(as_scalar_f32(&t).unwrap(), 0.5);
        let (_d, t) = tensor_file("F16", vec![], &half::f16::from_f32(2.0).to_le_bytes());
        assert_eq!(as_scalar_f32(&t).unwrap(), 2.0);
        let (_d, t) = tensor_file("F32", vec![2], &[0u8; 8]);
        assert!(
            as_scalar_f32(&t)
                .unwrap_err()
                .to_string()
                .contains("scalar")
        );
        let (_d, t) = tensor_file("F32", vec![], &f32::NAN.to_le_bytes());
        assert!(
            as_scalar_f32(&t)
                .unwrap_err()
                .to_string()
                .contains("positive finite")
        );
    }

    #[test]
    fn header_offsets_are_checked() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("h.safetensors");
        let write = |h: &str, data: usize| {
            let mut b = (h.len() as u64).to_le_bytes().to_vec();
            b.extend_from_slice(h.as_bytes());
            b.extend(std::iter::repeat_n(0u8, data));
            std::fs::write(&p, b).unwrap();
        };
        write(
            r#"{"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]},"__metadata__":{"k":"v"}}"#,
            4,
        );
        let h = read_header(&p).unwrap();
        assert_eq!(h.tensors.len(), 1);
        assert_eq!(h.get("a").unwrap().offset, h.data_start);
        write(
            r#"{"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]}}"#,
            3,
        );
        assert!(
            read_header(&p)
                .unwrap_err()
                .to_string()
                .contains("truncated")
        );
        write(
            r#"{"a":{"dtype":"U8","shape":[4],"data_offsets":[4,0]}}"#,
            4,
        );
        assert!(
            read_header(&p)
                .unwrap_err()
                .to_string()
                .contains("begin after end")
        );
        write(
            r#"{"a":{"dtype":"U8","shape":[2,3],"data_offsets":[0,4]}}"#,
            4,
        );
        let e = read_header(&p).unwrap_err().to_string();
        assert!(
            e.contains("tensor 'a' (U8 [2, 3]) needs 6 bytes but its data_offsets span 4"),
            "{e}"
        );
        write(r#"{"a":{"dtype":"U8","shape":[4]}}"#, 4);
        assert!(
            read_header(&p)
                .unwrap_err()
                .to_string()
                .contains("malformed")
        );
        write(
            r#"{"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},"a":{"dtype":"U8","shape":[1],"data_offsets":[1,2]}}"#,
            2,
        );
        assert!(
            read_header(&p)
                .unwrap_err()
                .to_string()
                .contains("appears twice")
        );
        // two tensors sharing data bytes (the packer would copy them twice)
        write(
            r#"{"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]},"b":{"dtype":"U8","shape":[2],"data_offsets":[2,4]}}"#,
            4,
        );
        let e = read_header(&p).unwrap_err().to_string();
        assert!(
            e.contains("'a' (data bytes 0..4) and 'b' (data bytes 2..4) overlap"),
            "{e}"
        );
        // adjacent and empty tensors do not overlap
        write(
            r#"{"a":{"dtype":"U8","shape":[2],"data_offsets":[0,2]},"b":{"dtype":"U8","shape":[2],"data_offsets":[2,4]},"c":{"dtype":"U8","shape":[0],"data_offsets":[1,1]}}"#,
            4,
        );
        assert_eq!(read_header(&p).unwrap().tensors.len(), 3);
        // unknown (sub-byte) dtypes pass the size check; they are refused only where used
        write(
            r#"{"a":{"dtype":"F4","shape":[8],"data_offsets":[0,4]}}"#,
            4,
        );
        assert_eq!(read_header(&p).unwrap().tensors[0].dtype, "F4");
    }
}
