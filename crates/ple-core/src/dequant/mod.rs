//! Row formats → f32/f16/bf16: on the CPU ([`cpu`]) and on the GPU ([`gpu`]).

pub mod cpu;
pub mod gpu;

pub use cpu::{Dtype, Out, OutArgs, dequant_rows};
