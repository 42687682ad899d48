//! The bound a user set on NCCL's CTAs (the blocks of its kernels) for a communicator, to leave
//! SMs to the work beside it, which the core keeps to as NCCL does: a call whose grid would be
//! larger goes to NCCL (`CommFacts::max_blocks`). NCCL takes `maxCTAs` from the communicator's
//! config, which `NCCL_MAX_CTAS` overrides (init.cc, `envConfigOverride`; a child made without a
//! config takes its parent's), and bounds its channels, and so its CTAs, by `NCCL_MAX_NCHANNELS`
//! (or its older name `NCCL_MAX_NRINGS`; below 1, 1) too. A bound NCCL's kernels never reach
//! (its most channels: 32 before 2.25, 64 from) bounds nothing.

use std::sync::{Mutex, OnceLock};

use crate::ffi::ncclComm_t;
use crate::nccl_env;

/// NCCL's `NCCL_CONFIG_UNDEF_INT`: a config field left unset.
const UNSET: i32 = i32::MIN;

/// The communicators whose config set `maxCTAs`, and to what.
static CONFIGURED: Mutex<Vec<(usize, u32)>> = Mutex::new(Vec::new());

/// `comm` was made with a config whose `maxCTAs` is `max_ctas` (`None`: no config), or, a child
/// made without a config, of `parent`, whose it takes.
pub fn made(comm: ncclComm_t, max_ctas: Option<i32>, parent: Option<ncclComm_t>) {
    let bound = match (max_ctas, parent) {
        (Some(n), _) => (n != UNSET && n > 0).then_some(n as u32),
        (None, Some(parent)) => configured(parent),
        (None, None) => None,
    };
    let mut all = CONFIGURED.lock().unwrap_or_else(|e| e.into_inner());
    all.retain(|&(c, _)| c != comm as usize);
    if let Some(bound) = bound {
        all.push((comm as usize, bound));
    }
}

/// `comm` is gone.
pub fn forget(comm: ncclComm_t) {
    let mut all = CONFIGURED.lock().unwrap_or_else(|e| e.into_inner());
    all.retain(|&(c, _)| c != comm as usize);
}

fn configured(comm: ncclComm_t) -> Option<u32> {
    let all = CONFIGURED.lock().unwrap_or_else(|e| e.into_inner());
    all.iter()
        .find(|&&(c, _)| c == comm as usize)
        .map(|&(_, n)| n)
}

/// The bound on `comm`'s kernels' blocks, where its user set one that bounds NCCL's.
pub fn bound(comm: ncclComm_t) -> Option<u32> {
    bound_with(configured(comm))
}

/// The bound the settings alone put on every communicator's kernels, whatever its config.
pub fn settings_bound() -> Option<u32> {
    bound_with(None)
}

/// The bound of a config's `maxCTAs` (`configured`) with the settings'.
fn bound_with(configured: Option<u32>) -> Option<u32> {
    bound_of(configured, settings(), most_channels(nccl_env::version()))
}

/// `NCCL_MAX_CTAS` where positive, and the channels `NCCL_MAX_NCHANNELS` (else
/// `NCCL_MAX_NRINGS`) leaves NCCL where set, read once, as NCCL caches them (at each
/// communicator, where `NCCL_NO_CACHE` names one of them).
fn settings() -> (Option<u32>, Option<u32>) {
    static READ: OnceLock<(Option<u32>, Option<u32>)> = OnceLock::new();
    let read = || {
        // NCCL keeps each in an int.
        let int = |name| nccl_env::integer(name).map(|n| i64::from(n as i32));
        let ctas = int("NCCL_MAX_CTAS").filter(|&n| n > 0);
        // NCCL's default, -2, is "not set" whichever way it comes.
        let set = |name| int(name).filter(|&n| n != -2);
        let channels = set("NCCL_MAX_NCHANNELS").or_else(|| set("NCCL_MAX_NRINGS"));
        let fit = |n: i64| n.max(1) as u32;
        (ctas.map(fit), channels.map(fit))
    };
    let names = ["NCCL_MAX_CTAS", "NCCL_MAX_NCHANNELS", "NCCL_MAX_NRINGS"];
    nccl_env::as_nccl_caches(&READ, &names, read)
}

/// NCCL's most channels (`MAXCHANNELS`) in `version` (unknown: the newest's).
fn most_channels(version: Option<i32>) -> u32 {
    match version {
        Some(code) if code < 22500 => 32,
        _ => 64,
    }
}

/// The bound of a config's `maxCTAs` (`configured`) and the settings (`NCCL_MAX_CTAS` over it,
/// `NCCL_MAX_NCHANNELS`), where below NCCL's `most` channels.
fn bound_of(
    configured: Option<u32>,
    settings: (Option<u32>, Option<u32>),
    most: u32,
) -> Option<u32> {
    let (max_ctas, max_channels) = settings;
    let ctas = max_ctas.or(configured);
    [ctas, max_channels]
        .into_iter()
        .flatten()
        .min()
        .filter(|&n| n < most)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_bound_is_nccls_as_its_settings_give_it() {
        assert_eq!(bound_of(None, (None, None), 64), None);
        assert_eq!(bound_of(Some(16), (None, None), 64), Some(16));
        // NCCL_MAX_CTAS overrides the config, up or down.
        assert_eq!(bound_of(Some(16), (Some(24), None), 64), Some(24));
        assert_eq!(bound_of(Some(16), (Some(8), None), 64), Some(8));
        // NCCL_MAX_NCHANNELS bounds it too.
        assert_eq!(bound_of(Some(16), (None, Some(4)), 64), Some(4));
        assert_eq!(bound_of(None, (None, Some(4)), 64), Some(4));
        // A bound NCCL's own kernels never reach bounds nothing.
        assert_eq!(bound_of(Some(64), (None, None), 64), None);
        assert_eq!(bound_of(Some(48), (None, None), 32), None);
        assert_eq!(most_channels(Some(22403)), 32);
        assert_eq!(most_channels(Some(22809)), 64);
    }

    #[test]
    fn a_config_bounds_its_communicator_and_children_made_without_one() {
        let (parent, child, other, unset) = (0x7a00_0000, 0x7a00_0010, 0x7a00_0020, 0x7a00_0030);
        let handle = |n: usize| n as ncclComm_t;
        made(handle(parent), Some(16), None);
        made(handle(child), None, Some(handle(parent)));
        made(handle(other), Some(32), Some(handle(parent)));
        made(handle(unset), Some(UNSET), None);
        assert_eq!(configured(handle(parent)), Some(16));
        assert_eq!(configured(handle(child)), Some(16));
        assert_eq!(configured(handle(other)), Some(32));
        assert_eq!(configured(handle(unset)), None);
        forget(handle(parent));
        assert_eq!(configured(handle(parent)), None);
        for comm in [child, other] {
            forget(handle(comm));
        }
    }
}
