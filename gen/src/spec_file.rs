use std::path::{Path, PathBuf};

use crate::bindgen_run;
use crate::headers::Headers;

/// Runs bindgen on the headers beside `nccl_h` and writes the spec into `out_dir`, named after
/// their version.
pub fn write_spec(nccl_h: &Path, out_dir: &Path) -> Result<PathBuf, String> {
    let headers = Headers::beside(nccl_h)?;
    let text = bindgen_run::generate(&headers)?;
    let spec = ncclshim_syntax::parse_spec(&text)
        .map_err(|e| format!("bindgen's output for {}: {e}", nccl_h.display()))?;
    if spec.functions.is_empty() {
        return Err(format!("{} declares no nccl functions", nccl_h.display()));
    }
    let path = out_dir.join(format!("nccl-{}.rs", spec.version));
    std::fs::write(&path, text).map_err(|e| format!("{}: {e}", path.display()))?;
    Ok(path)
}
