//! The exit summary: per communicator, whether the core served it, and per operation and size
//! band the calls and bytes it routed (by algorithm) and forwarded.

use std::fmt::Write;

use super::book::{self, BAND_BOUNDS, BANDS, MAX_KINDS, Page, WAYS};
use super::{bytes_text, kind_name, way_name};
use crate::log::{Level, write as log_write};

/// The size band's name: "< 4 KiB", "4 KiB - 64 KiB", ..., ">= 256 MiB".
fn band_name(band: usize) -> String {
    match band {
        0 => format!("< {}", bytes_text(BAND_BOUNDS[0])),
        b if b == BANDS - 1 => format!(">= {}", bytes_text(BAND_BOUNDS[b - 1])),
        b => format!(
            "{} - {}",
            bytes_text(BAND_BOUNDS[b - 1]),
            bytes_text(BAND_BOUNDS[b])
        ),
    }
}

/// The summary of one communicator: a head line, then one line per operation and size band.
pub fn page_lines(page: &Page) -> Vec<String> {
    let (rank, nranks, device) = page.identity();
    let core = match page.core() {
        Some(true) => "the core served it",
        Some(false) => "the core did not serve it",
        None => "the core never set up",
    };
    let notes: Vec<String> = [
        (
            page.calls_in_shared_launches(),
            "in launches shared by a group's calls",
        ),
        (
            page.calls_sent_with_group(),
            "counted as the core's went to NCCL with their group",
        ),
    ]
    .into_iter()
    .filter(|&(calls, _)| calls > 0)
    .map(|(calls, what)| format!("{calls} {what}"))
    .collect();
    let shared = if notes.is_empty() {
        String::new()
    } else {
        format!(" ({})", notes.join("; "))
    };
    let mut lines = vec![format!(
        "summary: comm {:#x} rank {rank}/{nranks} on GPU {device}{}: {core}; {} calls{shared}",
        page.comm(),
        if page.destroyed() { " (destroyed)" } else { "" },
        page.calls_recorded()
    )];
    for kind in 0..MAX_KINDS {
        for band in 0..BANDS {
            let tallies: Vec<(usize, u64, u64)> = (0..WAYS)
                .map(|way| {
                    let (calls, bytes) = page.tally(kind, band, way);
                    (way, calls, bytes)
                })
                .filter(|&(_, calls, _)| calls > 0)
                .collect();
            if tallies.is_empty() {
                continue;
            }
            let (calls, bytes) = tallies
                .iter()
                .fold((0, 0), |(c, b), &(_, calls, bytes)| (c + calls, b + bytes));
            let mut line = format!(
                "summary: comm {:#x} rank {rank}  {} {}: {calls} calls, {}:",
                page.comm(),
                kind_name(kind as u8),
                band_name(band),
                bytes_text(bytes)
            );
            for (way, calls, _) in tallies {
                let _ = write!(line, " {} {calls}", way_name(way as u8));
            }
            lines.push(line);
        }
    }
    lines
}

/// Writes the summary of every communicator to the log, whatever `NCCL_DEBUG` says.
pub fn write() {
    for page in book::pages() {
        for line in page_lines(page) {
            log_write(Level::Info, true, format_args!("{line}"));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::book::find_or_claim;
    use super::super::book::tests::call;
    use super::*;

    #[test]
    fn a_summary_line_per_operation_and_band() {
        assert_eq!(band_name(0), "< 4 KiB");
        assert_eq!(band_name(1), "4 KiB - 64 KiB");
        assert_eq!(band_name(BANDS - 1), ">= 256 MiB");
        let page = find_or_claim(0x5200_0000, |p| p.set_identity(0, 2, 0)).unwrap();
        page.record(&call(0, 2, 1024));
        page.record(&call(0, 0, 1024));
        page.record(&call(1, 0, 8 << 20));
        let lines = page_lines(page);
        assert_eq!(lines.len(), 3, "{lines:#?}");
        assert!(lines[0].contains("rank 0/2 on GPU 0") && lines[0].ends_with("; 3 calls"));
        page.shared_launch(2);
        assert!(
            page_lines(page)[0].ends_with("; 3 calls (2 in launches shared by a group's calls)")
        );
        page.sent_with_group();
        assert!(page_lines(page)[0].ends_with(
            "; 3 calls (2 in launches shared by a group's calls; 1 counted as the core's went to NCCL with their group)"
        ));
        assert!(
            lines[1].ends_with("< 4 KiB: 2 calls, 2 KiB: forwarded 1 core one_shot 1"),
            "{}",
            lines[1]
        );
        assert!(
            lines[2].ends_with("1 MiB - 16 MiB: 1 calls, 8 MiB: forwarded 1"),
            "{}",
            lines[2]
        );
    }
}
