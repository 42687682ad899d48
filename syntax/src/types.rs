use quote::ToTokens;

/// A type as a person writes it: `* mut ncclComm_t`, not a token dump.
pub fn type_to_string(ty: &syn::Type) -> String {
    let text = ty.to_token_stream().to_string();
    let text = text.replace(" :: ", "::").replace(":: ", "::");
    // A path after `*mut`/`*const` keeps its space: `*mut ::std::os::raw::c_int`.
    text.replace("mut::", "mut ::")
        .replace("const::", "const ::")
        .replace("* ", "*")
        .replace(" ,", ",")
        .replace(" ;", ";")
}

/// A type as a person reads it in C terms: `*mut c_int`, not `*mut ::std::os::raw::c_int`.
pub fn readable_type(ty: &syn::Type) -> String {
    without_paths(&type_to_string(ty))
}

/// `text` (a type, a signature) without the paths of the C types: `c_int`, `c_void`.
pub fn without_paths(text: &str) -> String {
    text.replace("::std::os::raw::", "")
        .replace("::core::ffi::", "")
}

#[cfg(test)]
mod tests {
    #[test]
    fn types_read_as_written() {
        let text = |t: &str| super::type_to_string(&syn::parse_str(t).unwrap());
        assert_eq!(
            text("*mut ::std::os::raw::c_int"),
            "*mut ::std::os::raw::c_int"
        );
        assert_eq!(
            text("*mut *mut ::std::os::raw::c_void"),
            "*mut *mut ::std::os::raw::c_void"
        );
        assert_eq!(text("*const ncclComm"), "*const ncclComm");
        assert_eq!(text("ncclResult_t"), "ncclResult_t");
        assert_eq!(text("[u8; 16]"), "[u8; 16]");
    }

    #[test]
    fn readable_types_drop_the_paths_of_c_types() {
        let ty: syn::Type = syn::parse_str("*mut *const ::std::os::raw::c_int").unwrap();
        assert_eq!(super::readable_type(&ty), "*mut *const c_int");
    }
}
