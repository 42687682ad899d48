use std::path::Path;

/// Placeholder until the version-difference issue; keeps the command line stable.
pub fn diff_files(from: &Path, to: &Path) -> Result<String, String> {
    let from = ncclshim_syntax::parse_spec_file(from)?;
    let to = ncclshim_syntax::parse_spec_file(to)?;
    let mut out = format!("NCCL {} -> {}\n", from.version, to.version);
    for f in &to.functions {
        if from.function(&f.name).is_none() {
            out += &format!("+ {}\n", f.signature());
        }
    }
    for f in &from.functions {
        if to.function(&f.name).is_none() {
            out += &format!("- {}\n", f.signature());
        }
    }
    Ok(out)
}
