//! pmtx: a transactional storage engine for persistent memory.
//!
//! Open a [`Db`] (it recovers after a crash on its own), create tables, and run serializable
//! transactions from as many threads as you configure; one import brings everything in:
//!
//! ```
//! use pmtx::prelude::*;
//!
//! # fn main() -> Result<(), DbError> {
//! # let dir = tempfile::tempdir_in("/dev/shm").unwrap_or_else(|_| tempfile::tempdir().unwrap());
//! # let path = dir.path().join("bank.pool");
//! let db = Db::open_or_create(DbConfig::default().path(&path).pool_size(32 << 20).max_threads(4))?;
//! let accounts = match db.table("accounts") {
//!     Some(t) => t,
//!     None => db.create_table(Schema::new(
//!         "accounts",
//!         &[("owner", ColumnType::Bytes(16)), ("balance", ColumnType::I64)],
//!     ))?,
//! };
//! let balance = db.column(accounts, "balance")?; // resolved once, by name
//!
//! // A transaction as a closure: retried on conflicts, so it may run more than once.
//! db.run(|tx| {
//!     tx.insert(accounts, 1, &[Value::Bytes(b"ada"), Value::I64(100)])?;
//!     tx.insert(accounts, 2, &[Value::Bytes(b"grace"), Value::I64(0)])
//! })?;
//! db.run(|tx| {
//!     let from = tx.get(accounts, 1)?.get_i64("balance")?;
//!     if from < 10 {
//!         return tx.abort(); // or tx.abort_with(your_error)
//!     }
//!     let to = tx.get(accounts, 2)?.i64(balance);
//!     tx.update(accounts, 1, &[(balance, Value::I64(from - 10))])?;
//!     tx.update(accounts, 2, &[(balance, Value::I64(to + 10))])
//! })?;
//!
//! // Or an explicit transaction: commit, roll back, or drop (= roll back); not retried.
//! let mut txn = db.begin()?;
//! let ada = txn.get(accounts, 1)?.get_i64("balance")?;
//! txn.commit()?;
//! assert_eq!(ada, 90);
//!
//! // Errors are typed, one level deep from `run`.
//! let err = db.run(|tx| tx.insert(accounts, 1, &[Value::Bytes(b"x"), Value::I64(0)]));
//! assert!(matches!(
//!     err.unwrap_err().tx_error(),
//!     Some(TxError::DuplicateKey { .. })
//! ));
//! # Ok(())
//! # }
//! ```
//!
//! [`DbConfig`] chooses the engine ([`EngineKind`](engine::EngineKind): Falcon, the default, Zen, FIR, DUDETx,
//! MMDB...), the concurrency-control protocol and the persistence domain; see the README and
//! `docs/ARCHITECTURE.md`.
//!
//! The crate is organised in layers, bottom up:
//!
//! - [`pmem`]: the pool file and its mapping, persistence primitives, persistence domains,
//!   instrumentation and crash simulation. The only layer with raw-pointer `unsafe` for PM.
//! - [`alloc`]: PM space in 2 MiB pages.
//! - [`index`], [`cc`], [`catalog`]: indexes, concurrency control, schemas.
//! - [`engine`]: the durability designs, behind one [`engine::Engine`] contract.
//! - [`db`]: the API above ([`Db`], [`Transaction`](db::Transaction), [`Tx`](db::Tx)).
//! - [`ptm`]: ArchTM, a persistent-object transactional memory.
//!
//! With the default feature `cli` (which an embedding application can turn off with
//! `default-features = false`, leaving only the layers above): `bench` and `workload`
//! (benchmark drivers, YCSB, TPC-C, TATP), `crashtest` (the crash suite), `peers` (LMDB and
//! PMDK for comparison) and `cli` (the `pmtx` command).

#![warn(missing_docs)]
#![deny(unsafe_op_in_unsafe_fn)]

pub mod alloc;
#[cfg(feature = "bench")]
pub mod bench;
pub mod catalog;
pub mod cc;
#[cfg(feature = "cli")]
pub mod cli;
#[cfg(feature = "cli")]
pub mod crashtest;
pub mod db;
pub mod engine;
pub mod index;
#[cfg(feature = "cli")]
pub mod peers;
pub mod pmem;
pub mod ptm;
#[cfg(feature = "bench")]
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
