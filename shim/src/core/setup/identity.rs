//! Who we are: a host (name and boot) and a process (a random number, not the pid, which
//! containers can share).

use std::io::Read;
use std::sync::OnceLock;

use crate::core::fnv::Fnv;

pub fn host() -> u64 {
    let name = std::fs::read("/proc/sys/kernel/hostname").unwrap_or_default();
    let boot = std::fs::read("/proc/sys/kernel/random/boot_id").unwrap_or_default();
    Fnv::new().bytes(&name).bytes(&boot).finish()
}

/// A number for one set-up, unlike any other of any process.
pub fn nonce() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static SET_UPS: AtomicU64 = AtomicU64::new(0);
    let nth = SET_UPS.fetch_add(1, Ordering::Relaxed);
    Fnv::new().word(process()).word(nth).finish()
}

pub fn process() -> u64 {
    static PROCESS: OnceLock<u64> = OnceLock::new();
    *PROCESS.get_or_init(|| {
        let mut bytes = [0u8; 8];
        let random = std::fs::File::open("/dev/urandom").and_then(|mut f| f.read_exact(&mut bytes));
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        u64::from_le_bytes(bytes)
            ^ if random.is_ok() {
                0
            } else {
                nanos as u64 ^ std::process::id() as u64
            }
    })
}
