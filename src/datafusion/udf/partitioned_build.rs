//! The two functions of an index build run by a cluster's workers (the driver is
//! `distributed::build`; docs/distributed.md §2). A round of the partitioned build of
//! [`core::partitioned`](crate::core::partitioned) is a GROUP BY on the owner of each key's
//! bucket range:
//! - [`MphfRouteFunc`] (`mphf_route(key, seed, buckets, owners)`) gives the owner of each key's
//!   bucket under the round's seed: the GROUP BY key.
//! - [`MphfBuildPartFunc`] (`mphf_build_part(key, leaf, bucket, rotation, seed, buckets,
//!   owners)`) hashes its group's keys where the scan runs (the partial aggregate), so the
//!   engine's shuffle by owner carries 16-byte hash pairs, never the keys. When the group is
//!   final it sorts, checks, solves and encodes them ([`solve_owner`], [`encode_outcome`]):
//!   its value is the owner's encoded outcome.
//!
//! # Why these shapes
//! - The round's parameters are constant arguments, so the plan carries them, and both
//!   functions are plain named functions that [`with_mphf`](crate::datafusion::with_mphf)
//!   registers on the coordinator and on every worker. (datafusion-distributed's own codec
//!   comes first in its chain and claims every function with empty bytes, so a worker can only
//!   find functions by name.)
//! - Each key is hashed twice (route, then part) rather than once into a struct: DataFusion
//!   moves field accesses of a struct column down into the projection that makes the struct,
//!   which would evaluate the routing once per field.
//!
//! # Invariants
//! - A NULL key is an error (the build reads the non-NULL keys only), never a bucket.
//! - All keys of a group have the group's owner; a key of another owner is an internal error.

use std::sync::Arc;

use ::datafusion::arrow::array::{Array, ArrayRef, AsArray, ListArray, UInt32Array, UInt64Array};
use ::datafusion::arrow::buffer::OffsetBuffer;
use ::datafusion::arrow::datatypes::{DataType, Field, FieldRef, UInt32Type, UInt64Type};
use ::datafusion::common::{exec_err, internal_err, plan_err, Result, ScalarValue};
use ::datafusion::logical_expr::function::{AccumulatorArgs, StateFieldsArgs};
use ::datafusion::logical_expr::utils::format_state_name;
use ::datafusion::logical_expr::{
    Accumulator, AggregateUDFImpl, ColumnarValue, ScalarFunctionArgs, ScalarUDFImpl, Signature, Volatility,
};
use ::datafusion::physical_expr::expressions::Literal;

use crate::core::column::keys::{with_col, ColFn, KeyCol};
use crate::core::column::{value_type, KeyType};
use crate::core::hash::bucket_of;
use crate::core::partitioned::{encode_outcome, solve_owner, BucketRanges, MAX_OWNERS};
use crate::core::{Builder, Hash128, Params};
use crate::datafusion::error::to_df;

/// Name of the routing function.
pub const ROUTE_NAME: &str = "mphf_route";
/// Name of the part-building aggregate.
pub const BUILD_PART_NAME: &str = "mphf_build_part";

/// What both functions of a round share: the seed and the bucket ranges; the aggregate also
/// the MPHF parameters (its constant arguments).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) struct Round {
    pub(crate) params: Params,
    pub(crate) seed: u64,
    pub(crate) num_buckets: u64,
    pub(crate) owners: u64,
}

impl Round {
    fn ranges(&self) -> BucketRanges {
        BucketRanges::new(self.num_buckets, self.owners as usize)
    }

    /// The round that `name`'s constant arguments give, checked.
    fn checked(name: &str, params: (u64, u64, bool), seed: u64, num_buckets: u64, owners: u64) -> Result<Self> {
        let (leaf, bucket, rotation) = params;
        let params = Params::try_new(leaf as usize, bucket as usize, rotation).map_err(to_df)?;
        checked_ranges(name, num_buckets, owners)?;
        Ok(Round {
            params,
            seed,
            num_buckets,
            owners,
        })
    }
}

/// The bucket ranges of `num_buckets` buckets among `owners` (constant arguments of `name`).
fn checked_ranges(name: &str, num_buckets: u64, owners: u64) -> Result<BucketRanges> {
    match usize::try_from(owners) {
        Ok(w) if num_buckets > 0 && (1..=MAX_OWNERS).contains(&w) => Ok(BucketRanges::new(num_buckets, w)),
        _ => plan_err!("{name}: a round of {num_buckets} buckets among {owners} owners"),
    }
}

/// `mphf_route(key, seed, buckets, owners)`: the owner of each key's bucket under `seed`, for
/// `buckets` buckets split among `owners` ranges (constants).
#[derive(Debug, PartialEq, Eq, Hash)]
pub struct MphfRouteFunc {
    signature: Signature,
}

impl Default for MphfRouteFunc {
    fn default() -> Self {
        Self {
            signature: Signature::any(4, Volatility::Immutable),
        }
    }
}

