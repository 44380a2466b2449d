//! `ple inspect`: a table's metadata and validation result.

use clap::Args;
use ple_core::error::Result;
use std::path::PathBuf;

/// `ple inspect <table_dir> [--json]`
#[derive(Args, Debug)]
pub struct InspectArgs {
    pub table_dir: PathBuf,
    #[arg(long)]
    pub json: bool,
    /// config.json for tables made by the Python tool.
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// Also check that the table was packed from this checkpoint (fingerprint).
    #[arg(long)]
    pub checkpoint: Option<PathBuf>,
}

pub fn run(a: InspectArgs) -> Result<()> {
    let opts = ple_core::format::table::TableOpenOptions {
        config_json_path: a.config.clone(),
        checkpoint_dir: a.checkpoint.clone(),
    };
    let t = match ple_core::format::table::Table::open(&a.table_dir, &opts) {
        Ok(t) => t,
        Err(e) => {
            if a.json {
                println!(
                    "{}",
                    serde_json::json!({ "table_dir": a.table_dir, "valid": false, "error": e.to_string() })
                );
            } else {
                println!("table:        {}", a.table_dir.display());
                println!("valid:        no");
            }
            return Err(e);
        }
    };
    let m = t.meta();
    let info = ple_core::format::table::table_info(&t);
    if a.json {
        let v = serde_json::json!({
            "table_dir": a.table_dir,
            "valid": true,
            "rows_path": t.rows_path(),
            "file_size": info.file_size,
            "addressed_rows": info.addressed_rows,
            "format_code": info.format,
            "meta": m,
        });
        println!("{}", serde_json::to_string_pretty(&v).expect("serialises"));
        return Ok(());
    }
    println!("table:        {}", a.table_dir.display());
    println!(
        "rows file:    {} ({} bytes)",
        t.rows_path().display(),
        info.file_size
    );
    println!(
        "format:       {} ({} B/row: {} code + {} scale bytes)",
        m.row_format.name(),
        m.row_bytes,
        m.code_bytes,
        m.scale_bytes
    );
    println!(
        "rows:         {} ({} shards × {}), {} addressed by the hash",
        m.total_rows, m.num_shards, m.rows_per_shard, info.addressed_rows
    );
    if let Some(s) = &m.shard {
        println!(
            "head shard:   {}/{} ({}): heads {}, {} of the whole table's {} rows",
            s.index,
            s.count,
            s.layout.as_deref().unwrap_or("?"),
            s.shard().heads(m.num_heads as usize).describe(),
            m.total_rows,
            s.whole_total_rows
        );
    }
    println!(
        "heads:        {} × {} elements, ngram_size {}, {} heads per order",
        m.num_heads, m.head_dim, m.ngram_size, m.heads_per_ngram
    );
    println!(
        "tokens:       vocab_size {}, eos {}",
        m.hash.vocab_size, m.hash.eos_token_id
    );
    println!("global scale: {}", m.global_scale);
    println!("multipliers:  {:?}", m.hash.multipliers);
    println!("head sizes:   {:?}", m.hash.head_sizes);
    println!(
        "source:       {} (fingerprint {})",
        m.source.name,
        if m.source.fingerprint.is_empty() {
            "unknown"
        } else {
            &m.source.fingerprint
        }
    );
    println!("valid:        yes");
    Ok(())
}
