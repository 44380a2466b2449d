//! Where a checkpoint's hash parameters come from: its hash tensors, its config.json, or both
//! (which must then agree) (`docs/FORMAT.md#the-n-gram-hash`).

use super::{CONFIG_FILE, Tensors, strip_format};
use crate::error::{Error, Result};
use crate::format::safetensors::TensorRef;
use crate::model::{HashParams, ModelConfig};

/// Names (last component) of the three hash tensors a checkpoint may ship.
pub const HASH_TENSOR_KEYS: [&str; 3] = [
    "layer_multipliers",
    "ngram_heads_vocab_sizes",
    "ngram_heads_offsets",
];

/// Where the hash parameters came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HashSource {
    /// The checkpoint's hash tensors (no config.json).
    Tensors,
    /// Derived from config.json (no hash tensors).
    Config,
    /// Both present and equal.
    Both,
    /// A GGUF's `{arch}.ple.*` keys (`docs/FORMAT.md#gguf-sources`).
    Gguf,
}

/// Finds one hash tensor: under the PLE module first, else anywhere by its last component.
fn find_hash_tensor<'a>(
    tensors: &'a Tensors,
    module: &str,
    key: &str,
) -> Result<Option<&'a TensorRef>> {
    let exact = format!("{module}.{key}");
    if let Some(t) = tensors.get(&exact) {
        return Ok(Some(t));
    }
    let suffix = format!(".{key}");
    let mut found: Vec<&TensorRef> = tensors
        .by_name
        .values()
        .filter(|t| t.info.name.ends_with(&suffix) || t.info.name == key)
        .collect();
    found.sort_by(|a, b| a.info.name.cmp(&b.info.name));
    let under: Vec<&TensorRef> = found
        .iter()
        .copied()
        .filter(|t| t.info.name.starts_with(&format!("{module}.")))
        .collect();
    let pick = if !under.is_empty() { under } else { found };
    match pick.len() {
        0 => Ok(None),
        1 => Ok(Some(pick[0])),
        _ => Err(Error::Format(format!(
            "several hash tensors named *.{key}: {}",
            pick.iter()
                .map(|t| t.info.name.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        ))),
    }
}

fn first_diff(a: &[u64], b: &[u64]) -> String {
    if a.len() != b.len() {
        return format!("{} values vs {}", a.len(), b.len());
    }
    let i = a.iter().zip(b).position(|(x, y)| x != y).unwrap_or(0);
    format!("[{i}] = {} vs {}", a[i], b[i])
}

/// The hash parameters from the three hash tensors, if the checkpoint ships them (all three or
/// none), checked against the constants of `config` (or the model's defaults).
fn hash_from_tensors(
    tensors: &Tensors,
    module: &str,
    config: Option<&ModelConfig>,
    d: &str,
) -> Result<Option<HashParams>> {
    let mut found = Vec::new();
    for k in HASH_TENSOR_KEYS {
        found.push(find_hash_tensor(tensors, module, k)?);
    }
    if found.iter().all(|f| f.is_none()) {
        return Ok(None);
    }
    let [Some(mults), Some(sizes), Some(offsets)] = found[..] else {
        let have: Vec<&str> = found
            .iter()
            .flatten()
            .map(|t| t.info.name.as_str())
            .collect();
        let missing: Vec<&str> = HASH_TENSOR_KEYS
            .iter()
            .zip(&found)
            .filter(|(_, f)| f.is_none())
            .map(|(k, _)| *k)
            .collect();
        return Err(Error::Format(format!(
            "{d}: incomplete hash tensors: found {}, missing *.{}",
            have.join(", "),
            missing.join(", *.")
        )));
    };
    let base = config.cloned().unwrap_or_default();
    let p = HashParams {
        multipliers: mults.ints(Some(base.ngram_size as usize))?,
        head_sizes: sizes.ints(Some(base.num_heads()))?,
        offsets: offsets.ints(Some(base.num_heads()))?,
        eos_token_id: base.eos_token_id,
        vocab_size: base.vocab_size,
        ngram_size: base.ngram_size,
        heads_per_ngram: base.heads_per_ngram,
    };
    p.validate()
        .map_err(|e| Error::Format(format!("{d}: hash tensors: {}", strip_format(&e))))?;
    Ok(Some(p))
}

/// The hash parameters: from the tensors, from config.json, or from both (then equal).
pub(super) fn resolve_hash(
    tensors: &Tensors,
    module: &str,
    config: Option<&ModelConfig>,
    d: &str,
) -> Result<(HashParams, HashSource)> {
    let from_tensors = hash_from_tensors(tensors, module, config, d)?;
    let from_config = config.map(HashParams::derive);
    match (from_tensors, from_config) {
        (None, None) => Err(Error::Format(format!(
            "{d}: no hash parameters: the checkpoint has neither {CONFIG_FILE} nor hash tensors (*.layer_multipliers, *.ngram_heads_vocab_sizes, *.ngram_heads_offsets)"
        ))),
        (Some(t), None) => Ok((t, HashSource::Tensors)),
        (None, Some(c)) => Ok((c, HashSource::Config)),
        (Some(t), Some(c)) => {
            for (what, a, b) in [
                ("layer_multipliers", &t.multipliers, &c.multipliers),
                ("ngram_heads_vocab_sizes", &t.head_sizes, &c.head_sizes),
                ("ngram_heads_offsets", &t.offsets, &c.offsets),
            ] {
                if a != b {
                    return Err(Error::Format(format!(
                        "{d}: hash tensor {what} disagrees with the values config.json derives: {} (tensor vs config)",
                        first_diff(a, b)
                    )));
                }
            }
            Ok((t, HashSource::Both))
        }
    }
}
