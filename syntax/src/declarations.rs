//! The spec's types and constants, read from bindgen's items: structs and unions with the layout
//! that bindgen's layout tests state (`["Size of X"][size_of::<X>() - 72usize]`), type aliases,
//! and constants (which is also how enums are emitted).

use crate::model::{Alias, Constant, Field, Record, RecordKind};

#[derive(Default)]
pub struct Declarations {
    pub records: Vec<Record>,
    pub aliases: Vec<Alias>,
    pub constants: Vec<Constant>,
}

/// Reads every struct, union, alias and constant of `items`, in their order.
pub fn collect(items: &[syn::Item]) -> Declarations {
    let mut found = Declarations::default();
    let mut layouts = Vec::new();
    for item in items {
        match item {
            syn::Item::Struct(s) => found.records.push(record(
                RecordKind::Struct,
                &s.ident,
                s.fields.iter().map(|f| (f.ident.as_ref(), &f.ty)),
            )),
            syn::Item::Union(u) => found.records.push(record(
                RecordKind::Union,
                &u.ident,
                u.fields.named.iter().map(|f| (f.ident.as_ref(), &f.ty)),
            )),
            syn::Item::Type(t) => found.aliases.push(Alias {
                name: t.ident.to_string(),
                target: (*t.ty).clone(),
            }),
            syn::Item::Const(c) if c.ident == "_" => layouts.extend(layout_facts(&c.expr)),
            syn::Item::Const(c) => found.constants.push(Constant {
                name: c.ident.to_string(),
                ty: (*c.ty).clone(),
                value: quote::ToTokens::to_token_stream(&c.expr).to_string(),
            }),
            _ => {}
        }
    }
    for (fact, value) in layouts {
        apply(&mut found.records, fact, value);
    }
    found
}

fn record<'a>(
    kind: RecordKind,
    ident: &syn::Ident,
    fields: impl Iterator<Item = (Option<&'a syn::Ident>, &'a syn::Type)>,
) -> Record {
    let fields: Vec<Field> = fields
        .map(|(name, ty)| Field {
            name: name.map_or_else(String::new, ToString::to_string),
            ty: ty.clone(),
            offset: None,
        })
        .collect();
    // bindgen's way of saying "declared, never defined": `_unused: [u8; 0]`.
    let opaque = fields.len() == 1 && fields[0].name == "_unused";
    Record {
        name: ident.to_string(),
        kind,
        fields: if opaque { Vec::new() } else { fields },
        opaque,
        size: None,
        align: None,
    }
}

/// One statement of a layout test: what it states, and the number.
enum LayoutFact {
    Size(String),
    Align(String),
    Offset(String, String),
}

/// The statements of one `const _: () = { ... };` block of layout tests.
fn layout_facts(expr: &syn::Expr) -> Vec<(LayoutFact, usize)> {
    let syn::Expr::Block(block) = expr else {
        return Vec::new();
    };
    block
        .block
        .stmts
        .iter()
        .filter_map(|stmt| match stmt {
            syn::Stmt::Expr(syn::Expr::Index(index), _) => layout_fact(index),
            _ => None,
        })
        .collect()
}

/// `["Size of X"][::std::mem::size_of::<X>() - 72usize]` -> (Size("X"), 72).
fn layout_fact(index: &syn::ExprIndex) -> Option<(LayoutFact, usize)> {
    let syn::Expr::Array(label) = &*index.expr else {
        return None;
    };
    let Some(syn::Expr::Lit(syn::ExprLit {
        lit: syn::Lit::Str(label),
        ..
    })) = label.elems.first()
    else {
        return None;
    };
    let syn::Expr::Binary(difference) = &*index.index else {
        return None;
    };
    let syn::Expr::Lit(syn::ExprLit {
        lit: syn::Lit::Int(number),
        ..
    }) = &*difference.right
    else {
        return None;
    };
    let value = number.base10_parse().ok()?;
    let label = label.value();
    let fact = if let Some(name) = label.strip_prefix("Size of ") {
        LayoutFact::Size(name.to_string())
    } else if let Some(name) = label.strip_prefix("Alignment of ") {
        LayoutFact::Align(name.to_string())
    } else {
        let (record, field) = label.strip_prefix("Offset of field: ")?.split_once("::")?;
        LayoutFact::Offset(record.to_string(), field.to_string())
    };
    Some((fact, value))
}

