//! A checkpoint directory read once (`CheckpointDir`): its safetensors headers, its index and
//! its config.json (the constants and `ple_layer_ids`), from which its PLE layers are listed and
//! each one located and checked ([`Checkpoint`]) without reading any of them again.

use super::{
    CONFIG_FILE, Checkpoint, PleLayer, SHARD0_SUFFIX, Tensors, check_index, collect_shards,
    dir_name, global_scale, layers, resolve_hash, row_format_of, shard_sources, strip_format,
    table_shape,
};
use crate::error::{Error, Result};
use crate::format::files::{MAX_CONFIG, non_empty, read_text_capped};
use crate::format::fingerprint::fingerprint;
use crate::format::safetensors::{
    INDEX_FILE, SINGLE_FILE, TensorRef, read_header, read_index, safetensors_files,
};
use crate::model::ModelConfig;
use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

/// config.json as a checkpoint uses it.
struct Config {
    path: PathBuf,
    model: ModelConfig,
    /// `ple_layer_ids` (1-based decoder layers), if the file has it.
    ple_layer_ids: Option<Vec<u64>>,
}

/// A checkpoint directory whose headers, index and config.json have been read (once).
pub struct CheckpointDir {
    dir: PathBuf,
    tensors: Tensors,
    index: Option<BTreeMap<String, String>>,
    config: Option<Config>,
}

impl CheckpointDir {
    /// Reads `dir`'s safetensors headers, index and config.json (if present); a `dir` that is
    /// missing, empty or a file is refused.
    pub fn scan(dir: &Path) -> Result<CheckpointDir> {
        check_dir(dir)?;
        let (tensors, index) = load_tensors(dir)?;
        let path = dir.join(CONFIG_FILE);
        let config = if path.exists() {
            let v = parse_json(&read_text_capped(&path, MAX_CONFIG)?, &path)?;
            Some(Config {
                model: config_of(&v, &path)?,
                ple_layer_ids: layers::ple_layer_ids(&v, &path)?,
                path,
            })
        } else {
            None
        };
        Ok(CheckpointDir {
            dir: dir.to_path_buf(),
            tensors,
            index,
            config,
        })
    }

    /// The PLE layers of the checkpoint (`docs/FORMAT.md#several-ple-layers`).
    pub fn layers(&self) -> Result<Vec<PleLayer>> {
        find_layers(
            &self.tensors,
            self.config.as_ref(),
            &self.dir.display().to_string(),
        )
    }

    /// Locates and checks the PLE layer whose `ple_layer_index` is `layer` (`None`: the only
    /// one) (`docs/FORMAT.md#safetensors-checkpoints`); its hash is derived with that index.
    pub fn open_layer(&self, layer: Option<u64>) -> Result<Checkpoint> {
        let dir = self.dir.as_path();
        let tensors = &self.tensors;
        let fingerprint = fingerprint(dir)?;
        let d = dir.display().to_string();
        let d = d.as_str();
        let all = self.layers()?;
        let chosen = layers::choose(&all, layer, d)?;
        let mut config = self.config.as_ref().map(|c| c.model.clone());
        if let (Some(c), Some(f)) = (config.as_mut(), &self.config) {
            c.ple_layer_index = chosen.index;
            c.validate().map_err(|e| {
                Error::Format(format!("{}: {}", f.path.display(), strip_format(&e)))
            })?;
        }
        let prefix = chosen.prefix;
        let module = prefix
            .strip_suffix(".ngram_embedding")
            .unwrap_or(&prefix)
            .to_string();
        check_index(tensors, self.index.as_ref(), &prefix, &module, d)?;
        let (shard_tensors, num_shards) = collect_shards(tensors, &prefix, config.as_ref(), d)?;
        let format = row_format_of(shard_tensors[&(0, "weight".to_string())], d)?;
        let (hash, hash_source) = resolve_hash(tensors, &module, config.as_ref(), d)?;
        let shape = table_shape(&hash, config.as_ref(), num_shards, d)?;
        let shards = shard_sources(&shard_tensors, format, &shape, num_shards, &prefix, d)?;
        let global_scale = global_scale(tensors, &shard_tensors, format, &prefix, d)?;
        Ok(Checkpoint {
            dir: dir.to_path_buf(),
            name: dir_name(dir),
            fingerprint,
            format,
            prefix,
            // collect_shards bounds num_shards by u32::MAX.
            num_shards: num_shards as u32,
            rows_per_shard: shape.rows_per_shard,
            head_dim: shape.head_dim,
            global_scale,
            hash,
            hash_source,
            ple_layer_index: chosen.index,
            config,
            shards,
        })
    }
}

