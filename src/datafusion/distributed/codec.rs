//! [`MphfCodec`]: the `PhysicalExtensionCodec` of every MPHF node and of `mphf_index`.
//!
//! # Encoding
//! Each MPHF node wraps DataFusion nodes (the aggregate or hash join it replaced). Those are
//! encoded by DataFusion's own protobuf, with their children replaced by empty placeholders
//! of the same schema and partition count: the real children travel as the extension node's
//! inputs, once. The index travels as an [`IndexRef`] (identity, never bytes), the planner's
//! choices (key position, form, device) and estimates as plain fields, so that a decoded node
//! shows the same `EXPLAIN` text.
//!
//! # Decoding
//! The wrapped nodes are decoded and given the decoded inputs; the index is resolved by the
//! worker's [`WorkerIndexes`] (an error naming the index when it cannot be); the node is rebuilt
//! through its own constructor. A GPU placement is made again for the worker's device (its CPU
//! fallback gives the same rows).

use std::sync::Arc;

use ::datafusion::arrow::datatypes::{Schema, SchemaRef};
use ::datafusion::common::{internal_datafusion_err, not_impl_err, DataFusionError, Result};
use ::datafusion::execution::TaskContext;
use ::datafusion::logical_expr::ScalarUDF;
use ::datafusion::physical_plan::aggregates::AggregateExec;
use ::datafusion::physical_plan::empty::EmptyExec;
use ::datafusion::physical_plan::joins::HashJoinExec;
use ::datafusion::physical_plan::{
    ChildrenPropertiesMode, ExecutionPlan, ExecutionPlanProperties, ReplaceChildrenOptions,
};
use datafusion_proto::physical_plan::{
    PhysicalExtensionCodec, PhysicalPlanDecodeContext, PhysicalProtoConverterExtension,
};
use datafusion_proto::protobuf;
use prost::Message;

use super::identity::{IndexRef, WorkerIndexes};
use crate::datafusion::aggregate::{MergeForm, MphfMergedAggregateExec, Placement};
use crate::datafusion::explain::MphfDeclinedExec;
use crate::datafusion::join::MphfGroupJoinExec;
use crate::datafusion::plan::{Declined, Estimate, Tuning};
use crate::datafusion::registry::MphfRegistry;
use crate::datafusion::slot_scan::{KeyColumn, SlotScanExec};
use crate::datafusion::table::MphfRelabelExec;
use crate::datafusion::udf::mphf_index::MPHF_INDEX_NAME;
use crate::datafusion::udf::{MphfStoredSlotsFunc, STORED_SLOTS_NAME};
use crate::datafusion::{MphfAggregateExec, MphfIndexFunc, MphfJoinExec};

/// One encoded MPHF node.
#[derive(Clone, PartialEq, prost::Message)]
struct NodeProto {
    #[prost(oneof = "Node", tags = "1, 2, 3, 4, 5, 6, 7")]
    node: Option<Node>,
}

#[derive(Clone, PartialEq, prost::Oneof)]
enum Node {
    #[prost(message, tag = "1")]
    Relabel(RelabelProto),
    #[prost(message, tag = "2")]
    Aggregate(AggregateProto),
    #[prost(message, tag = "3")]
    Merged(MergedProto),
    #[prost(message, tag = "4")]
    Join(JoinProto),
    #[prost(message, tag = "5")]
    GroupJoin(GroupJoinProto),
    #[prost(message, tag = "6")]
    Declined(DeclinedProto),
    #[prost(message, tag = "7")]
    SlotScan(SlotScanProto),
}

#[derive(Clone, PartialEq, prost::Message)]
struct EstimateProto {
    #[prost(double, tag = "1")]
    mphf_ns: f64,
    #[prost(double, tag = "2")]
    hash_ns: f64,
    #[prost(double, optional, tag = "3")]
    other_device_ns: Option<f64>,
    #[prost(bool, tag = "4")]
    on_gpu: bool,
}

