use quote::ToTokens;

/// A type as a person writes it: `* mut ncclComm_t`, not a token dump.
pub fn type_to_string(ty: &syn::Type) -> String {
    let text = ty.to_token_stream().to_string();
    text.replace(" :: ", "::")
        .replace(":: ", "::")
        .replace("* ", "*")
        .replace(" ,", ",")
}
