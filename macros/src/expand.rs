use std::path::PathBuf;

use ncclshim_syntax::{Function, Returns, Spec};
use proc_macro2::TokenStream;
use quote::{format_ident, quote};

/// The paths the exports name.
pub struct Paths {
    pub ffi: syn::Path,
    pub call: syn::Path,
    pub real: syn::Path,
    pub router: syn::Path,
    pub runtime: syn::Path,
    pub recorder: syn::Path,
}

/// The API's types and constants, the ABI's version and functions, the operations described call
/// by call, and `if_exported!`.
pub fn ffi(spec: &Spec, paths: &[PathBuf]) -> TokenStream {
    let items = &spec.items;
    let version = spec.version.to_string();
    let version_code = spec.version.code() as i32;
    let names: Vec<&str> = spec.functions.iter().map(|f| f.name.as_str()).collect();
    let path_strings: Vec<String> = paths.iter().map(|p| p.display().to_string()).collect();
    let operation_names: Vec<&str> = operations(spec).iter().map(|f| f.name.as_str()).collect();
    let exported_arms = spec.functions.iter().map(|f| {
        let ident = &f.ident;
        quote! { (#ident { $($body:tt)* }) => { $($body)* }; }
    });
    quote! {
        /// Expands its body only if this build exports the named function, so that hand-written
        /// code can claim functions that older NCCL versions lack:
        /// `if_exported!(ncclCommShrink { unsafe fn ncclCommShrink(...) { ... } });`
        #[allow(unused_macros)]
        macro_rules! if_exported {
            #(#exported_arms)*
            ($other:ident { $($body:tt)* }) => {};
        }
        #[allow(unused_imports)]
        pub(crate) use if_exported;

        /// The types and constants of the NCCL API, as the spec declares them.
        #[allow(non_camel_case_types, non_upper_case_globals, non_snake_case, dead_code, unused_imports)]
        #[allow(clippy::all)]
        mod declared {
            #(#items)*
        }
        pub use self::declared::*;
        // Makes the compiler rebuild this crate whenever a spec file changes.
        #(const _: &[u8] = include_bytes!(#path_strings);)*

        /// The NCCL version whose ABI this library exports.
        pub const ABI_VERSION: &str = #version;
        /// `NCCL_VERSION_CODE` of that version.
        pub const ABI_VERSION_CODE: i32 = #version_code;
        /// Every function exported, without its `pncclX` twin.
        pub const ABI_FUNCTIONS: &[&str] = &[#(#names),*];
        /// The operations on a communicator's stream (collectives, sends, receives), which the
        /// shim describes call by call; a call's `Operation::kind` is its index here.
        pub const OPERATIONS: &[&str] = &[#(#operation_names),*];
    }
}

/// The real NCCL's functions: the table of them, a typed forwarder each, and the `Route` trait.
pub fn real(spec: &Spec, ffi: &syn::Path, call: &syn::Path, runtime: &syn::Path) -> TokenStream {
    let table_fields = spec.functions.iter().map(|f| {
        let ident = &f.ident;
        let pointer = pointer_type(f);
        quote! { pub #ident: ::core::option::Option<#pointer> }
    });
    let table_resolves = spec.functions.iter().map(|f| {
        let ident = &f.ident;
        let pointer = pointer_type(f);
        let c_name = syn::LitCStr::new(&std::ffi::CString::new(f.name.clone()).unwrap(), proc_macro2::Span::call_site());
        quote! {
            #ident: {
                let address = lookup(#c_name);
                // SAFETY: the real NCCL's symbol of this name has this C signature (the spec says so).
                (!address.is_null()).then(|| unsafe { ::core::mem::transmute::<*mut ::core::ffi::c_void, #pointer>(address) })
            }
        }
    });
    let forwarders = spec.functions.iter().map(|f| forwarder(f, runtime));
    let described: Vec<(usize, TokenStream)> = operations(spec)
        .into_iter()
        .enumerate()
        .filter_map(|(kind, f)| Some((kind, described_arm(kind, f)?)))
        .collect();
    let operation_arms = operations(spec).into_iter().enumerate().map(|(kind, f)| {
        let ident = &f.ident;
        quote! { #kind => table.#ident.is_some(), }
    });
    let described_kinds = described.iter().map(|(kind, _)| kind);
    let described_arms = described.iter().map(|(_, arm)| arm);
    // Operations go through `Route::operation`, described; every other function has a method.
    let route_methods = spec
        .functions
        .iter()
        .filter(|f| f.operation().is_none())
        .map(|f| {
            let (ident, params, args, ret) = (&f.ident, params(f), args(f), ret(f));
            // A question (`Function::is_query`) asks nothing of a group: asked inside one, it
            // leaves the group where it is (open in the core, not in NCCL).
            let before = (!f.is_query()).then(|| quote! { Self::before_forward(); });
            quote! {
                /// Forwards to the real NCCL unless the router claims it.
                unsafe fn #ident(#(#params),*) #ret {
                    #before
                    // SAFETY: the caller's arguments go on unchanged to the function they were meant for.
                    unsafe { #ident(#(#args),*) }
                }
            }
        });
    quote! {
        #[allow(unused_imports)]
        use #ffi::*;

        /// The real NCCL's functions, each looked up once; `None` where the real library lacks it.
        #[allow(non_snake_case)]
        pub struct RealFunctions {
            #(#table_fields,)*
        }

        impl RealFunctions {
            fn resolve(lookup: &mut dyn FnMut(&::core::ffi::CStr) -> *mut ::core::ffi::c_void) -> RealFunctions {
                RealFunctions { #(#table_resolves,)* }
            }
        }

        static REAL_FUNCTIONS: ::std::sync::OnceLock<RealFunctions> = ::std::sync::OnceLock::new();

        /// The table, loading the real NCCL on first use. A call nested inside the shim never
        /// waits for the loading (that could be this thread's own): it gets `None` until it's done.
        #[inline]
        pub fn real_functions() -> ::core::option::Option<&'static RealFunctions> {
            match REAL_FUNCTIONS.get() {
                Some(table) => Some(table),
                None if #runtime::Reentry::depth() <= 1 => {
                    Some(REAL_FUNCTIONS.get_or_init(|| RealFunctions::resolve(&mut #runtime::real_symbol)))
                }
                None => None,
            }
        }

        #(#forwarders)*

        /// Calls the real NCCL's operation `call.kind` with the arguments `call` describes, where
        /// it takes no argument `call` does not hold (`None` otherwise): a call the core queued
        /// in a group, sent to NCCL after all, needs no forwarder of its own.
        ///
        /// # Safety
        /// `call` describes a call of its operation as its export received it.
        #[allow(unreachable_patterns)]
        pub unsafe fn forward_described(call: &#call) -> ::core::option::Option<#ffi::ncclResult_t> {
            match call.kind as usize {
                #(#described_arms)*
                _ => None,
            }
        }

        /// Whether the real NCCL has the operation `kind` (its index in `OPERATIONS`): a newer
        /// spec's operation is missing from an older NCCL, whose calls the stub answers.
        pub fn has_operation(kind: u8) -> bool {
            let Some(table) = real_functions() else {
                return false;
            };
            match kind as usize {
                #(#operation_arms)*
                _ => false,
            }
        }

        /// Whether `forward_described` forwards calls of the operation `kind`.
        pub fn forwards_described(kind: u8) -> bool {
            [#(#described_kinds),*].contains(&(kind as usize))
        }

        /// How the exports' calls are served. Every operation on a communicator's stream comes to
        /// `operation`, described; every other function to a method of its own. Hand-written code
        /// claims what it serves by overriding them; the defaults forward.
        #[allow(non_snake_case, clippy::too_many_arguments, clippy::missing_safety_doc)]
        pub trait Route {
            /// An operation (`ffi::OPERATIONS[call.kind]`) as `call` describes it; `forward` calls
            /// the real NCCL's function with the caller's arguments.
            #[inline]
            fn operation<F: FnOnce() -> #ffi::ncclResult_t + 'static>(call: &#call, forward: F) -> #ffi::ncclResult_t {
                let _ = call;
                forward()
            }

            /// Runs before a caller's call goes to the real NCCL: in the default methods, and in
            /// the `forward` of an operation. Hand-written methods call it where they forward.
            #[inline]
            fn before_forward() {}

            #(#route_methods)*
        }
    }
}

/// The C exports, `ncclX` and `pncclX` for every function.
pub fn exports(spec: &Spec, paths: &Paths) -> TokenStream {
    let operations = operations(spec);
    let exports = spec.functions.iter().flat_map(|f| {
        let profiling = format_ident!("p{}", f.ident);
        let kind = operations.iter().position(|o| o.name == f.name);
        [
            export(f, &f.ident, kind, paths),
            export(f, &profiling, kind, paths),
        ]
    });
    let ffi = &paths.ffi;
    quote! {
        #[allow(unused_imports)]
        use #ffi::*;
        #(#exports)*
    }
}

/// The functions the spec reads as operations on a communicator's stream, in its order.
fn operations(spec: &Spec) -> Vec<&Function> {
    spec.functions
        .iter()
        .filter(|f| f.operation().is_some())
        .collect()
}

fn params(f: &Function) -> Vec<TokenStream> {
    f.params
        .iter()
        .map(|p| {
            let (ident, ty) = (&p.ident, &p.ty);
            quote! { #ident: #ty }
        })
        .collect()
}

fn args(f: &Function) -> Vec<&syn::Ident> {
    f.params.iter().map(|p| &p.ident).collect()
}

fn ret(f: &Function) -> TokenStream {
    match f.returns.ty() {
        Some(ty) => quote! { -> #ty },
        None => quote! {},
    }
}

fn pointer_type(f: &Function) -> TokenStream {
    let types = f.params.iter().map(|p| &p.ty);
    let ret = ret(f);
    quote! { unsafe extern "C" fn(#(#types),*) #ret }
}

/// What a function returns when it can't be served: the failure's code, its message, nothing, or
/// zeroes, by what the function returns.
fn failure_value(f: &Function, failure: TokenStream) -> TokenStream {
    match &f.returns {
        Returns::Nothing => quote! { { let _ = #failure; } },
        Returns::Result(_) => quote! { #failure.code },
        Returns::Message(_) => quote! { #failure.message },
        Returns::Value(ty) => quote! {{
            let _ = #failure;
            // SAFETY: values returned by value from the C API are plain C data, valid when zeroed.
            unsafe { ::core::mem::zeroed::<#ty>() }
        }},
    }
}

/// `forward_described`'s arm for the operation `f` (`kind`, its index in `OPERATIONS`): its
/// arguments from a `Call`'s fields, where every parameter of it is one a `Call` holds.
fn described_arm(kind: usize, f: &Function) -> Option<TokenStream> {
    let o = f.operation()?;
    let is = |p: Option<&syn::Ident>, ident: &syn::Ident| p == Some(ident);
    let args = f
        .params
        .iter()
        .map(|p| {
            let ident = &p.ident;
            // An in-place broadcast's one buffer (`buff`) is both `send` and `recv`.
            Some(if is(o.recv.map(|q| &q.ident), ident) {
                quote! { call.recv as _ }
            } else if is(o.send.map(|q| &q.ident), ident) {
                quote! { call.send as _ }
            } else if *ident == o.comm.ident {
                quote! { call.comm }
            } else if *ident == o.stream.ident {
                quote! { call.stream }
            } else if *ident == o.count.ident {
                quote! { call.count as _ }
            } else if *ident == o.datatype.ident {
                quote! { call.datatype as _ }
            } else if is(o.op.map(|q| &q.ident), ident) {
                quote! { call.op? as _ }
            } else if is(o.root.map(|q| &q.ident), ident) {
                quote! { call.root? as _ }
            } else {
                return None;
            })
        })
        .collect::<Option<Vec<_>>>()?;
    let ident = &f.ident;
    Some(quote! {
        // SAFETY: the arguments the call's export received, as `call` describes them.
        #kind => Some(unsafe { #ident(#(#args),*) }),
    })
}

fn forwarder(f: &Function, runtime: &syn::Path) -> TokenStream {
    let (ident, params, args, ret) = (&f.ident, params(f), args(f), ret(f));
    let name = &f.name;
    let missing = failure_value(f, quote! { #runtime::missing_function(#name) });
    let call = match &f.returns {
        // A failure of the real NCCL is newer than any message of ours.
        Returns::Result(_) => quote! {{
            let result = unsafe { function(#(#args),*) };
            if result != ncclSuccess && result != ncclInProgress {
                #runtime::real_call_failed();
            }
            result
        }},
        _ => quote! { unsafe { function(#(#args),*) } },
    };
    quote! {
        /// Forwards to the real NCCL's function; the stub answers where it lacks it.
        #[inline]
        #[allow(non_snake_case, clippy::too_many_arguments, clippy::missing_safety_doc)]
        pub unsafe fn #ident(#(#params),*) #ret {
            match real_functions().and_then(|table| table.#ident) {
                // SAFETY: `function` is the real NCCL's own, of this signature; arguments pass unchanged.
                Some(function) => #call,
                None => #missing,
            }
        }
    }
}

/// `kind`: the function's index in `OPERATIONS`, for an operation on a communicator's stream,
/// whose every outermost call is described to the recorder's `operation_done` once it returns.
fn export(
    f: &Function,
    export_name: &syn::Ident,
    kind: Option<usize>,
    paths: &Paths,
) -> TokenStream {
    let Paths {
        call,
        real,
        router,
        runtime,
        recorder,
        ..
    } = paths;
    let (ident, params, args, ret) = (&f.ident, params(f), args(f), ret(f));
    let name = export_name.to_string();
    let panicked = failure_value(f, quote! { #runtime::panicked(#name) });
    let routed = quote! {
        // SAFETY: the C caller's arguments, passed on unchanged.
        unsafe { <#router as #real::Route>::#ident(#(#args),*) }
    };
    let routed = match (kind, f.operation()) {
        (Some(kind), Some(o)) => {
            let (comm, count, datatype, stream) = (
                &o.comm.ident,
                &o.count.ident,
                &o.datatype.ident,
                &o.stream.ident,
            );
            let send = o.send.map_or(quote! { ::core::ptr::null() }, |p| {
                let p = &p.ident;
                quote! { #p as *const ::core::ffi::c_void }
            });
            let recv = o.recv.map_or(quote! { ::core::ptr::null_mut() }, |p| {
                let p = &p.ident;
                quote! { #p as *mut ::core::ffi::c_void }
            });
            let op = o.op.map_or(quote! { None }, |p| {
                let p = &p.ident;
                quote! { Some(#p as u32) }
            });
            let root = o.root.map_or(quote! { None }, |p| {
                let p = &p.ident;
                quote! { Some(#p as i32) }
            });
            quote! {{
                let call = #call {
                    kind: #kind as u8,
                    comm: #comm,
                    send: #send,
                    recv: #recv,
                    count: #count as usize,
                    datatype: #datatype as u32,
                    op: #op,
                    root: #root,
                    stream: #stream,
                };
                let forward = move || {
                    <#router as #real::Route>::before_forward();
                    // SAFETY: the C caller's arguments, passed on unchanged.
                    unsafe { #real::#ident(#(#args),*) }
                };
                let result = <#router as #real::Route>::operation(&call, forward);
                #recorder::operation_done(&call, result);
                result
            }}
        }
        _ => routed,
    };
    quote! {
        #[unsafe(no_mangle)]
        #[allow(non_snake_case, clippy::too_many_arguments, clippy::missing_safety_doc)]
        pub unsafe extern "C" fn #export_name(#(#params),*) #ret {
            let outcome = ::std::panic::catch_unwind(::std::panic::AssertUnwindSafe(|| {
                let inside = #runtime::Reentry::enter();
                if inside.outermost() {
                    #routed
                } else {
                    // Already inside the shim on this thread: straight to the real NCCL.
                    // SAFETY: as above.
                    unsafe { #real::#ident(#(#args),*) }
                }
            }));
            match outcome {
                Ok(value) => value,
                Err(_) => #panicked,
            }
        }
    }
}
