//! `mphf sql`: run SQL over Parquet tables with the MPHF extension, from `-c`, `-f` or an
//! interactive shell (line editing and history, like datafusion-cli).

use std::path::PathBuf;
use std::time::Instant;

use ::datafusion::arrow::array::RecordBatch;
use ::datafusion::arrow::util::pretty::pretty_format_batches;
use ::datafusion::dataframe::DataFrame;
use ::datafusion::execution::runtime_env::RuntimeEnvBuilder;
use ::datafusion::execution::session_state::SessionStateBuilder;
use ::datafusion::prelude::{ParquetReadOptions, SessionConfig, SessionContext};
use anyhow::{anyhow, bail, Context as _, Result};
use clap::{Args, ValueEnum};

use super::demo::apply_tuning;
use crate::datafusion::config::OnStale;
use crate::datafusion::statements::split_statements;
use crate::datafusion::{MphfConfig, MphfContext};

/// Output formats of query results.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Format {
    /// An ASCII table.
    Table,
    /// CSV with a header line.
    Csv,
    /// One JSON object per row (newline-delimited).
    Json,
}

/// Arguments of `mphf sql`.
#[derive(Args, Debug, Clone)]
pub struct SqlArgs {
    /// Register a Parquet file or folder as a table (repeatable); saved MPHF indexes are loaded.
    #[arg(long = "table", value_name = "NAME=PATH")]
    pub tables: Vec<String>,
    /// Run this SQL statement (repeatable, run in order).
    #[arg(short = 'c', long = "command", value_name = "SQL")]
    pub commands: Vec<String>,
    /// Run the statements of this file (`;`-separated; repeatable).
    #[arg(short = 'f', long = "file", value_name = "FILE.sql")]
    pub files: Vec<PathBuf>,
    /// Output format of query results.
    #[arg(long, value_enum, default_value_t = Format::Table)]
    pub format: Format,
    /// Directory for saved MPHF indexes (default: a `_mphf/` folder next to the data).
    #[arg(long, value_name = "DIR")]
    pub index_dir: Option<PathBuf>,
    /// What to do with a saved index that no longer matches its data, from the first
    /// registration on (`SET mphf.on_stale` comes too late for `--table` tables).
    #[arg(long, value_name = "rebuild|refuse")]
    pub on_stale: Option<OnStale>,
    /// Memory limit of the session's pool (e.g. `512M`, `2G`): queries, index builds and
    /// loads that need more fail with "resources exhausted" instead of growing without bound.
    #[arg(long, value_name = "BYTES", value_parser = parse_bytes)]
    pub memory_limit: Option<usize>,
    /// Plain DataFusion, without the MPHF extension (for comparison).
    #[arg(long)]
    pub no_mphf: bool,
    /// Do not print timings on stderr.
    #[arg(long, short = 'q')]
    pub quiet: bool,
    /// Plan with the cost constants `mphf calibrate` wrote to this file.
    #[arg(long, value_name = "FILE")]
    pub costs: Option<PathBuf>,
    /// `NAME=VALUE`: one of the planner's thresholds (`Tuning`, not a setting) changed before
    /// the statements run (repeatable, applied after `--costs`), e.g.
    /// `--tune join_partitioned_max_partitions=0`.
    #[arg(long = "tune", value_name = "NAME=VALUE")]
    pub tune: Vec<String>,
    /// Run the statements on an in-memory cluster of N datafusion-distributed workers in this
    /// process: every stage is encoded, sent over gRPC on an in-process stream and decoded by
    /// a worker, as between machines (0: one process, no cluster).
    #[arg(long, value_name = "N", default_value_t = 0)]
    pub workers: usize,
    /// Run the statements on the `mphf worker` at this URL (repeatable: one per worker, e.g.
    /// `http://10.0.0.2:50051`). The workers open the saved indexes themselves.
    #[arg(long = "worker-url", value_name = "URL", conflicts_with = "workers")]
    pub worker_urls: Vec<String>,
}

/// A session with or without the extension.
pub enum Session {
    /// With the MPHF extension.
    Mphf(MphfContext),
    /// Plain DataFusion.
    Plain(SessionContext),
}