/// Reads the config.json at `path`.
pub fn read_config(path: &Path) -> Result<ModelConfig> {
    let text = read_text_capped(path, MAX_CONFIG)?;
    parse_config(&text, path)
}

/// Parses the text of a config.json (`path` names it in errors).
pub fn parse_config(text: &str, path: &Path) -> Result<ModelConfig> {
    config_of(&parse_json(text, path)?, path)
}

fn parse_json(text: &str, path: &Path) -> Result<serde_json::Value> {
    serde_json::from_str(text)
        .map_err(|e| Error::Format(format!("{}: invalid JSON: {e}", path.display())))
}

fn config_of(v: &serde_json::Value, path: &Path) -> Result<ModelConfig> {
    ModelConfig::from_config_json(v)
        .map_err(|e| Error::Format(format!("{}: {}", path.display(), strip_format(&e))))
}

/// Every safetensors header of `dir` (and its index, if any), read once.
fn load_tensors(dir: &Path) -> Result<(Tensors, Option<BTreeMap<String, String>>)> {
    let files = safetensors_files(dir)?;
    let index = if dir.join(INDEX_FILE).exists() {
        Some(read_index(dir)?)
    } else {
        None
    };
    let mut by_name: HashMap<String, TensorRef> = HashMap::new();
    let mut duplicates = Vec::new();
    for f in &files {
        if !f.exists() {
            return Err(Error::Format(format!(
                "{}: the index names shard file {} but it does not exist",
                dir.join(INDEX_FILE).display(),
                f.file_name().unwrap_or_default().to_string_lossy()
            )));
        }
        let h = read_header(f)?;
        for t in h.tensors {
            let name = t.name.clone();
            let r = TensorRef {
                path: f.clone(),
                info: t,
            };
            if let Some(prev) = by_name.get(&name) {
                duplicates.push((name, prev.path.clone(), f.clone()));
            } else {
                by_name.insert(name, r);
            }
        }
    }
    Ok((
        Tensors {
            by_name,
            duplicates,
        },
        index,
    ))
}

/// Refuses a `dir` that is empty, a file or missing.
fn check_dir(dir: &Path) -> Result<()> {
    non_empty(dir, "checkpoint directory")?;
    if dir.exists() && !dir.is_dir() {
        return Err(Error::Format(format!(
            "{} is a file but not a GGUF; give the checkpoint's directory (holding {INDEX_FILE} or {SINGLE_FILE}) or a GGUF file",
            dir.display()
        )));
    }
    if !dir.is_dir() {
        return Err(Error::io_path(
            "opening checkpoint",
            dir,
            std::io::Error::new(std::io::ErrorKind::NotFound, "no such directory"),
        ));
    }
    Ok(())
}

/// The PLE layers of the checkpoint (at least one), from its tensors and config.json.
fn find_layers(tensors: &Tensors, config: Option<&Config>, d: &str) -> Result<Vec<PleLayer>> {
    let ids = config.and_then(|c| c.ple_layer_ids.as_deref());
    let single = config.map_or(0, |c| c.model.ple_layer_index);
    let found = layers::find_layers(tensors, ids, single, d)?;
    if !found.is_empty() {
        return Ok(found);
    }
    let mut any: Vec<&String> = tensors
        .by_name
        .keys()
        .filter(|n| n.contains(".ngram_embedding.shard_"))
        .collect();
    any.sort();
    Err(match any.first() {
        Some(n) => Error::Format(format!(
            "{d}: missing shard 0: the checkpoint has PLE shard tensors (e.g. '{n}') but no '*{SHARD0_SUFFIX}'"
        )),
        None => Error::Format(format!(
            "{d}: no PLE n-gram table: no tensor named '*{SHARD0_SUFFIX}' among the {} tensors",
            tensors.by_name.len()
        )),
    })
}
