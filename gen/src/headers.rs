use std::path::{Path, PathBuf};

/// The headers one NCCL release declares its API in: `nccl.h`, and from 2.28 on `nccl_device.h`
/// beside it, whose `nccl_device/*.h` (C++) declare host functions the library exports too.
pub struct Headers {
    pub nccl_h: PathBuf,
    pub nccl_device_h: Option<PathBuf>,
}

impl Headers {
    /// The headers of the release whose `nccl.h` is `nccl_h`.
    pub fn beside(nccl_h: &Path) -> Result<Headers, String> {
        if !nccl_h.is_file() {
            return Err(format!("{}: no such file", nccl_h.display()));
        }
        let device = nccl_h.with_file_name("nccl_device.h");
        Ok(Headers {
            nccl_h: nccl_h.to_path_buf(),
            nccl_device_h: device.is_file().then_some(device),
        })
    }

    /// The folder both live in, which their `#include`s are relative to.
    pub fn include_dir(&self) -> &Path {
        self.nccl_h.parent().unwrap_or(Path::new("."))
    }
}
