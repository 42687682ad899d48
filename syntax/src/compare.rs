//! Whether two versions declare a function alike, as far as a call of it is concerned.

use crate::model::{Function, Spec};

/// Whether calls of `old` (in `from`) and `new` (in `to`) pass the same types.
pub fn same_signature(from: &Spec, old: &Function, to: &Spec, new: &Function) -> bool {
    old.params.len() == new.params.len()
        && old
            .params
            .iter()
            .zip(&new.params)
            .all(|(a, b)| same_type(from, &a.ty, to, &b.ty))
        && match (old.returns.ty(), new.returns.ty()) {
            (None, None) => true,
            (Some(a), Some(b)) => same_type(from, a, to, b),
            _ => false,
        }
}

/// The same type, or names of it: pointers to the same type, or names whose alias chains meet.
fn same_type(from: &Spec, a: &syn::Type, to: &Spec, b: &syn::Type) -> bool {
    match (a, b) {
        (syn::Type::Ptr(a), syn::Type::Ptr(b)) => {
            a.mutability.is_some() == b.mutability.is_some()
                && same_type(from, &a.elem, to, &b.elem)
        }
        (syn::Type::Path(pa), syn::Type::Path(pb)) if a != b => {
            match (pa.path.get_ident(), pb.path.get_ident()) {
                (Some(na), Some(nb)) => {
                    let chain = to.alias_chain(&nb.to_string());
                    from.alias_chain(&na.to_string())
                        .iter()
                        .any(|name| chain.contains(name))
                }
                _ => false,
            }
        }
        _ => a == b,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::parse_spec;

    fn spec(minor: u32, body: &str) -> Spec {
        parse_spec(&format!(
            "pub const NCCL_MAJOR: u32 = 2; pub const NCCL_MINOR: u32 = {minor};
             pub const NCCL_PATCH: u32 = 1; pub type ncclResult_t = u32;
             #[repr(C)] pub struct ncclHandle {{ pub p: *mut u8 }}
             {body}"
        ))
        .unwrap()
    }

    fn same(old: &str, new: &str) -> bool {
        let (a, b) = (spec(29, old), spec(30, new));
        let name = "ncclF";
        same_signature(&a, a.function(name).unwrap(), &b, b.function(name).unwrap())
    }

    #[test]
    fn another_name_of_the_same_type_is_the_same_signature() {
        let plain = "unsafe extern \"C\" { pub fn ncclF(h: ncclHandle, out: *mut *mut u8) -> ncclResult_t; }";
        let aliased = "pub type ncclHandle_t = ncclHandle;
            unsafe extern \"C\" { pub fn ncclF(handle: ncclHandle_t, o: *mut *mut u8) -> ncclResult_t; }";
        assert!(same(plain, aliased));
        assert!(same(aliased, plain));
    }

    #[test]
    fn other_types_counts_or_results_differ() {
        let base = "unsafe extern \"C\" { pub fn ncclF(a: i32) -> ncclResult_t; }";
        assert!(!same(
            base,
            "unsafe extern \"C\" { pub fn ncclF(a: i64) -> ncclResult_t; }"
        ));
        assert!(!same(
            base,
            "unsafe extern \"C\" { pub fn ncclF(a: i32, b: i32) -> ncclResult_t; }"
        ));
        assert!(!same(base, "unsafe extern \"C\" { pub fn ncclF(a: i32); }"));
        assert!(!same(
            "unsafe extern \"C\" { pub fn ncclF(a: *const u8); }",
            "unsafe extern \"C\" { pub fn ncclF(a: *mut u8); }"
        ));
    }
}
