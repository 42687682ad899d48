//! What a user asked of NCCL's CTAs (the blocks of its kernels) for a communicator, to leave SMs
//! to the work beside it, which the core keeps to as NCCL does.
//!
//! A bound: a call whose grid would be larger goes to NCCL (`CommFacts::max_blocks`). NCCL takes
//! `maxCTAs` from the communicator's config, which `NCCL_MAX_CTAS` overrides (init.cc,
//! `envConfigOverride`; a child made without a config takes its parent's), and bounds its
//! channels, and so its CTAs, by `NCCL_MAX_NCHANNELS` (or its older name `NCCL_MAX_NRINGS`;
//! below 1, 1) too. A bound NCCL's kernels never reach (its most channels: 32 before 2.25, 64
//! from) bounds nothing.
//!
//! No CTAs at all: from 2.28, a config's `CTAPolicy` (which `NCCL_CTA_POLICY` overrides) of
//! `NCCL_CTA_POLICY_ZERO` has NCCL move all-gathers, all-to-alls, gathers and scatters whose
//! buffers lie in symmetric windows with the GPU's copy engines, no SM taking part
//! (enqueue.cc, `ceCollTaskAppend`): the core leaves such calls to NCCL (`copy_engines`).

use std::sync::{Mutex, OnceLock};

use crate::ffi::ncclComm_t;
use crate::nccl_env;

/// What a communicator's config says of NCCL's CTAs: its `maxCTAs` and `CTAPolicy` (`UNSET`
/// where it leaves them, or where the headers it was written with have no such field).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CtaConfig {
    pub max_ctas: i32,
    pub policy: i32,
}

impl CtaConfig {
    /// NCCL's `NCCL_CONFIG_UNDEF_INT`: a config field left unset.
    pub const UNSET: i32 = i32::MIN;
}

/// `NCCL_CTA_POLICY_ZERO` (nccl.h, 2.28 on).
const POLICY_ZERO: i32 = 0x02;

/// What a config set, as kept for its communicator.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Configured {
    /// `maxCTAs`, where positive.
    bound: Option<u32>,
    /// `CTAPolicy`, where set.
    policy: Option<i32>,
}

/// The communicators whose config set either, and what.
static CONFIGURED: Mutex<Vec<(usize, Configured)>> = Mutex::new(Vec::new());

/// `comm` was made with `config` (`None`: no config), or, a child made without a config, of
/// `parent`, whose it takes.
pub fn made(comm: ncclComm_t, config: Option<CtaConfig>, parent: Option<ncclComm_t>) {
    let configured = match (config, parent) {
        (Some(config), _) => Configured {
            // NCCL's unset value is negative too.
            bound: (config.max_ctas > 0).then_some(config.max_ctas as u32),
            policy: (config.policy != CtaConfig::UNSET).then_some(config.policy),
        },
        (None, Some(parent)) => configured(parent),
        (None, None) => Configured::default(),
    };
    let mut all = CONFIGURED.lock().unwrap_or_else(|e| e.into_inner());
    all.retain(|&(c, _)| c != comm as usize);
    if configured != Configured::default() {
        all.push((comm as usize, configured));
    }
}

/// `comm` is gone.
pub fn forget(comm: ncclComm_t) {
    let mut all = CONFIGURED.lock().unwrap_or_else(|e| e.into_inner());
    all.retain(|&(c, _)| c != comm as usize);
}

fn configured(comm: ncclComm_t) -> Configured {
    let all = CONFIGURED.lock().unwrap_or_else(|e| e.into_inner());
    all.iter()
        .find(|&&(c, _)| c == comm as usize)
        .map_or_else(Configured::default, |&(_, configured)| configured)
}

/// What a communicator's user asked of NCCL's CTAs, as the core keeps to it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Asked {
    /// The most blocks a kernel may have, where the user set a bound that bounds NCCL's.
    pub bound: Option<u32>,
    /// No CTAs where NCCL moves a call with the copy engines (`CTAPolicy` ZERO).
    pub copy_engines: bool,
}

