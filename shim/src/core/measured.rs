//! The measured limits of the collectives other than all-reduce: per GPU model and number of
//! ranks, the sizes at which each one's core takes calls by default (`measured_limits.tsv`,
//! written by the GPU suite): the small calls up to a size, and spans of larger ones where the
//! core won again. Each rank looks its own GPU up; the communicator takes what all of its ranks'
//! limits have in common (setup.rs), so that every rank decides alike.

use std::sync::atomic::{AtomicBool, Ordering};

use super::types::Collective;

/// The most spans of sizes one collective's limit holds.
pub const SPANS: usize = 3;

/// The sizes (in bytes, as nccl-tests counts them) at which a collective's core takes a call:
/// up to SPANS spans `from..=to`, in order; an unused span is `(0, 0)`. Size 0 is never the
/// core's, so a span from 0 starts at the smallest call.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Limit([(usize, usize); SPANS]);

impl Limit {
    /// No call.
    pub const NONE: Limit = Limit([(0, 0); SPANS]);

    /// Every call up to `bytes` (none for 0). Allocates nothing: a setting's limit is made so
    /// on every call's path (`Settings::limit`).
    pub const fn up_to(bytes: usize) -> Limit {
        let mut spans = [(0, 0); SPANS];
        spans[0].1 = bytes;
        Limit(spans)
    }

    /// The spans given (each `from..=to`) that hold a size, in order of size, the first SPANS.
    pub fn of(spans: impl IntoIterator<Item = (usize, usize)>) -> Limit {
        let mut kept: Vec<(usize, usize)> = spans
            .into_iter()
            .filter(|&(from, to)| to > 0 && from <= to)
            .collect();
        kept.sort_unstable();
        let mut limit = Limit::NONE;
        for (slot, span) in limit.0.iter_mut().zip(kept) {
            *slot = span;
        }
        limit
    }

    /// The spans that hold a size.
    pub fn spans(&self) -> impl Iterator<Item = (usize, usize)> + '_ {
        self.0.iter().copied().filter(|&(_, to)| to > 0)
    }

    /// Whether the core takes a call of `bytes`.
    pub fn takes(&self, bytes: usize) -> bool {
        bytes > 0 && self.spans().any(|(from, to)| (from..=to).contains(&bytes))
    }

    pub fn is_none(&self) -> bool {
        self.spans().next().is_none()
    }

    /// The sizes both take.
    pub fn meet(&self, other: &Limit) -> Limit {
        let mut common = Vec::new();
        for (a, b) in self.spans() {
            for (c, d) in other.spans() {
                common.push((a.max(c), b.min(d)));
            }
        }
        Limit::of(common)
    }

    /// A cell of the table: spans separated by commas, each `TO` (from the smallest call) or
    /// `FROM-TO`. A cell that does not read whole is no limit: one not known is none to rely on.
    pub fn parse(cell: &str) -> Limit {
        let span = |item: &str| match item.split_once('-') {
            Some((from, to)) => Some((from.trim().parse().ok()?, to.trim().parse().ok()?)),
            None => Some((0, item.trim().parse().ok()?)),
        };
        cell.split(',')
            .map(span)
            .collect::<Option<Vec<_>>>()
            .map_or(Limit::NONE, Limit::of)
    }

    /// As a record carries it: each span's two ends.
    pub fn to_words(self) -> [u64; 2 * SPANS] {
        std::array::from_fn(|i| {
            let (from, to) = self.0[i / 2];
            (if i % 2 == 0 { from } else { to }) as u64
        })
    }

    pub fn from_words(words: [u64; 2 * SPANS]) -> Limit {
        Limit::of((0..SPANS).map(|i| (words[2 * i] as usize, words[2 * i + 1] as usize)))
    }

    /// As `to_words`, in half the room: sizes past 4 GiB - 1 (none measured) as 4 GiB - 1, which
    /// only narrows a span.
    pub fn to_words32(self) -> [u32; 2 * SPANS] {
        self.to_words()
            .map(|w| u32::try_from(w).unwrap_or(u32::MAX))
    }

    /// As `from_words`, of what `to_words32` wrote.
    pub fn from_words32(words: [u32; 2 * SPANS]) -> Limit {
        Limit::from_words(words.map(u64::from))
    }

    /// "up to 128 KiB and 8 MiB – 32 MiB", each size as `size` writes it.
    pub fn describe(&self, size: impl Fn(usize) -> String) -> String {
        self.spans()
            .map(|(from, to)| match from {
                0 => format!("up to {}", size(to)),
                _ if from == to => size(from),
                _ => format!("{} – {}", size(from), size(to)),
            })
            .collect::<Vec<_>>()
            .join(" and ")
    }
}

