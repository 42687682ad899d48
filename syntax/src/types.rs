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
}
