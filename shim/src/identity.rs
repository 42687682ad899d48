//! Tells whether a library file is ncclshim (this one or a copy), so that we never take
//! ourselves for the real NCCL, and which build it is: every build carries a section of its own
//! in its ELF file, a marker followed by the build's flavor (the NCCL version whose API it
//! exports, or `all`).

use std::io::{Read, Seek, SeekFrom};
use std::path::Path;

const SECTION: &str = ".ncclshim";
const MARKER_TEXT: &[u8; 16] = b"ncclshim-marker\0";
const MARKER_BYTES: usize = 48;

/// The marker, then the flavor, NUL-padded.
const fn marker() -> [u8; MARKER_BYTES] {
    let mut bytes = [0u8; MARKER_BYTES];
    let flavor = env!("NCCLSHIM_BUILD_FLAVOR").as_bytes();
    let mut i = 0;
    while i < MARKER_TEXT.len() {
        bytes[i] = MARKER_TEXT[i];
        i += 1;
    }
    let mut j = 0;
    while j < flavor.len() && MARKER_TEXT.len() + j < MARKER_BYTES - 1 {
        bytes[MARKER_TEXT.len() + j] = flavor[j];
        j += 1;
    }
    bytes
}

#[used]
#[unsafe(link_section = ".ncclshim")]
static MARKER: [u8; MARKER_BYTES] = marker();

/// True when `path` is an ELF file that has ncclshim's section; false for anything else,
/// unreadable files included (the loader will report those).
pub fn is_ncclshim(path: &Path) -> bool {
    sections(path).is_some_and(|s| s.iter().any(|(name, _, _)| name == SECTION))
}

/// The flavor of the ncclshim build at `path`: "2.27.7" (the NCCL API it exports), or "all".
pub fn build_flavor(path: &Path) -> Option<String> {
    let (_, offset, size) = sections(path)?
        .into_iter()
        .find(|(name, _, _)| name == SECTION)?;
    let mut bytes = vec![0u8; (size as usize).min(4096)];
    let mut file = std::fs::File::open(path).ok()?;
    file.seek(SeekFrom::Start(offset)).ok()?;
    file.read_exact(&mut bytes).ok()?;
    let at = bytes
        .windows(MARKER_TEXT.len())
        .position(|w| w == MARKER_TEXT)?
        + MARKER_TEXT.len();
    let flavor = &bytes[at..];
    let end = flavor.iter().position(|&b| b == 0)?;
    (end > 0).then(|| String::from_utf8_lossy(&flavor[..end]).into_owned())
}

/// The sections of a 64-bit little-endian ELF file: name, file offset, size.
fn sections(path: &Path) -> Option<Vec<(String, u64, u64)>> {
    let mut file = std::fs::File::open(path).ok()?;
    let mut header = [0u8; 64];
    file.read_exact(&mut header).ok()?;
    if &header[..4] != b"\x7fELF" || header[4] != 2 || header[5] != 1 {
        return None;
    }
    let u16_at = |b: &[u8], at: usize| u16::from_le_bytes([b[at], b[at + 1]]) as u64;
    let u64_at = |b: &[u8], at: usize| u64::from_le_bytes(b[at..at + 8].try_into().unwrap());
    let (table, entry_size, count, names_index) = (
        u64_at(&header, 0x28),
        u16_at(&header, 0x3a),
        u16_at(&header, 0x3c),
        u16_at(&header, 0x3e),
    );
    if entry_size < 64 || count == 0 || names_index >= count || count > 4096 {
        return None;
    }
    let mut sections = vec![0u8; (entry_size * count) as usize];
    file.seek(SeekFrom::Start(table)).ok()?;
    file.read_exact(&mut sections).ok()?;
    let entry = |i: u64| &sections[(i * entry_size) as usize..((i + 1) * entry_size) as usize];
    let names_header = entry(names_index);
    let (names_offset, names_size) = (u64_at(names_header, 0x18), u64_at(names_header, 0x20));
    if names_size > 1 << 20 {
        return None;
    }
    let mut names = vec![0u8; names_size as usize];
    file.seek(SeekFrom::Start(names_offset)).ok()?;
    file.read_exact(&mut names).ok()?;
    let name_at = |offset: usize| {
        let rest = names.get(offset..)?;
        let end = rest.iter().position(|&b| b == 0)?;
        Some(String::from_utf8_lossy(&rest[..end]).into_owned())
    };
    (0..count)
        .map(|i| {
            let header = entry(i);
            let name = name_at(u32::from_le_bytes(header[..4].try_into().unwrap()) as usize)?;
            Some((name, u64_at(header, 0x18), u64_at(header, 0x20)))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn other_files_are_not_ncclshim() {
        assert!(!is_ncclshim(Path::new("/nonexistent/libnccl.so.2")));
        let exe = std::env::current_exe().unwrap();
        // The test binary links this crate, marker included.
        assert!(
            is_ncclshim(&exe),
            "{} should carry the marker section",
            exe.display()
        );
        let scratch = crate::locate::Scratch::new("identity");
        let not_elf = scratch.0.join("not-elf");
        std::fs::write(&not_elf, b"#!/bin/sh\n").unwrap();
        assert!(!is_ncclshim(&not_elf));
        assert!(!is_ncclshim(Path::new("/bin/sh")));
        assert_eq!(
            build_flavor(&exe).as_deref(),
            Some(env!("NCCLSHIM_BUILD_FLAVOR"))
        );
        assert_eq!(build_flavor(Path::new("/bin/sh")), None);
    }
}
