//! Row ids: the n-gram hash and each token's request context.

pub mod context;
pub mod hash;
pub mod tokens;
