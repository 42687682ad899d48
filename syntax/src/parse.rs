use std::path::Path;

use crate::declarations;
use crate::model::{Function, Param, Returns, Spec, Version};

/// Reads and parses one spec file. Errors name the file and, where they can, the line.
pub fn parse_spec_file(path: &Path) -> Result<Spec, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
    parse_spec(&text).map_err(|e| format!("{}: {e}", path.display()))
}

/// Parses the text of a spec file (what bindgen emitted).
pub fn parse_spec(text: &str) -> Result<Spec, String> {
    let file = syn::parse_file(text).map_err(|e| format!("not valid Rust: {e}"))?;
    let mut items = Vec::new();
    let mut functions = Vec::new();
    let mut version_parts = [None; 3];
    for item in file.items {
        match item {
            syn::Item::ForeignMod(block) => {
                for foreign in block.items {
                    match foreign {
                        syn::ForeignItem::Fn(f) => {
                            functions.push(function(&f.sig, &f.attrs, text)?)
                        }
                        other => {
                            return Err(format!(
                                "only functions are supported in extern blocks, found `{}`",
                                quote::ToTokens::to_token_stream(&other)
                            ));
                        }
                    }
                }
            }
            syn::Item::Const(c) => {
                let slot = match c.ident.to_string().as_str() {
                    "NCCL_MAJOR" => Some(0),
                    "NCCL_MINOR" => Some(1),
                    "NCCL_PATCH" => Some(2),
                    _ => None,
                };
                if let Some(slot) = slot {
                    version_parts[slot] = Some(
                        integer(&c.expr)
                            .ok_or_else(|| format!("{} is not an integer literal", c.ident))?,
                    );
                }
                items.push(syn::Item::Const(c));
            }
            other => items.push(other),
        }
    }
    let [Some(major), Some(minor), Some(patch)] = version_parts else {
        return Err("NCCL_MAJOR, NCCL_MINOR and NCCL_PATCH must all be defined".into());
    };
    // The profiling twins are implied by their `ncclX`; a spec lists only the `ncclX`.
    functions.retain(|f: &Function| !f.name.starts_with("pnccl"));
    let declarations = declarations::collect(&items);
    Ok(Spec {
        version: Version {
            major,
            minor,
            patch,
        },
        items,
        functions,
        records: declarations.records,
        aliases: declarations.aliases,
        constants: declarations.constants,
    })
}

fn integer(expr: &syn::Expr) -> Option<u32> {
    match expr {
        syn::Expr::Lit(syn::ExprLit {
            lit: syn::Lit::Int(i),
            ..
        }) => i.base10_parse().ok(),
        _ => None,
    }
}

fn function(
    sig: &syn::Signature,
    attrs: &[syn::Attribute],
    text: &str,
) -> Result<Function, String> {
    let name = sig.ident.to_string();
    let at = || line_of(text, &format!("fn {name}"));
    if attrs.iter().any(|a| a.path().is_ident("link_name")) {
        return Err(format!(
            "line {}: `{name}` has C++ linkage (a link_name), which the exports cannot forward",
            at()
        ));
    }
    if sig.variadic.is_some() {
        return Err(format!(
            "line {}: `{name}` is variadic, which the exports cannot forward",
            at()
        ));
    }
    if !name.starts_with("nccl") && !name.starts_with("pnccl") {
        return Err(format!(
            "line {}: `{name}` is not an NCCL function (ncclX)",
            at()
        ));
    }
    let mut params = Vec::new();
    for (i, input) in sig.inputs.iter().enumerate() {
        let syn::FnArg::Typed(arg) = input else {
            return Err(format!("line {}: `{name}` takes `self`", at()));
        };
        // bindgen names unnamed C parameters arg1, arg2...; keep whatever it chose.
        let ident = match &*arg.pat {
            syn::Pat::Ident(p) => p.ident.clone(),
            _ => syn::Ident::new(&format!("arg{i}"), proc_macro2::Span::call_site()),
        };
        params.push(Param {
            name: ident.to_string(),
            ident,
            ty: (*arg.ty).clone(),
        });
    }
    let returns = match &sig.output {
        syn::ReturnType::Default => Returns::Nothing,
        syn::ReturnType::Type(_, ty) => classify(ty),
    };
    Ok(Function {
        name,
        ident: sig.ident.clone(),
        params,
        returns,
    })
}

