//! Distributed execution on datafusion-distributed: MPHF plans cut into stages that run on
//! workers.
//!
//! # Why
//! The operators, the UDF and the indexes otherwise live in one process. A stage sent to a
//! worker is a protobuf plan; the MPHF nodes in it need a codec ([`MphfCodec`]), and the worker
//! needs the indexes they name ([`WorkerIndexes`]).
//!
//! # Pieces
//! - [`identity`]: [`IndexRef`], how an encoded node names its index (identity and fingerprint,
//!   never bytes), and how a worker resolves it (the coordinator's live index in the same
//!   process, or the saved file, checked).
//! - [`broadcast`]: the build sides of collect-form MPHF joins broadcast to every task of
//!   their stage.
//! - [`build`]: an index's MPHF built by the workers, bucket range by bucket range, with the
//!   single-process build's bytes.
//! - [`codec`]: encoding and decoding of every MPHF node and of `mphf_index`.
//! - [`cluster`]: the coordinator's session, a worker endpoint, and an in-memory cluster of N
//!   workers speaking gRPC over in-process streams.
//!
//! # Invariants
//! - A worker runs a stage only on the coordinator's index (same fingerprint); otherwise the
//!   query fails with an error that names the index.
//! - A decoded node shows the same `EXPLAIN` text and gives the same rows as the encoded one.

pub mod broadcast;
pub mod build;
pub mod cluster;
pub mod codec;
pub mod identity;

pub use build::{build_on_cluster, build_round_plan};
pub use cluster::{distributed_state, worker, InMemoryCluster};
pub use codec::MphfCodec;
pub use identity::{fingerprint_of, IndexRef, WorkerIndexes};
