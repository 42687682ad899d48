//! FNV-1a (64-bit), the one hash of the core: the key of the kernel caches, a host's and a
//! process's identity, what ranks compare of their builds and settings. Not for anything an
//! adversary chooses.

/// A hash in progress.
#[derive(Clone, Copy, Debug)]
pub struct Fnv(u64);

impl Fnv {
    pub fn new() -> Fnv {
        Fnv(0xcbf29ce484222325)
    }

    pub fn bytes(mut self, bytes: &[u8]) -> Fnv {
        for &b in bytes {
            self.0 = (self.0 ^ b as u64).wrapping_mul(0x100000001b3);
        }
        self
    }

    /// A number, as its eight little-endian bytes.
    pub fn word(self, word: u64) -> Fnv {
        self.bytes(&word.to_le_bytes())
    }

    pub fn finish(self) -> u64 {
        self.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The published FNV-1a 64 values.
    #[test]
    fn matches_the_reference_values() {
        assert_eq!(Fnv::new().finish(), 0xcbf29ce484222325);
        assert_eq!(Fnv::new().bytes(b"a").finish(), 0xaf63dc4c8601ec8c);
        assert_eq!(Fnv::new().bytes(b"foobar").finish(), 0x85944171f73967e8);
        assert_eq!(
            Fnv::new().bytes(b"foo").bytes(b"bar").finish(),
            Fnv::new().bytes(b"foobar").finish()
        );
    }
}
