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

/// One spec file: everything bindgen emitted from one release's headers.
#[derive(Clone)]
pub struct Spec {
    pub version: Version,
    /// Every item that is not a function declaration (type aliases, structs, constants, layout
    /// checks), kept verbatim so that the macros can re-emit them.
    pub items: Vec<syn::Item>,
    /// The `ncclX` functions, in the order of the spec. Their `pncclX` twins are implied.
    pub functions: Vec<Function>,
    /// The structs and unions of `items`, with their layout.
    pub records: Vec<Record>,
    /// The type aliases of `items` (`typedef`s).
    pub aliases: Vec<Alias>,
    /// The constants of `items`: `#define`d numbers and strings, and enum values.
    pub constants: Vec<Constant>,
}

impl Spec {
    pub fn function(&self, name: &str) -> Option<&Function> {
        self.functions.iter().find(|f| f.name == name)
    }

    pub fn record(&self, name: &str) -> Option<&Record> {
        self.records.iter().find(|r| r.name == name)
    }

    pub fn alias(&self, name: &str) -> Option<&Alias> {
        self.aliases.iter().find(|a| a.name == name)
    }

    pub fn constant(&self, name: &str) -> Option<&Constant> {
        self.constants.iter().find(|c| c.name == name)
    }

    /// The struct or union `name` stands for, following aliases: `ncclConfig_t` gives
    /// `ncclConfig_v22800`.
    pub fn resolve_record(&self, name: &str) -> Option<&Record> {
        self.alias_chain(name)
            .iter()
            .find_map(|name| self.record(name))
    }

    /// `name` and the names its aliases lead to, as long as each is a plain name (not a pointer):
    /// `ncclConfig_t`, `ncclConfig_v22800`.
    pub fn alias_chain(&self, name: &str) -> Vec<String> {
        let mut chain = vec![name.to_string()];
        while let Some(next) = self
            .alias(chain.last().unwrap())
            .and_then(Alias::target_name)
        {
            // A chain is short; the bound only guards against a cycle.
            if chain.contains(&next) || chain.len() > 16 {
                break;
            }
            chain.push(next);
        }
        chain
    }
}

/// A struct or union, with the layout bindgen's layout tests state.
#[derive(Clone, Debug, PartialEq)]
pub struct Record {
    pub name: String,
    pub kind: RecordKind,
    /// Empty when opaque.
    pub fields: Vec<Field>,
    /// Declared but never defined by the headers (a handle's target): no fields, no size.
    pub opaque: bool,
    /// In bytes.
    pub size: Option<usize>,
    pub align: Option<usize>,
}

impl Record {
    pub fn field(&self, name: &str) -> Option<&Field> {
        self.fields.iter().find(|f| f.name == name)
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RecordKind {
    Struct,
    Union,
}

impl fmt::Display for RecordKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            RecordKind::Struct => "struct",
            RecordKind::Union => "union",
        })
    }
}

#[derive(Clone, Debug, PartialEq)]
pub struct Field {
    pub name: String,
    pub ty: syn::Type,
    /// In bytes from the start of the record.
    pub offset: Option<usize>,
}

/// `pub type ncclConfig_t = ncclConfig_v22800;`
#[derive(Clone, Debug, PartialEq)]
pub struct Alias {
    pub name: String,
    pub target: syn::Type,
}

impl Alias {
    /// The name of the target when it is a plain name (not a pointer, not an array).
    pub fn target_name(&self) -> Option<String> {
        match &self.target {
            syn::Type::Path(p) if p.qself.is_none() => {
                p.path.segments.last().map(|s| s.ident.to_string())
            }
            _ => None,
        }
    }
}

/// `pub const ncclInvalidUsage: ncclResult_t = 5;`
#[derive(Clone, Debug, PartialEq)]
pub struct Constant {
    pub name: String,
    pub ty: syn::Type,
    /// The value as written in the spec, e.g. `5`, `- 1.0`, `b"\0"`.
    pub value: String,
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
