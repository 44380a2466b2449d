//! `ple lookup`: the 16 row ids of each token of one sequence.

use clap::Args;
use ple_core::error::{Error, Result};
use std::path::PathBuf;

/// `ple lookup <table_dir> --tokens 9707,11,... [--json]`
#[derive(Args, Debug)]
pub struct LookupArgs {
    pub table_dir: PathBuf,
    /// Comma-separated token ids of one sequence starting at position 0.
    #[arg(long, value_delimiter = ',', required = true)]
    pub tokens: Vec<i32>,
    #[arg(long)]
    pub json: bool,
}

pub fn run(a: LookupArgs) -> Result<()> {
    let t = ple_core::format::table::Table::open(&a.table_dir, &Default::default())?;
    let ids = lookup_ids(t.hash_params(), &a.tokens)?;
    if a.json {
        println!("{}", serde_json::json!({ "ids": ids }));
    } else {
        for (p, (tok, row)) in a.tokens.iter().zip(&ids).enumerate() {
            let row: Vec<String> = row.iter().map(|i| i.to_string()).collect();
            println!("{p}\t{tok}\t{}", row.join(" "));
        }
    }
    Ok(())
}

/// The 16 row ids of each token of one sequence starting at position 0.
pub fn lookup_ids(params: &ple_core::model::HashParams, tokens: &[i32]) -> Result<Vec<Vec<i64>>> {
    if tokens.is_empty() {
        return Err(Error::InvalidArgument("no tokens".into()));
    }
    let hasher = ple_core::lookup::hash::Hasher::new(params)?;
    let positions: Vec<i32> = (0..tokens.len() as i32).collect();
    let b = ple_core::lookup::context::Batch {
        tokens,
        positions: &positions,
        request_ids: &[0],
        query_start: &[0, tokens.len() as u32],
        context: None,
    };
    ple_core::lookup::context::validate_batch(&b, params.vocab_size, u32::MAX)?;
    let tracker =
        ple_core::lookup::context::Tracker::new(params.ngram_size, params.eos_token_id, 2)?;
    let ctx = ple_core::lookup::context::resolve_contexts(
        &b,
        Some(&tracker),
        params.eos_token_id,
        params.ngram_size,
    )?;
    let heads = hasher.num_heads();
    let mut out = vec![0i64; tokens.len() * heads];
    ple_core::lookup::context::compute_ids_i64(&hasher, &b, &ctx, &mut out);
    Ok(out.chunks(heads).map(|c| c.to_vec()).collect())
}
