//! DataFusion integration: the `mphf_index(col)` UDF, MPHF-indexed tables, the `CREATE INDEX …
//! USING mphf` / `DROP INDEX` / `SHOW MPHF INDEXES` statements and saved indexes.
//!
//! One call makes a session MPHF-aware: [`with_mphf`] on a `SessionStateBuilder`, or
//! [`MphfContext`], which wraps a `SessionContext` and also runs the extension's statements.
//!
//! ```no_run
//! # async fn demo() -> datafusion::error::Result<()> {
//! use datafusion_mphf::datafusion::MphfContext;
//! let ctx = MphfContext::new();
//! ctx.sql("CREATE TABLE t AS VALUES (10), (20), (30)").await?.collect().await?;
//! ctx.sql("CREATE INDEX t_idx ON t USING mphf (column1)").await?;
//! ctx.sql("SELECT column1, mphf_index(column1) FROM t").await?.show().await?;
//! # Ok(()) }
//! ```
//!
//! Module map: [`udf`] (the function and how it finds its index), [`table`] (`MphfTable`),
//! [`registry`] (live indexes, the session registry, the hook for optimizer rules),
//! [`context`] (statement execution), [`distributed`] (plans on datafusion-distributed workers: codec, index identity, in-memory cluster), [`install`] (the index installation pipeline), [`once`] (work shared by the partitions of one execution), [`compact_views`] (sparse view columns copied before an operator emits them), [`statements`] (parsing), [`persist`] (saved indexes and
//! fingerprints), [`config`] (`mphf.*` options), [`error`] (error mapping), [`union_labels`] (UNIONs of
//! differently indexed inputs), and the operators:
//! [`aggregate`] (`MphfAggregateExec`, GROUP BY on slots) and [`join`] (`MphfJoinExec`, hash
//! joins on slot tables), each with the optimizer rule that installs it.

pub mod aggregate;
pub mod compact_views;
pub mod config;
pub mod context;
#[cfg(feature = "distributed")]
pub mod distributed;
pub mod error;
pub mod explain;
pub mod install;
pub mod join;
pub mod once;
pub mod persist;
pub mod plan;
pub mod registry;
pub mod slot_scan;
pub mod statements;
pub mod table;
pub mod tpch;
pub mod udf;
pub mod union_labels;

pub use aggregate::{MphfAggregateExec, MphfAggregateRule};
pub use config::MphfConfig;
pub use context::{with_mphf, MphfContext};
pub use join::{MphfJoinExec, MphfJoinRule};
pub use registry::{index_of_field, registry_of, IndexHandle, MphfRegistry, INDEX_METADATA_KEY};
pub use table::MphfTable;
pub use udf::MphfIndexFunc;
