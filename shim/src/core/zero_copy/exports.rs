//! One rank's table of the allocations it offered its peers: a fixed number of positions, each
//! holding one allocation under a generation number, and where every peer mapped it. Pure
//! bookkeeping (no CUDA): the caller asks the driver, sends the messages and records uses.
//!
//! A position changes hands only when no kernel can still use what it held: its allocation is
//! gone (freed memory: `cudaFree` waits for the device), or the last call that used it is done
//! on this GPU (`Done`), which the direct kernel's closing barrier makes true of every peer's
//! kernel of that call too. A position used in a CUDA graph is kept (a replay may use it at any
//! time).

use std::time::Instant;

use super::super::policy::MAX_RANKS;

/// Positions per communicator and rank.
pub const CAPACITY: usize = 256;

/// How another process maps an allocation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Sharing {
    /// cudaMalloc memory: a CUDA IPC handle.
    LegacyIpc,
    /// cuMem memory made shareable: a file descriptor.
    PosixFd,
}

/// A device allocation as the driver names it: its range and its unique id (an allocation freed
/// and made again at the same address gets another id), and the range reserved around it
/// (start, size), which cuMem allocations may share side by side.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Allocation {
    pub base: u64,
    pub size: u64,
    pub id: u64,
    pub sharing: Sharing,
    pub reservation: (u64, u64),
}

impl Allocation {
    #[cfg(test)]
    pub fn holds(&self, pointer: u64, bytes: u64) -> bool {
        pointer >= self.base
            && pointer
                .checked_add(bytes)
                .is_some_and(|end| end <= self.base + self.size)
    }
}

/// Whether the work a marker was put behind has completed (a CUDA event, in the core).
pub trait Done {
    fn done(&self) -> bool;
}

impl<T: Done + ?Sized> Done for std::sync::Arc<T> {
    fn done(&self) -> bool {
        (**self).done()
    }
}

struct Export<E> {
    allocation: Allocation,
    generation: u64,
    /// Each peer's address of the allocation once it answered (0: it could not map it).
    mapped: [Option<u64>; MAX_RANKS],
    /// Used by a captured call: kept for good.
    pinned: bool,
    last_use: Option<E>,
    /// When it was last used, for choosing what to replace.
    tick: u64,
    offered_at: Instant,
}

/// Where an allocation stands after `place`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Placement {
    /// Offered before (its peers may not all have answered yet).
    Known { position: usize, generation: u64 },
    /// Newly offered at `position`: the caller sends it to every peer.
    New { position: usize, generation: u64 },
    /// No position can be had now.
    Full,
}

/// A position whose allocation is gone, for the peers to unmap.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Retired {
    pub position: usize,
    pub generation: u64,
}

pub struct Exports<E> {
    rank: usize,
    nranks: usize,
    slots: Vec<Option<Export<E>>>,
    last_generation: u64,
    tick: u64,
    /// Positions placed at this tick or later may be in a call that is not queued yet (its
    /// uses not marked): never replaced.
    unqueued_from: u64,
}

impl<E: Done> Exports<E> {
    pub fn new(rank: usize, nranks: usize) -> Exports<E> {
        Exports {
            rank,
            nranks,
            slots: (0..CAPACITY).map(|_| None).collect(),
            last_generation: 0,
            tick: 0,
            unqueued_from: 0,
        }
    }

