//! The build/query comparison harness without the DataFusion-linked CLI:
//! `cargo run --release --no-default-features --features bench-peers --example bench_build -- --keys 1000000`
//! (same options as `mphf bench build`).

use clap::Parser;
use datafusion_mphf::cli::bench_build::{run, BenchBuildArgs};

#[derive(Parser)]
struct Cli {
    #[command(flatten)]
    args: BenchBuildArgs,
}

fn main() -> anyhow::Result<()> {
    run(&Cli::parse().args)?;
    Ok(())
}
