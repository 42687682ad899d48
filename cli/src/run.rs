//! `ncclshim run -- CMD ...`: the command, with the shim first in `LD_PRELOAD` and the real
//! NCCL named in `NCCLSHIM_REAL_NCCL` (unless already set), in place of this process.

use std::ffi::OsString;
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::ExitCode;

use crate::libraries;

pub fn run(shim: Option<PathBuf>, quiet: bool, command: Vec<OsString>) -> ExitCode {
    let shim = match libraries::find_shim(shim) {
        Ok(shim) => shim,
        Err(e) => {
            eprintln!("ncclshim run: {e}");
            return ExitCode::FAILURE;
        }
    };
    let explicit = std::env::var_os("NCCLSHIM_REAL_NCCL").filter(|v| !v.is_empty());
    let real = match libraries::find_real() {
        Ok(found) => found.path,
        Err(not_found) => {
            eprintln!(
                "ncclshim run: no real NCCL found; fix: {}. Looked at:\n{not_found}",
                nccl::locate::HOW_TO_GET_NCCL
            );
            return ExitCode::FAILURE;
        }
    };
    let mut preload = OsString::from(&shim);
    if let Some(rest) = std::env::var_os("LD_PRELOAD").filter(|v| !v.is_empty()) {
        preload.push(":");
        preload.push(rest);
    }
    if !quiet {
        eprintln!(
            "ncclshim run: {} in front of the real NCCL at {}",
            shim.display(),
            real.display()
        );
    }
    let (program, args) = command.split_first().expect("clap requires a command");
    let error = std::process::Command::new(program)
        .args(args)
        .env("LD_PRELOAD", preload)
        .env(
            "NCCLSHIM_REAL_NCCL",
            explicit.unwrap_or_else(|| real.into()),
        )
        .exec();
    eprintln!("ncclshim run: {}: {error}", program.to_string_lossy());
    ExitCode::from(127)
}