/// Every collective's limit, by `Collective as usize` (all-reduce's unused: none).
pub type Limits = [Limit; Collective::ALL.len()];

/// Where a call's buffers lie, which decides which of NCCL's kernels it races: its symmetric
/// kernels (NCCL 2.27 on) run only where a call's buffers are in windows registered with
/// `NCCL_WIN_COLL_SYMMETRIC` (windows.rs), and there NCCL is faster at some sizes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Buffers {
    /// In no symmetric window: NCCL's plain kernels.
    Plain,
    /// In a symmetric window: NCCL's symmetric kernels where they take the call.
    InWindows,
}

/// A communicator's measured limits, one set for each kind of buffer: `any` holds against
/// NCCL at its best with every kind (a table's `any` row), `plain` against NCCL on buffers in no
/// symmetric window (its `plain` row, or the `any` row where none was measured).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Measured {
    pub any: Limits,
    pub plain: Limits,
}

impl Measured {
    pub const NONE: Measured = Measured {
        any: [Limit::NONE; Collective::ALL.len()],
        plain: [Limit::NONE; Collective::ALL.len()],
    };

    /// The same limits for every kind of buffer.
    pub const fn alike(limits: Limits) -> Measured {
        Measured {
            any: limits,
            plain: limits,
        }
    }

    /// The limits of a call whose buffers lie so.
    pub fn of(&self, buffers: Buffers) -> &Limits {
        match buffers {
            Buffers::Plain => &self.plain,
            Buffers::InWindows => &self.any,
        }
    }
}

const TABLE: &str = include_str!("measured_limits.tsv");

/// The rows for a GPU of this name and `nranks` ranks; no limit where none was measured.
pub fn limits(gpu: &str, nranks: usize) -> Measured {
    let rows = rows(TABLE);
    let find = |kind: RowKind| {
        rows.iter()
            .find(|row| row.gpu == gpu && row.nranks == nranks && row.kind == kind)
            .map(|row| row.limits)
    };
    let any = find(RowKind::Any).unwrap_or([Limit::NONE; Collective::ALL.len()]);
    Measured {
        any,
        plain: find(RowKind::Plain).unwrap_or(any),
    }
}

/// Which calls a row's limits hold for (its `buffers` cell).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RowKind {
    /// Measured against NCCL at its best with every kind of buffer (`any`, or no such column).
    Any,
    /// Measured against NCCL on buffers in no symmetric window (`plain`).
    Plain,
}

/// One measured row.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Row {
    pub gpu: String,
    pub nranks: usize,
    pub kind: RowKind,
    pub limits: Limits,
}

/// What a column of the table holds.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Column {
    Gpu,
    Ranks,
    Buffers,
    Of(Collective),
    Other,
}

/// The rows of a table: tab-separated, `#` comments, a header naming the columns ("gpu",
/// "ranks", optionally "buffers", then collectives as their settings spell them, in lower case),
/// each cell as `Limit::parse` reads it. A row whose `buffers` cell is neither `any` nor `plain`
/// is left out.
pub fn rows(table: &str) -> Vec<Row> {
    let mut lines = table
        .lines()
        .filter(|line| !line.trim().is_empty() && !line.starts_with('#'));
    let Some(header) = lines.next() else {
        return Vec::new();
    };
    let columns: Vec<Column> = header
        .split('\t')
        .map(|name| match name.trim() {
            "gpu" => Column::Gpu,
            "ranks" => Column::Ranks,
            "buffers" => Column::Buffers,
            name => Collective::ALL
                .into_iter()
                .find(|c| c.variable_name().eq_ignore_ascii_case(name))
                .map_or(Column::Other, Column::Of),
        })
        .collect();
    lines
        .filter_map(|line| {
            let mut row = Row {
                gpu: String::new(),
                nranks: 0,
                kind: RowKind::Any,
                limits: [Limit::NONE; Collective::ALL.len()],
            };
            for (column, cell) in columns.iter().zip(line.split('\t').map(str::trim)) {
                match *column {
                    Column::Gpu => row.gpu = cell.to_string(),
                    Column::Ranks => row.nranks = cell.parse().ok()?,
                    Column::Buffers => {
                        row.kind = match cell {
                            "any" => RowKind::Any,
                            "plain" => RowKind::Plain,
                            _ => return None,
                        }
                    }
                    Column::Of(c) if c != Collective::AllReduce => {
                        row.limits[c as usize] = Limit::parse(cell)
                    }
                    Column::Of(_) | Column::Other => {}
                }
            }
            (row.nranks > 0).then_some(row)
        })
        .collect()
}

