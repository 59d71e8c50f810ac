//! An MPHF-aware session on datafusion-distributed, and the in-memory cluster that tests and
//! `mphf sql --workers N` run it on.
//!
//! [`distributed_state`] makes the coordinator's session builder: the distributed planner, the
//! given worker and channel resolvers, the [`MphfCodec`], the `mphf.*` options sent to the
//! workers with every query. [`MphfContext::with_state_builder`](crate::datafusion::MphfContext::with_state_builder) adds the extension (its rules
//! run before the distributed planner cuts the plan into stages); datafusion-distributed's own
//! options (`DistributedExt`) can be set on the builder in between.
//! [`worker`] makes one worker endpoint with the same codec and options, to be served by the
//! caller's gRPC server (`Worker::into_worker_server`) on every machine.
//!
//! [`InMemoryCluster`] serves N such workers in this process, each on its own in-process duplex
//! stream speaking gRPC: every stage goes through the codec and the wire protocol exactly as
//! between machines, and no port is opened. The coordinator never runs a stage itself (no local
//! worker context is set).

use std::collections::HashMap;
use std::sync::Arc;

use ::datafusion::catalog::Session;
use ::datafusion::common::format::ExplainFormat;
use ::datafusion::common::{DataFusionError, Result};
use ::datafusion::execution::context::QueryPlanner;
use ::datafusion::execution::SessionStateBuilder;
use ::datafusion::logical_expr::{LogicalPlan, PlanType, StringifiedPlan, ToStringifiedPlan};
use ::datafusion::physical_plan::aggregates::AggregateMode;
use ::datafusion::physical_plan::explain::ExplainExec;
use ::datafusion::physical_plan::joins::PartitionMode;
use ::datafusion::physical_plan::ExecutionPlan;
use async_trait::async_trait;
use datafusion_distributed::{
    display_plan_ascii, grpc, ChannelResolver, DesiredTaskCountEvent, DesiredTaskCountEventResponse, DistributedConfig,
    DistributedExec, DistributedExt, DistributedLeafExec, ScaleUpLeafNodeEvent, ScaleUpLeafNodeEventResponse,
    SessionStateBuilderExt, Worker, WorkerChannel, WorkerQueryContext, WorkerResolver,
};
use hyper_util::rt::TokioIo;
use tonic::transport::{Endpoint, Server};
use url::Url;

use super::broadcast::{build_is_broadcast, BroadcastBuildSides};
use super::codec::MphfCodec;
use super::identity::WorkerIndexes;
use crate::datafusion::aggregate::MphfMergedAggregateExec;
use crate::datafusion::join::MphfGroupJoinExec;
use crate::datafusion::registry::MphfRegistry;
use crate::datafusion::slot_scan::SlotScanExec;
use crate::datafusion::{with_mphf, MphfConfig, MphfJoinExec};

/// The coordinator's session builder: `builder` (DataFusion's defaults, the config and
/// runtime), the distributed planner over `workers` reached through `channels`, `codec` for the
/// MPHF nodes, and the `mphf.*` options propagated to the workers. Make the session with
/// [`MphfContext::with_state_builder`](crate::datafusion::MphfContext::with_state_builder).
pub fn distributed_state(
    mut builder: SessionStateBuilder,
    workers: impl WorkerResolver + 'static,
    channels: impl ChannelResolver + Send + Sync + 'static,
    codec: MphfCodec,
) -> SessionStateBuilder {
    let mphf = builder
        .config()
        .as_ref()
        .and_then(|c| c.options().extensions.get::<MphfConfig>().cloned())
        .unwrap_or_default();
    // The MPHF joins' build sides are broadcast after DataFusion's planner (and the MPHF rules)
    // and before the distributed planner cuts the plan into stages.
    let inner = builder.query_planner().take();
    let mut builder = builder
        .with_query_planner(Arc::new(BroadcastBuildSides { inner }))
        .with_distributed_planner();
    if let Some(inner) = builder.query_planner().take() {
        builder = builder.with_query_planner(Arc::new(StagesInExplain { inner }));
    }
    builder
        .with_distributed_option_extension(mphf)
        .with_distributed_desired_task_count_handler(one_task_where_all_input_is_needed)
        .with_distributed_desired_task_count_handler(slot_scan_tasks)
        .with_distributed_scale_up_leaf_node_handler(slot_scan_split_over_tasks)
        .with_distributed_worker_resolver(workers)
        .with_distributed_channel_resolver(channels)
        .with_distributed_user_codec(codec)
}

/// The distributed query planner, with plain `EXPLAIN` showing the plan that runs: its stages,
/// their tasks and the network boundaries between them (datafusion-distributed's
/// `display_plan_ascii`). DataFusion plans `EXPLAIN`'s input inside its own physical planner, so
/// without this the text would be the single-process plan, which never runs in a distributed
/// session; `EXPLAIN ANALYZE` and `EXPLAIN VERBOSE` stay as they are (the former already shows
/// the stages with their metrics).
#[derive(Debug)]
struct StagesInExplain {
    inner: Arc<dyn QueryPlanner + Send + Sync>,
}