/// The UInt64 constant at argument `i` of `name`.
fn u64_constant(name: &str, args: &[ColumnarValue], i: usize) -> Result<u64> {
    match args.get(i) {
        Some(ColumnarValue::Scalar(ScalarValue::UInt64(Some(v)))) => Ok(*v),
        _ => exec_err!("{name}: argument {} must be a non-NULL UInt64 constant", i + 1),
    }
}

/// Hashes every row of a null-free key column.
struct HashRows {
    seed: u64,
}

impl ColFn for HashRows {
    type Out = (Vec<u64>, Vec<u64>);
    fn call<C: KeyCol>(self, col: &C, _arr: &dyn Array) -> Self::Out {
        (0..col.rows())
            .map(|i| {
                let Hash128 { hi, lo } = col.hash_at(i, self.seed);
                (hi, lo)
            })
            .unzip()
    }
}

/// The `(hi, lo)` hashes under `seed` of the keys of `keys` (a dictionary is read as its
/// values), for function `name`.
fn hash_keys(name: &str, keys: &ArrayRef, seed: u64) -> Result<(Vec<u64>, Vec<u64>)> {
    let dt = value_type(keys.data_type()).clone();
    let keys = if &dt != keys.data_type() {
        ::datafusion::arrow::compute::cast(keys, &dt)?
    } else {
        Arc::clone(keys)
    };
    if keys.logical_null_count() > 0 {
        return exec_err!("{name}: a NULL key has no bucket (the build reads the non-NULL keys only)");
    }
    let key_type = KeyType::from_arrow(&dt).map_err(to_df)?;
    Ok(with_col(&key_type, keys.as_ref(), HashRows { seed }))
}

/// The owner of the bucket of each `hi`.
fn owners_of(hi: &[u64], ranges: BucketRanges) -> impl Iterator<Item = u32> + '_ {
    let num_buckets = ranges.num_buckets();
    hi.iter()
        .map(move |&h| ranges.owner_of(bucket_of(h, num_buckets)) as u32)
}

impl ScalarUDFImpl for MphfRouteFunc {
    fn name(&self) -> &str {
        ROUTE_NAME
    }

    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn return_type(&self, arg_types: &[DataType]) -> Result<DataType> {
        KeyType::from_arrow(value_type(&arg_types[0])).map_err(to_df)?;
        Ok(DataType::UInt32)
    }

    fn invoke_with_args(&self, args: ScalarFunctionArgs) -> Result<ColumnarValue> {
        let seed = u64_constant(ROUTE_NAME, &args.args, 1)?;
        let num_buckets = u64_constant(ROUTE_NAME, &args.args, 2)?;
        let ranges = checked_ranges(ROUTE_NAME, num_buckets, u64_constant(ROUTE_NAME, &args.args, 3)?)?;
        let keys = args.args[0].to_array(args.number_rows)?;
        let (hi, _) = hash_keys(ROUTE_NAME, &keys, seed)?;
        let owners: UInt32Array = owners_of(&hi, ranges).collect();
        Ok(ColumnarValue::Array(Arc::new(owners)))
    }
}

/// `mphf_build_part(key, leaf, bucket, rotation, seed, buckets, owners)`: one owner's encoded
/// outcome ([`encode_outcome`]); the arguments after `key` are constants.
#[derive(Debug, PartialEq, Eq, Hash)]
pub struct MphfBuildPartFunc {
    signature: Signature,
}

impl Default for MphfBuildPartFunc {
    fn default() -> Self {
        Self {
            signature: Signature::any(7, Volatility::Immutable),
        }
    }
}

/// The constant value of argument `i` of the aggregate.
fn literal_at(args: &AccumulatorArgs<'_>, i: usize) -> Result<ScalarValue> {
    match args.exprs.get(i).and_then(|e| e.downcast_ref::<Literal>()) {
        Some(l) => Ok(l.value().clone()),
        None => plan_err!("{BUILD_PART_NAME}: argument {} must be a constant", i + 1),
    }
}

/// The round that the aggregate's constant arguments give.
fn round_of_args(args: &AccumulatorArgs<'_>) -> Result<Round> {
    let word = |i: usize| match literal_at(args, i)? {
        ScalarValue::UInt64(Some(v)) => Ok(v),
        v => plan_err!("{BUILD_PART_NAME}: argument {} is {v}, not a UInt64", i + 1),
    };
    let rotation = match literal_at(args, 3)? {
        ScalarValue::Boolean(Some(b)) => b,
        v => return plan_err!("{BUILD_PART_NAME}: argument 4 is {v}, not a Boolean"),
    };
    Round::checked(
        BUILD_PART_NAME,
        (word(1)?, word(2)?, rotation),
        word(4)?,
        word(5)?,
        word(6)?,
    )
}

fn list_of_u64() -> DataType {
    DataType::List(Arc::new(Field::new_list_field(DataType::UInt64, false)))
}

