//! The `mphf` binary: parses the command line and runs it (see `datafusion_mphf::cli`).

use std::process::ExitCode;

use clap::Parser;

/// mimalloc, as datafusion-cli uses: glibc's allocator made the same query's time vary 2-3× from
/// process to process (see benches/RESULTS.md, session 4).
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> ExitCode {
    let cli = datafusion_mphf::cli::Cli::parse();
    match datafusion_mphf::cli::run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            // One line with the whole cause chain; no backtrace (the messages carry the context).
            eprintln!("error: {err}");
            ExitCode::FAILURE
        }
    }
}
