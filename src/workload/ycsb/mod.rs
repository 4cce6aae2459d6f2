//! YCSB request generators (Cooper et al., SoCC'10): the pure-logic half of YCSB.
//!
//! This module turns a [`Workload`] (core workloads A–F or a custom read/update mix)
//! into a stream of [`Op`]s; a driver elsewhere turns those into transactions. The
//! distributions follow the YCSB Java `generator` package:
//!
//! - [`ZipfianGenerator`]: Gray et al.'s zipfian with precomputed and incrementally
//!   grown zeta.
//! - [`ScrambledZipfianGenerator`]: zipfian spread over the key space with
//!   [`fnv_hash64`], so hot records are not clustered.
//! - [`SkewedLatestGenerator`]: workload D, the newest records are hottest.
//! - [`UniformGenerator`], and [`AcknowledgedCounter`] for insert record numbers.
//!
//! Records are numbered `0..n`; [`build_key`] maps a record number to the 8-byte key
//! the engine stores, and [`key_to_record`] inverts it.
//!
//! Nothing here touches storage, and every generator takes the RNG as an argument so
//! that a run is reproducible from its seed.

pub mod driver;
mod generators;
mod keys;
mod values;
mod workload;

pub use generators::{
    fnv_hash64, zeta, zeta_from, AcknowledgedCounter, ScrambledZipfianGenerator,
    SkewedLatestGenerator, UniformGenerator, ZipfianGenerator, ACK_WINDOW, FNV_OFFSET_BASIS_64,
    FNV_PRIME_64, SCRAMBLED_ITEM_COUNT, SCRAMBLED_ZETAN, ZIPFIAN_CONSTANT,
};
pub use keys::{build_key, key_to_record, Distribution, KeyChooser};
pub use values::{deterministic_field, fill_field, verify_field};
pub use workload::{Op, OpGenerator, ScanLengthDistribution, Workload, WORKLOAD_NAMES};

/// Errors from building YCSB generators and workloads, or from acknowledging inserts.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum YcsbError {
    /// The zipfian constant must satisfy 0 < theta < 1 (theta 0 is uniform: use
    /// [`Distribution::Uniform`] or let [`KeyChooser`] map it).
    #[error("invalid zipfian theta {0}: must be finite with 0 < theta < 1")]
    InvalidTheta(f64),
    /// A generator was asked to draw from an empty range.
    #[error("empty item range: {0}")]
    EmptyRange(&'static str),
    /// An operation proportion is negative or not finite.
    #[error("invalid {name} proportion {value}: must be finite and >= 0")]
    InvalidProportion {
        /// Which operation.
        name: &'static str,
        /// The offending value.
        value: f64,
    },
    /// Operation proportions do not sum to 1.
    #[error("operation proportions sum to {0}, expected 1")]
    ProportionSum(f64),
    /// A workload parameter is out of range.
    #[error("invalid workload parameter: {0}")]
    InvalidParameter(&'static str),
    /// `Workload::from_name` got a name it does not know.
    #[error("unknown YCSB workload {name:?}; valid names: {valid}")]
    UnknownWorkload {
        /// The name asked for.
        name: String,
        /// Comma-separated list of accepted names.
        valid: String,
    },
    /// An insert record number was acknowledged that was never handed out.
    #[error("insert key {key} was never handed out (next is {next})")]
    AckNotIssued {
        /// The record number.
        key: u64,
        /// The next record number the counter would hand out.
        next: u64,
    },
    /// An insert record number was acknowledged twice.
    #[error("insert key {0} acknowledged twice")]
    AckDuplicate(u64),
    /// Too many inserts are outstanding ahead of the oldest unacknowledged one.
    #[error("insert key {key} is {distance} past the acknowledged prefix (window {window})")]
    AckWindowFull {
        /// The record number.
        key: u64,
        /// How far past the contiguous acknowledged prefix it is.
        distance: u64,
        /// The window, [`ACK_WINDOW`].
        window: u64,
    },
}
