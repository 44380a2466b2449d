//! The PLE layers of a checkpoint (`docs/FORMAT.md#several-ple-layers`): one n-gram table per
//! layer, `*.ngram_embedding.shard_{i}.weight` under each layer's module, each hashed with its own
//! `ple_layer_index` (its position in config.json's `ple_layer_ids`, as transformers' Qwen4Exp
//! derives it).

use super::{SHARD0_SUFFIX, Tensors};
use crate::error::{Error, Result};
use std::path::Path;

/// One PLE layer of a checkpoint.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PleLayer {
    /// `ple_layer_index`: the layer's index among the PLE layers (its hash depends on it).
    pub index: u64,
    /// The prefix of its shards, e.g. `model.layers.1.ple.ple_embedding.ngram_embedding`.
    pub prefix: String,
    /// The decoder layer holding it (`layers.{L}.` in the prefix), if the name says.
    pub decoder_layer: Option<u64>,
}

/// config.json's `ple_layer_ids` (1-based decoder layers, under `text_config` or at the top
/// level), if present.
pub(super) fn ple_layer_ids(v: &serde_json::Value, config_path: &Path) -> Result<Option<Vec<u64>>> {
    let tc = v.get("text_config").filter(|t| t.is_object()).unwrap_or(v);
    let bad = || {
        Error::Format(format!(
            "{}: ple_layer_ids is not a list of non-negative integers",
            config_path.display()
        ))
    };
    match tc.get("ple_layer_ids") {
        None | Some(serde_json::Value::Null) => Ok(None),
        Some(serde_json::Value::Array(a)) => a
            .iter()
            .map(|x| x.as_u64().ok_or_else(bad))
            .collect::<Result<Vec<u64>>>()
            .map(Some),
        Some(_) => Err(bad()),
    }
}

/// The decoder layer `L` of a prefix `...layers.{L}.ple...` (the last `layers.{L}` in it).
fn decoder_layer(prefix: &str) -> Option<u64> {
    let parts: Vec<&str> = prefix.split('.').collect();
    parts
        .windows(2)
        .rev()
        .find(|w| w[0] == "layers" && w[1].bytes().all(|c| c.is_ascii_digit()))
        .and_then(|w| w[1].parse().ok())
}

/// Every PLE layer of the checkpoint, by `ple_layer_index`. With `ple_layer_ids` each table's
/// index is the position of its decoder layer + 1 there (every listed layer must have a table and
/// every table a listed layer); without, tables are numbered in decoder-layer order. One table
/// without `ple_layer_ids` has index `single_index` (config.json's `ple_layer_index`, else 0).
pub(super) fn find_layers(
    tensors: &Tensors,
    ids: Option<&[u64]>,
    single_index: u64,
    d: &str,
) -> Result<Vec<PleLayer>> {
    let mut prefixes: Vec<(Option<u64>, String)> = tensors
        .by_name
        .keys()
        .filter_map(|n| {
            n.strip_suffix(".shard_0.weight")
                .filter(|_| n.ends_with(SHARD0_SUFFIX))
        })
        .map(|p| (decoder_layer(p), p.to_string()))
        .collect();
    prefixes.sort();
    if prefixes.is_empty() {
        return Ok(Vec::new());
    }
    let ids = ids.filter(|v| !v.is_empty());
    let Some(ids) = ids else {
        if prefixes.len() == 1 {
            let (decoder_layer, prefix) = prefixes.remove(0);
            return Ok(vec![PleLayer {
                index: single_index,
                prefix,
                decoder_layer,
            }]);
        }
        if let Some((_, p)) = prefixes.iter().find(|(l, _)| l.is_none()) {
            return Err(Error::Format(format!(
                "{d}: several PLE tables, and '{p}' names no decoder layer ('layers.<L>.'): cannot number them"
            )));
        }
        return Ok(prefixes
            .into_iter()
            .enumerate()
            .map(|(i, (decoder_layer, prefix))| PleLayer {
                index: i as u64,
                prefix,
                decoder_layer,
            })
            .collect());
    };
    let mut layers = Vec::with_capacity(prefixes.len());
    for (decoder_layer, prefix) in prefixes {
        let pos = decoder_layer.and_then(|l| ids.iter().position(|&id| id == l + 1));
        let Some(index) = pos else {
            return Err(Error::Format(format!(
                "{d}: PLE table '{prefix}' is in decoder layer {}, which config.json's ple_layer_ids {ids:?} (1-based) does not list",
                decoder_layer.map_or("(none)".into(), |l| l.to_string())
            )));
        };
        layers.push(PleLayer {
            index: index as u64,
            prefix,
            decoder_layer,
        });
    }
    layers.sort_by_key(|l| l.index);
    if layers.len() != ids.len() {
        let have: Vec<u64> = layers
            .iter()
            .filter_map(|l| l.decoder_layer)
            .map(|l| l + 1)
            .collect();
        let missing: Vec<&u64> = ids.iter().filter(|i| !have.contains(i)).collect();
        return Err(Error::Format(format!(
            "{d}: config.json's ple_layer_ids {ids:?} lists {} PLE layers, but the checkpoint has tables for {} (none for {missing:?}: missing '*{SHARD0_SUFFIX}')",
            ids.len(),
            layers.len()
        )));
    }
    Ok(layers)
}

/// The layer to open: `want` (a `ple_layer_index`), or the only one.
pub(super) fn choose(layers: &[PleLayer], want: Option<u64>, d: &str) -> Result<PleLayer> {
    let list = || {
        layers
            .iter()
            .map(|l| format!("{} ('{}')", l.index, l.prefix))
            .collect::<Vec<_>>()
            .join(", ")
    };
    match want {
        None if layers.len() == 1 => Ok(layers[0].clone()),
        None => Err(Error::Format(format!(
            "{d}: several PLE layers: {}; name one (`ple pack --layer K`), or pack them all (`ple pack` writes layer-K/ for each)",
            list()
        ))),
        Some(k) => layers
            .iter()
            .find(|l| l.index == k)
            .cloned()
            .ok_or_else(|| {
                Error::Format(format!(
                    "{d}: no PLE layer with ple_layer_index {k}: the checkpoint has {}",
                    list()
                ))
            }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_decoder_layer_is_read_from_the_prefix() {
        let p = "model.language_model.layers.12.ple.ple_embedding.ngram_embedding";
        assert_eq!(decoder_layer(p), Some(12));
        assert_eq!(decoder_layer("ple.ngram_embedding"), None);
        assert_eq!(decoder_layer("layers.x.ple"), None);
    }
}