fn apply(records: &mut [Record], fact: LayoutFact, value: usize) {
    let find = |records: &mut [Record], name: &str| records.iter_mut().position(|r| r.name == name);
    match fact {
        LayoutFact::Size(name) => {
            if let Some(i) = find(records, &name) {
                records[i].size = Some(value);
            }
        }
        LayoutFact::Align(name) => {
            if let Some(i) = find(records, &name) {
                records[i].align = Some(value);
            }
        }
        LayoutFact::Offset(name, field) => {
            let field = find(records, &name)
                .and_then(|i| records[i].fields.iter_mut().find(|f| f.name == field));
            if let Some(field) = field {
                field.offset = Some(value);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::{RecordKind, parse_spec, type_to_string};

    const SPEC: &str = r#"
        pub const NCCL_MAJOR: u32 = 2;
        pub const NCCL_MINOR: u32 = 28;
        pub const NCCL_PATCH: u32 = 9;
        #[repr(C)]
        #[derive(Debug)]
        pub struct ncclComm {
            _unused: [u8; 0],
        }
        pub type ncclComm_t = *mut ncclComm;
        #[repr(C)]
        #[derive(Debug, Copy, Clone)]
        pub struct ncclConfig_v22800 {
            pub size: usize,
            pub magic: ::std::os::raw::c_uint,
        }
        #[allow(clippy::unnecessary_operation, clippy::identity_op)]
        const _: () = {
            ["Size of ncclConfig_v22800"][::std::mem::size_of::<ncclConfig_v22800>() - 16usize];
            ["Alignment of ncclConfig_v22800"][::std::mem::align_of::<ncclConfig_v22800>() - 8usize];
            ["Offset of field: ncclConfig_v22800::size"]
                [::std::mem::offset_of!(ncclConfig_v22800, size) - 0usize];
            ["Offset of field: ncclConfig_v22800::magic"]
                [::std::mem::offset_of!(ncclConfig_v22800, magic) - 8usize];
        };
        pub type ncclConfig_t = ncclConfig_v22800;
        #[repr(C)]
        #[derive(Copy, Clone)]
        pub union ncclValue {
            pub i: i64,
            pub d: f64,
        }
        pub const ncclSuccess: ncclResult_t = 0;
        pub const ncclTimeout: ncclResult_t = 8;
        pub type ncclResult_t = ::std::os::raw::c_uint;
        pub const NCCL_UNDEF_FLOAT: f64 = -1.0;
        unsafe extern "C" {
            pub fn ncclCommInitRankConfig(comm: *mut ncclComm_t, config: *mut ncclConfig_t) -> ncclResult_t;
        }
    "#;

    #[test]
    fn reads_records_with_their_layout() {
        let spec = parse_spec(SPEC).unwrap();
        let config = spec.resolve_record("ncclConfig_t").unwrap();
        assert_eq!(config.name, "ncclConfig_v22800");
        assert_eq!(config.kind, RecordKind::Struct);
        assert_eq!((config.size, config.align), (Some(16), Some(8)));
        let magic = config.field("magic").unwrap();
        assert_eq!(magic.offset, Some(8));
        assert_eq!(type_to_string(&magic.ty), "::std::os::raw::c_uint");
        let comm = spec.record("ncclComm").unwrap();
        assert!(comm.opaque && comm.fields.is_empty() && comm.size.is_none());
        // A pointer alias does not stand for the record it points to.
        assert!(spec.resolve_record("ncclComm_t").is_none());
        let value = spec.record("ncclValue").unwrap();
        assert_eq!((value.kind, value.fields.len()), (RecordKind::Union, 2));
    }

    #[test]
    fn reads_aliases_and_constants() {
        let spec = parse_spec(SPEC).unwrap();
        assert_eq!(
            spec.alias("ncclConfig_t").unwrap().target_name().as_deref(),
            Some("ncclConfig_v22800")
        );
        assert_eq!(spec.alias("ncclComm_t").unwrap().target_name(), None);
        let timeout = spec.constant("ncclTimeout").unwrap();
        assert_eq!(
            (type_to_string(&timeout.ty).as_str(), timeout.value.as_str()),
            ("ncclResult_t", "8")
        );
        assert_eq!(spec.constant("NCCL_UNDEF_FLOAT").unwrap().value, "- 1.0");
        assert!(spec.constant("_").is_none());
        assert_eq!(spec.constants.len(), 6);
    }
}