    /// The position of `allocation`, offering it anew where needed. Before a new offer, those
    /// made before whose allocation is gone (`alive` says no) are retired into `retired`: a
    /// peer's mapping keeps the memory of a freed allocation from being used again, so it is
    /// let go as soon as it is seen (new offers are rare, so is the look).
    pub fn place(
        &mut self,
        allocation: Allocation,
        alive: impl Fn(&Allocation) -> bool,
        retired: &mut Vec<Retired>,
    ) -> Placement {
        self.tick += 1;
        let same_base = self.slots.iter().position(|slot| {
            slot.as_ref()
                .is_some_and(|e| e.allocation.base == allocation.base)
        });
        if let Some(position) = same_base {
            let export = self.slots[position].as_mut().unwrap();
            if export.allocation == allocation {
                export.tick = self.tick;
                return Placement::Known {
                    position,
                    generation: export.generation,
                };
            }
            // Freed and made again at the same address: the old one is gone.
            return self.offer(position, allocation);
        }
        for (position, slot) in self.slots.iter_mut().enumerate() {
            if let Some(export) = slot
                && !alive(&export.allocation)
            {
                retired.push(Retired {
                    position,
                    generation: export.generation,
                });
                *slot = None;
            }
        }
        if let Some(position) = self.slots.iter().position(Option::is_none) {
            return self.offer(position, allocation);
        }
        // The least recently used one that no graph holds, no kernel still uses and no call
        // about to be queued uses.
        let replaceable = self
            .slots
            .iter()
            .enumerate()
            .filter_map(|(position, slot)| slot.as_ref().map(|e| (position, e)))
            .filter(|(_, e)| !e.pinned && e.last_use.as_ref().is_none_or(Done::done))
            .filter(|(_, e)| e.tick < self.unqueued_from)
            .min_by_key(|(_, e)| e.tick)
            .map(|(position, _)| position);
        match replaceable {
            Some(position) => self.offer(position, allocation),
            None => Placement::Full,
        }
    }

    fn offer(&mut self, position: usize, allocation: Allocation) -> Placement {
        self.last_generation += 1;
        self.slots[position] = Some(Export {
            allocation,
            generation: self.last_generation,
            mapped: [None; MAX_RANKS],
            pinned: false,
            last_use: None,
            tick: self.tick,
            offered_at: Instant::now(),
        });
        Placement::New {
            position,
            generation: self.last_generation,
        }
    }

    /// A peer's answer for `position`; ignored unless it is about the allocation there now.
    pub fn answer(&mut self, position: usize, generation: u64, peer: usize, address: u64) {
        if let Some(Some(export)) = self.slots.get_mut(position)
            && export.generation == generation
            && peer < self.nranks
        {
            export.mapped[peer] = Some(address);
        }
    }

    /// Every rank's address of the allocation at `position` (this rank's own: its base), once
    /// every peer has answered; `Err` if one could not map it (it never will).
    pub fn addresses(
        &self,
        position: usize,
        generation: u64,
    ) -> Option<Result<[u64; MAX_RANKS], ()>> {
        let export = self.slots.get(position)?.as_ref()?;
        if export.generation != generation {
            return Some(Err(()));
        }
        let mut addresses = [0u64; MAX_RANKS];
        for (peer, address) in addresses.iter_mut().enumerate().take(self.nranks) {
            *address = if peer == self.rank {
                export.allocation.base
            } else {
                match export.mapped[peer] {
                    None => return None,
                    Some(0) => return Some(Err(())),
                    Some(mapped) => mapped,
                }
            };
        }
        Some(Ok(addresses))
    }

    /// When the allocation at `position` was offered (now, for an empty position).
    pub fn offered_at(&self, position: usize) -> Instant {
        match self.slots.get(position) {
            Some(Some(export)) => export.offered_at,
            _ => Instant::now(),
        }
    }

    /// The calls placed so far are queued, their uses marked (`used`): what they placed and did
    /// not use no kernel uses.
    pub fn queued(&mut self) {
        self.unqueued_from = self.tick + 1;
    }

    /// A call used `position`: behind `marker` (eager), or in a graph (`None`: kept for good).
    pub fn used(&mut self, position: usize, marker: Option<E>) {
        if let Some(Some(export)) = self.slots.get_mut(position) {
            match marker {
                Some(marker) => export.last_use = Some(marker),
                None => export.pinned = true,
            }
        }
    }

    /// Every offer in the table now: its position, generation and allocation (for a look at
    /// which are gone without the table's lock, `retire`).
    pub fn offers(&self) -> Vec<(usize, u64, Allocation)> {
        self.slots
            .iter()
            .enumerate()
            .filter_map(|(position, slot)| {
                slot.as_ref()
                    .map(|e| (position, e.generation, e.allocation))
            })
            .collect()
    }

    /// Retires the offer at `position` if it is still the one of `generation` (its allocation
    /// found gone: freed memory, which no kernel can still use).
    pub fn retire(&mut self, position: usize, generation: u64) -> Option<Retired> {
        let slot = self.slots.get_mut(position)?;
        if slot.as_ref()?.generation != generation {
            return None;
        }
        *slot = None;
        Some(Retired {
            position,
            generation,
        })
    }

