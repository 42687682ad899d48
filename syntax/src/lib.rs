//! The model of an NCCL spec: the types, constants and functions that bindgen emitted from one
//! release's headers. Parsed once, here, and used by both the proc macros (to emit the exports)
//! and the generator (to check what it wrote and to compare two versions).

mod compare;
mod declarations;
mod model;
mod operation;
mod parse;
mod query;
mod types;
mod union;

pub use compare::same_signature;
pub use model::{
    Alias, Constant, Field, Function, Param, Record, RecordKind, Returns, Spec, Version,
};
pub use operation::OperationParams;
pub use parse::{parse_spec, parse_spec_file};
pub use types::{readable_type, type_to_string, without_paths};
pub use union::union_of;
