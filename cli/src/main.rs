//! `ncclshim`: what a user runs to see whether a machine is ready for the shim (`doctor`), to
//! run a program with the shim in front (`run -- CMD ...`), and to sum up trace files
//! (`trace FILES...`).

mod allreduce;
mod doctor;
mod gpus;
mod libraries;
mod run;
mod trace;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "ncclshim",
    version,
    about = "ncclshim: a drop-in libnccl.so.2 in front of NVIDIA's NCCL"
)]
struct Cli {
    /// The shim's libnccl.so.2 (default: $NCCLSHIM_LIB, else ../lib/libnccl.so.2 beside this
    /// program, as `make build` and `make install` lay them out)
    #[arg(long, global = true)]
    shim: Option<PathBuf>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Checks this machine: the real NCCL the shim would use, the GPUs, the core's kernels and
    /// routing, and with GPUs a short all-reduce through the shim and the real NCCL side by
    /// side. Exits 1 if something a job needs is missing, saying how to fix it.
    Doctor {
        /// Skip the all-reduce on the GPUs
        #[arg(long)]
        no_run: bool,
    },
    /// Runs a command with the shim in front (LD_PRELOAD) and the real NCCL named
    /// (NCCLSHIM_REAL_NCCL): `ncclshim run -- torchrun ...`
    Run {
        /// Say nothing before running the command
        #[arg(long, short)]
        quiet: bool,
        /// The command and its arguments
        #[arg(required = true, trailing_var_arg = true, allow_hyphen_values = true)]
        command: Vec<std::ffi::OsString>,
    },
    /// Sums up trace files (NCCLSHIM_TRACE): per operation and size band the calls, the share
    /// the core ran, and per file (process) where each communicator's calls stopped; logs with
    /// flight-recorder dumps count for where they stopped
    Trace {
        #[arg(required = true)]
        files: Vec<PathBuf>,
    },
    /// Asks running processes (started with NCCLSHIM_DUMP_ON_SIGNAL=1) to write every
    /// communicator's last calls to their logs (sends SIGUSR1)
    Dump {
        #[arg(required = true)]
        pids: Vec<i32>,
    },
    /// (doctor's child) all-reduces on the first GPUS GPUs through the NCCL at LIBRARY
    #[command(hide = true)]
    AllReduceCheck { library: PathBuf, gpus: usize },
}

unsafe extern "C" {
    fn signal(signum: i32, handler: usize) -> usize;
    fn kill(pid: i32, signum: i32) -> i32;
}
const SIGPIPE: i32 = 13;
const SIGUSR1: i32 = 10;

/// SIGUSR1 to each process: the shim's flight recorder goes to its log (NCCL_DEBUG_FILE or
/// stdout) where NCCLSHIM_DUMP_ON_SIGNAL=1 was set; `ncclshim trace` reads such logs.
fn dump(pids: &[i32]) -> ExitCode {
    let mut failed = false;
    for &pid in pids {
        // SAFETY: sends a signal; a wrong pid only fails.
        if pid <= 0 || unsafe { kill(pid, SIGUSR1) } != 0 {
            eprintln!(
                "ncclshim dump: cannot signal process {pid}: {}",
                std::io::Error::last_os_error()
            );
            failed = true;
        }
    }
    if failed {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}
const SIG_DFL: usize = 0;

fn main() -> ExitCode {
    // Output into a closed pipe (`ncclshim doctor | head`) ends the program quietly, as other
    // command-line programs do, instead of panicking.
    // SAFETY: restores the default action of a signal, before any thread exists.
    unsafe { signal(SIGPIPE, SIG_DFL) };
    let cli = Cli::parse();
    let shim = cli.shim;
    match cli.command {
        Command::Doctor { no_run } => doctor::run(shim, !no_run),
        Command::Run { quiet, command } => run::run(shim, quiet, command),
        Command::Trace { files } => trace::run(&files),
        Command::Dump { pids } => dump(&pids),
        Command::AllReduceCheck { library, gpus } => match allreduce::child(&library, gpus) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("{e}");
                ExitCode::FAILURE
            }
        },
    }
}
