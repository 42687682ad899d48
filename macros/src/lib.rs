//! Proc macros that turn NCCL spec files into the shim's C ABI: for every function of the spec,
//! the exports `ncclX` and `pncclX`, a typed forwarder to the real NCCL's `ncclX` (resolved once),
//! the reentrancy guard, the stub for a real NCCL that lacks the function, and a method of the
//! `Route` trait through which hand-written code claims the function.

mod expand;
mod input;

use proc_macro::TokenStream;

/// `nccl_api!(specs_env = "VAR", router = path::Router, runtime = path::runtime)`
///
/// `VAR` names an environment variable (set by the build script) holding the absolute paths of
/// the spec files to export, separated by `:`; several specs export their union.
#[proc_macro]
pub fn nccl_api(input: TokenStream) -> TokenStream {
    let input = syn::parse_macro_input!(input as input::ApiInput);
    match input.load_spec() {
        Ok((spec, paths)) => expand::expand(&spec, &paths, &input).into(),
        Err(message) => syn::Error::new(input.specs_env.span(), message)
            .to_compile_error()
            .into(),
    }
}