/// What the limits of every rank's row (`limits`) have in common, collective by collective.
pub fn least(ranks: impl IntoIterator<Item = Limits>) -> Limits {
    ranks
        .into_iter()
        .reduce(|a, b| std::array::from_fn(|i| a[i].meet(&b[i])))
        .unwrap_or([Limit::NONE; Collective::ALL.len()])
}

/// `least` of both kinds of limits.
pub fn least_measured(ranks: impl IntoIterator<Item = Measured>) -> Measured {
    let ranks: Vec<Measured> = ranks.into_iter().collect();
    Measured {
        any: least(ranks.iter().map(|m| m.any)),
        plain: least(ranks.iter().map(|m| m.plain)),
    }
}

/// Whether some communicator of this process may give calls of a collective to its core by its
/// measured limit: until one does, such calls forward at once, as for a collective that is off,
/// without looking their communicator up. Set before that communicator's set-up returns on every
/// rank, so that its calls find it set on all of them.
static MEASURED_ON: [AtomicBool; Collective::ALL.len()] =
    [const { AtomicBool::new(false) }; Collective::ALL.len()];

/// Notes the limits of a communicator whose core came on.
pub fn note_in_use(measured: &Measured) {
    for (on, (any, plain)) in MEASURED_ON
        .iter()
        .zip(measured.any.iter().zip(&measured.plain))
    {
        if !any.is_none() || !plain.is_none() {
            on.store(true, Ordering::Relaxed);
        }
    }
}

/// Whether some communicator of this process has a measured limit for `collective`.
pub fn in_use(collective: Collective) -> bool {
    MEASURED_ON[collective as usize].load(Ordering::Relaxed)
}

#[cfg(test)]
mod tests {
    use super::*;

    const NONE: Limits = [Limit::NONE; 8];

    #[test]
    fn the_table_reads_by_its_header() {
        let table = "# note\ngpu\tranks\tscatter\tall_gather\nGPU A\t2\t4096\t128,2048-8192\nGPU B\t4\tx\t7\n";
        let rows = rows(table);
        assert_eq!(rows.len(), 2);
        assert_eq!(rows[0].gpu, "GPU A");
        assert_eq!(
            rows[0].limits[Collective::Scatter as usize],
            Limit::up_to(4096)
        );
        assert_eq!(
            rows[0].limits[Collective::AllGather as usize],
            Limit::of([(0, 128), (2048, 8192)])
        );
        assert_eq!(rows[0].limits[Collective::Gather as usize], Limit::NONE);
        assert_eq!(
            (rows[1].nranks, rows[1].limits[Collective::Scatter as usize]),
            (4, Limit::NONE)
        );
    }

    #[test]
    fn a_limit_takes_the_sizes_of_its_spans() {
        let limit = Limit::parse("131072, 8388608-33554432,2097152-2097152");
        let taken = [1, 131072, 2097152, 8388608, 16 << 20, 33554432];
        let not = [0, 131073, 2097151, 2097153, 8388607, 33554433];
        assert!(taken.iter().all(|&b| limit.takes(b)), "{limit:?}");
        assert!(!not.iter().any(|&b| limit.takes(b)), "{limit:?}");
        assert_eq!(
            limit.describe(|b| format!("{b}")),
            "up to 131072 and 2097152 and 8388608 – 33554432"
        );
        assert_eq!(Limit::parse("0"), Limit::NONE);
        assert!(Limit::parse("0").is_none() && Limit::up_to(0).is_none());
        for bad in ["", "x", "1-", "5,y", "-3"] {
            assert_eq!(Limit::parse(bad), Limit::NONE, "{bad:?}");
        }
        assert_eq!(
            Limit::parse("9-3"),
            Limit::NONE,
            "a span the wrong way round"
        );
        let many = Limit::parse("1-2,3-4,5-6,7-8");
        assert_eq!(many.spans().count(), SPANS);
        assert!(!many.takes(7), "past SPANS spans, the largest go");
        assert_eq!(Limit::from_words(limit.to_words()), limit);
        assert_eq!(Limit::from_words32(limit.to_words32()), limit);
        let huge = Limit::of([(0, 1 << 20), (5 << 30, 6 << 30)]);
        assert_eq!(
            Limit::from_words32(huge.to_words32()),
            Limit::of([(0, 1 << 20), (u32::MAX as usize, u32::MAX as usize)]),
            "past 4 GiB a span only narrows"
        );
    }

