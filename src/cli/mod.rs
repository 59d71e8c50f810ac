//! The `mphf` command line: one module per subcommand.

#[cfg(feature = "bench-peers")]
pub mod bench_build;
