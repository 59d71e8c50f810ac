//! `mphf worker`: one datafusion-distributed worker with the MPHF codec, served over gRPC, for
//! coordinators started with `mphf sql --worker-url`. It opens the saved indexes that plans name
//! (from `--index-dir`, else from the coordinator's paths) and checks their fingerprints.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use anyhow::{Context as _, Result};
use clap::Args;
use datafusion_distributed::grpc::DefaultChannelResolver;
use tonic::transport::Server;

use crate::datafusion::distributed::{worker, WorkerIndexes};

/// Arguments of `mphf worker`.
#[derive(Args, Debug, Clone)]
pub struct WorkerArgs {
    /// Address to serve on.
    #[arg(long, value_name = "IP:PORT", default_value = "127.0.0.1:50051")]
    pub listen: SocketAddr,
    /// Folder of the saved indexes, as mounted on this machine (default: the paths the
    /// coordinator saved them at).
    #[arg(long, value_name = "DIR")]
    pub index_dir: Option<PathBuf>,
}

/// Serves until the process is stopped.
///
/// # Errors
/// The address cannot be bound, or the server fails.
pub async fn run(args: WorkerArgs) -> Result<()> {
    let indexes = Arc::new(WorkerIndexes::saved(args.index_dir.clone()).with_notices(true));
    let endpoint = worker(indexes, None, DefaultChannelResolver::default());
    eprintln!("mphf worker serving on {}", args.listen);
    Server::builder()
        .add_service(endpoint.into_worker_server())
        .serve(args.listen)
        .await
        .with_context(|| format!("serving on {}", args.listen))
}
