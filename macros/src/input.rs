use std::path::PathBuf;

use ncclshim_syntax::Spec;
use syn::parse::{Parse, ParseStream};

/// What `nccl_api!` is given.
pub struct ApiInput {
    pub specs_env: syn::LitStr,
    pub router: syn::Path,
    pub runtime: syn::Path,
}

impl Parse for ApiInput {
    fn parse(input: ParseStream) -> syn::Result<Self> {
        let mut specs_env = None;
        let mut router = None;
        let mut runtime = None;
        while !input.is_empty() {
            let key: syn::Ident = input.parse()?;
            input.parse::<syn::Token![=]>()?;
            match key.to_string().as_str() {
                "specs_env" => specs_env = Some(input.parse()?),
                "router" => router = Some(input.parse()?),
                "runtime" => runtime = Some(input.parse()?),
                _ => {
                    return Err(syn::Error::new(
                        key.span(),
                        "expected specs_env, router or runtime",
                    ));
                }
            }
            if !input.is_empty() {
                input.parse::<syn::Token![,]>()?;
            }
        }
        let missing =
            |what: &str| syn::Error::new(input.span(), format!("nccl_api! needs `{what} = ...`"));
        Ok(ApiInput {
            specs_env: specs_env.ok_or_else(|| missing("specs_env"))?,
            router: router.ok_or_else(|| missing("router"))?,
            runtime: runtime.ok_or_else(|| missing("runtime"))?,
        })
    }
}

impl ApiInput {
    /// Parses every spec the variable names and merges them into one.
    pub fn load_spec(&self) -> Result<(Spec, Vec<PathBuf>), String> {
        let var = self.specs_env.value();
        let list = std::env::var(&var).map_err(|_| {
            format!("environment variable {var} is not set: the build script names the spec files")
        })?;
        let paths: Vec<PathBuf> = list
            .split(':')
            .filter(|p| !p.is_empty())
            .map(PathBuf::from)
            .collect();
        let specs = paths
            .iter()
            .map(|p| ncclshim_syntax::parse_spec_file(p))
            .collect::<Result<Vec<_>, _>>()?;
        let spec =
            ncclshim_syntax::union_of(&specs).ok_or_else(|| format!("{var} names no spec file"))?;
        Ok((spec, paths))
    }
}
