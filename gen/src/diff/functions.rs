use ncclshim_syntax::{Spec, same_signature, without_paths};

use super::Section;

/// Functions added, removed, and those whose parameter or result types changed. A renamed
/// parameter is no change, and neither is a type named through another alias of the same type
/// (`ncclMultimemHandle` -> `ncclMultimemHandle_t`); a changed struct shows under the types.
pub(super) fn sections(from: &Spec, to: &Spec) -> Vec<Section> {
    let added = to
        .functions
        .iter()
        .filter(|f| from.function(&f.name).is_none())
        .map(|f| format!("+ {}", without_paths(&f.signature())))
        .collect();
    let removed = from
        .functions
        .iter()
        .filter(|f| to.function(&f.name).is_none())
        .map(|f| format!("- {}", without_paths(&f.signature())))
        .collect();
    let changed = to
        .functions
        .iter()
        .filter_map(|new| {
            let old = from.function(&new.name)?;
            (!same_signature(from, old, to, new)).then(|| {
                format!(
                    "~ {}\n    {}: {}\n    {}: {}",
                    new.name,
                    from.version,
                    without_paths(&old.signature()),
                    to.version,
                    without_paths(&new.signature())
                )
            })
        })
        .collect();
    vec![
        Section {
            title: "Functions added",
            entries: added,
        },
        Section {
            title: "Functions removed",
            entries: removed,
        },
        Section {
            title: "Functions whose signature changed",
            entries: changed,
        },
    ]
}
