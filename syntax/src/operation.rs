//! Which functions are operations on a communicator's stream (collectives, sends and receives):
//! those the shim describes call by call (counts, trace, flight recorder). Read from the
//! parameters, never from a list of names: a function with a communicator `comm`, a stream
//! `stream`, an element type `datatype` and an element count (`count`, `sendcount`,
//! `recvcount`: a `usize` whose name ends in `count`), returning `ncclResult_t`. Its buffers: `sendbuff` and `recvbuff`,
//! or one `buff` that is both (an in-place broadcast).

use crate::model::{Function, Param, Returns};
use crate::types::type_to_string;

/// The parameters that describe one call of an operation.
pub struct OperationParams<'a> {
    pub comm: &'a Param,
    /// The buffer read, where the operation has one (not a receive).
    pub send: Option<&'a Param>,
    /// The buffer written, where the operation has one (not a send).
    pub recv: Option<&'a Param>,
    pub stream: &'a Param,
    pub datatype: &'a Param,
    pub count: &'a Param,
    /// The reduction, for reducing operations.
    pub op: Option<&'a Param>,
    /// The root of a rooted collective, or the peer of a send or receive.
    pub root: Option<&'a Param>,
}

impl Function {
    /// This function's operation parameters, if it is an operation on a communicator's stream.
    pub fn operation(&self) -> Option<OperationParams<'_>> {
        if !matches!(self.returns, Returns::Result(_)) {
            return None;
        }
        let named = |name: &str| self.params.iter().find(|p| p.name == name);
        let typed = |p: &&Param, ty: &str| type_to_string(&p.ty).ends_with(ty);
        Some(OperationParams {
            comm: named("comm").filter(|p| typed(p, "ncclComm_t"))?,
            send: named("sendbuff").or_else(|| named("buff")),
            recv: named("recvbuff").or_else(|| named("buff")),
            stream: named("stream").filter(|p| typed(p, "cudaStream_t"))?,
            datatype: named("datatype").filter(|p| typed(p, "ncclDataType_t"))?,
            count: self
                .params
                .iter()
                .find(|p| p.name.ends_with("count") && type_to_string(&p.ty) == "usize")?,
            op: named("op").filter(|p| typed(p, "ncclRedOp_t")),
            root: named("root").or_else(|| named("peer")),
        })
    }
}

#[cfg(test)]
mod tests {
    use crate::parse_spec;

    const SPEC: &str = r#"
pub const NCCL_MAJOR: u32 = 2;
pub const NCCL_MINOR: u32 = 27;
pub const NCCL_PATCH: u32 = 7;
pub type ncclComm_t = *mut ncclComm;
pub type cudaStream_t = *mut CUstream_st;
pub type ncclDataType_t = ::std::os::raw::c_uint;
pub type ncclRedOp_t = ::std::os::raw::c_uint;
pub type ncclResult_t = ::std::os::raw::c_uint;
unsafe extern "C" {
    pub fn ncclGetVersion(version: *mut ::std::os::raw::c_int) -> ncclResult_t;
}
unsafe extern "C" {
    pub fn ncclReduce(
        sendbuff: *const ::std::os::raw::c_void,
        recvbuff: *mut ::std::os::raw::c_void,
        count: usize,
        datatype: ncclDataType_t,
        op: ncclRedOp_t,
        root: ::std::os::raw::c_int,
        comm: ncclComm_t,
        stream: cudaStream_t,
    ) -> ncclResult_t;
}
unsafe extern "C" {
    pub fn ncclRecv(
        recvbuff: *mut ::std::os::raw::c_void,
        count: usize,
        datatype: ncclDataType_t,
        peer: ::std::os::raw::c_int,
        comm: ncclComm_t,
        stream: cudaStream_t,
    ) -> ncclResult_t;
}
unsafe extern "C" {
    pub fn ncclAllGather(
        sendbuff: *const ::std::os::raw::c_void,
        recvbuff: *mut ::std::os::raw::c_void,
        sendcount: usize,
        datatype: ncclDataType_t,
        comm: ncclComm_t,
        stream: cudaStream_t,
    ) -> ncclResult_t;
}
unsafe extern "C" {
    pub fn ncclCommCount(comm: ncclComm_t, count: *mut ::std::os::raw::c_int) -> ncclResult_t;
}
"#;

    #[test]
    fn buffers_are_read_from_their_parameters() {
        let spec = parse_spec(SPEC).unwrap();
        let buffers: Vec<(Option<String>, Option<String>)> = spec
            .functions
            .iter()
            .filter_map(|f| {
                let o = f.operation()?;
                Some((
                    o.send.map(|p| p.name.clone()),
                    o.recv.map(|p| p.name.clone()),
                ))
            })
            .collect();
        let named = |n: Option<&str>| n.map(String::from);
        assert_eq!(
            buffers,
            vec![
                (named(Some("sendbuff")), named(Some("recvbuff"))),
                (None, named(Some("recvbuff"))),
                (named(Some("sendbuff")), named(Some("recvbuff"))),
            ]
        );
    }

    #[test]
    fn operations_are_read_from_their_parameters() {
        let spec = parse_spec(SPEC).unwrap();
        let described: Vec<(String, String, Option<String>, Option<String>)> = spec
            .functions
            .iter()
            .filter_map(|f| {
                let o = f.operation()?;
                Some((
                    f.name.clone(),
                    o.count.name.clone(),
                    o.op.map(|p| p.name.clone()),
                    o.root.map(|p| p.name.clone()),
                ))
            })
            .collect();
        let owned = |n: &str, c: &str, op: Option<&str>, root: Option<&str>| {
            (n.into(), c.into(), op.map(Into::into), root.map(Into::into))
        };
        assert_eq!(
            described,
            vec![
                owned("ncclReduce", "count", Some("op"), Some("root")),
                owned("ncclRecv", "count", None, Some("peer")),
                owned("ncclAllGather", "sendcount", None, None),
            ]
        );
    }
}