impl Session {
    /// Runs one statement.
    pub async fn sql(&self, sql: &str) -> ::datafusion::error::Result<DataFrame> {
        match self {
            Session::Mphf(c) => c.sql(sql).await,
            Session::Plain(c) => c.sql(sql).await,
        }
    }
    /// Registers a Parquet file or folder (loading saved indexes with the extension).
    pub async fn register_parquet(&self, name: &str, path: &str) -> ::datafusion::error::Result<()> {
        match self {
            Session::Mphf(c) => c.register_parquet(name, path).await,
            Session::Plain(c) => c.register_parquet(name, path, ParquetReadOptions::default()).await,
        }
    }
}

/// Prints batches to stdout in `format`.
pub fn print_batches(batches: &[RecordBatch], format: Format) -> Result<()> {
    if batches.is_empty() || batches[0].num_columns() == 0 {
        return Ok(());
    }
    let stdout = std::io::stdout();
    match format {
        Format::Table => println!("{}", pretty_format_batches(batches)?),
        Format::Csv => {
            let mut w = ::datafusion::arrow::csv::WriterBuilder::new()
                .with_header(true)
                .build(stdout.lock());
            for b in batches {
                w.write(b)?;
            }
        }
        Format::Json => {
            let mut w = ::datafusion::arrow::json::LineDelimitedWriter::new(stdout.lock());
            for b in batches {
                w.write(b)?;
            }
            w.finish()?;
        }
    }
    Ok(())
}

async fn run_statement(session: &Session, sql: &str, args: &SqlArgs) -> Result<()> {
    let started = Instant::now();
    let df = session.sql(sql).await?;
    let batches = df.collect().await?;
    print_batches(&batches, args.format)?;
    if !args.quiet {
        let rows: usize = batches.iter().map(|b| b.num_rows()).sum();
        eprintln!("{rows} row(s) in {:.3} s", started.elapsed().as_secs_f64());
    }
    Ok(())
}

fn shell_history() -> Option<PathBuf> {
    std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".mphf_history"))
}

async fn shell(session: &Session, args: &SqlArgs) -> Result<()> {
    use rustyline::error::ReadlineError;
    let mut rl = rustyline::DefaultEditor::new()?;
    let history = shell_history();
    if let Some(h) = &history {
        let _ = rl.load_history(h);
    }
    eprintln!("mphf sql shell: end statements with ';', \\q to quit");
    let mut buf = String::new();
    loop {
        let prompt = if buf.is_empty() { "mphf> " } else { "   -> " };
        match rl.readline(prompt) {
            Ok(line) => {
                let t = line.trim();
                if buf.is_empty() && matches!(t, "\\q" | "quit" | "exit") {
                    break;
                }
                buf.push_str(&line);
                buf.push('\n');
                if t.ends_with(';') {
                    let _ = rl.add_history_entry(buf.trim());
                    for stmt in split_statements(&buf) {
                        if let Err(e) = run_statement(session, &stmt, args).await {
                            eprintln!("error: {e:#}");
                        }
                    }
                    buf.clear();
                }
            }
            Err(ReadlineError::Interrupted) => buf.clear(),
            Err(ReadlineError::Eof) => break,
            Err(e) => return Err(e.into()),
        }
    }
    if let Some(h) = &history {
        let _ = rl.save_history(h);
    }
    Ok(())
}

/// `512`, `64K`, `512M`, `2G` (binary multiples) as bytes.
fn parse_bytes(text: &str) -> std::result::Result<usize, String> {
    let t = text.trim();
    let (digits, unit) = match t.char_indices().find(|(_, c)| !c.is_ascii_digit()) {
        Some((i, _)) => t.split_at(i),
        None => (t, ""),
    };
    let shift = match unit.to_ascii_uppercase().trim_end_matches('B') {
        "" => 0,
        "K" => 10,
        "M" => 20,
        "G" => 30,
        "T" => 40,
        _ => return Err(format!("'{text}' is not a size (examples: 512M, 2G)")),
    };
    let n: usize = digits
        .parse()
        .map_err(|_| format!("'{text}' is not a size (examples: 512M, 2G)"))?;
    match n.checked_mul(1 << shift) {
        Some(0) => Err("the memory limit must be above 0".into()),
        Some(b) => Ok(b),
        None => Err(format!("'{text}' is too large")),
    }
}

