use std::fmt;

/// One NCCL release, as `NCCL_MAJOR.NCCL_MINOR.NCCL_PATCH`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Version {
    pub major: u32,
    pub minor: u32,
    pub patch: u32,
}

impl Version {
    /// `NCCL_VERSION_CODE` as NCCL computes it (the encoding changed after 2.8).
    pub fn code(self) -> u32 {
        if self.major <= 2 && self.minor <= 8 {
            self.major * 1000 + self.minor * 100 + self.patch
        } else {
            self.major * 10000 + self.minor * 100 + self.patch
        }
    }

    /// Parses "2.27.7".
    pub fn parse(text: &str) -> Option<Version> {
        let mut parts = text.trim().split('.').map(|p| p.parse::<u32>().ok());
        let v = Version {
            major: parts.next()??,
            minor: parts.next()??,
            patch: parts.next()??,
        };
        parts.next().is_none().then_some(v)
    }
}

impl fmt::Display for Version {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}.{}", self.major, self.minor, self.patch)
    }
}

/// One spec file: everything bindgen emitted from one `nccl.h`.
#[derive(Clone)]
pub struct Spec {
    pub version: Version,
    /// Every item that is not a function declaration (type aliases, structs, constants, layout
    /// checks), kept verbatim so that the macros can re-emit them.
    pub items: Vec<syn::Item>,
    /// The `ncclX` functions, in the order of the spec. Their `pncclX` twins are implied.
    pub functions: Vec<Function>,
}

impl Spec {
    pub fn function(&self, name: &str) -> Option<&Function> {
        self.functions.iter().find(|f| f.name == name)
    }
}

/// One exported function, e.g. `ncclAllReduce`.
#[derive(Clone)]
pub struct Function {
    pub name: String,
    pub ident: syn::Ident,
    pub params: Vec<Param>,
    pub returns: Returns,
}

impl Function {
    /// The C-like signature, for people: `ncclResult_t ncclGetVersion(int* version)` style,
    /// but with the spec's Rust types.
    pub fn signature(&self) -> String {
        let params: Vec<String> = self
            .params
            .iter()
            .map(|p| format!("{}: {}", p.name, crate::type_to_string(&p.ty)))
            .collect();
        format!("{}({}) -> {}", self.name, params.join(", "), self.returns)
    }
}

#[derive(Clone)]
pub struct Param {
    pub name: String,
    pub ident: syn::Ident,
    pub ty: syn::Type,
}

/// What a function gives back; this decides what its stub returns.
#[derive(Clone)]
pub enum Returns {
    /// `void`
    Nothing,
    /// `ncclResult_t`: stubs return an error code.
    Result(syn::Type),
    /// `const char*`: stubs return a message, never NULL.
    Message(syn::Type),
    /// Anything else (an `int`, a struct by value): stubs return zeroes.
    Value(syn::Type),
}

impl Returns {
    pub fn ty(&self) -> Option<&syn::Type> {
        match self {
            Returns::Nothing => None,
            Returns::Result(t) | Returns::Message(t) | Returns::Value(t) => Some(t),
        }
    }
}

impl fmt::Display for Returns {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.ty() {
            None => f.write_str("()"),
            Some(t) => f.write_str(&crate::type_to_string(t)),
        }
    }
}