/// What `comm`'s user asked: its config's, with the settings over it, as the real NCCL takes
/// them.
pub fn asked(comm: ncclComm_t) -> Asked {
    let configured = configured(comm);
    Asked {
        bound: bound_with(configured.bound),
        copy_engines: asks_copy_engines(
            policy_setting().or(configured.policy),
            nccl_env::version(),
        ),
    }
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

/// Whether the settings alone ask every communicator for the copy engines (`NCCL_CTA_POLICY`).
pub fn settings_copy_engines() -> bool {
    asks_copy_engines(policy_setting(), nccl_env::version())
}

/// The first NCCL that moves data with the copy engines (and has `NCCL_CTA_POLICY_ZERO`).
const COPY_ENGINES: i32 = 22800;
/// The first NCCL that takes a policy as flags, and `NCCL_CTA_POLICY` as their names.
const POLICY_FLAGS: i32 = 22900;

/// Whether a communicator's CTA `policy` (`None`: NCCL's default) asks NCCL of `version`
/// (unknown: the newest's) for the copy engines.
fn asks_copy_engines(policy: Option<i32>, version: Option<i32>) -> bool {
    let Some(policy) = policy else {
        return false;
    };
    match version.unwrap_or(i32::MAX) {
        v if v < COPY_ENGINES => false,
        // One policy at a time: any other value is refused, or reset to the default.
        v if v < POLICY_FLAGS => policy == POLICY_ZERO,
        _ => (0..=3).contains(&policy) && policy & POLICY_ZERO != 0,
    }
}

/// `NCCL_CTA_POLICY`, read once, as NCCL does (an integer parameter of 2.28's; once at the first
/// communicator from 2.29).
fn policy_setting() -> Option<i32> {
    static READ: OnceLock<Option<i32>> = OnceLock::new();
    *READ.get_or_init(|| policy_of(&nccl_env::get("NCCL_CTA_POLICY")?, nccl_env::version()))
}

/// The policy an `NCCL_CTA_POLICY` of `value` sets in NCCL of `version` (`None`: none). From
/// 2.29: a leading digit 0 - 2 is that policy (others set none), else names of policies
/// between `|`, any case, whose flags add up (unknown names passed over).
fn policy_of(value: &str, version: Option<i32>) -> Option<i32> {
    if version.is_some_and(|v| v < POLICY_FLAGS) {
        // An integer parameter, kept in an int; NCCL's "unset" leaves the config's.
        return nccl_env::c_integer(value)
            .map(|n| n as i32)
            .filter(|&n| n != CtaConfig::UNSET);
    }
    match *value.as_bytes().first()? {
        digit @ b'0'..=b'2' => Some(i32::from(digit - b'0')),
        b'0'..=b'9' => None,
        _ => (value.split('|'))
            .filter_map(|name| {
                ["DEFAULT", "EFFICIENCY", "ZERO"]
                    .iter()
                    .position(|policy| policy.eq_ignore_ascii_case(name))
            })
            .map(|flag| [0, 1, POLICY_ZERO][flag])
            .reduce(|a, b| a | b),
    }
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
        let config = |max_ctas, policy| Some(CtaConfig { max_ctas, policy });
        made(handle(parent), config(16, POLICY_ZERO), None);
        made(handle(child), None, Some(handle(parent)));
        made(
            handle(other),
            config(32, CtaConfig::UNSET),
            Some(handle(parent)),
        );
        made(
            handle(unset),
            config(CtaConfig::UNSET, CtaConfig::UNSET),
            None,
        );
        let bound = |comm| configured(handle(comm)).bound;
        let policy = |comm| configured(handle(comm)).policy;
        assert_eq!(
            (bound(parent), policy(parent)),
            (Some(16), Some(POLICY_ZERO))
        );
        assert_eq!((bound(child), policy(child)), (Some(16), Some(POLICY_ZERO)));
        assert_eq!((bound(other), policy(other)), (Some(32), None));
        assert_eq!((bound(unset), policy(unset)), (None, None));
        forget(handle(parent));
        assert_eq!(configured(handle(parent)), Configured::default());
        for comm in [child, other] {
            forget(handle(comm));
        }
    }

    #[test]
    fn the_copy_engines_are_asked_for_as_each_version_of_nccl_takes_the_policy() {
        let (v2_27, v2_28, v2_29) = (Some(22703), Some(22809), Some(22907));
        for version in [v2_28, v2_29, None] {
            assert!(asks_copy_engines(Some(POLICY_ZERO), version));
            assert!(!asks_copy_engines(Some(0), version));
            assert!(!asks_copy_engines(Some(1), version));
            assert!(!asks_copy_engines(None, version));
        }
        // Before 2.28 no copy engines; 2.28 takes one policy, 2.29 flags.
        assert!(!asks_copy_engines(Some(POLICY_ZERO), v2_27));
        assert!(!asks_copy_engines(Some(3), v2_28));
        assert!(asks_copy_engines(Some(3), v2_29));
        assert!(!asks_copy_engines(Some(6), v2_29));
    }

    #[test]
    fn nccl_cta_policy_reads_as_each_version_of_nccl_reads_it() {
        let (v2_28, v2_29) = (Some(22809), Some(22907));
        // 2.28: an integer, as strtoll reads it.
        assert_eq!(policy_of("2", v2_28), Some(2));
        assert_eq!(policy_of("0x2", v2_28), Some(2));
        assert_eq!(policy_of("ZERO", v2_28), Some(0));
        assert_eq!(policy_of("", v2_28), None);
        assert_eq!(policy_of("-2147483648", v2_28), None);
        // 2.29 on: a leading digit, or names between bars.
        for version in [v2_29, None] {
            assert_eq!(policy_of("2", version), Some(2));
            assert_eq!(policy_of("20", version), Some(2));
            assert_eq!(policy_of("3", version), None);
            assert_eq!(policy_of("zero", version), Some(POLICY_ZERO));
            assert_eq!(policy_of("EFFICIENCY|ZERO", version), Some(3));
            assert_eq!(policy_of("|Zero||", version), Some(POLICY_ZERO));
            assert_eq!(policy_of("DEFAULT", version), Some(0));
            // Names are not trimmed; unknown ones are passed over.
            assert_eq!(policy_of(" ZERO", version), None);
            assert_eq!(policy_of("FAST|ZERO", version), Some(POLICY_ZERO));
            assert_eq!(policy_of("", version), None);
        }
    }
}
