//! Which operations of this build's spec are the core's collectives: worked out when the crate is
//! compiled, from the table of collectives (types.rs) and the spec's operations, so that a call
//! asks one array.

use super::types::Collective;
use crate::ffi::OPERATIONS;

/// The collective whose call an operation of `kind` (its index in `OPERATIONS`) makes, if the
/// core has it: every other operation forwards.
#[inline]
pub fn collective_of(kind: u8) -> Option<Collective> {
    BY_OPERATION.get(kind as usize).copied().flatten()
}

/// The collective of each operation of this build's spec, by its index in `ffi::OPERATIONS`:
/// worked out when the crate is compiled.
const BY_OPERATION: [Option<Collective>; OPERATIONS.len()] = {
    const fn same(a: &str, b: &str) -> bool {
        let (a, b) = (a.as_bytes(), b.as_bytes());
        if a.len() != b.len() {
            return false;
        }
        let mut i = 0;
        while i < a.len() {
            if a[i] != b[i] {
                return false;
            }
            i += 1;
        }
        true
    }
    let mut table = [None; OPERATIONS.len()];
    let mut kind = 0;
    while kind < OPERATIONS.len() {
        let mut c = 0;
        while c < Collective::ALL.len() {
            let functions = Collective::ALL[c].functions();
            let mut f = 0;
            while f < functions.len() {
                if same(functions[f], OPERATIONS[kind]) {
                    table[kind] = Some(Collective::ALL[c]);
                }
                f += 1;
            }
            c += 1;
        }
        kind += 1;
    }
    table
};

#[cfg(test)]
mod tests {
    use super::*;

    /// Every operation the core takes is one the real NCCL can be called with from its
    /// description alone: a call the core queues in a group keeps no forwarder of its own.
    #[test]
    fn every_operation_the_core_takes_forwards_from_its_description() {
        for (kind, function) in OPERATIONS.iter().enumerate() {
            if collective_of(kind as u8).is_some() {
                assert!(crate::real::forwards_described(kind as u8), "{function}");
            }
        }
    }

    #[test]
    fn each_operation_is_the_collective_that_names_its_function_or_none() {
        for (kind, function) in OPERATIONS.iter().enumerate() {
            let named = Collective::ALL
                .into_iter()
                .find(|c| c.functions().contains(function));
            assert_eq!(collective_of(kind as u8), named, "{function}");
        }
        let all_reduce = OPERATIONS
            .iter()
            .position(|f| *f == "ncclAllReduce")
            .unwrap();
        assert_eq!(collective_of(all_reduce as u8), Some(Collective::AllReduce));
        let kind = |function: &str| OPERATIONS.iter().position(|f| *f == function);
        let bcast = kind("ncclBcast").unwrap() as u8;
        assert_eq!(
            collective_of(bcast),
            Some(Collective::Broadcast),
            "in place"
        );
        for forwards in ["ncclSend", "ncclRecv"] {
            assert_eq!(
                collective_of(kind(forwards).unwrap() as u8),
                None,
                "{forwards}"
            );
        }
        // Variants the core has not weighed, where this build's spec has them (2.30 on).
        for variant in [
            "ncclAllReduceConfig",
            "ncclAllGatherConfig",
            "ncclBroadcastConfig",
        ] {
            if let Some(k) = kind(variant) {
                assert_eq!(collective_of(k as u8), None, "{variant}");
            }
        }
        assert_eq!(collective_of(u8::MAX), None);
    }
}
