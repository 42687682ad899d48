//! What a rank opens of its peers once they agreed: their buffers (mapped through CUDA IPC or
//! peer access), zero-copy between processes, and the facts every rank computes alike.

use std::sync::Arc;

use super::agreement::{RECORD_BYTES, Record, agree};
use super::exchange::Candidate;
use super::identity;
use crate::core::comm::{Parts, Reach};
use crate::core::cuda::{Device, IpcMapping};
use crate::core::measured::{self, Limit, Measured};
use crate::core::policy::{self, CommFacts};
use crate::core::zero_copy::{DeviceMemory, Service, ZeroCopy};
use crate::log::log_info;

/// What a rank opened of its peers' buffers, for a yes verdict. Unmapped when dropped: on every
/// path where the core does not come on. Where ranks are in several processes, `reach` holds
/// this rank's side of their zero-copy if it could join (used only if every rank could).
pub(super) struct Mapped {
    pub(super) reach: Reach,
    /// What every rank computes alike from the gathered records.
    pub(super) facts: CommFacts,
}

/// The limits every rank's GPU has (ranks that differ in blocking, which would follow their
/// windows differently, core/windows.rs, decline: `agree`).
fn measured_of(records: &[Record]) -> Measured {
    measured::least_measured(records.iter().map(|r| Measured {
        any: r.measured.map(Limit::from_words),
        plain: r.measured_plain.map(Limit::from_words32),
    }))
}

/// This rank's verdict: can it reach every peer's buffer? Peers in this process by their device
/// pointers (with peer access), others through CUDA IPC.
pub(super) fn map_peers(candidate: &Candidate, gathered: &[u8]) -> Result<Mapped, String> {
    if let Some(why) = &candidate.why_not {
        return Err(why.clone());
    }
    let parts = candidate.parts.as_ref().ok_or("no local set-up")?;
    let records: Vec<Record> = gathered
        .chunks(RECORD_BYTES)
        .map(Record::from_bytes)
        .collect();
    agree(&records, candidate.rank)?;
    let me = &records[candidate.rank];
    let _context = parts.device.enter().map_err(|e| e.to_string())?;
    let mut mapped = Mapped {
        reach: Reach {
            bases: Vec::new(),
            opened: Vec::new(),
            peer_devices: Vec::new(),
            zero_copy: None,
        },
        facts: CommFacts {
            nranks: records.len(),
            single_process: records.iter().all(|r| r.process == me.process),
            zero_copy: false,
            resident_blocks: records.iter().map(|r| r.resident_blocks).min().unwrap_or(0),
            compute_capability: records
                .iter()
                .map(|r| r.compute_capability)
                .min()
                .unwrap_or(0),
            measured: measured_of(&records),
            max_blocks: (records.iter())
                .filter_map(|r| (r.cta_bound != 0).then_some(r.cta_bound))
                .min()
                .unwrap_or(u32::MAX),
            copy_engines: records.iter().any(|r| r.copy_engines != 0),
        },
    };
    for (r, record) in records.iter().enumerate() {
        let base = if r == candidate.rank {
            parts.buffer.pointer
        } else if record.process == me.process {
            let peer = Device::open(record.device).map_err(|e| e.to_string())?;
            if !parts
                .device
                .can_access_peer(&peer)
                .map_err(|e| e.to_string())?
            {
                return Err(format!(
                    "no peer access from GPU {} to GPU {}",
                    parts.device.ordinal, peer.ordinal
                ));
            }
            parts
                .device
                .enable_peer_access(&peer)
                .map_err(|e| e.to_string())?;
            mapped.reach.peer_devices.push(peer.ordinal);
            record.buffer
        } else {
            let mapping = IpcMapping::open(parts.device, &record.ipc)
                .map_err(|e| format!("rank {r}'s buffer: {e}"))?;
            let pointer = mapping.pointer;
            mapped.reach.opened.push(mapping);
            pointer
        };
        mapped.reach.bases.push(base);
    }
    if !mapped.facts.single_process && policy::settings().zero_copy {
        mapped.reach.zero_copy = if a_process_holds_several(&records) {
            log_info!(
                "comm {:p} rank {}: no zero-copy (a process holds several of its ranks): its large all-reduces go through the core's staging",
                candidate.comm,
                candidate.rank
            );
            None
        } else {
            join_zero_copy(candidate, parts, &records)
        };
    }
    Ok(mapped)
}

/// Whether a process holds more than one of the ranks. Zero-copy's messages name a
/// communicator and a process, not a rank, so such a process could not tell which of its ranks
/// one is for: every rank then keeps to the staging (the same answer on every rank, from the
/// records all have).
fn a_process_holds_several(records: &[Record]) -> bool {
    let mut processes: Vec<u64> = records.iter().map(|r| r.process).collect();
    processes.sort_unstable();
    processes.windows(2).any(|w| w[0] == w[1])
}

/// This rank's side of zero-copy for a communicator of several processes, named after rank 0's
/// nonce; `None` where this process cannot serve it (said in the log).
pub(super) fn join_zero_copy(
    candidate: &Candidate,
    parts: &Parts,
    records: &[Record],
) -> Option<Arc<ZeroCopy>> {
    match Service::of_process(identity::process()) {
        Ok(service) => Some(ZeroCopy::join(
            service,
            records[0].nonce,
            candidate.rank,
            records.iter().map(|r| r.process).collect(),
            Box::new(DeviceMemory(parts.device)),
        )),
        Err(why) => {
            log_info!(
                "comm {:p} rank {}: no zero-copy ({why}): its large all-reduces go through the core's staging",
                candidate.comm,
                candidate.rank
            );
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::types::Collective;

    /// Zero-copy needs a process per rank: a communicator of four ranks in two processes of two
    /// (`mpirun -np 2` with `-g 2`) keeps to the staging, on every rank.
    #[test]
    fn a_process_that_holds_two_ranks_keeps_zero_copy_off() {
        let of = |processes: &[u64]| {
            let records: Vec<Record> = (processes.iter())
                .map(|&process| {
                    let mut r = Record::not_ready();
                    r.process = process;
                    r
                })
                .collect();
            a_process_holds_several(&records)
        };
        assert!(!of(&[7, 9]));
        assert!(!of(&[7, 9, 11, 13]));
        assert!(of(&[7, 7, 9, 9]));
        assert!(of(&[9, 7, 9]));
    }

    /// Ranks' limits meet; ranks that differ in blocking never get this far.
    #[test]
    fn every_rank_takes_the_limits_all_have_and_ranks_that_differ_in_blocking_decline() {
        let gather = Collective::AllGather as usize;
        let record = |blocking: u32, plain: usize| {
            let mut r = Record::not_ready();
            r.ready = 1;
            r.blocking = blocking;
            r.measured[gather] = Limit::up_to(2 << 20).to_words();
            r.measured_plain[gather] = Limit::up_to(plain).to_words32();
            r
        };
        let both = measured_of(&[record(1, 256 << 20), record(1, 64 << 20)]);
        assert_eq!(both.plain[gather], Limit::up_to(64 << 20));
        assert_eq!(both.any[gather], Limit::up_to(2 << 20));
        let why = agree(&[record(1, 1 << 20), record(0, 1 << 20)], 0).unwrap_err();
        assert!(
            why.contains("not all blocking nor all nonblocking"),
            "{why}"
        );
    }
}