#[async_trait]
impl QueryPlanner for StagesInExplain {
    async fn create_physical_plan(
        &self,
        logical_plan: &LogicalPlan,
        session: &dyn Session,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        let explain = &session.config_options().explain;
        if let LogicalPlan::Explain(e) = logical_plan {
            if !e.verbose
                && e.explain_format == ExplainFormat::Indent
                && e.logical_optimization_succeeded
                && !explain.logical_plan_only
            {
                let physical = self.inner.create_physical_plan(&e.plan, session).await?;
                if physical.is::<DistributedExec>() {
                    // The rows DataFusion's planner gives a plain EXPLAIN, with the physical
                    // plan's text replaced (`ExplainExec` shows only the non-verbose ones).
                    let mut plans = Vec::new();
                    if !explain.physical_plan_only {
                        plans.extend(e.stringified_plans.iter().cloned());
                        plans.push(e.plan.to_stringified(PlanType::FinalLogicalPlan));
                    }
                    plans.push(StringifiedPlan::new(
                        PlanType::FinalPhysicalPlan,
                        display_plan_ascii(physical.as_ref(), false),
                    ));
                    return Ok(Arc::new(ExplainExec::new(Arc::clone(e.schema.inner()), plans, false)));
                }
            }
        }
        self.inner.create_physical_plan(logical_plan, session).await
    }
}

/// One task for the stage of a node that must see all of its input in one process: the
/// slot-range merge (each output range merges every input partition's partial), and the collect
/// form of the join (one build side for all probe partitions) unless its build side is
/// broadcast (`broadcast`; for a group join, also unless its aggregate is partial). Split over
/// tasks, each task would see part of the input and emit partial groups or miss matches. The
/// distributed planner already does this for DataFusion's own collect-form join when its build
/// side cannot be broadcast; for every other node it inherits its children's task count.
///
/// The rules do not make these forms in a distributed session (`plan::runs_distributed`); this
/// keeps a plan made otherwise (by hand, or by a session without the planner's options)
/// correct.
fn one_task_where_all_input_is_needed(ev: DesiredTaskCountEvent<'_>) -> Option<Result<DesiredTaskCountEventResponse>> {
    let plan = ev.plan;
    let collects = |join: &MphfJoinExec| *join.join().partition_mode() == PartitionMode::CollectLeft;
    let needs_all = plan.is::<MphfMergedAggregateExec>()
        || plan
            .downcast_ref::<MphfJoinExec>()
            .is_some_and(|j| collects(j) && !build_is_broadcast(j))
        || plan.downcast_ref::<MphfGroupJoinExec>().is_some_and(|g| {
            let partial = *g.aggregate().mode() == AggregateMode::Partial;
            collects(g.join()) && !(partial && build_is_broadcast(g.join()))
        });
    needs_all.then(|| Ok(DesiredTaskCountEventResponse::maximum(1)))
}

/// The task count of a slot-map scan's stage: as for DataFusion's own file scan (the
/// distributed planner's default handler), one task per
/// `file_scan_config_bytes_per_partition` bytes of files per target partition. Without it the
/// planner gives a leaf it does not know one task.
fn slot_scan_tasks(ev: DesiredTaskCountEvent<'_>) -> Option<Result<DesiredTaskCountEventResponse>> {
    let scan = ev.plan.downcast_ref::<SlotScanExec>()?;
    let per_partition = DistributedConfig::from_session_config(ev.session_config)
        .ok()?
        .file_scan_config_bytes_per_partition;
    let bytes: u64 = scan.file_bytes();
    let tasks = (bytes as usize)
        .div_ceil(per_partition.max(1))
        .div_ceil(ev.session_config.target_partitions().max(1));
    Some(Ok(DesiredTaskCountEventResponse::desired(tasks.max(1))))
}

/// A slot-map scan's stage over several tasks: each task scans its share of the files
/// ([`SlotScanExec::split_over_tasks`]), and the codec sends each worker only its own.
fn slot_scan_split_over_tasks(ev: ScaleUpLeafNodeEvent<'_>) -> Option<Result<ScaleUpLeafNodeEventResponse>> {
    let scan = ev.plan.downcast_ref::<SlotScanExec>()?;
    if ev.task_count <= 1 {
        return None;
    }
    let leaf = scan
        .split_over_tasks(ev.task_count)
        .and_then(|variants| DistributedLeafExec::try_new(Arc::clone(ev.plan), variants));
    Some(leaf.map(|leaf| ScaleUpLeafNodeEventResponse::new(Arc::new(leaf))))
}

