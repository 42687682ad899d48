//! Which all-reduces the core takes, and how: a pure function of (bytes, type, op, ranks) and of
//! settings read once from the environment, so that every rank decides the same. Nothing local
//! (capture status, caches, timing) enters it.
//!
//! Settings (the same on every rank):
//!   NCCLSHIM_CORE=0                      the core is off: no set-up, everything forwards
//!   NCCLSHIM_FORCE=nccl|core             route nothing / everything the core can take
//!   NCCLSHIM_ONE_SHOT_MAX_BYTES=N        one-shot up to N bytes
//!   NCCLSHIM_ALL_REDUCE_MAX_BYTES=N      the core up to N bytes (two-shot above one-shot's limit)

use std::sync::OnceLock;

use super::types::{Algorithm, DataType, Op};

/// Largest all-reduce the staging buffers take; also the default limit.
pub const STAGING_HALF_BYTES: usize = 32 << 20;
pub const THREADS: u32 = 512;
/// Must match MAX_BLOCKS and MAX_RANKS in all_reduce.cu.
pub const MAX_BLOCKS: u32 = 64;
pub const MAX_RANKS: usize = 8;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Settings {
    pub enabled: bool,
    pub force_core: bool,
    pub one_shot_max_bytes: usize,
    pub all_reduce_max_bytes: usize,
}

impl Settings {
    /// Thresholds measured on H200 (NVLink, 18 links per pair): see docs/performance.md.
    pub fn defaults(nranks_hint: Option<usize>) -> Settings {
        let _ = nranks_hint;
        Settings {
            enabled: true,
            force_core: false,
            one_shot_max_bytes: 256 << 10,
            all_reduce_max_bytes: 8 << 20,
        }
    }

    fn from_lookup(get: impl Fn(&str) -> Option<String>) -> Settings {
        let mut s = Settings::defaults(None);
        let bytes = |name: &str| get(name).and_then(|v| v.trim().parse::<usize>().ok());
        if get("NCCLSHIM_CORE").is_some_and(|v| v.trim() == "0") {
            s.enabled = false;
        }
        match get("NCCLSHIM_FORCE")
            .map(|v| v.trim().to_ascii_lowercase())
            .as_deref()
        {
            Some("nccl") => s.enabled = false,
            Some("core") => s.force_core = true,
            _ => {}
        }
        if let Some(n) = bytes("NCCLSHIM_ONE_SHOT_MAX_BYTES") {
            s.one_shot_max_bytes = n;
        }
        if let Some(n) = bytes("NCCLSHIM_ALL_REDUCE_MAX_BYTES") {
            s.all_reduce_max_bytes = n;
        }
        s.all_reduce_max_bytes = s.all_reduce_max_bytes.min(STAGING_HALF_BYTES);
        s.one_shot_max_bytes = s.one_shot_max_bytes.min(s.all_reduce_max_bytes);
        s
    }
}

pub fn settings() -> &'static Settings {
    static SETTINGS: OnceLock<Settings> = OnceLock::new();
    SETTINGS.get_or_init(|| Settings::from_lookup(|name| std::env::var(name).ok()))
}

/// How the core runs one all-reduce.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Plan {
    pub algorithm: Algorithm,
    pub dtype: DataType,
    pub op: Op,
    pub blocks: u32,
}

/// The core's plan for an all-reduce of `count` elements, or `None` to leave it to NCCL.
pub fn plan_all_reduce(
    settings: &Settings,
    count: usize,
    dtype: u32,
    op: u32,
    nranks: usize,
) -> Option<Plan> {
    let (dtype, op) = (DataType::from_nccl(dtype)?, Op::from_nccl(op)?);
    let bytes = count.checked_mul(dtype.size())?;
    if !settings.enabled || count == 0 || !(2..=MAX_RANKS).contains(&nranks) {
        return None;
    }
    let limit = if settings.force_core {
        STAGING_HALF_BYTES
    } else {
        settings.all_reduce_max_bytes
    };
    if bytes > limit {
        return None;
    }
    let algorithm = if bytes <= settings.one_shot_max_bytes {
        Algorithm::OneShot
    } else {
        Algorithm::TwoShot
    };
    let packs = bytes.div_ceil(16) as u64;
    let blocks = packs.div_ceil(THREADS as u64).clamp(1, MAX_BLOCKS as u64) as u32;
    Some(Plan {
        algorithm,
        dtype,
        op,
        blocks,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with(vars: &[(&str, &str)]) -> Settings {
        Settings::from_lookup(|name| {
            vars.iter()
                .find(|(k, _)| *k == name)
                .map(|(_, v)| v.to_string())
        })
    }

    #[test]
    fn plans_depend_on_size_type_op_and_ranks_only() {
        let s = with(&[]);
        let plan = plan_all_reduce(&s, 1024, 7, 0, 2).unwrap();
        assert_eq!(
            (plan.algorithm, plan.dtype, plan.op, plan.blocks),
            (Algorithm::OneShot, DataType::Float32, Op::Sum, 1)
        );
        assert_eq!(
            plan_all_reduce(&s, (1 << 20) / 4, 7, 0, 4)
                .unwrap()
                .algorithm,
            Algorithm::TwoShot
        );
        assert_eq!(
            plan_all_reduce(&s, (64 << 20) / 4, 7, 0, 4),
            None,
            "above the limit NCCL takes it"
        );
        assert_eq!(plan_all_reduce(&s, 0, 7, 0, 2), None);
        assert_eq!(
            plan_all_reduce(&s, 8, 7, 5, 2),
            None,
            "PreMulSum stays with NCCL"
        );
        assert_eq!(plan_all_reduce(&s, 8, 12, 0, 2), None);
        assert_eq!(plan_all_reduce(&s, 8, 7, 0, 1), None);
        assert_eq!(plan_all_reduce(&s, 8, 7, 0, 9), None);
        assert_eq!(
            plan_all_reduce(&s, 1 << 30, 7, 0, 2).map(|p| p.blocks),
            None
        );
        assert_eq!(
            plan_all_reduce(&s, (4 << 20) / 4, 7, 0, 2).unwrap().blocks,
            MAX_BLOCKS
        );
    }

    #[test]
    fn settings_come_from_the_environment() {
        assert!(!with(&[("NCCLSHIM_CORE", "0")]).enabled);
        assert!(!with(&[("NCCLSHIM_FORCE", "nccl")]).enabled);
        let forced = with(&[("NCCLSHIM_FORCE", "core")]);
        assert_eq!(
            plan_all_reduce(&forced, (16 << 20) / 4, 7, 0, 2)
                .unwrap()
                .algorithm,
            Algorithm::TwoShot
        );
        let limits = with(&[
            ("NCCLSHIM_ONE_SHOT_MAX_BYTES", "4096"),
            ("NCCLSHIM_ALL_REDUCE_MAX_BYTES", "65536"),
        ]);
        assert_eq!(
            plan_all_reduce(&limits, 1024, 7, 0, 2).unwrap().algorithm,
            Algorithm::OneShot
        );
        assert_eq!(
            plan_all_reduce(&limits, 1025, 7, 0, 2).unwrap().algorithm,
            Algorithm::TwoShot
        );
        assert_eq!(plan_all_reduce(&limits, 16385, 7, 0, 2), None);
        let huge = with(&[("NCCLSHIM_ALL_REDUCE_MAX_BYTES", "999999999999")]);
        assert_eq!(
            huge.all_reduce_max_bytes, STAGING_HALF_BYTES,
            "never past the staging buffers"
        );
    }
}
