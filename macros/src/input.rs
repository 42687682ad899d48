use std::collections::BTreeMap;
use std::path::PathBuf;

use ncclshim_syntax::Spec;
use syn::parse::{Parse, ParseStream};

/// What a macro is given: `key = value` pairs, the spec variable's name a string and every other
/// value a path.
pub struct Input {
    pub specs_env: syn::LitStr,
    paths: BTreeMap<String, syn::Path>,
}

impl Parse for Input {
    fn parse(input: ParseStream) -> syn::Result<Self> {
        let mut specs_env = None;
        let mut paths = BTreeMap::new();
        while !input.is_empty() {
            let key: syn::Ident = input.parse()?;
            input.parse::<syn::Token![=]>()?;
            match key.to_string().as_str() {
                "specs_env" => specs_env = Some(input.parse()?),
                name => {
                    paths.insert(name.to_string(), input.parse()?);
                }
            }
            if !input.is_empty() {
                input.parse::<syn::Token![,]>()?;
            }
        }
        let specs_env = specs_env
            .ok_or_else(|| syn::Error::new(input.span(), "needs `specs_env = \"VAR\"`"))?;
        Ok(Input { specs_env, paths })
    }
}

impl Input {
    /// The paths named `keys`, in their order; an error naming what is missing or unknown.
    pub fn paths<const N: usize>(&self, keys: [&str; N]) -> syn::Result<[syn::Path; N]> {
        if let Some(unknown) = self.paths.keys().find(|k| !keys.contains(&k.as_str())) {
            return Err(syn::Error::new(
                self.specs_env.span(),
                format!(
                    "unknown key `{unknown}`: expected specs_env, {}",
                    keys.join(", ")
                ),
            ));
        }
        let mut found = Vec::with_capacity(N);
        for key in keys {
            let path = self.paths.get(key).ok_or_else(|| {
                syn::Error::new(self.specs_env.span(), format!("needs `{key} = ...`"))
            })?;
            found.push(path.clone());
        }
        Ok(found.try_into().unwrap_or_else(|_| unreachable!("N paths")))
    }

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