    /// Offers in the table now.
    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.slots.iter().filter(|s| s.is_some()).count()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::Cell;
    use std::rc::Rc;

    /// A marker the test completes by hand.
    #[derive(Clone, Default)]
    struct Marker(Rc<Cell<bool>>);

    impl Done for Marker {
        fn done(&self) -> bool {
            self.0.get()
        }
    }

    fn allocation(base: u64, id: u64) -> Allocation {
        Allocation {
            base,
            size: 1 << 20,
            id,
            sharing: Sharing::LegacyIpc,
            reservation: (base, 1 << 20),
        }
    }

    fn place(exports: &mut Exports<Marker>, a: Allocation) -> Placement {
        exports.place(a, |_| true, &mut Vec::new())
    }

    /// The position and generation of `a`, which must be newly offered.
    fn offer_new(exports: &mut Exports<Marker>, a: Allocation) -> (usize, u64) {
        match place(exports, a) {
            Placement::New {
                position,
                generation,
            } => (position, generation),
            placed => panic!("not offered: {placed:?}"),
        }
    }

    #[test]
    fn an_allocation_is_offered_once_and_ready_when_every_peer_answered() {
        let mut exports = Exports::<Marker>::new(1, 3);
        let a = allocation(0x1000_0000, 7);
        let (position, generation) = offer_new(&mut exports, a);
        assert_eq!(
            place(&mut exports, a),
            Placement::Known {
                position,
                generation
            }
        );
        assert_eq!(exports.addresses(position, generation), None);
        exports.answer(position, generation, 0, 0xa000);
        assert_eq!(exports.addresses(position, generation), None);
        // An answer about an older allocation at the same position changes nothing.
        exports.answer(position, generation - 1, 2, 0xdead);
        assert_eq!(exports.addresses(position, generation), None);
        exports.answer(position, generation, 2, 0xc000);
        let addresses = exports.addresses(position, generation).unwrap().unwrap();
        assert_eq!(addresses[..3], [0xa000, 0x1000_0000, 0xc000]);
    }

    #[test]
    fn a_peer_that_cannot_map_it_makes_it_unusable() {
        let mut exports = Exports::<Marker>::new(0, 2);
        let (position, generation) = offer_new(&mut exports, allocation(0x2000_0000, 1));
        exports.answer(position, generation, 1, 0);
        assert_eq!(exports.addresses(position, generation), Some(Err(())));
    }

    /// The stale-mapping case: freed and made again at the same address, it is another
    /// allocation (another id), offered anew under another generation at the same position.
    #[test]
    fn the_same_address_with_another_id_is_offered_anew() {
        let mut exports = Exports::<Marker>::new(0, 2);
        let (position, generation) = offer_new(&mut exports, allocation(0x3000_0000, 1));
        exports.answer(position, generation, 1, 0xb000);
        let again = place(&mut exports, allocation(0x3000_0000, 2));
        let Placement::New {
            position: p2,
            generation: g2,
        } = again
        else {
            panic!("reused a stale offer: {again:?}");
        };
        assert_eq!(p2, position);
        assert!(g2 > generation);
        assert_eq!(exports.addresses(position, generation), Some(Err(())));
        assert_eq!(
            exports.addresses(p2, g2),
            None,
            "the peer must map it again"
        );
        assert_eq!(exports.len(), 1);
    }

    #[test]
    fn allocations_found_gone_at_a_new_offer_are_retired() {
        let mut exports = Exports::<Marker>::new(0, 2);
        place(&mut exports, allocation(0x1_0000_0000, 1));
        place(&mut exports, allocation(0x2_0000_0000, 1));
        let mut retired = Vec::new();
        // Known ones are not looked at.
        exports.place(allocation(0x2_0000_0000, 1), |_| false, &mut retired);
        assert!(retired.is_empty());
        let placed = exports.place(
            allocation(0x3_0000_0000, 1),
            |a| a.base != 0x1_0000_0000,
            &mut retired,
        );
        assert_eq!(
            retired,
            [Retired {
                position: 0,
                generation: 1
            }]
        );
        assert!(matches!(placed, Placement::New { position: 0, .. }));
        assert_eq!(exports.len(), 2);
    }

