//! The index layer: what an index knows about the data it was made from, between the MPHF
//! ([`core`](crate::core)) and the query operators ([`datafusion`](crate::datafusion)).
//!
//! - [`file_stamp`]: the identity of a data file's content, checked before anything derived
//!   from the file is used.
//! - [`slot_map`]: the slot of every row of the indexed column, per data file, made when the
//!   index is made and saved next to it, so that a scan hands the operators slots instead of
//!   keys to look up.

pub mod file_stamp;
pub mod slot_map;

pub use file_stamp::FileStamp;
pub use slot_map::{CpuSlots, FileSlots, SlotMaps, SlotSource, NO_SLOT};