/// `MphfRelabelExec`: its schema (with the coordinator's labels) and the indexes they name.
#[derive(Clone, PartialEq, prost::Message)]
struct RelabelProto {
    #[prost(message, optional, tag = "1")]
    schema: Option<protobuf::Schema>,
    #[prost(string, repeated, tag = "2")]
    columns: Vec<String>,
    #[prost(message, repeated, tag = "3")]
    indexes: Vec<IndexRef>,
}

#[derive(Clone, PartialEq, prost::Message)]
struct AggregateProto {
    /// The replaced aggregate over a placeholder input.
    #[prost(bytes = "vec", tag = "1")]
    aggregate: Vec<u8>,
    #[prost(message, optional, tag = "2")]
    index: Option<IndexRef>,
    #[prost(uint64, tag = "3")]
    key_pos: u64,
    #[prost(string, tag = "4")]
    device: String,
    #[prost(string, tag = "5")]
    merge_form: String,
    #[prost(bool, tag = "6")]
    needs_merge: bool,
    #[prost(message, optional, tag = "7")]
    estimate: Option<EstimateProto>,
}

#[derive(Clone, PartialEq, prost::Message)]
struct MergedProto {
    /// The replaced partial aggregate over a placeholder input.
    #[prost(bytes = "vec", tag = "1")]
    partial: Vec<u8>,
    /// The replaced final aggregate over a placeholder input.
    #[prost(bytes = "vec", tag = "2")]
    final_aggregate: Vec<u8>,
    #[prost(message, optional, tag = "3")]
    index: Option<IndexRef>,
    #[prost(uint64, tag = "4")]
    key_pos: u64,
    #[prost(uint64, tag = "5")]
    output_partitions: u64,
    #[prost(string, tag = "6")]
    device: String,
    #[prost(string, tag = "7")]
    form: String,
    #[prost(message, optional, tag = "8")]
    estimate: Option<EstimateProto>,
}

#[derive(Clone, PartialEq, prost::Message)]
struct JoinProto {
    /// The replaced hash join over placeholder inputs.
    #[prost(bytes = "vec", tag = "1")]
    join: Vec<u8>,
    #[prost(message, optional, tag = "2")]
    index: Option<IndexRef>,
    #[prost(uint64, tag = "3")]
    key: u64,
    #[prost(message, optional, tag = "4")]
    estimate: Option<EstimateProto>,
}

#[derive(Clone, PartialEq, prost::Message)]
struct GroupJoinProto {
    /// The replaced partial aggregate over a placeholder input.
    #[prost(bytes = "vec", tag = "1")]
    aggregate: Vec<u8>,
    #[prost(message, optional, tag = "2")]
    join: Option<JoinProto>,
}

#[derive(Clone, PartialEq, prost::Message)]
struct DeclinedProto {
    #[prost(string, tag = "1")]
    reason: String,
    #[prost(message, optional, tag = "2")]
    estimate: Option<EstimateProto>,
}

#[derive(Clone, PartialEq, prost::Message)]
struct SlotScanProto {
    /// The Parquet scan the slot scan replaced.
    #[prost(bytes = "vec", tag = "1")]
    scan: Vec<u8>,
    /// The relabel node that was over it.
    #[prost(message, optional, tag = "2")]
    relabel: Option<RelabelProto>,
    #[prost(message, optional, tag = "3")]
    index: Option<IndexRef>,
    #[prost(uint64, tag = "4")]
    key: u64,
    #[prost(bool, tag = "5")]
    key_where_no_slots: bool,
    /// Files of this scan (of this task's share, once split over tasks) that had a slot map
    /// on the coordinator.
    #[prost(uint64, tag = "6")]
    mapped: u64,
}

/// Encodes and decodes the MPHF nodes and `mphf_index` (see the module docs). Set it on the
/// coordinator and on every worker (`datafusion_distributed::DistributedExt::with_distributed_user_codec`).
#[derive(Debug, Clone)]
pub struct MphfCodec {
    /// How this process finds the indexes that decoded plans name.
    indexes: Arc<WorkerIndexes>,
    /// The session registry the decoded `mphf_index` resolves index names in.
    registry: Option<Arc<MphfRegistry>>,
}

