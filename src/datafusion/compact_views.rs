//! Compacting string and binary view columns before an operator emits them.
//!
//! Why: `take` on a view array (`Utf8View`, `BinaryView`) copies only the 16-byte views; the
//! result keeps every data buffer of its source. An operator that takes a few thousand rows
//! from a large array (a join's build side, all of its rows in one batch) would emit each
//! batch holding the whole source's buffers. Operators above then pay for those buffers per
//! batch: a hash join concatenates them into its build side, and every batch it emits holds
//! the buffers again. DataFusion's own joins avoid this by copying the used strings into fresh
//! buffers (their batch coalescer's garbage collection); [`compact_views`] does the same, with
//! the same rule: only when the buffers hold more than twice the bytes the views use.
//!
//! Invariant: the values are unchanged; only buffer ownership changes.

use std::sync::Arc;

use ::datafusion::arrow::array::{Array, ArrayRef, AsArray, GenericByteViewArray, RecordBatch};
use ::datafusion::arrow::datatypes::{BinaryViewType, ByteViewType, DataType};
use ::datafusion::common::Result;

/// `array` with its used bytes copied into fresh buffers when its buffers hold more than
/// twice as many bytes as its views use; `None` when it is compact enough already.
fn compacted<T: ByteViewType + ?Sized>(array: &GenericByteViewArray<T>) -> Option<ArrayRef> {
    let held: usize = array.data_buffers().iter().map(|b| b.capacity()).sum();
    let used = array.total_buffer_bytes_used();
    (held > 2 * used).then(|| Arc::new(array.gc()) as ArrayRef)
}

/// `column`, compacted when it is a sparse view array (see the module docs); `None` when it is
/// kept as it is.
fn compacted_column(column: &ArrayRef) -> Option<ArrayRef> {
    match column.data_type() {
        DataType::Utf8View => compacted(column.as_string_view()),
        DataType::BinaryView => compacted(column.as_byte_view::<BinaryViewType>()),
        _ => None,
    }
}

/// `column`, compacted when it is a sparse view array (see the module docs).
pub fn compact_view_column(column: ArrayRef) -> ArrayRef {
    compacted_column(&column).unwrap_or(column)
}

/// `batch` with each sparse view column compacted (see the module docs).
///
/// # Errors
/// Arrow errors from rebuilding the batch.
pub fn compact_views(batch: RecordBatch) -> Result<RecordBatch> {
    let mut columns: Option<Vec<ArrayRef>> = None;
    for (i, column) in batch.columns().iter().enumerate() {
        if let Some(new) = compacted_column(column) {
            columns.get_or_insert_with(|| batch.columns().to_vec())[i] = new;
        }
    }
    match columns {
        None => Ok(batch),
        Some(columns) => Ok(RecordBatch::try_new_with_options(
            batch.schema(),
            columns,
            &::datafusion::arrow::array::RecordBatchOptions::new().with_row_count(Some(batch.num_rows())),
        )?),
    }
}

#[cfg(test)]
mod tests {
    use ::datafusion::arrow::array::{StringViewArray, UInt32Array};
    use ::datafusion::arrow::compute::take;
    use ::datafusion::arrow::datatypes::{Field, Schema};

    use super::*;

    fn buffer_bytes(array: &ArrayRef) -> usize {
        array.as_string_view().data_buffers().iter().map(|b| b.capacity()).sum()
    }

    #[test]
    fn rows_taken_from_a_large_view_array_get_their_own_buffers() {
        let names: Vec<String> = (0..10_000)
            .map(|i| format!("a name long enough to sit in a buffer #{i}"))
            .collect();
        let source: ArrayRef = Arc::new(StringViewArray::from_iter_values(&names));
        let taken = take(source.as_ref(), &UInt32Array::from(vec![7, 9_999, 7]), None).expect("take");
        assert_eq!(buffer_bytes(&taken), buffer_bytes(&source));
        let schema = Arc::new(Schema::new(vec![Field::new("name", DataType::Utf8View, false)]));
        let batch = RecordBatch::try_new(schema, vec![taken]).expect("batch");
        let compact = compact_views(batch.clone()).expect("compact");
        assert_eq!(compact, batch, "values are unchanged");
        assert!(
            buffer_bytes(compact.column(0)) < 200,
            "{}",
            buffer_bytes(compact.column(0))
        );
        // A dense array is left as it is (the same buffers, not a copy).
        let whole = RecordBatch::try_new(batch.schema(), vec![Arc::clone(&source)]).expect("batch");
        let kept = compact_views(whole).expect("compact");
        assert!(Arc::ptr_eq(kept.column(0), &source));
    }
}
