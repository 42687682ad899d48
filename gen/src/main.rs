//! ncclshim-gen: turns an NVIDIA `nccl.h` (with `nccl_device.h` beside it, from 2.28 on) into
//! `spec/nccl-<version>.rs`, and tells the difference between two specs.
//!
//!   ncclshim-gen spec <nccl.h> <out-dir>     writes <out-dir>/nccl-X.Y.Z.rs, prints its path
//!   ncclshim-gen diff <from.rs> <to.rs>      prints what changed between two specs

mod bindgen_run;
mod diff;
mod headers;
mod spec_file;

use std::path::PathBuf;
use std::process::ExitCode;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let result = match args
        .iter()
        .map(String::as_str)
        .collect::<Vec<_>>()
        .as_slice()
    {
        ["spec", header, out_dir] => {
            spec_file::write_spec(&PathBuf::from(header), &PathBuf::from(out_dir))
                .map(|path| println!("{}", path.display()))
        }
        ["diff", from, to] => {
            diff::diff_files(&PathBuf::from(from), &PathBuf::from(to)).map(|text| print!("{text}"))
        }
        _ => Err(
            "usage: ncclshim-gen spec <nccl.h> <out-dir> | ncclshim-gen diff <from.rs> <to.rs>"
                .to_string(),
        ),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("ncclshim-gen: {e}");
            ExitCode::FAILURE
        }
    }
}
