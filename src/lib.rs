//! pmtx: a transactional storage engine for persistent memory.
//!
//! The crate is organised in layers, bottom up (see `docs/ARCHITECTURE.md`):
//!
//! - [`pmem`]: the pool file and its mapping, persistence primitives, persistence domains,
//!   instrumentation and crash simulation. The only layer with raw-pointer `unsafe` for PM.
//! - [`alloc`]: PM space in 2 MiB pages.
//! - [`cli`]: the `pmtx` command line.
//! - [`workload`]: workload generators (YCSB, ...).

#![warn(missing_docs)]
#![deny(unsafe_op_in_unsafe_fn)]

pub mod alloc;
pub mod bench;
pub mod catalog;
pub mod cc;
pub mod cli;
pub mod crashtest;
pub mod db;
pub mod engine;
pub mod index;
pub mod peers;
pub mod pmem;
pub mod ptm;
pub mod workload;

pub use db::{Db, DbConfig};
pub use engine::{AppError, DbError, TxError};

/// What an application embedding pmtx needs, in one import: `use pmtx::prelude::*;`.
pub mod prelude {
    pub use crate::catalog::{ColumnType, Schema, TableId};
    pub use crate::cc::Protocol;
    pub use crate::db::{Db, DbConfig, Row, RowRef, Transaction, Tx, Value, Worker};
    pub use crate::engine::{AppError, DbError, EngineKind, TxError};
    pub use crate::pmem::PersistenceDomain;
}