impl MphfCodec {
    /// A codec whose decoded plans find their indexes through `indexes`, and whose decoded
    /// `mphf_index` names indexes in `registry`.
    pub fn new(indexes: Arc<WorkerIndexes>, registry: Option<Arc<MphfRegistry>>) -> Self {
        Self { indexes, registry }
    }
}

fn missing(what: &str) -> DataFusionError {
    internal_datafusion_err!("MphfCodec: the encoded node lacks its {what}")
}

fn estimate_to(e: Option<Estimate>) -> Option<EstimateProto> {
    e.map(|e| EstimateProto {
        mphf_ns: e.mphf_ns,
        hash_ns: e.hash_ns,
        other_device_ns: e.other_device_ns,
        on_gpu: e.on_gpu,
    })
}

fn estimate_from(e: &Option<EstimateProto>) -> Option<Estimate> {
    e.as_ref().map(|e| Estimate {
        mphf_ns: e.mphf_ns,
        hash_ns: e.hash_ns,
        other_device_ns: e.other_device_ns,
        on_gpu: e.on_gpu,
    })
}

/// `plan` with each child replaced by an empty node of the same schema and partition count.
fn with_placeholder_children(plan: &Arc<dyn ExecutionPlan>) -> Result<Arc<dyn ExecutionPlan>> {
    let placeholders = plan
        .children()
        .into_iter()
        .map(|c| {
            Arc::new(EmptyExec::new(c.schema()).with_partitions(c.output_partitioning().partition_count()))
                as Arc<dyn ExecutionPlan>
        })
        .collect();
    Arc::clone(plan).replace_children(placeholders, recompute())
}

fn recompute() -> ReplaceChildrenOptions {
    ReplaceChildrenOptions::new(ChildrenPropertiesMode::Recompute)
}

fn schema_to(schema: &Schema) -> Result<protobuf::Schema> {
    Ok(protobuf::Schema::try_from(schema)?)
}

fn schema_from(schema: &Option<protobuf::Schema>) -> Result<SchemaRef> {
    let schema = schema.as_ref().ok_or_else(|| missing("schema"))?;
    Ok(Arc::new(Schema::try_from(schema)?))
}

fn merge_form_of(name: &str) -> Result<MergeForm> {
    MergeForm::parse(name).ok_or_else(|| internal_datafusion_err!("MphfCodec: unknown merge form '{name}'"))
}

/// The encoding and decoding of nested DataFusion nodes, with the converter and task context
/// of one call.
struct Nested<'a> {
    codec: &'a MphfCodec,
    converter: &'a dyn PhysicalProtoConverterExtension,
}

impl Nested<'_> {
    /// `plan` (over placeholders) as protobuf bytes.
    fn encode(&self, plan: &Arc<dyn ExecutionPlan>) -> Result<Vec<u8>> {
        let node = self
            .converter
            .execution_plan_to_proto(&with_placeholder_children(plan)?, self.codec)?;
        Ok(node.encode_to_vec())
    }

    /// The node in `bytes`, over `inputs` instead of its placeholders.
    fn decode(
        &self,
        bytes: &[u8],
        ctx: &TaskContext,
        inputs: Vec<Arc<dyn ExecutionPlan>>,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        let node = protobuf::PhysicalPlanNode::decode(bytes)
            .map_err(|e| internal_datafusion_err!("MphfCodec: undecodable nested plan: {e}"))?;
        let plan = self
            .converter
            .proto_to_execution_plan(&node, &PhysicalPlanDecodeContext::new(ctx, self.codec))?;
        if inputs.is_empty() {
            return Ok(plan);
        }
        plan.replace_children(inputs, recompute())
    }

    fn aggregate(
        &self,
        bytes: &[u8],
        ctx: &TaskContext,
        inputs: Vec<Arc<dyn ExecutionPlan>>,
    ) -> Result<Arc<AggregateExec>> {
        let plan = self.decode(bytes, ctx, inputs)?;
        plan.downcast_ref::<AggregateExec>()
            .map(|a| Arc::new(a.clone()))
            .ok_or_else(|| internal_datafusion_err!("MphfCodec: the nested plan is not an aggregate"))
    }

    fn hash_join(
        &self,
        bytes: &[u8],
        ctx: &TaskContext,
        inputs: Vec<Arc<dyn ExecutionPlan>>,
    ) -> Result<Arc<HashJoinExec>> {
        let plan = self.decode(bytes, ctx, inputs)?;
        let Some(join) = plan.downcast_ref::<HashJoinExec>() else {
            return Err(internal_datafusion_err!(
                "MphfCodec: the nested plan is not a hash join"
            ));
        };
        Ok(Arc::new(join.builder().build()?))
    }
}

