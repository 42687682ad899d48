//! The host's control block the kernels read and write (pinned, mapped memory).

use super::error::{Cuda, Named, check};
use super::handles::DevicePtr;
use crate::core::limits::MAX_RANKS;
use cudarc::driver::{result, sys};
use std::sync::atomic::{AtomicBool, Ordering};

/// Pinned host memory shared with the kernels: their control block (device/device.cuh, "the host's
/// control block"): [0] abort, raised by the host; [1] how long a kernel may wait for a peer, in
/// seconds (0: for ever); [2] written by a kernel that gave up waiting: 1 + the rank it waited
/// for, or `MAX_RANKS + 1` for blocks of its own grid. And, the host's alone, whether the
/// all-reduce every rank runs at one point could not be launched.
pub struct HostControl {
    host: *mut i32,
    pub device: DevicePtr,
    not_launched: AtomicBool,
}

const CONTROL_WORDS: usize = 4;

// SAFETY: pinned host memory, written and read with volatile accesses only.
unsafe impl Send for HostControl {}
// SAFETY: as above.
unsafe impl Sync for HostControl {}

/// Whom a kernel gave up waiting for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GaveUp {
    Rank(usize),
    /// Other blocks of its own grid (which themselves waited for peers).
    OwnBlocks,
    /// It found this rank on a later call: a wait of that rank had given up, and it went on.
    OutOfStep(usize),
    /// No kernel gave up: the all-reduce every rank runs at one point (`ask_about_graphs`) could
    /// not be launched here, so this rank's later calls would meet its peers' of that one.
    NotLaunched,
}

impl HostControl {
    /// Kernels wait for a peer at most `wait_limit_s` seconds (0: for ever).
    pub fn new(wait_limit_s: u32) -> Cuda<HostControl> {
        let flags = sys::CU_MEMHOSTALLOC_DEVICEMAP | sys::CU_MEMHOSTALLOC_PORTABLE;
        // SAFETY: a fresh pinned allocation of CONTROL_WORDS ints.
        let host = unsafe { result::malloc_host(CONTROL_WORDS * size_of::<i32>(), flags) }
            .named("cuMemHostAlloc")?;
        let mut control = HostControl {
            host: host.cast::<i32>(),
            device: 0,
            not_launched: AtomicBool::new(false),
        };
        for word in 0..CONTROL_WORDS {
            control.write(word, 0);
        }
        control.write(1, wait_limit_s as i32);
        // SAFETY: mapped pinned memory (freed by `control`'s drop if this fails).
        check("cuMemHostGetDevicePointer", unsafe {
            sys::cuMemHostGetDevicePointer_v2(&mut control.device, control.host.cast(), 0)
        })?;
        Ok(control)
    }

    fn write(&self, word: usize, value: i32) {
        assert!(word < CONTROL_WORDS);
        // SAFETY: our pinned allocation, alive until drop.
        unsafe { self.host.add(word).write_volatile(value) };
    }

    pub fn raise_abort(&self) {
        self.write(0, 1);
    }

    /// That all-reduce could not be launched: the communicator is out of step, as where a wait
    /// gave up. Kept here, not in word 2, so that kernels launched before, which may still wait
    /// for slow peers, run to their end.
    pub fn launch_failed(&self) {
        self.not_launched.store(true, Ordering::Relaxed);
    }

    /// Whom a kernel gave up waiting for, if one did (the word stays set), or that the all-reduce
    /// could not be launched.
    pub fn gave_up(&self) -> Option<GaveUp> {
        // SAFETY: our pinned allocation, alive until drop; written by kernels.
        GaveUp::from_word(unsafe { self.host.add(2).read_volatile() }).or_else(|| {
            self.not_launched
                .load(Ordering::Relaxed)
                .then_some(GaveUp::NotLaunched)
        })
    }
}

impl GaveUp {
    /// What the kernels wrote into control word 2 (device.cuh: GAVE_UP_OWN, OUT_OF_STEP).
    fn from_word(word: i32) -> Option<GaveUp> {
        match word {
            0 => None,
            w if (1..=MAX_RANKS as i32).contains(&w) => Some(GaveUp::Rank(w as usize - 1)),
            w if (-(MAX_RANKS as i32)..=-1).contains(&w) => {
                Some(GaveUp::OutOfStep(-w as usize - 1))
            }
            _ => Some(GaveUp::OwnBlocks),
        }
    }
}

impl Drop for HostControl {
    fn drop(&mut self) {
        // SAFETY: our pinned allocation; no kernel uses it any more.
        let _ = unsafe { result::free_host(self.host.cast()) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The words device.cuh writes: 1 + the rank waited for, GAVE_UP_OWN (MAX_RANKS + 1), and
    /// OUT_OF_STEP(rank) = -rank - 1.
    #[test]
    fn the_kernels_word_says_whom_they_gave_up_on() {
        assert_eq!(GaveUp::from_word(0), None);
        assert_eq!(GaveUp::from_word(1), Some(GaveUp::Rank(0)));
        assert_eq!(
            GaveUp::from_word(MAX_RANKS as i32),
            Some(GaveUp::Rank(MAX_RANKS - 1))
        );
        assert_eq!(
            GaveUp::from_word(MAX_RANKS as i32 + 1),
            Some(GaveUp::OwnBlocks)
        );
        assert_eq!(GaveUp::from_word(-1), Some(GaveUp::OutOfStep(0)));
        assert_eq!(
            GaveUp::from_word(-(MAX_RANKS as i32)),
            Some(GaveUp::OutOfStep(MAX_RANKS - 1))
        );
        assert_eq!(GaveUp::from_word(i32::MAX), Some(GaveUp::OwnBlocks));
    }
}