impl AggregateUDFImpl for MphfBuildPartFunc {
    fn name(&self) -> &str {
        BUILD_PART_NAME
    }

    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn return_type(&self, _arg_types: &[DataType]) -> Result<DataType> {
        Ok(DataType::Binary)
    }

    fn accumulator(&self, args: AccumulatorArgs) -> Result<Box<dyn Accumulator>> {
        Ok(Box::new(PartAccumulator {
            round: round_of_args(&args)?,
            owner: None,
            hi: Vec::new(),
            lo: Vec::new(),
        }))
    }

    fn state_fields(&self, args: StateFieldsArgs) -> Result<Vec<FieldRef>> {
        Ok(vec![
            Arc::new(Field::new(
                format_state_name(args.name, "owner"),
                DataType::UInt32,
                true,
            )),
            Arc::new(Field::new(format_state_name(args.name, "hi"), list_of_u64(), true)),
            Arc::new(Field::new(format_state_name(args.name, "lo"), list_of_u64(), true)),
        ])
    }
}

/// One owner's pairs, gathered from every input share.
#[derive(Debug)]
struct PartAccumulator {
    round: Round,
    owner: Option<u32>,
    hi: Vec<u64>,
    lo: Vec<u64>,
}

impl PartAccumulator {
    /// Takes the group's owner from `owners` (all rows of a group share it).
    fn note_owners(&mut self, owners: impl IntoIterator<Item = u32>) -> Result<()> {
        for o in owners {
            match self.owner {
                None if u64::from(o) < self.round.owners => self.owner = Some(o),
                Some(w) if w == o => {}
                _ => return internal_err!("{BUILD_PART_NAME}: owner {o} in the group of owner {:?}", self.owner),
            }
        }
        Ok(())
    }

    fn extend(&mut self, hi: &dyn Array, lo: &dyn Array) -> Result<()> {
        if hi.null_count() + lo.null_count() > 0 || hi.len() != lo.len() {
            return internal_err!("{BUILD_PART_NAME}: NULL or unpaired hashes");
        }
        self.hi.extend_from_slice(hi.as_primitive::<UInt64Type>().values());
        self.lo.extend_from_slice(lo.as_primitive::<UInt64Type>().values());
        Ok(())
    }
}

/// `values` as one list scalar.
fn list_scalar(values: Vec<u64>) -> ScalarValue {
    let values = UInt64Array::from(values);
    let field = Arc::new(Field::new_list_field(DataType::UInt64, false));
    ScalarValue::List(Arc::new(ListArray::new(
        field,
        OffsetBuffer::from_lengths([values.len()]),
        Arc::new(values),
        None,
    )))
}

impl Accumulator for PartAccumulator {
    fn update_batch(&mut self, values: &[ArrayRef]) -> Result<()> {
        let Some(keys) = values.first() else {
            return internal_err!("{BUILD_PART_NAME} takes (key, ...)");
        };
        let (hi, lo) = hash_keys(BUILD_PART_NAME, keys, self.round.seed)?;
        self.note_owners(owners_of(&hi, self.round.ranges()))?;
        self.hi.extend(hi);
        self.lo.extend(lo);
        Ok(())
    }

    fn merge_batch(&mut self, states: &[ArrayRef]) -> Result<()> {
        let [owner, hi, lo] = states else {
            return internal_err!("{BUILD_PART_NAME}: a state of {} columns", states.len());
        };
        self.note_owners(owner.as_primitive::<UInt32Type>().iter().flatten())?;
        let (hi, lo) = (hi.as_list::<i32>(), lo.as_list::<i32>());
        for row in 0..hi.len() {
            if hi.is_valid(row) && lo.is_valid(row) {
                self.extend(hi.value(row).as_ref(), lo.value(row).as_ref())?;
            }
        }
        Ok(())
    }

    fn state(&mut self) -> Result<Vec<ScalarValue>> {
        Ok(vec![
            ScalarValue::UInt32(self.owner),
            list_scalar(std::mem::take(&mut self.hi)),
            list_scalar(std::mem::take(&mut self.lo)),
        ])
    }

    fn evaluate(&mut self) -> Result<ScalarValue> {
        let Some(w) = self.owner else {
            return Ok(ScalarValue::Binary(None));
        };
        let pairs: Vec<Hash128> = std::mem::take(&mut self.hi)
            .into_iter()
            .zip(std::mem::take(&mut self.lo))
            .map(|(hi, lo)| Hash128 { hi, lo })
            .collect();
        let builder = Builder::new(self.round.params).seed(self.round.seed);
        let outcome = solve_owner(&builder, &self.round.ranges(), w as usize, &[pairs]);
        Ok(ScalarValue::Binary(Some(encode_outcome(&outcome))))
    }

    fn size(&self) -> usize {
        std::mem::size_of_val(self) + (self.hi.capacity() + self.lo.capacity()) * 8
    }
}