/// One worker: sessions with the extension's options and function, and a codec whose plans
/// find their indexes through `indexes` (the caller serves it with
/// `Worker::into_worker_server`). `registry`: the registry the decoded `mphf_index('name', …)`
/// names indexes in (`None`: the named form fails on this worker with a clear error).
pub fn worker(
    indexes: Arc<WorkerIndexes>,
    registry: Option<Arc<MphfRegistry>>,
    channels: impl ChannelResolver + Clone + Send + Sync + 'static,
) -> Worker {
    Worker::from_session_builder(move |ctx: WorkerQueryContext| {
        let codec = MphfCodec::new(Arc::clone(&indexes), registry.clone());
        let channels = channels.clone();
        let registry = registry.clone();
        async move {
            let mut builder = ctx
                .builder
                .with_distributed_option_extension_from_headers::<MphfConfig>(&ctx.headers)?
                .with_distributed_user_codec(codec)
                .with_distributed_channel_resolver(channels);
            // The decoded plan finds `mphf_index` among the session's functions before it asks
            // the codec: the session's function must name indexes in `registry` too.
            if let Some(registry) = registry {
                let config = builder.config().take().unwrap_or_default();
                *builder.config() = Some(config.with_extension(registry));
            }
            Ok(with_mphf(builder).build())
        }
    })
}

/// The URL of in-memory worker `i` (only a name: nothing listens on it).
fn worker_url(i: usize) -> Result<Url> {
    Url::parse(&format!("http://mphf-worker-{i}:50051/")).map_err(|e| DataFusionError::External(Box::new(e)))
}

/// The channels to the workers of an [`InMemoryCluster`], by URL.
#[derive(Clone)]
struct InMemoryChannels {
    channels: Arc<HashMap<String, grpc::BoxCloneSyncChannel>>,
}

#[async_trait]
impl ChannelResolver for InMemoryChannels {
    async fn get_worker_client_for_url(&self, url: &Url) -> Result<Box<dyn WorkerChannel>, DataFusionError> {
        match self.channels.get(url.as_str()) {
            Some(channel) => Ok(grpc::create_worker_client(channel.clone())),
            None => Err(DataFusionError::Execution(format!("no in-memory worker at {url}"))),
        }
    }
}

/// The URLs of an [`InMemoryCluster`]'s workers.
struct InMemoryWorkers {
    urls: Vec<Url>,
}

impl WorkerResolver for InMemoryWorkers {
    fn get_urls(&self) -> Result<Vec<Url>, DataFusionError> {
        Ok(self.urls.clone())
    }
}

/// N workers in this process, each a gRPC server on its own in-process stream (see the
/// module docs).
pub struct InMemoryCluster {
    workers: usize,
    indexes: Arc<WorkerIndexes>,
}

impl InMemoryCluster {
    /// A cluster of `workers` (at least 1) that use the coordinator's live indexes.
    pub fn new(workers: usize) -> Self {
        Self {
            workers: workers.max(1),
            indexes: Arc::new(WorkerIndexes::in_process()),
        }
    }

    /// The same cluster with workers that find indexes as `indexes` says (saved files only,
    /// for example, as workers on other machines do).
    pub fn with_worker_indexes(mut self, indexes: WorkerIndexes) -> Self {
        self.indexes = Arc::new(indexes);
        self
    }

    /// Starts the workers (tasks on the current Tokio runtime, which must be running) and
    /// returns the coordinator's session builder made of `builder` (DataFusion's defaults,
    /// config and runtime: see [`distributed_state`]).
    ///
    /// # Errors
    /// A worker URL that does not parse (never, for the names used here).
    pub fn start(self, mut builder: SessionStateBuilder) -> Result<SessionStateBuilder> {
        // The registry is made first so that in-process workers name indexes in it.
        let config = builder.config().take().unwrap_or_default();
        let registry = match config.get_extension::<MphfRegistry>() {
            Some(r) => r,
            None => Arc::new(MphfRegistry::new()),
        };
        *builder.config() = Some(config.with_extension(Arc::clone(&registry)));
        let mut channels = HashMap::new();
        let mut servers = Vec::new();
        for i in 0..self.workers {
            let (client, server) = tokio::io::duplex(1 << 20);
            let mut client = Some(client);
            let url = worker_url(i)?;
            let channel = Endpoint::try_from(url.to_string())
                .map_err(|e| DataFusionError::External(Box::new(e)))?
                .connect_with_connector_lazy(tower::service_fn(move |_| {
                    let stream = client.take();
                    async move {
                        stream
                            .map(TokioIo::new)
                            .ok_or_else(|| std::io::Error::other("the in-memory worker stream was taken already"))
                    }
                }));
            channels.insert(url.to_string(), grpc::BoxCloneSyncChannel::new(channel));
            servers.push(server);
        }
        let channels = InMemoryChannels {
            channels: Arc::new(channels),
        };
        let shared_registry = Some(Arc::clone(&registry)).filter(|_| self.indexes.shares_process());
        for server in servers {
            let endpoint = worker(Arc::clone(&self.indexes), shared_registry.clone(), channels.clone());
            tokio::spawn(async move {
                Server::builder()
                    .add_service(endpoint.into_worker_server())
                    .serve_with_incoming(tokio_stream::once(Ok::<_, std::io::Error>(server)))
                    .await
            });
        }
        let urls = (0..self.workers).map(worker_url).collect::<Result<Vec<_>>>()?;
        let codec = MphfCodec::new(Arc::clone(&self.indexes), Some(registry));
        Ok(distributed_state(builder, InMemoryWorkers { urls }, channels, codec))
    }
}
