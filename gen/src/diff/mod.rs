//! What changed between two specs, for people: functions, types (with their layout) and
//! constants added, removed and changed.

mod constants;
mod functions;
mod types;

use std::fmt;
use std::path::Path;

use ncclshim_syntax::Spec;

/// Reads two spec files and tells what changed from the first to the second.
pub fn diff_files(from: &Path, to: &Path) -> Result<String, String> {
    let from = ncclshim_syntax::parse_spec_file(from)?;
    let to = ncclshim_syntax::parse_spec_file(to)?;
    Ok(SpecDiff::between(&from, &to).to_string())
}

/// The difference between two specs, section by section.
pub struct SpecDiff {
    title: String,
    sections: Vec<Section>,
}

impl SpecDiff {
    pub fn between(from: &Spec, to: &Spec) -> SpecDiff {
        let mut sections = functions::sections(from, to);
        sections.extend(types::sections(from, to));
        sections.extend(constants::sections(from, to));
        SpecDiff {
            title: format!("NCCL {} -> {}", from.version, to.version),
            sections: sections
                .into_iter()
                .filter(|s| !s.entries.is_empty())
                .collect(),
        }
    }
}

impl fmt::Display for SpecDiff {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "{}", self.title)?;
        if self.sections.is_empty() {
            return writeln!(f, "\nNo differences.");
        }
        for section in &self.sections {
            writeln!(f, "\n{} ({}):", section.title, section.entries.len())?;
            for entry in &section.entries {
                for line in entry.lines() {
                    writeln!(f, "  {line}")?;
                }
            }
        }
        Ok(())
    }
}

/// One heading and its entries; an entry is one line, or several (details indented).
struct Section {
    title: &'static str,
    entries: Vec<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(minor: u32, body: &str) -> Spec {
        ncclshim_syntax::parse_spec(&format!(
            "pub const NCCL_MAJOR: u32 = 2; pub const NCCL_MINOR: u32 = {minor};
             pub const NCCL_PATCH: u32 = 1; pub type ncclResult_t = ::std::os::raw::c_uint;
             {body}"
        ))
        .unwrap()
    }

    #[test]
    fn identical_specs_have_no_differences() {
        let a = spec(
            27,
            "unsafe extern \"C\" { pub fn ncclF() -> ncclResult_t; }",
        );
        let text = SpecDiff::between(&a, &a).to_string();
        assert_eq!(text, "NCCL 2.27.1 -> 2.27.1\n\nNo differences.\n");
    }

    #[test]
    fn sections_count_their_entries_and_indent_details() {
        let old = spec(
            27,
            "unsafe extern \"C\" { pub fn ncclF(a: ::std::os::raw::c_int) -> ncclResult_t; }",
        );
        let new = spec(
            28,
            "unsafe extern \"C\" { pub fn ncclF(a: i64) -> ncclResult_t; pub fn ncclG(); }",
        );
        let text = SpecDiff::between(&old, &new).to_string();
        assert_eq!(
            text,
            "NCCL 2.27.1 -> 2.28.1\n\
             \n\
             Functions added (1):\n  + ncclG() -> ()\n\
             \n\
             Functions whose signature changed (1):\n  ~ ncclF\n      2.27.1: ncclF(a: c_int) -> ncclResult_t\n      2.28.1: ncclF(a: i64) -> ncclResult_t\n"
        );
    }
}
