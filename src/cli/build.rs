//! `mphf build`: reads one Parquet column, builds its column index with a progress bar on
//! stderr, writes the index file, and prints one summary line.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::Args;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

use super::parquet_io::read_column;
use super::{CliError, InputArgs, ParamArgs};
use crate::core::column::ColumnIndex;

/// Arguments of `mphf build`.
#[derive(Debug, Clone, Args)]
pub struct BuildArgs {
    /// The Parquet input and key column.
    #[command(flatten)]
    pub input: InputArgs,
    /// MPHF parameters.
    #[command(flatten)]
    pub params: ParamArgs,
    /// Output index file (e.g. COL.mphf).
    #[arg(long, short = 'o')]
    pub output: PathBuf,
}

/// What a build produced, for the summary line.
#[derive(Debug, Clone)]
pub struct BuildSummary {
    /// Distinct keys.
    pub keys: u64,
    /// Bits per key of the MPHF alone.
    pub bits_per_key: f64,
    /// Bytes of the index file.
    pub index_bytes: u64,
    /// Seconds of the build (reading excluded).
    pub build_secs: f64,
}

impl std::fmt::Display for BuildSummary {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "keys {}, bits/key {:.3} (MPHF), index bytes {}, build time {:.3} s",
            self.keys, self.bits_per_key, self.index_bytes, self.build_secs
        )
    }
}

/// Runs `mphf build`.
///
/// # Errors
/// Reading, building or writing failed (see [`CliError`]).
pub fn run(args: &BuildArgs) -> Result<(), CliError> {
    args.params.options()?;
    let data = read_column(&args.input.input, &args.input.column)?;
    let non_null: u64 = data.chunks.iter().map(|c| (c.len() - c.null_count()) as u64).sum();
    let opts = args.params.options_for(non_null)?;

    let bar = ProgressBar::with_draw_target(Some(non_null), ProgressDrawTarget::stderr());
    bar.set_style(
        ProgressStyle::with_template("{spinner} building [{bar:40}] {pos}/{len} keys ({elapsed})")
            .expect("valid template")
            .progress_chars("=> "),
    );
    let counter = Arc::new(AtomicU64::new(0));
    let done = AtomicBool::new(false);
    let start = Instant::now();
    let result = std::thread::scope(|s| {
        s.spawn(|| {
            while !done.load(Ordering::Relaxed) {
                bar.set_position(counter.load(Ordering::Relaxed));
                std::thread::sleep(Duration::from_millis(100));
            }
        });
        let r = ColumnIndex::build_with_progress(&data.chunks, &opts, Some(counter.clone()));
        done.store(true, Ordering::Relaxed);
        r
    });
    let build_secs = start.elapsed().as_secs_f64();
    bar.finish_and_clear();
    let index = result?;
    drop(data);
    index.write_to_path(&args.output)?;
    let summary = BuildSummary {
        keys: index.len(),
        bits_per_key: index.mphf().bits_per_key(),
        index_bytes: index.size_bytes(),
        build_secs,
    };
    println!("{summary}");
    Ok(())
}