impl MphfCodec {
    fn index(&self, r: &Option<IndexRef>, ctx: &TaskContext) -> Result<Arc<crate::datafusion::IndexHandle>> {
        let pool = &ctx.runtime_env().memory_pool;
        self.indexes.resolve(r.as_ref().ok_or_else(|| missing("index"))?, pool)
    }

    /// The placement named `device` of `agg`, made for this process's device.
    fn placement(device: &str, agg: &AggregateExec, key_pos: usize, ctx: &TaskContext) -> Placement {
        if device == "cpu" {
            return Placement::Cpu;
        }
        let emulate = Tuning::of(ctx.session_config().options()).gpu_emulation;
        Placement::gpu_for(agg, key_pos, emulate).unwrap_or_default()
    }

    fn relabel_to(&self, relabel: &MphfRelabelExec) -> Result<RelabelProto> {
        Ok(RelabelProto {
            schema: Some(schema_to(&relabel.schema())?),
            columns: relabel.columns().to_vec(),
            indexes: relabel.indexes().iter().map(|h| IndexRef::of(h)).collect(),
        })
    }

    /// The relabel node of `proto` over `input`. Its indexes are resolved where possible, so
    /// that their labels resolve here; one that cannot be is left to the operators that need
    /// it (they fail with its error).
    fn relabel_from(
        &self,
        proto: &RelabelProto,
        input: Arc<dyn ExecutionPlan>,
        ctx: &TaskContext,
    ) -> Result<MphfRelabelExec> {
        for r in &proto.indexes {
            let _ = self.indexes.resolve(r, &ctx.runtime_env().memory_pool);
        }
        MphfRelabelExec::with_schema(input, schema_from(&proto.schema)?, proto.columns.clone())
    }

    fn encode_node(&self, node: &Arc<dyn ExecutionPlan>, nested: &Nested<'_>) -> Result<Option<Node>> {
        if let Some(r) = node.downcast_ref::<MphfRelabelExec>() {
            return Ok(Some(Node::Relabel(self.relabel_to(r)?)));
        }
        if let Some(a) = node.downcast_ref::<MphfAggregateExec>() {
            let agg: Arc<dyn ExecutionPlan> = Arc::clone(a.aggregate()) as _;
            return Ok(Some(Node::Aggregate(AggregateProto {
                aggregate: nested.encode(&agg)?,
                index: Some(IndexRef::of(a.index())),
                key_pos: a.key_pos() as u64,
                device: a.placement().device_name().to_string(),
                merge_form: a.merge_form().name().to_string(),
                needs_merge: a.needs_merge(),
                estimate: estimate_to(a.estimate()),
            })));
        }
        if let Some(m) = node.downcast_ref::<MphfMergedAggregateExec>() {
            let partial: Arc<dyn ExecutionPlan> = Arc::clone(m.partial()) as _;
            let final_agg: Arc<dyn ExecutionPlan> = Arc::clone(m.final_aggregate()) as _;
            return Ok(Some(Node::Merged(MergedProto {
                partial: nested.encode(&partial)?,
                final_aggregate: nested.encode(&final_agg)?,
                index: Some(IndexRef::of(m.index())),
                key_pos: m.key_pos() as u64,
                output_partitions: node.output_partitioning().partition_count() as u64,
                device: m.placement().device_name().to_string(),
                form: m.chosen_form().name().to_string(),
                estimate: estimate_to(m.estimate()),
            })));
        }
        if let Some(j) = node.downcast_ref::<MphfJoinExec>() {
            return Ok(Some(Node::Join(Self::join_to(j, nested)?)));
        }
        if let Some(g) = node.downcast_ref::<MphfGroupJoinExec>() {
            let agg: Arc<dyn ExecutionPlan> = Arc::clone(g.aggregate()) as _;
            return Ok(Some(Node::GroupJoin(GroupJoinProto {
                aggregate: nested.encode(&agg)?,
                join: Some(Self::join_to(g.join(), nested)?),
            })));
        }
        if let Some(d) = node.downcast_ref::<MphfDeclinedExec>() {
            let declined = d.declined();
            return Ok(Some(Node::Declined(DeclinedProto {
                reason: declined.reason.clone(),
                estimate: estimate_to(declined.estimate),
            })));
        }
        if let Some(s) = node.downcast_ref::<SlotScanExec>() {
            return Ok(Some(Node::SlotScan(SlotScanProto {
                scan: nested.encode(s.scan())?,
                relabel: Some(RelabelProto {
                    schema: Some(schema_to(&s.relabel_schema())?),
                    columns: s.relabel_columns(),
                    indexes: vec![IndexRef::of(s.index())],
                }),
                index: Some(IndexRef::of(s.index())),
                key: s.key() as u64,
                key_where_no_slots: matches!(s.key_column(), KeyColumn::WhereNoSlots),
                mapped: s.mapped_files() as u64,
            })));
        }
        Ok(None)
    }

