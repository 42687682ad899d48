//! The model of an NCCL spec: the types, constants and functions that bindgen emitted from one
//! `nccl.h`. Parsed once, here, and used by both the proc macros (to emit the exports) and the
//! generator (to check what it wrote and to compare two versions).

mod model;
mod parse;
mod types;
mod union;

pub use model::{Function, Param, Returns, Spec, Version};
pub use parse::{parse_spec, parse_spec_file};
pub use types::type_to_string;
pub use union::union_of;
