//! A llama.cpp Qwen4Exp GGUF as the source of a table (`docs/FORMAT.md#gguf-sources`): the PLE
//! tensor `per_layer_token_embd.weight` and the hash keys `{arch}.ple.*` the converter
//! (`convert_hf_to_gguf.py`, `conversion/qwen4exp.py`) writes, presented as a [`Checkpoint`] of
//! one shard, so the packer streams it like any checkpoint.
//!
//! Row formats: F32 → F32 rows and BF16 → BF16 rows (bytes copied), F16 → F32 rows (every f16 is
//! an f32 exactly). Quantised ggml types are refused, naming the type.

use crate::error::{Error, Result};
use crate::format::checkpoint::{Checkpoint, HashSource, ShardSource, dir_name};
use crate::format::files::open_regular;
use crate::format::fingerprint::hash_samples;
use crate::format::gguf::{Gguf, Value, ggml_type_name};
use crate::format::safetensors::{TensorInfo, TensorRef};
use crate::model::{HashParams, RowFormat};
use sha2::{Digest, Sha256};
use std::os::unix::fs::FileExt;
use std::path::Path;

/// The PLE table's tensor (gguf-py's `MODEL_TENSOR.PER_LAYER_TOKEN_EMBD`).
pub const PLE_TENSOR: &str = "per_layer_token_embd.weight";

/// A value of the GGUF's metadata, by full key.
struct Keys<'a> {
    g: &'a Gguf,
    arch: String,
}

impl Keys<'_> {
    fn bad(&self, m: String) -> Error {
        Error::Format(format!("{}: {m}", self.g.path.display()))
    }

    fn full(&self, k: &str) -> String {
        format!("{}.{k}", self.arch)
    }

    fn get(&self, k: &str) -> Result<&Value> {
        let key = self.full(k);
        self.g.kv.get(&key).ok_or_else(|| {
            self.bad(format!(
                "key '{key}' missing (the PLE hash keys of a Qwen4Exp GGUF, written by llama.cpp's convert_hf_to_gguf.py)"
            ))
        })
    }

    fn int<T: TryFrom<i128>>(&self, k: &str) -> Result<T> {
        match self.get(k)? {
            Value::Int(v) => T::try_from(*v)
                .map_err(|_| self.bad(format!("key '{}' = {v} is out of range", self.full(k)))),
            v => Err(self.bad(format!(
                "key '{}' is {v:?}, expected an integer",
                self.full(k)
            ))),
        }
    }

    fn u64s(&self, k: &str) -> Result<Vec<u64>> {
        match self.get(k)? {
            Value::Ints(v) => v
                .iter()
                .map(|&x| u64::try_from(x))
                .collect::<std::result::Result<_, _>>()
                .map_err(|_| self.bad(format!("key '{}' holds a negative value", self.full(k)))),
            v => Err(self.bad(format!(
                "key '{}' is {v:?}, expected an integer array",
                self.full(k)
            ))),
        }
    }

    /// The tokenizer's size: `{arch}.vocab_size`, else the length of `tokenizer.ggml.tokens`.
    fn vocab_size(&self) -> Result<u32> {
        if self.g.kv.contains_key(&self.full("vocab_size")) {
            return self.int("vocab_size");
        }
        match self.g.kv.get("tokenizer.ggml.tokens") {
            Some(Value::Array { len, .. }) => u32::try_from(*len)
                .map_err(|_| self.bad(format!("{len} tokens do not fit 32 bits"))),
            Some(Value::Ints(v)) => Ok(v.len() as u32),
            _ => Err(self.bad(format!(
                "no vocabulary size: neither '{}' nor 'tokenizer.ggml.tokens' (the hash needs it)",
                self.full("vocab_size")
            ))),
        }
    }
}

/// The hash parameters from the GGUF's `{arch}.ple.*` keys.
fn hash_params(k: &Keys) -> Result<HashParams> {
    let layers = match k.get("ple.layers")? {
        Value::Ints(v) => v.len(),
        v => return Err(k.bad(format!("key '{}' is {v:?}", k.full("ple.layers")))),
    };
    if layers != 1 {
        return Err(k.bad(format!(
            "key '{}' lists {layers} PLE layers; a GGUF carries one PLE table ({PLE_TENSOR}) and one set of hash keys",
            k.full("ple.layers")
        )));
    }
    let p = HashParams {
        multipliers: k.u64s("ple.layer_multipliers")?,
        head_sizes: k.u64s("ple.head_vocab_sizes")?,
        offsets: k.u64s("ple.head_offsets")?,
        eos_token_id: k.int("ple.eos_token_id")?,
        vocab_size: k.vocab_size()?,
        ngram_size: k.int("ple.ngram_size")?,
        heads_per_ngram: k.int("ple.heads_per_ngram")?,
    };
    p.validate()
        .map_err(|e| k.bad(format!("the {}.ple.* keys: {e}", k.arch)))?;
    Ok(p)
}

