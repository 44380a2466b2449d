//! A bounded reader of GGUF headers (`docs/FORMAT.md#gguf-sources`): the key-value metadata and
//! the tensor directory, never tensor data (the packer reads the one tensor it needs by byte range).
//!
//! Why not a crate: the GGUF readers on crates.io (`gguf`, `gguf-rs`, `ggus`) parse into owned
//! values with counts and lengths taken from the file as they are (a corrupt length allocates or
//! reads past the end), or want the whole file in memory or mapped (a file truncated under a map
//! raises SIGBUS); the subset `ple pack` needs is a few hundred lines. Here every length is
//! checked against the bytes the file has left before anything is allocated, so a truncated or
//! malformed file is an [`Error::Format`] naming the byte where it went wrong.
//!
//! Layout (GGUF v2 and v3, little-endian): magic `GGUF`, u32 version, u64 tensor count, u64 KV
//! count; KVs (string key, u32 value type, value); tensor infos (string name, u32 n_dims, u64
//! dims (ne0 first, the fastest-varying), u32 ggml type, u64 offset into the data section); the
//! data section starts at the next multiple of `general.alignment` (default 32).

use crate::error::{Error, Result};
use crate::format::files::open_regular;
use std::collections::BTreeMap;
use std::io::{BufReader, Read};
use std::path::{Path, PathBuf};

/// The file's first four bytes.
pub const MAGIC: &[u8; 4] = b"GGUF";
/// Largest key or string value accepted (a chat template is a few KiB; a token a few bytes).
const MAX_STRING: u64 = 16 << 20;
/// Integer arrays up to this many values are kept (hash constants: tens of values); longer
/// arrays (a tokenizer's types, merges) are skipped, their length kept.
const MAX_KEPT_ARRAY: u64 = 1 << 16;
/// GGML_MAX_DIMS.
const MAX_DIMS: u32 = 4;
/// Tensors and keys a file may declare (a large model has a few thousand tensors).
const MAX_ENTRIES: u64 = 1 << 20;
const DEFAULT_ALIGNMENT: u64 = 32;

/// A metadata value. Integers of every width are widened to i128 (u64 and i64 both fit).
#[derive(Clone, Debug, PartialEq)]
pub enum Value {
    Int(i128),
    Float(f64),
    Bool(bool),
    Str(String),
    /// An array of integers of at most [`MAX_KEPT_ARRAY`] values.
    Ints(Vec<i128>),
    /// Any other array (strings, floats, long integer arrays): its element type and length.
    Array {
        elem: u32,
        len: u64,
    },
}

/// One entry of the tensor directory.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TensorEntry {
    pub name: String,
    /// ne0 first: a row-major `[rows][cols]` matrix is `[cols, rows]`.
    pub dims: Vec<u64>,
    /// The ggml type id ([`ggml_type_name`] names it).
    pub ggml_type: u32,
    /// Absolute byte offset of the data in the file.
    pub offset: u64,
}

/// A GGUF file's header, checked.
#[derive(Clone, Debug)]
pub struct Gguf {
    pub path: PathBuf,
    pub file_len: u64,
    pub version: u32,
    pub kv: BTreeMap<String, Value>,
    pub tensors: Vec<TensorEntry>,
    /// Bytes of the header (everything before the data section).
    pub data_start: u64,
}

/// The ggml type's name, as gguf-py spells it (`GGMLQuantizationType`).
pub fn ggml_type_name(t: u32) -> String {
    let n = match t {
        0 => "F32",
        1 => "F16",
        2 => "Q4_0",
        3 => "Q4_1",
        6 => "Q5_0",
        7 => "Q5_1",
        8 => "Q8_0",
        9 => "Q8_1",
        10 => "Q2_K",
        11 => "Q3_K",
        12 => "Q4_K",
        13 => "Q5_K",
        14 => "Q6_K",
        15 => "Q8_K",
        16 => "IQ2_XXS",
        17 => "IQ2_XS",
        18 => "IQ3_XXS",
        19 => "IQ1_S",
        20 => "IQ4_NL",
        21 => "IQ3_S",
        22 => "IQ2_S",
        23 => "IQ4_XS",
        24 => "I8",
        25 => "I16",
        26 => "I32",
        27 => "I64",
        28 => "F64",
        29 => "IQ1_M",
        30 => "BF16",
        34 => "TQ1_0",
        35 => "TQ2_0",
        39 => "MXFP4",
        40 => "NVFP4",
        41 => "Q1_0",
        42 => "Q2_0",
        _ => return format!("unknown ggml type {t}"),
    };
    n.to_string()
}

/// Bytes per element of the unquantised types libple packs (F32, F16, BF16); `None` otherwise.
pub fn plain_element_bytes(t: u32) -> Option<u64> {
    match t {
        0 => Some(4),
        1 | 30 => Some(2),
        _ => None,
    }
}

/// True when `path` is a regular file starting with the GGUF magic.
pub fn is_gguf(path: &Path) -> bool {
    let Ok((mut f, len)) = open_regular(path) else {
        return false;
    };
    let mut m = [0u8; 4];
    len >= 4 && f.read_exact(&mut m).is_ok() && &m == MAGIC
}

