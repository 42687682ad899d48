//! Which functions are questions: NCCL answers them from what it already holds, and no group
//! changes the answer (`ncclGetVersion`, `ncclCommCount`, `ncclGetErrorString`). Read from the
//! signature, never from a list of names: a function that returns a message and takes at most a
//! communicator or a result code, or one that returns `ncclResult_t` and takes at most a
//! communicator and then one pointer to a number, which it writes. Anything else that takes a
//! communicator alone (`ncclCommFinalize`) acts on it, and a pointer to anything but a number
//! (a buffer, a handle, a struct) may be something NCCL keeps.

use crate::model::{Function, Param, Returns};
use crate::types::type_to_string;

/// The types a question writes its answer in.
const NUMBERS: &[&str] = &[
    "::std::os::raw::c_int",
    "::std::os::raw::c_uint",
    "::std::os::raw::c_long",
    "::std::os::raw::c_ulong",
    "i32",
    "u32",
    "i64",
    "u64",
    "usize",
    "ncclResult_t",
];

impl Function {
    /// Whether this function only asks NCCL something (see the module's comment).
    pub fn is_query(&self) -> bool {
        let ty = |p: &Param| type_to_string(&p.ty);
        let params: Vec<String> = self.params.iter().map(ty).collect();
        match &self.returns {
            Returns::Message(_) => match params.as_slice() {
                [] => true,
                [one] => one == "ncclComm_t" || one == "ncclResult_t",
                _ => false,
            },
            Returns::Result(_) => {
                let answer = match params.as_slice() {
                    [answer] => answer,
                    [comm, answer] if comm == "ncclComm_t" => answer,
                    _ => return false,
                };
                answer
                    .strip_prefix("*mut ")
                    .is_some_and(|number| NUMBERS.contains(&number))
            }
            Returns::Nothing | Returns::Value(_) => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::{parse_spec, parse_spec_file};

    const SPEC: &str = r#"
pub const NCCL_MAJOR: u32 = 2;
pub const NCCL_MINOR: u32 = 28;
pub const NCCL_PATCH: u32 = 9;
pub type ncclComm_t = *mut ncclComm;
pub type ncclResult_t = ::std::os::raw::c_uint;
pub type ncclCommMemStat_t = ::std::os::raw::c_uint;
unsafe extern "C" {
    pub fn ncclGetVersion(version: *mut ::std::os::raw::c_int) -> ncclResult_t;
}
unsafe extern "C" {
    pub fn ncclGetErrorString(result: ncclResult_t) -> *const ::std::os::raw::c_char;
}
unsafe extern "C" {
    pub fn ncclGetLastError(comm: ncclComm_t) -> *const ::std::os::raw::c_char;
}
unsafe extern "C" {
    pub fn ncclCommCount(comm: ncclComm_t, count: *mut ::std::os::raw::c_int) -> ncclResult_t;
}
unsafe extern "C" {
    pub fn ncclCommGetAsyncError(comm: ncclComm_t, asyncError: *mut ncclResult_t) -> ncclResult_t;
}
unsafe extern "C" {
    pub fn ncclCommFinalize(comm: ncclComm_t) -> ncclResult_t;
}
unsafe extern "C" {
    pub fn ncclCommDeregister(comm: ncclComm_t, handle: *mut ::std::os::raw::c_void) -> ncclResult_t;
}
unsafe extern "C" {
    pub fn ncclMemFree(ptr: *mut ::std::os::raw::c_void) -> ncclResult_t;
}
unsafe extern "C" {
    pub fn ncclCommInitAll(
        comm: *mut ncclComm_t,
        ndev: ::std::os::raw::c_int,
        devlist: *const ::std::os::raw::c_int,
    ) -> ncclResult_t;
}
unsafe extern "C" {
    pub fn ncclCommMemStats(comm: ncclComm_t, stat: ncclCommMemStat_t, value: *mut u64) -> ncclResult_t;
}
unsafe extern "C" {
    pub fn ncclCommRevoke(comm: ncclComm_t, revokeFlags: ::std::os::raw::c_int) -> ncclResult_t;
}
"#;

    #[test]
    fn questions_are_read_from_their_signatures() {
        let spec = parse_spec(SPEC).unwrap();
        let questions: Vec<&str> = spec
            .functions
            .iter()
            .filter(|f| f.is_query())
            .map(|f| f.name.as_str())
            .collect();
        // Not: what acts on a communicator, takes a buffer or a handle, makes communicators,
        // or asks with a selector of its own (held back: it could be new in kind).
        assert_eq!(
            questions,
            [
                "ncclGetVersion",
                "ncclGetErrorString",
                "ncclGetLastError",
                "ncclCommCount",
                "ncclCommGetAsyncError",
            ]
        );
    }

    /// Every committed spec's questions: a new NCCL function read as one fails this until a
    /// person has looked at what NCCL does with it inside a group.
    #[test]
    fn the_committed_specs_ask_only_known_questions() {
        const SEEN: &[&str] = &[
            "ncclGetVersion",
            "ncclGetErrorString",
            "ncclGetLastError",
            "ncclCommGetAsyncError",
            "ncclCommCount",
            "ncclCommCuDevice",
            "ncclCommUserRank",
        ];
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../spec");
        let mut specs = 0;
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.extension().is_none_or(|e| e != "rs") {
                continue;
            }
            let spec = parse_spec_file(&path).unwrap();
            let mut questions: Vec<&str> = spec
                .functions
                .iter()
                .filter(|f| f.is_query())
                .map(|f| f.name.as_str())
                .collect();
            questions.sort_unstable();
            let mut seen = SEEN.to_vec();
            seen.sort_unstable();
            assert_eq!(questions, seen, "{}", path.display());
            specs += 1;
        }
        assert!(specs >= 15, "only {specs} specs in {}", dir.display());
    }
}
