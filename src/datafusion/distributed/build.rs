//! Index builds run by a cluster's workers: [`build_on_cluster`] drives the partitioned build
//! of [`core::partitioned`](crate::core::partitioned) (docs/distributed.md §2) as DataFusion
//! queries that the distributed planner cuts into stages; the functions they call are in
//! [`udf::partitioned_build`](crate::datafusion::udf::partitioned_build).
//!
//! The coordinator counts the distinct non-NULL keys, runs rounds (one query each) until its
//! [`SeedAgreement`] has a part from every owner and no failed check, and assembles the MPHF.
//! Nothing here needs datafusion-distributed: on a session without a cluster the same queries
//! run locally.
//!
//! # Invariants
//! - The keys of a round are the distinct non-NULL values of the column, as `CREATE INDEX`
//!   indexes them, so the bytes equal those of the single-process build of the same column
//!   (`ColumnIndex::build`) with the same parameters and first seed.
//! - A part is checked when it arrives: its owner, its bucket range and the total key count.
//!   A damaged or foreign part fails the build with an error; it never yields another MPHF.

use std::sync::Arc;

use ::datafusion::arrow::array::{Array, AsArray, BinaryArray, RecordBatch};
use ::datafusion::arrow::datatypes::UInt32Type;
use ::datafusion::common::{internal_err, DataFusionError, Result};
use ::datafusion::dataframe::DataFrame;
use ::datafusion::logical_expr::{AggregateUDF, ScalarUDF};
use ::datafusion::physical_plan::ExecutionPlan;
use ::datafusion::prelude::{col, ident, lit, SessionContext};

use crate::core::build::BuildReport;
use crate::core::column::{value_type, KeyType};
use crate::core::partitioned::{decode_outcome, Outcome, SeedAgreement};
use crate::core::{Builder, Mphf, Params};
use crate::datafusion::error::to_df;
use crate::datafusion::udf::partitioned_build::{MphfBuildPartFunc, MphfRouteFunc, Round, BUILD_PART_NAME};

/// Column of the distinct keys in the build's queries.
const KEY: &str = "__mphf_key";

/// The distinct non-NULL values of `column` of `table` (one column, [`KEY`]), and the seed
/// agreement over them among `owners` owners.
async fn prepare<'a>(
    ctx: &SessionContext,
    table: &str,
    column: &str,
    builder: &'a Builder,
    owners: usize,
) -> Result<(DataFrame, SeedAgreement<'a>)> {
    let keys = ctx
        .table(table)
        .await?
        .select(vec![ident(column).alias(KEY)])?
        .filter(col(KEY).is_not_null())?
        .distinct()?;
    let key_type = KeyType::from_arrow(value_type(keys.schema().field(0).data_type())).map_err(to_df)?;
    let n = keys.clone().count().await? as u64;
    let agreement = SeedAgreement::new(builder, n, key_type.hash_kind(), owners).map_err(to_df)?;
    Ok((keys, agreement))
}

/// One round's query over the distinct keys (column [`KEY`] of `keys`):
/// `SELECT mphf_route(key, …) AS owner, mphf_build_part(key, …) AS part … GROUP BY owner`.
fn round_frame(keys: &DataFrame, round: Round) -> Result<DataFrame> {
    let route = ScalarUDF::from(MphfRouteFunc::default());
    let part = AggregateUDF::from(MphfBuildPartFunc::default());
    let Params { leaf, bucket, rotation } = round.params;
    let (seed, buckets, owners) = (lit(round.seed), lit(round.num_buckets), lit(round.owners));
    keys.clone().aggregate(
        vec![route
            .call(vec![col(KEY), seed.clone(), buckets.clone(), owners.clone()])
            .alias("owner")],
        vec![part
            .call(vec![
                col(KEY),
                lit(leaf as u64),
                lit(bucket as u64),
                lit(rotation),
                seed,
                buckets,
                owners,
            ])
            .alias("part")],
    )
}

/// The round of `agreement`'s current seed.
fn round_of(builder: &Builder, agreement: &SeedAgreement<'_>) -> Round {
    let ranges = agreement.ranges();
    Round {
        params: builder.params(),
        seed: agreement.seed(),
        num_buckets: ranges.num_buckets(),
        owners: ranges.owners() as u64,
    }
}

/// The physical plan of the first round of [`build_on_cluster`] (its stages and network
/// boundaries, on a distributed session), for `EXPLAIN`-like inspection.
///
/// # Errors
/// As [`build_on_cluster`], before any round runs.
pub async fn build_round_plan(
    ctx: &SessionContext,
    table: &str,
    column: &str,
    builder: &Builder,
    owners: usize,
) -> Result<Arc<dyn ExecutionPlan>> {
    let (keys, agreement) = prepare(ctx, table, column, builder, owners).await?;
    round_frame(&keys, round_of(builder, &agreement))?
        .create_physical_plan()
        .await
}

/// One round's outcomes, one per owner (`None`: the owner got no key), from the query's rows.
fn outcomes_of(batches: &[RecordBatch], owners: usize) -> Result<Vec<Option<Outcome>>> {
    let mut outcomes: Vec<Option<Outcome>> = vec![None; owners];
    for batch in batches {
        let owner = batch.column(0).as_primitive::<UInt32Type>();
        let part = batch
            .column(1)
            .as_any()
            .downcast_ref::<BinaryArray>()
            .ok_or_else(|| DataFusionError::Internal(format!("{BUILD_PART_NAME} returned no binary column")))?;
        for row in 0..batch.num_rows() {
            if owner.is_null(row) || part.is_null(row) {
                return internal_err!("{BUILD_PART_NAME}: a group without an owner or a part");
            }
            let w = owner.value(row) as usize;
            let slot = outcomes
                .get_mut(w)
                .ok_or_else(|| DataFusionError::Internal(format!("{BUILD_PART_NAME}: owner {w} of {owners}")))?;
            if slot.is_some() {
                return internal_err!("{BUILD_PART_NAME}: two parts of owner {w}");
            }
            *slot = Some(decode_outcome(part.value(row)).map_err(to_df)?);
        }
    }
    Ok(outcomes)
}

/// Builds the MPHF over the distinct non-NULL values of `column` of `table`, with `builder`'s
/// parameters and first seed, its buckets split among `owners` bucket ranges that the session's
/// workers solve (see the module docs). On a session without a cluster the same queries run
/// locally. The bytes equal the single-process build's.
///
/// # Errors
/// An unknown table or column, or an unsupported key type; the query errors of the cluster (a
/// worker that fails); the builder's errors after the last seed; an invalid or missing part.
pub async fn build_on_cluster(
    ctx: &SessionContext,
    table: &str,
    column: &str,
    builder: &Builder,
    owners: usize,
) -> Result<(Mphf, BuildReport)> {
    let (keys, mut agreement) = prepare(ctx, table, column, builder, owners).await?;
    loop {
        let batches = round_frame(&keys, round_of(builder, &agreement))?.collect().await?;
        if let Some(done) = agreement.finish_round(outcomes_of(&batches, owners)?).map_err(to_df)? {
            return Ok(done);
        }
    }
}
