use ncclshim_syntax::{Alias, Record, Spec, readable_type};

use super::Section;

/// Structs, unions and aliases added, removed and changed. A struct that an alias of both
/// versions names under a new name (`ncclConfig_t`: `ncclConfig_v22700` -> `ncclConfig_v22800`)
/// shows as a change of the alias, with the layout compared, not as one struct gone and one new.
pub(super) fn sections(from: &Spec, to: &Spec) -> Vec<Section> {
    let mut renamed_old = Vec::new();
    let mut renamed_new = Vec::new();
    let mut changed = Vec::new();
    for new in &to.aliases {
        let Some(old) = from.alias(&new.name) else {
            continue;
        };
        if old.target == new.target {
            continue;
        }
        match (from.resolve_record(&old.name), to.resolve_record(&new.name)) {
            (Some(old_record), Some(new_record)) => {
                renamed_old.push(old_record.name.clone());
                renamed_new.push(new_record.name.clone());
                let (summary, fields) = compare(old_record, new_record);
                changed.push(entry(
                    format!(
                        "~ {}: {} {} -> {}{summary}",
                        new.name, new_record.kind, old_record.name, new_record.name
                    ),
                    &fields,
                ));
            }
            _ => changed.push(format!(
                "~ {} = {} -> {}",
                new.name,
                readable_type(&old.target),
                readable_type(&new.target)
            )),
        }
    }
    for new in &to.records {
        let Some(old) = from.record(&new.name) else {
            continue;
        };
        let (summary, fields) = compare(old, new);
        if old != new {
            changed.push(entry(
                format!("~ {} {}{summary}", new.kind, new.name),
                &fields,
            ));
        }
    }

    let added = only_in(to, from, &renamed_new, "+");
    let removed = only_in(from, to, &renamed_old, "-");
    vec![
        Section {
            title: "Types added",
            entries: added,
        },
        Section {
            title: "Types removed",
            entries: removed,
        },
        Section {
            title: "Types changed",
            entries: changed,
        },
    ]
}

/// The records and aliases of `spec` that `other` lacks, but for the records in `renamed`.
fn only_in(spec: &Spec, other: &Spec, renamed: &[String], sign: &str) -> Vec<String> {
    let records = spec
        .records
        .iter()
        .filter(|r| other.record(&r.name).is_none() && !renamed.contains(&r.name))
        .map(|r| format!("{sign} {}", describe_record(r)));
    let aliases = spec
        .aliases
        .iter()
        .filter(|a| other.alias(&a.name).is_none())
        .map(|a| format!("{sign} {}", describe_alias(a)));
    records.chain(aliases).collect()
}

fn describe_record(r: &Record) -> String {
    if r.opaque {
        return format!("{} {} (opaque)", r.kind, r.name);
    }
    match r.size {
        Some(size) => format!("{} {}, {size} bytes", r.kind, r.name),
        None => format!("{} {}", r.kind, r.name),
    }
}

fn describe_alias(a: &Alias) -> String {
    format!("{} = {}", a.name, readable_type(&a.target))
}

/// A change's first line, with its details indented under it.
fn entry(first: String, details: &[String]) -> String {
    let mut text = first;
    for line in details {
        text += "\n    ";
        text += line;
    }
    text
}

/// How `new`'s layout differs from `old`'s: a summary for the heading (`, 72 -> 80 bytes`),
/// and one line per field added, removed or moved or retyped.
fn compare(old: &Record, new: &Record) -> (String, Vec<String>) {
    let mut summary = String::new();
    if old.kind != new.kind {
        summary += &format!(", was a {}", old.kind);
    }
    match (old.opaque, new.opaque) {
        (true, true) => summary += " (opaque)",
        (true, false) => summary += &format!(", now defined{}", size_text(new.size)),
        (false, true) => summary += ", now opaque",
        (false, false) if old.size != new.size => {
            summary += &format!(", {} -> {} bytes", number(old.size), number(new.size));
        }
        (false, false) => summary += &size_text(new.size),
    }
    if !old.opaque && !new.opaque && old.align != new.align {
        summary += &format!(
            ", aligned to {} -> {}",
            number(old.align),
            number(new.align)
        );
    }
    let mut fields = Vec::new();
    for field in &new.fields {
        let described = format!(
            "{}: {} at {}",
            field.name,
            readable_type(&field.ty),
            number(field.offset)
        );
        match old.field(&field.name) {
            None => fields.push(format!("+ {described}")),
            Some(before) if before != field => fields.push(format!(
                "~ {}: {} at {} -> {} at {}",
                field.name,
                readable_type(&before.ty),
                number(before.offset),
                readable_type(&field.ty),
                number(field.offset)
            )),
            Some(_) => {}
        }
    }
    for field in old.fields.iter().filter(|f| new.field(&f.name).is_none()) {
        fields.push(format!(
            "- {}: {} at {}",
            field.name,
            readable_type(&field.ty),
            number(field.offset)
        ));
    }
    (summary, fields)
}

fn size_text(size: Option<usize>) -> String {
    size.map_or_else(String::new, |s| format!(", {s} bytes"))
}

fn number(n: Option<usize>) -> String {
    n.map_or_else(|| "?".to_string(), |n| n.to_string())
}