    fn join_to(j: &MphfJoinExec, nested: &Nested<'_>) -> Result<JoinProto> {
        let join: Arc<dyn ExecutionPlan> = Arc::clone(j.join()) as _;
        Ok(JoinProto {
            join: nested.encode(&join)?,
            index: Some(IndexRef::of(j.index())),
            key: j.key_pair() as u64,
            estimate: estimate_to(j.estimate()),
        })
    }

    fn join_from(
        &self,
        proto: &JoinProto,
        nested: &Nested<'_>,
        ctx: &TaskContext,
        inputs: &[Arc<dyn ExecutionPlan>],
    ) -> Result<MphfJoinExec> {
        let join = nested.hash_join(&proto.join, ctx, inputs.to_vec())?;
        let index = self.index(&proto.index, ctx)?;
        Ok(MphfJoinExec::new(join, index, proto.key as usize).with_estimate(estimate_from(&proto.estimate)))
    }

    fn decode_node(
        &self,
        node: &Node,
        nested: &Nested<'_>,
        ctx: &TaskContext,
        inputs: &[Arc<dyn ExecutionPlan>],
    ) -> Result<Arc<dyn ExecutionPlan>> {
        let one_input = || match inputs {
            [input] => Ok(Arc::clone(input)),
            _ => Err(internal_datafusion_err!(
                "MphfCodec: expected one input, got {}",
                inputs.len()
            )),
        };
        Ok(match node {
            Node::Relabel(r) => Arc::new(self.relabel_from(r, one_input()?, ctx)?),
            Node::Aggregate(a) => {
                let agg = nested.aggregate(&a.aggregate, ctx, vec![one_input()?])?;
                let key_pos = a.key_pos as usize;
                let placement = Self::placement(&a.device, &agg, key_pos, ctx);
                let index = self.index(&a.index, ctx)?;
                Arc::new(
                    MphfAggregateExec::new(agg, index, key_pos)
                        .with_placement(placement)
                        .with_merge_form(merge_form_of(&a.merge_form)?)
                        .needing_merge(a.needs_merge)
                        .with_estimate(estimate_from(&a.estimate)),
                )
            }
            Node::Merged(m) => {
                let partial = nested.aggregate(&m.partial, ctx, vec![one_input()?])?;
                let final_agg = nested.aggregate(&m.final_aggregate, ctx, vec![])?;
                let key_pos = m.key_pos as usize;
                let placement = Self::placement(&m.device, &partial, key_pos, ctx);
                let index = self.index(&m.index, ctx)?;
                Arc::new(
                    MphfMergedAggregateExec::new(partial, final_agg, index, key_pos, m.output_partitions as usize)
                        .with_placement(placement)
                        .with_form(merge_form_of(&m.form)?)
                        .with_estimate(estimate_from(&m.estimate)),
                )
            }
            Node::Join(j) => Arc::new(self.join_from(j, nested, ctx, inputs)?),
            Node::GroupJoin(g) => {
                let join = self.join_from(g.join.as_ref().ok_or_else(|| missing("join"))?, nested, ctx, inputs)?;
                let agg = nested.aggregate(&g.aggregate, ctx, vec![Arc::new(join)])?;
                match MphfGroupJoinExec::fuse(&agg)? {
                    Some(fused) => Arc::new(fused),
                    None => return Err(internal_datafusion_err!("MphfCodec: the group join no longer fuses")),
                }
            }
            Node::Declined(d) => Arc::new(MphfDeclinedExec::new(
                one_input()?,
                Declined::new(d.reason.clone(), estimate_from(&d.estimate)),
            )),
            Node::SlotScan(s) => {
                let scan = nested.decode(&s.scan, ctx, vec![])?;
                let relabel =
                    self.relabel_from(s.relabel.as_ref().ok_or_else(|| missing("relabel node"))?, scan, ctx)?;
                let index = self.index(&s.index, ctx)?;
                let key_column = match s.key_where_no_slots {
                    true => KeyColumn::WhereNoSlots,
                    false => KeyColumn::Read,
                };
                match SlotScanExec::over_files(&relabel, s.key as usize, &index, key_column)? {
                    Some(scan) if scan.mapped_files() > 0 || s.mapped == 0 => Arc::new(scan),
                    _ => {
                        return Err(DataFusionError::Execution(format!(
                            "MPHF index '{}' on {}({}): this worker has no slot maps for the table's files; \
                             save them beside the index where the workers read it",
                            index.info().name,
                            index.info().table,
                            index.info().column
                        )))
                    }
                }
            }
        })
    }
}