/// A reader that knows how many bytes the file has left and names positions in errors.
struct Cursor {
    r: BufReader<std::fs::File>,
    pos: u64,
    len: u64,
    path: PathBuf,
}

impl Cursor {
    fn bad(&self, what: &str) -> Error {
        Error::Format(format!(
            "{}: malformed GGUF at byte {}: {what}",
            self.path.display(),
            self.pos
        ))
    }

    /// Refuses to read `n` bytes when the file has fewer left.
    fn need(&self, n: u64, what: &str) -> Result<()> {
        if n > self.len - self.pos {
            return Err(Error::Format(format!(
                "{}: truncated GGUF: {what} needs {n} bytes at byte {}, the file has {} ({} left)",
                self.path.display(),
                self.pos,
                self.len,
                self.len - self.pos
            )));
        }
        Ok(())
    }

    fn bytes<const N: usize>(&mut self, what: &str) -> Result<[u8; N]> {
        self.need(N as u64, what)?;
        let mut b = [0u8; N];
        self.r
            .read_exact(&mut b)
            .map_err(|e| Error::io_path("reading", &self.path, e))?;
        self.pos += N as u64;
        Ok(b)
    }

    fn u32(&mut self, what: &str) -> Result<u32> {
        Ok(u32::from_le_bytes(self.bytes(what)?))
    }

    fn u64(&mut self, what: &str) -> Result<u64> {
        Ok(u64::from_le_bytes(self.bytes(what)?))
    }

    fn skip(&mut self, n: u64, what: &str) -> Result<()> {
        self.need(n, what)?;
        let copied = std::io::copy(&mut (&mut self.r).take(n), &mut std::io::sink())
            .map_err(|e| Error::io_path("reading", &self.path, e))?;
        if copied != n {
            return Err(self.bad(&format!("{what}: the file ended early")));
        }
        self.pos += n;
        Ok(())
    }

    fn string(&mut self, what: &str) -> Result<String> {
        let n = self.u64(what)?;
        if n > MAX_STRING {
            return Err(self.bad(&format!("{what}: length {n} > {MAX_STRING}")));
        }
        self.need(n, what)?;
        let mut b = vec![0u8; n as usize];
        self.r
            .read_exact(&mut b)
            .map_err(|e| Error::io_path("reading", &self.path, e))?;
        self.pos += n;
        String::from_utf8(b).map_err(|_| self.bad(&format!("{what} is not UTF-8")))
    }

    /// A scalar of value type `t` (not STRING or ARRAY).
    fn scalar(&mut self, t: u32, what: &str) -> Result<Value> {
        Ok(match t {
            0 => Value::Int(u8::from_le_bytes(self.bytes(what)?) as i128),
            1 => Value::Int(i8::from_le_bytes(self.bytes(what)?) as i128),
            2 => Value::Int(u16::from_le_bytes(self.bytes(what)?) as i128),
            3 => Value::Int(i16::from_le_bytes(self.bytes(what)?) as i128),
            4 => Value::Int(u32::from_le_bytes(self.bytes(what)?) as i128),
            5 => Value::Int(i32::from_le_bytes(self.bytes(what)?) as i128),
            6 => Value::Float(f32::from_le_bytes(self.bytes(what)?) as f64),
            7 => match self.bytes::<1>(what)?[0] {
                0 => Value::Bool(false),
                1 => Value::Bool(true),
                b => return Err(self.bad(&format!("{what}: bool byte {b}"))),
            },
            10 => Value::Int(u64::from_le_bytes(self.bytes(what)?) as i128),
            11 => Value::Int(i64::from_le_bytes(self.bytes(what)?) as i128),
            12 => Value::Float(f64::from_le_bytes(self.bytes(what)?)),
            _ => return Err(self.bad(&format!("{what}: unknown value type {t}"))),
        })
    }

    fn value(&mut self, t: u32, what: &str) -> Result<Value> {
        match t {
            8 => Ok(Value::Str(self.string(what)?)),
            9 => {
                let elem = self.u32(what)?;
                let len = self.u64(what)?;
                let size = match elem {
                    0 | 1 | 7 => 1,
                    2 | 3 => 2,
                    4..=6 => 4,
                    10..=12 => 8,
                    8 => 8, // at least the length of each string
                    9 => return Err(self.bad(&format!("{what}: nested arrays"))),
                    _ => return Err(self.bad(&format!("{what}: unknown element type {elem}"))),
                };
                // every element takes at least `size` bytes: a larger count is a truncated file
                self.need(len.saturating_mul(size), what)?;
                let int = !matches!(elem, 6..=9 | 12);
                if int && len <= MAX_KEPT_ARRAY {
                    let mut v = Vec::with_capacity(len as usize);
                    for _ in 0..len {
                        match self.scalar(elem, what)? {
                            Value::Int(i) => v.push(i),
                            Value::Bool(b) => v.push(b as i128),
                            _ => unreachable!("integer element types give integers"),
                        }
                    }
                    return Ok(Value::Ints(v));
                }
                if elem == 8 {
                    for _ in 0..len {
                        let n = self.u64(what)?;
                        self.skip(n, what)?;
                    }
                } else {
                    self.skip(len * size, what)?;
                }
                Ok(Value::Array { elem, len })
            }
            _ => self.scalar(t, what),
        }
    }
}