/// The session `args` ask for: with or without the extension, the memory limit and the
/// stale-index policy in force before any table is registered.
fn session(args: &SqlArgs) -> Result<Session> {
    let mut config = SessionConfig::new();
    if !args.no_mphf {
        let mphf = MphfConfig {
            on_stale: args.on_stale.unwrap_or_default(),
            ..MphfConfig::default()
        };
        config = config.with_option_extension(mphf);
    }
    let mut runtime = RuntimeEnvBuilder::new();
    if let Some(limit) = args.memory_limit {
        runtime = runtime.with_memory_limit(limit, 1.0);
    }
    let state = SessionStateBuilder::new()
        .with_default_features()
        .with_config(config)
        .with_runtime_env(runtime.build_arc()?);
    // With --no-mphf the cluster runs DataFusion's own plans: the coordinator has no MPHF
    // rules, and the workers execute whatever plan they are sent.
    let state = match args.workers > 0 || !args.worker_urls.is_empty() {
        true => cluster(args, state)?,
        false => state,
    };
    Ok(match args.no_mphf {
        true => Session::Plain(SessionContext::new_with_state(state.build())),
        false => Session::Mphf(MphfContext::with_state_builder(state)),
    })
}

/// `state` as the coordinator of `--workers N` in-memory workers, or of the `mphf worker`s at
/// `--worker-url`s.
#[cfg(feature = "distributed")]
fn cluster(args: &SqlArgs, state: SessionStateBuilder) -> Result<SessionStateBuilder> {
    use crate::datafusion::distributed::{distributed_state, InMemoryCluster, MphfCodec, WorkerIndexes};
    use datafusion_distributed::grpc::DefaultChannelResolver;
    use std::sync::Arc;
    if args.workers > 0 {
        return Ok(InMemoryCluster::new(args.workers).start(state)?);
    }
    let urls = args
        .worker_urls
        .iter()
        .map(|u| url::Url::parse(u).with_context(|| format!("--worker-url {u}")))
        .collect::<Result<Vec<_>>>()?;
    let codec = MphfCodec::new(Arc::new(WorkerIndexes::saved(None)), None);
    Ok(distributed_state(
        state,
        StaticWorkers(urls),
        DefaultChannelResolver::default(),
        codec,
    ))
}

/// The workers named on the command line.
#[cfg(feature = "distributed")]
struct StaticWorkers(Vec<url::Url>);

#[cfg(feature = "distributed")]
impl datafusion_distributed::WorkerResolver for StaticWorkers {
    fn get_urls(&self) -> ::datafusion::error::Result<Vec<url::Url>> {
        Ok(self.0.clone())
    }
}

#[cfg(not(feature = "distributed"))]
fn cluster(_args: &SqlArgs, _state: SessionStateBuilder) -> Result<SessionStateBuilder> {
    Err(anyhow!(
        "--workers needs the `distributed` feature; build with the default features"
    ))
}

/// Runs `mphf sql`.
///
/// # Errors
/// The first failing statement (with `-c` / `-f`), bad `--table` values, I/O errors.
pub async fn run(args: SqlArgs) -> Result<()> {
    let session = session(&args)?;
    if let (Some(path), Session::Mphf(ctx)) = (&args.costs, &session) {
        ctx.load_costs(path)?;
    }
    match &session {
        Session::Mphf(ctx) => apply_tuning(ctx, &args.tune)?,
        _ if !args.tune.is_empty() => bail!("--tune changes the MPHF planner's thresholds; drop --no-mphf"),
        _ => {}
    }
    if let (Some(dir), Session::Mphf(_)) = (&args.index_dir, &session) {
        let dir = dir.display().to_string().replace('\'', "''");
        session.sql(&format!("SET mphf.index_dir = '{dir}'")).await?;
    }
    for t in &args.tables {
        let (name, path) = t
            .split_once('=')
            .ok_or_else(|| anyhow!("--table expects NAME=PATH, got '{t}'"))?;
        session
            .register_parquet(name, path)
            .await
            .with_context(|| format!("registering {name} from {path}"))?;
    }
    let mut statements: Vec<String> = args.commands.clone();
    for f in &args.files {
        let script = std::fs::read_to_string(f).with_context(|| format!("reading {}", f.display()))?;
        statements.extend(split_statements(&script));
    }
    if statements.is_empty() {
        return shell(&session, &args).await;
    }
    for s in &statements {
        run_statement(&session, s, &args)
            .await
            .with_context(|| format!("in statement: {s}"))?;
    }
    Ok(())
}