    #[test]
    fn a_full_table_retires_what_is_gone_then_replaces_what_no_kernel_uses() {
        let mut exports = Exports::<Marker>::new(0, 2);
        let markers: Vec<Marker> = (0..CAPACITY).map(|_| Marker::default()).collect();
        for (i, marker) in markers.iter().enumerate() {
            let (position, _) = offer_new(
                &mut exports,
                allocation(0x1_0000_0000 + (i as u64) * (1 << 21), 1),
            );
            exports.used(position, Some(marker.clone()));
        }
        exports.queued();
        // Every position busy, every kernel still running: nothing can be had.
        let late = allocation(0x9_0000_0000, 5);
        assert_eq!(place(&mut exports, late), Placement::Full);
        // One allocation gone: its position is retired and reused.
        let gone = 0x1_0000_0000 + 3 * (1 << 21);
        let mut retired = Vec::new();
        let placed = exports.place(late, |a| a.base != gone, &mut retired);
        assert_eq!(retired.len(), 1);
        assert_eq!(retired[0].position, 3);
        assert!(matches!(placed, Placement::New { position: 3, .. }));
        exports.queued();
        // Full again: the least recently used position whose kernel is done goes.
        markers[10].0.set(true);
        markers[20].0.set(true);
        place(&mut exports, allocation(0x1_0000_0000 + 10 * (1 << 21), 1)); // used again: newer
        let placed = place(&mut exports, allocation(0xa_0000_0000, 6));
        assert!(
            matches!(placed, Placement::New { position: 20, .. }),
            "{placed:?}"
        );
    }

    /// A call's positions are marked once its kernel is queued, after the calls of its launch
    /// placed theirs: until then, what they placed is kept, used or not.
    #[test]
    fn what_calls_not_queued_yet_placed_is_never_replaced() {
        let mut exports = Exports::<Marker>::new(0, 2);
        for i in 0..CAPACITY {
            place(&mut exports, allocation((i as u64 + 1) << 30, 1));
        }
        assert_eq!(place(&mut exports, allocation(1 << 50, 1)), Placement::Full);
        exports.queued();
        // Queued without using them: the least recently used goes, then the next; the one
        // just placed stays.
        let first = place(&mut exports, allocation(1 << 51, 1));
        assert!(
            matches!(first, Placement::New { position: 0, .. }),
            "{first:?}"
        );
        let second = place(&mut exports, allocation(1 << 52, 1));
        assert!(
            matches!(second, Placement::New { position: 1, .. }),
            "{second:?}"
        );
    }

    #[test]
    fn a_position_used_in_a_graph_is_never_replaced() {
        let mut exports = Exports::<Marker>::new(0, 2);
        for i in 0..CAPACITY {
            let (position, _) = offer_new(&mut exports, allocation((i as u64 + 1) << 30, 1));
            exports.used(position, None);
        }
        assert_eq!(place(&mut exports, allocation(1 << 50, 1)), Placement::Full);
    }

    #[test]
    fn an_offer_is_retired_only_under_its_own_generation() {
        let mut exports = Exports::<Marker>::new(0, 2);
        let a = allocation(0x4_0000_0000, 1);
        let (position, generation) = offer_new(&mut exports, a);
        assert_eq!(exports.offers(), [(position, generation, a)]);
        // Made again at the same address since the look: the new offer stays.
        let (_, newer) = offer_new(&mut exports, allocation(0x4_0000_0000, 2));
        assert_eq!(exports.retire(position, generation), None);
        assert_eq!(exports.len(), 1);
        assert_eq!(
            exports.retire(position, newer),
            Some(Retired {
                position,
                generation: newer
            })
        );
        assert_eq!(exports.len(), 0);
        assert_eq!(exports.retire(position, newer), None);
        assert_eq!(exports.retire(CAPACITY, newer), None);
    }

    #[test]
    fn an_allocation_holds_only_ranges_inside_it() {
        let a = allocation(0x1000, 0);
        assert!(a.holds(0x1000, 1 << 20));
        assert!(a.holds(0x1010, 16));
        assert!(!a.holds(0x1010, 1 << 20));
        assert!(!a.holds(0x0ff0, 16));
        assert!(!a.holds(u64::MAX - 4, 16));
    }
}