fn classify(ty: &syn::Type) -> Returns {
    let last_segment = |t: &syn::Type| match t {
        syn::Type::Path(p) => p.path.segments.last().map(|s| s.ident.to_string()),
        _ => None,
    };
    match ty {
        syn::Type::Ptr(p)
            if p.const_token.is_some() && last_segment(&p.elem).as_deref() == Some("c_char") =>
        {
            Returns::Message(ty.clone())
        }
        _ if last_segment(ty).as_deref() == Some("ncclResult_t") => Returns::Result(ty.clone()),
        syn::Type::Tuple(t) if t.elems.is_empty() => Returns::Nothing,
        _ => Returns::Value(ty.clone()),
    }
}

/// 1-based line of the first occurrence of `needle`, for error messages; 0 if absent.
fn line_of(text: &str, needle: &str) -> usize {
    text.find(needle)
        .map_or(0, |at| text[..at].lines().count().max(1))
}

#[cfg(test)]
mod tests {
    use super::*;

    const SMALL: &str = r#"
        pub const NCCL_MAJOR: u32 = 2;
        pub const NCCL_MINOR: u32 = 27;
        pub const NCCL_PATCH: u32 = 7;
        pub type ncclResult_t = ::std::os::raw::c_uint;
        unsafe extern "C" {
            pub fn ncclGetVersion(version: *mut ::std::os::raw::c_int) -> ncclResult_t;
            pub fn pncclGetVersion(version: *mut ::std::os::raw::c_int) -> ncclResult_t;
            pub fn ncclGetErrorString(result: ncclResult_t) -> *const ::std::os::raw::c_char;
            pub fn ncclResetDebugInit();
            pub fn ncclTeamRankToLsa(arg1: *mut u8, rank: ::std::os::raw::c_int) -> ::std::os::raw::c_int;
        }
    "#;

    #[test]
    fn reads_version_functions_and_return_kinds() {
        let spec = parse_spec(SMALL).unwrap();
        assert_eq!(
            spec.version,
            Version {
                major: 2,
                minor: 27,
                patch: 7
            }
        );
        assert_eq!(spec.version.code(), 22707);
        let names: Vec<&str> = spec.functions.iter().map(|f| f.name.as_str()).collect();
        assert_eq!(
            names,
            [
                "ncclGetVersion",
                "ncclGetErrorString",
                "ncclResetDebugInit",
                "ncclTeamRankToLsa"
            ]
        );
        assert!(matches!(spec.functions[0].returns, Returns::Result(_)));
        assert!(matches!(spec.functions[1].returns, Returns::Message(_)));
        assert!(matches!(spec.functions[2].returns, Returns::Nothing));
        assert!(matches!(spec.functions[3].returns, Returns::Value(_)));
        assert_eq!(
            spec.functions[0].signature(),
            "ncclGetVersion(version: *mut ::std::os::raw::c_int) -> ncclResult_t"
        );
        assert_eq!(spec.items.len(), 4);
    }

    #[test]
    fn rejects_what_cannot_be_forwarded() {
        let variadic = SMALL.replace(
            "pub fn ncclResetDebugInit();",
            "pub fn ncclLog(fmt: *const u8, ...);",
        );
        let err = parse_spec(&variadic).err().unwrap();
        assert!(
            err.contains("ncclLog") && err.contains("variadic") && err.contains("line 10"),
            "{err}"
        );
        let no_version = SMALL.replace("pub const NCCL_PATCH: u32 = 7;", "");
        assert!(
            parse_spec(&no_version)
                .err()
                .unwrap()
                .contains("NCCL_PATCH")
        );
        let mangled = SMALL.replace(
            "pub fn ncclResetDebugInit();",
            "#[link_name = \"\\u{1}_Z18ncclResetDebugInitv\"] pub fn ncclResetDebugInit();",
        );
        let err = parse_spec(&mangled).err().unwrap();
        assert!(
            err.contains("ncclResetDebugInit") && err.contains("C++"),
            "{err}"
        );
        let stranger = SMALL.replace("ncclResetDebugInit", "cudaMalloc");
        assert!(parse_spec(&stranger).err().unwrap().contains("cudaMalloc"));
    }

    #[test]
    fn versions_parse_and_encode_like_nccl() {
        assert_eq!(Version::parse("2.28.9").map(Version::code), Some(22809));
        assert_eq!(Version::parse("2.8.4").map(Version::code), Some(2804));
        assert_eq!(Version::parse("2.28"), None);
        assert_eq!(Version::parse("2.28.9.1"), None);
    }
}
