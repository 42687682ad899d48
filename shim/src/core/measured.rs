//! The measured limits of the collectives other than all-reduce: per GPU model and number of
//! ranks, the largest call each one's core takes by default (`measured_limits.tsv`, written by
//! the GPU suite). Each rank looks its own GPU up; the communicator takes the least of its
//! ranks' limits (setup.rs), so that every rank decides alike.

use std::sync::atomic::{AtomicBool, Ordering};

use super::types::Collective;

/// Every collective's limit in bytes, by `Collective as usize` (all-reduce's unused: 0).
pub type Limits = [usize; Collective::ALL.len()];

const TABLE: &str = include_str!("measured_limits.tsv");

/// The row for a GPU of this name and `nranks` ranks; every limit 0 where none was measured.
pub fn limits(gpu: &str, nranks: usize) -> Limits {
    rows(TABLE)
        .into_iter()
        .find(|row| row.gpu == gpu && row.nranks == nranks)
        .map_or([0; Collective::ALL.len()], |row| row.limits)
}

/// One measured row.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Row {
    pub gpu: String,
    pub nranks: usize,
    pub limits: Limits,
}

/// The rows of a table: tab-separated, `#` comments, a header naming the columns ("gpu",
/// "ranks", then collectives as their settings spell them, in lower case). A cell that does not
/// read as a number counts as 0: a limit not known is no limit to rely on.
pub fn rows(table: &str) -> Vec<Row> {
    let mut lines = table
        .lines()
        .filter(|line| !line.trim().is_empty() && !line.starts_with('#'));
    let Some(header) = lines.next() else {
        return Vec::new();
    };
    let columns: Vec<Option<Collective>> = header
        .split('\t')
        .map(|name| {
            Collective::ALL
                .into_iter()
                .find(|c| c.variable_name().eq_ignore_ascii_case(name.trim()))
        })
        .collect();
    lines
        .filter_map(|line| {
            let cells: Vec<&str> = line.split('\t').map(str::trim).collect();
            let (gpu, nranks) = (cells.first()?, cells.get(1)?.parse().ok()?);
            let mut limits = [0; Collective::ALL.len()];
            for (column, cell) in columns.iter().zip(&cells).skip(2) {
                if let Some(c) = column.filter(|&c| c != Collective::AllReduce) {
                    limits[c as usize] = cell.parse().unwrap_or(0);
                }
            }
            Some(Row {
                gpu: gpu.to_string(),
                nranks,
                limits,
            })
        })
        .collect()
}

/// The limits of every rank's row (`limits`), the least of each.
pub fn least(ranks: impl IntoIterator<Item = Limits>) -> Limits {
    ranks
        .into_iter()
        .reduce(|a, b| std::array::from_fn(|i| a[i].min(b[i])))
        .unwrap_or([0; Collective::ALL.len()])
}

/// Whether some communicator of this process may give calls of a collective to its core by its
/// measured limit: until one does, such calls forward at once, as for a collective that is off,
/// without looking their communicator up. Set before that communicator's set-up returns on every
/// rank, so that its calls find it set on all of them.
static MEASURED_ON: [AtomicBool; Collective::ALL.len()] =
    [const { AtomicBool::new(false) }; Collective::ALL.len()];

/// Notes the limits of a communicator whose core came on.
pub fn note_in_use(limits: &Limits) {
    for (on, &limit) in MEASURED_ON.iter().zip(limits) {
        if limit > 0 {
            on.store(true, Ordering::Relaxed);
        }
    }
}

/// Whether some communicator of this process has a measured limit above 0 for `collective`.
pub fn in_use(collective: Collective) -> bool {
    MEASURED_ON[collective as usize].load(Ordering::Relaxed)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_table_reads_by_its_header() {
        let table =
            "# note\ngpu\tranks\tscatter\tall_gather\nGPU A\t2\t4096\t128\nGPU B\t4\tx\t7\n";
        let rows = rows(table);
        assert_eq!(rows.len(), 2);
        assert_eq!(rows[0].gpu, "GPU A");
        assert_eq!(rows[0].limits[Collective::Scatter as usize], 4096);
        assert_eq!(rows[0].limits[Collective::AllGather as usize], 128);
        assert_eq!(rows[0].limits[Collective::Gather as usize], 0);
        assert_eq!(
            (rows[1].nranks, rows[1].limits[Collective::Scatter as usize]),
            (4, 0)
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
            assert_eq!(row.limits[Collective::AllReduce as usize], 0);
            assert!(row.nranks >= 2, "{row:?}");
        }
    }

    #[test]
    fn a_gpu_or_rank_count_not_measured_gets_nothing() {
        let measured = rows(TABLE).remove(0);
        assert_eq!(limits(&measured.gpu, measured.nranks), measured.limits);
        assert_eq!(limits(&measured.gpu, measured.nranks + 64), [0; 8]);
        assert_eq!(limits("a GPU no one measured", measured.nranks), [0; 8]);
    }

    #[test]
    fn a_communicator_takes_the_least_of_its_ranks() {
        let a = [0, 8, 4, 0, 9, 1, 2, 3];
        let b = [0, 2, 6, 5, 0, 1, 9, 3];
        assert_eq!(least([a, b]), [0, 2, 4, 0, 0, 1, 2, 3]);
        assert_eq!(least([]), [0; 8]);
    }
}