/// Fingerprint of a GGUF: SHA-256 over its size, its header, and samples of its data section
/// and of the PLE tensor (first, middle and last 4 KiB), as for a checkpoint
/// (`docs/FORMAT.md#the-source-fingerprint`).
fn fingerprint(g: &Gguf, ple: &TensorInfo) -> Result<String> {
    let (f, size) = open_regular(&g.path)?;
    if size != g.file_len {
        return Err(Error::Format(format!(
            "{}: the file changed size while it was read ({} then {size} bytes)",
            g.path.display(),
            g.file_len
        )));
    }
    let mut header = vec![0u8; g.data_start.min(size) as usize];
    f.read_exact_at(&mut header, 0)
        .map_err(|e| Error::io_path("reading", &g.path, e))?;
    let mut h = Sha256::new();
    h.update(b"gguf\0");
    h.update(size.to_le_bytes());
    h.update(&header);
    h.update(b"samples\0");
    hash_samples(&mut h, &f, &g.path, g.data_start.min(size), size, 16)?;
    h.update(PLE_TENSOR.as_bytes());
    hash_samples(&mut h, &f, &g.path, ple.offset, ple.offset + ple.len, 3)?;
    Ok(h.finalize().iter().map(|b| format!("{b:02x}")).collect())
}

/// The PLE table of the GGUF at `path`, as a one-shard [`Checkpoint`].
pub fn open(path: &Path) -> Result<Checkpoint> {
    let g = Gguf::open(path)?;
    let d = path.display();
    let arch = match g.kv.get("general.architecture") {
        Some(Value::Str(a)) => a.clone(),
        _ => {
            return Err(Error::Format(format!(
                "{d}: no string key 'general.architecture'"
            )));
        }
    };
    let k = Keys { g: &g, arch };
    let Some(t) = g.tensor(PLE_TENSOR) else {
        return Err(Error::Format(format!(
            "{d}: no PLE table: the GGUF ({} architecture, {} tensors) has no tensor '{PLE_TENSOR}'",
            k.arch,
            g.tensors.len()
        )));
    };
    let (format, dtype) = match t.ggml_type {
        0 => (RowFormat::F32, "F32"),
        1 => (RowFormat::F32, "F16"),
        30 => (RowFormat::Bf16, "BF16"),
        other => {
            return Err(Error::Format(format!(
                "{d}: tensor '{PLE_TENSOR}' is {}: libple packs F32, F16 and BF16 GGUF tables exactly and no quantised ggml type (convert with --outtype f32, f16 or bf16, or pack the safetensors checkpoint)",
                ggml_type_name(other)
            )));
        }
    };
    let [head_dim, rows] = t.dims[..] else {
        return Err(Error::Format(format!(
            "{d}: tensor '{PLE_TENSOR}' has shape {:?}, expected [head_dim, rows]",
            t.dims
        )));
    };
    if head_dim == 0 || rows == 0 {
        return Err(Error::Format(format!(
            "{d}: tensor '{PLE_TENSOR}' is empty: shape {:?}",
            t.dims
        )));
    }
    let per_layer = k.full("embedding_length_per_layer_input");
    if let Some(v) = g.kv.get(&per_layer)
        && *v != Value::Int(head_dim as i128)
    {
        return Err(Error::Format(format!(
            "{d}: '{per_layer}' is {v:?} but tensor '{PLE_TENSOR}' has rows of {head_dim} values"
        )));
    }
    let hash = hash_params(&k)?;
    let head_dim = usize::try_from(head_dim)
        .map_err(|_| Error::Format(format!("{d}: head dim {head_dim} too large")))?;
    let info = TensorInfo {
        name: PLE_TENSOR.to_string(),
        dtype: dtype.to_string(),
        shape: vec![rows, head_dim as u64],
        offset: t.offset,
        // Gguf::open checked the plain types' size against the file
        len: t.plain_bytes().flatten().expect("a plain type's size"),
    };
    let fingerprint = fingerprint(&g, &info)?;
    Ok(Checkpoint {
        dir: path.to_path_buf(),
        name: dir_name(path),
        fingerprint,
        format,
        prefix: PLE_TENSOR.to_string(),
        num_shards: 1,
        rows_per_shard: rows,
        head_dim,
        global_scale: 1.0,
        hash,
        hash_source: HashSource::Gguf,
        ple_layer_index: 0, // a GGUF with several PLE layers is refused above
        config: None,
        shards: vec![ShardSource {
            weight: TensorRef {
                path: path.to_path_buf(),
                info,
            },
            scales: None,
        }],
    })
}