    #[test]
    fn the_shipped_table_has_every_column_and_no_all_reduce() {
        let header = TABLE.lines().find(|l| !l.starts_with('#')).unwrap();
        for collective in Collective::ALL.into_iter().skip(1) {
            let name = collective.variable_name().to_lowercase();
            assert!(header.split('\t').any(|c| c == name), "no column {name}");
        }
        let rows = rows(TABLE);
        assert!(!rows.is_empty());
        for row in &rows {
            assert!(row.limits[Collective::AllReduce as usize].is_none());
            assert!(row.nranks >= 2, "{row:?}");
            // Every cell reads whole: one that did not would silently turn a collective off.
            let kind = match row.kind {
                RowKind::Any => "any",
                RowKind::Plain => "plain",
            };
            let line = TABLE
                .lines()
                .find(|l| l.starts_with(&format!("{}\t{}\t{kind}\t", row.gpu, row.nranks)))
                .unwrap();
            for (name, cell) in header.split('\t').zip(line.split('\t')).skip(3) {
                let collective = Collective::ALL
                    .into_iter()
                    .find(|c| c.variable_name().eq_ignore_ascii_case(name))
                    .unwrap();
                let limit = row.limits[collective as usize];
                assert_eq!(cell == "0", limit.is_none(), "{line:?}: {cell:?}");
            }
        }
    }

    #[test]
    fn a_gpu_or_rank_count_not_measured_gets_nothing() {
        let measured = rows(TABLE).remove(0);
        assert_eq!(limits(&measured.gpu, measured.nranks).any, measured.limits);
        assert_eq!(limits(&measured.gpu, measured.nranks + 64), Measured::NONE);
        assert_eq!(
            limits("a GPU no one measured", measured.nranks),
            Measured::NONE
        );
    }

    #[test]
    fn plain_buffers_take_their_own_row_where_one_was_measured() {
        let table = "gpu\tranks\tbuffers\tall_gather\tgather\n\
                     GPU A\t2\tany\t4096\t128\n\
                     GPU A\t2\tplain\t8192\t256\n\
                     GPU A\t4\tany\t64\t0\n\
                     GPU A\t8\tsome\t64\t0\n";
        let rows = rows(table);
        assert_eq!(rows.len(), 3, "a row of no known kind is left out");
        assert_eq!(
            (rows[1].kind, rows[1].limits[Collective::AllGather as usize]),
            (RowKind::Plain, Limit::up_to(8192))
        );
        // Without a `buffers` column every row holds for any buffers.
        let old = super::rows("gpu\tranks\tgather\nGPU A\t2\t128\n");
        assert_eq!(old[0].kind, RowKind::Any);
        // The shipped table: every plain row's GPU has an `any` row, and takes at least as much.
        let shipped = super::rows(TABLE);
        for plain in shipped.iter().filter(|r| r.kind == RowKind::Plain) {
            let measured = limits(&plain.gpu, plain.nranks);
            assert_eq!(measured.plain, plain.limits);
            assert_ne!(measured.any, NONE, "{plain:?} has no any row");
        }
        let many = Measured {
            any: [Limit::up_to(1); 8],
            plain: [Limit::up_to(2); 8],
        };
        assert_eq!(many.of(Buffers::Plain)[1], Limit::up_to(2));
        assert_eq!(many.of(Buffers::InWindows)[1], Limit::up_to(1));
        let other = Measured::alike([Limit::up_to(3); 8]);
        let both = least_measured([many, other]);
        assert_eq!(
            (both.any[1], both.plain[1]),
            (Limit::up_to(1), Limit::up_to(2))
        );
    }

    #[test]
    fn a_communicator_takes_what_its_ranks_have_in_common() {
        let mut a = NONE;
        let mut b = NONE;
        a[1] = Limit::parse("8,100-400");
        b[1] = Limit::parse("2,300-500");
        a[2] = Limit::up_to(4);
        b[2] = Limit::up_to(6);
        a[3] = Limit::up_to(5);
        let both = least([a, b]);
        assert_eq!(both[1], Limit::parse("2,300-400"));
        assert_eq!(both[2], Limit::up_to(4));
        assert_eq!(both[3], Limit::NONE, "one rank has none");
        assert_eq!(
            Limit::parse("10-20").meet(&Limit::parse("30-40")),
            Limit::NONE
        );
        assert_eq!(least([]), NONE);
    }
}
