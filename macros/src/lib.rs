//! Proc macros that turn NCCL spec files into the shim's C ABI, in three layers, each expanded in
//! a module of its own so that the lower ones never name the higher:
//! - `nccl_ffi!`: the API's types and constants, and what the spec says of its functions;
//! - `nccl_real!`: for every function a typed forwarder to the real NCCL's (resolved once) with
//!   the stub for a real NCCL that lacks it, and the `Route` trait: one method for every
//!   operation on a stream, given its description, and one per other function, each forwarding
//!   unless hand-written code claims it;
//! - `nccl_exports!`: the exports `ncclX` and `pncclX`, with the reentrancy guard; an
//!   operation's describes the call once, hands it to the router and then to the recorder.

mod expand;
mod input;

use proc_macro::TokenStream;

/// Expands `expand` over the spec the input names, or into the error that stops it.
fn with_spec(
    input: TokenStream,
    expand: impl FnOnce(
        &ncclshim_syntax::Spec,
        &[std::path::PathBuf],
        &input::Input,
    ) -> syn::Result<proc_macro2::TokenStream>,
) -> TokenStream {
    let input = syn::parse_macro_input!(input as input::Input);
    let expanded = input
        .load_spec()
        .map_err(|message| syn::Error::new(input.specs_env.span(), message))
        .and_then(|(spec, paths)| expand(&spec, &paths, &input));
    match expanded {
        Ok(tokens) => tokens.into(),
        Err(error) => error.to_compile_error().into(),
    }
}

/// `nccl_ffi!(specs_env = "VAR")`
///
/// `VAR` names an environment variable (set by the build script) holding the absolute paths of
/// the spec files to export, separated by `:`; several specs export their union.
#[proc_macro]
pub fn nccl_ffi(input: TokenStream) -> TokenStream {
    with_spec(input, |spec, paths, _| Ok(expand::ffi(spec, paths)))
}

/// `nccl_real!(specs_env = "VAR", ffi = path::ffi, call = path::Call, runtime = path::runtime)`
///
/// `Call`: the description of an operation's call, with the fields `kind` (its index in
/// `OPERATIONS`), `comm`, `send`, `recv`, `count`, `datatype`, `op`, `root` and `stream`.
#[proc_macro]
pub fn nccl_real(input: TokenStream) -> TokenStream {
    with_spec(input, |spec, _, input| {
        let [ffi, call, runtime] = input.paths(["ffi", "call", "runtime"])?;
        Ok(expand::real(spec, &ffi, &call, &runtime))
    })
}

/// `nccl_exports!(specs_env = "VAR", ffi = path::ffi, call = path::Call, real = path::real,
/// router = path::Router, runtime = path::runtime, recorder = path::recorder)`
#[proc_macro]
pub fn nccl_exports(input: TokenStream) -> TokenStream {
    with_spec(input, |spec, _, input| {
        let [ffi, call, real, router, runtime, recorder] =
            input.paths(["ffi", "call", "real", "router", "runtime", "recorder"])?;
        let paths = expand::Paths {
            ffi,
            call,
            real,
            router,
            runtime,
            recorder,
        };
        Ok(expand::exports(spec, &paths))
    })
}