impl Gguf {
    /// Reads and checks the header of the GGUF file at `path`: every tensor's data must lie
    /// inside the file.
    pub fn open(path: &Path) -> Result<Gguf> {
        let (f, len) = open_regular(path)?;
        let mut c = Cursor {
            r: BufReader::with_capacity(1 << 16, f),
            pos: 0,
            len,
            path: path.to_path_buf(),
        };
        if &c.bytes::<4>("the magic")? != MAGIC {
            return Err(c.bad("not a GGUF file (the first 4 bytes are not 'GGUF')"));
        }
        let version = c.u32("the version")?;
        if !(2..=3).contains(&version) {
            return Err(c.bad(&format!(
                "GGUF version {version} (libple reads little-endian versions 2 and 3)"
            )));
        }
        let n_tensors = c.u64("the tensor count")?;
        let n_kv = c.u64("the key count")?;
        if n_tensors > MAX_ENTRIES || n_kv > MAX_ENTRIES {
            return Err(c.bad(&format!(
                "{n_tensors} tensors and {n_kv} keys (at most {MAX_ENTRIES} each)"
            )));
        }
        let mut kv = BTreeMap::new();
        for i in 0..n_kv {
            let key = c.string(&format!("key {i}"))?;
            let t = c.u32(&format!("the type of '{key}'"))?;
            let v = c.value(t, &format!("the value of '{key}'"))?;
            if kv.insert(key.clone(), v).is_some() {
                return Err(c.bad(&format!("key '{key}' appears twice")));
            }
        }
        let mut infos = Vec::new();
        for i in 0..n_tensors {
            let name = c.string(&format!("the name of tensor {i}"))?;
            let nd = c.u32(&format!("the rank of '{name}'"))?;
            if nd == 0 || nd > MAX_DIMS {
                return Err(c.bad(&format!("tensor '{name}' has rank {nd} (1..{MAX_DIMS})")));
            }
            let mut dims = Vec::new();
            for _ in 0..nd {
                dims.push(c.u64(&format!("the shape of '{name}'"))?);
            }
            let ggml_type = c.u32(&format!("the type of '{name}'"))?;
            let offset = c.u64(&format!("the offset of '{name}'"))?;
            infos.push((name, dims, ggml_type, offset));
        }
        let alignment = match kv.get("general.alignment") {
            None => DEFAULT_ALIGNMENT,
            Some(Value::Int(a)) if *a > 0 && *a % 8 == 0 && *a <= 1 << 20 => *a as u64,
            Some(v) => return Err(c.bad(&format!("general.alignment is {v:?}"))),
        };
        let data_start = c.pos.div_ceil(alignment) * alignment;
        let mut tensors: Vec<TensorEntry> = Vec::with_capacity(infos.len());
        let mut names = std::collections::HashSet::new();
        for (name, dims, ggml_type, rel) in infos {
            if !names.insert(name.clone()) {
                return Err(c.bad(&format!("tensor '{name}' appears twice")));
            }
            let offset = data_start.checked_add(rel).filter(|_| rel % alignment == 0);
            let Some(offset) = offset else {
                return Err(c.bad(&format!(
                    "tensor '{name}': offset {rel} is not a multiple of the alignment {alignment}"
                )));
            };
            let t = TensorEntry {
                name,
                dims,
                ggml_type,
                offset,
            };
            // the plain types' byte size is known; a quantised tensor is checked where it is used
            if let Some(bytes) = t.plain_bytes() {
                let end = bytes.and_then(|b| b.checked_add(offset));
                if end.is_none_or(|e| e > len) {
                    return Err(Error::Format(format!(
                        "{}: truncated GGUF: tensor '{}' ({} {:?}) ends past the end of the file ({len} bytes)",
                        path.display(),
                        t.name,
                        ggml_type_name(ggml_type),
                        t.dims
                    )));
                }
            }
            tensors.push(t);
        }
        Ok(Gguf {
            path: path.to_path_buf(),
            file_len: len,
            version,
            kv,
            tensors,
            data_start,
        })
    }

    /// The tensor named `name`.
    pub fn tensor(&self, name: &str) -> Option<&TensorEntry> {
        self.tensors.iter().find(|t| t.name == name)
    }
}

impl TensorEntry {
    /// Elements (product of the dims; `None` on overflow).
    pub fn numel(&self) -> Option<u64> {
        self.dims.iter().try_fold(1u64, |a, &d| a.checked_mul(d))
    }

    /// `Some(bytes)` for F32 / F16 / BF16 (`Some(None)` when the size overflows), `None` for
    /// any other type.
    pub fn plain_bytes(&self) -> Option<Option<u64>> {
        let e = plain_element_bytes(self.ggml_type)?;
        Some(self.numel().and_then(|n| n.checked_mul(e)))
    }
}