impl PhysicalExtensionCodec for MphfCodec {
    fn try_decode(
        &self,
        buf: &[u8],
        inputs: &[Arc<dyn ExecutionPlan>],
        ctx: &TaskContext,
        proto_converter: &dyn PhysicalProtoConverterExtension,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        let proto = NodeProto::decode(buf).map_err(|e| internal_datafusion_err!("MphfCodec: undecodable node: {e}"))?;
        let node = proto.node.as_ref().ok_or_else(|| missing("node"))?;
        let nested = Nested {
            codec: self,
            converter: proto_converter,
        };
        self.decode_node(node, &nested, ctx, inputs)
    }

    fn try_encode(
        &self,
        node: Arc<dyn ExecutionPlan>,
        buf: &mut Vec<u8>,
        proto_converter: &dyn PhysicalProtoConverterExtension,
    ) -> Result<()> {
        let nested = Nested {
            codec: self,
            converter: proto_converter,
        };
        match self.encode_node(&node, &nested)? {
            Some(node) => NodeProto { node: Some(node) }
                .encode(buf)
                .map_err(|e| internal_datafusion_err!("MphfCodec: {e}")),
            None => not_impl_err!("MphfCodec does not encode {}", node.name()),
        }
    }

    fn try_decode_udf(&self, name: &str, _buf: &[u8]) -> Result<Arc<ScalarUDF>> {
        if name == MPHF_INDEX_NAME {
            return Ok(Arc::new(MphfIndexFunc::udf(self.registry.clone())));
        }
        if name == STORED_SLOTS_NAME {
            return Ok(Arc::new(MphfStoredSlotsFunc::udf()));
        }
        not_impl_err!("MphfCodec does not decode the function {name}")
    }

    fn try_encode_udf(&self, node: &ScalarUDF, _buf: &mut Vec<u8>) -> Result<()> {
        // `mphf_index` carries no state of its own: its column's index travels with the
        // relabel node below it, its named form resolves in the worker's registry. So does
        // its answer from stored slots, whose slot column comes from the slot-map scan.
        if node.name() == MPHF_INDEX_NAME || node.name() == STORED_SLOTS_NAME {
            return Ok(());
        }
        not_impl_err!("MphfCodec does not encode the function {}", node.name())
    }
}
