//! The `mphf` binary: parses the command line and runs it (see `datafusion_mphf::cli`).

use clap::Parser;

fn main() -> anyhow::Result<()> {
    let cli = datafusion_mphf::cli::Cli::parse();
    datafusion_mphf::cli::run(cli)?;
    Ok(())
}
