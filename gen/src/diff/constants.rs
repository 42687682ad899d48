use ncclshim_syntax::{Constant, Spec, readable_type};

use super::Section;

/// The constants that only say which release this is; the title says that already.
const VERSION_CONSTANTS: [&str; 4] = [
    "NCCL_MAJOR",
    "NCCL_MINOR",
    "NCCL_PATCH",
    "NCCL_VERSION_CODE",
];

/// Constants (`#define`s and enum values) added, removed, and changed in type or value.
pub(super) fn sections(from: &Spec, to: &Spec) -> Vec<Section> {
    let compared = |c: &&Constant| !VERSION_CONSTANTS.contains(&c.name.as_str());
    let added = to
        .constants
        .iter()
        .filter(compared)
        .filter(|c| from.constant(&c.name).is_none())
        .map(|c| format!("+ {}", describe(c)))
        .collect();
    let removed = from
        .constants
        .iter()
        .filter(compared)
        .filter(|c| to.constant(&c.name).is_none())
        .map(|c| format!("- {}", describe(c)))
        .collect();
    let changed = to
        .constants
        .iter()
        .filter(compared)
        .filter_map(|new| {
            let old = from.constant(&new.name)?;
            (old != new).then(|| {
                if old.ty == new.ty {
                    format!(
                        "~ {}: {} = {} -> {}",
                        new.name,
                        readable_type(&new.ty),
                        value(old),
                        value(new)
                    )
                } else {
                    format!("~ {} -> {}", describe(old), describe(new))
                }
            })
        })
        .collect();
    vec![
        Section {
            title: "Constants added",
            entries: added,
        },
        Section {
            title: "Constants removed",
            entries: removed,
        },
        Section {
            title: "Constants changed",
            entries: changed,
        },
    ]
}

fn describe(c: &Constant) -> String {
    format!("{}: {} = {}", c.name, readable_type(&c.ty), value(c))
}

/// `-1.0`, not the token stream's `- 1.0`.
fn value(c: &Constant) -> String {
    match c.value.strip_prefix("- ") {
        Some(negated) => format!("-{negated}"),
        None => c.value.clone(),
    }
}
