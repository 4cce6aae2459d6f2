//! Peers for `pmtx compare`: the stores a user would pick instead of pmtx (issue 18), driven by
//! the same YCSB key generator and bank transfers as the pmtx engines.
//!
//! Each peer is behind its own cargo feature so that the default build, `cargo test` and CI need
//! no C library (`scripts/peers.sh` installs and builds everything):
//!
//! - `lmdb` (feature `lmdb`): LMDB through heed, whose -sys crate vendors and builds LMDB. Modes:
//!   `lmdb` (the default: fsync on commit, durable), `lmdb-writemap` (MDB_WRITEMAP, msync on
//!   commit, durable), `lmdb-nosync` (MDB_NOSYNC) and `lmdb-mapasync` (MDB_WRITEMAP |
//!   MDB_MAPASYNC): the last two are fast modes that lose the last commits on a crash. LMDB runs
//!   one write transaction at a time (a process-wide writer lock); readers run concurrently.
//! - `pmdk` (feature `pmdk`): PMDK libpmemobj (Debian `libpmemobj-dev`): a hash map of
//!   fixed-size records in a pmemobj pool, each write transaction a pmemobj transaction (undo
//!   log), isolation from a readers-writer lock per record taken in key order (what the issue
//!   asks for: libpmemobj gives atomicity and durability, not isolation). The pool lives in
//!   /dev/shm like pmtx's, and PMDK is told to flush with cache-line flushes as on real PM
//!   (`PMEM_IS_PMEM_FORCE=1`), the same assumption pmtx's `--domain adr` makes there.
//! - `pmdk` also runs behind the persistent-object API for `pmtx bench ptm --engine pmdk`
//!   (`pmdk_ptm.rs`): the same hash table, B+-tree and key-value store as ArchTM's, on
//!   libpmemobj objects and transactions, under one pool-wide readers-writer lock (ArchTM §6).
//! - RocksDB (synced WAL) is not built: its build needs libclang and takes 15–30 minutes here.
//!
//! The FFI (`unsafe`) lives in `lmdb.rs` (opening an environment), `pmdk.rs` and `pmdk_ptm.rs`.

use crate::bench::{DriverError, TxnDriver, TxnOutcome};
use crate::workload::ycsb::{
    build_key, deterministic_field, AcknowledgedCounter, Op, OpGenerator, Workload,
};
use rand::rngs::StdRng;
use rand::SeedableRng;
use std::path::{Path, PathBuf};
use std::sync::Arc;

#[cfg(feature = "lmdb")]
mod lmdb;
#[cfg(feature = "pmdk")]
mod pmdk;
#[cfg(feature = "pmdk")]
pub mod pmdk_ptm;

/// A peer and its mode.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum PeerKind {
    /// LMDB, default flags: fsync on every commit (durable).
    Lmdb,
    /// LMDB with MDB_WRITEMAP: writes go to the map, msync on commit (durable).
    LmdbWritemap,
    /// LMDB with MDB_NOSYNC: no sync on commit (fast; a crash loses recent commits).
    LmdbNosync,
    /// LMDB with MDB_WRITEMAP | MDB_MAPASYNC: asynchronous flushes (fast; not durable).
    LmdbMapasync,
    /// PMDK libpmemobj: undo-logged transactions on a pmemobj pool, per-record locks.
    Pmdk,
}

impl PeerKind {
    /// Every peer, built or not.
    pub const ALL: [PeerKind; 5] = [
        PeerKind::Lmdb,
        PeerKind::LmdbWritemap,
        PeerKind::LmdbNosync,
        PeerKind::LmdbMapasync,
        PeerKind::Pmdk,
    ];

    /// The name on the command line and in reports.
    pub fn name(self) -> &'static str {
        match self {
            PeerKind::Lmdb => "lmdb",
            PeerKind::LmdbWritemap => "lmdb-writemap",
            PeerKind::LmdbNosync => "lmdb-nosync",
            PeerKind::LmdbMapasync => "lmdb-mapasync",
            PeerKind::Pmdk => "pmdk",
        }
    }

    /// The cargo feature that builds it.
    pub fn feature(self) -> &'static str {
        match self {
            PeerKind::Pmdk => "pmdk",
            _ => "lmdb",
        }
    }

    /// Whether this binary was built with the peer.
    pub fn built(self) -> bool {
        const BUILT: [(&str, bool); 2] = [
            ("pmdk", cfg!(feature = "pmdk")),
            ("lmdb", cfg!(feature = "lmdb")),
        ];
        BUILT.iter().any(|&(f, built)| built && f == self.feature())
    }

    /// Whether a commit is durable when it returns.
    pub fn durable(self) -> bool {
        !matches!(self, PeerKind::LmdbNosync | PeerKind::LmdbMapasync)
    }

    /// One line on the mode, for `--help` and the report.
    pub fn describe(self) -> &'static str {
        match self {
            PeerKind::Lmdb => "LMDB, fsync on commit (durable; one writer at a time)",
            PeerKind::LmdbWritemap => {
                "LMDB, MDB_WRITEMAP, msync on commit (durable; one writer at a time)"
            }
            PeerKind::LmdbNosync => "LMDB, MDB_NOSYNC (fast mode, NOT durable; one writer)",
            PeerKind::LmdbMapasync => {
                "LMDB, MDB_WRITEMAP|MDB_MAPASYNC (fast mode, NOT durable; one writer)"
            }
            PeerKind::Pmdk => {
                "PMDK libpmemobj: undo-log transactions, a rwlock per record in key order"
            }
        }
    }

    /// What the report's `cc` column says: how the peer isolates transactions.
    pub fn isolation(self) -> &'static str {
        match self {
            PeerKind::Pmdk => "rwlock-2pl",
            _ => "1-writer",
        }
    }

    /// What the report's `domain` column says: how a commit is made durable.
    pub fn durability(self) -> &'static str {
        match self {
            PeerKind::Lmdb => "fsync",
            PeerKind::LmdbWritemap => "msync",
            PeerKind::LmdbNosync | PeerKind::LmdbMapasync => "none",
            PeerKind::Pmdk => "pm-flush",
        }
    }

    /// Creates an empty store at `path` (a directory for LMDB, a pool file for PMDK; it must
    /// not exist) for up to `capacity` records of `row_len` bytes.
    pub fn create(self, path: &Path, capacity: u64, row_len: usize) -> StoreResult {
        self.store(path, capacity, row_len, true)
    }

    /// Opens the store a [`PeerKind::create`] made at `path` (after a close or a crash), with
    /// the `capacity` and `row_len` it was created with.
    pub fn open(self, path: &Path, capacity: u64, row_len: usize) -> StoreResult {
        self.store(path, capacity, row_len, false)
    }

    /// Creates (`create`) or opens the store at `path`.
    #[cfg_attr(not(any(feature = "lmdb", feature = "pmdk")), allow(unused_variables))]
    fn store(self, path: &Path, capacity: u64, row_len: usize, create: bool) -> StoreResult {
        self.check_built()?;
        if row_len == 0 {
            return Err(PeerError::Config(
                "records must have at least 1 byte".into(),
            ));
        }
        match (create, path.exists()) {
            (true, true) => {
                return Err(PeerError::Config(format!(
                    "{}: exists; a peer is created fresh",
                    path.display()
                )))
            }
            (false, false) => {
                return Err(PeerError::Config(format!(
                    "{}: does not exist",
                    path.display()
                )))
            }
            _ => {}
        }
        match self {
            #[cfg(feature = "pmdk")]
            PeerKind::Pmdk if create => {
                Ok(Box::new(pmdk::PmdkStore::create(path, capacity, row_len)?))
            }
            #[cfg(feature = "pmdk")]
            PeerKind::Pmdk => Ok(Box::new(pmdk::PmdkStore::open(path, row_len)?)),
            #[cfg(feature = "lmdb")]
            PeerKind::Lmdb
            | PeerKind::LmdbWritemap
            | PeerKind::LmdbNosync
            | PeerKind::LmdbMapasync => Ok(Box::new(lmdb::LmdbStore::open(
                self, path, capacity, row_len, create,
            )?)),
            #[allow(unreachable_patterns)]
            _ => Err(self.not_built()),
        }
    }

    /// Ok if this binary has the peer; else the error naming the feature to build.
    pub fn check_built(self) -> Result<(), PeerError> {
        if self.built() {
            Ok(())
        } else {
            Err(self.not_built())
        }
    }

    fn not_built(self) -> PeerError {
        PeerError::NotBuilt {
            peer: self.name(),
            feature: self.feature(),
        }
    }

    /// A fresh scratch path for one run of this peer in /dev/shm (registered for removal on a
    /// signal, see [`crate::pmem::scratch`]).
    pub fn scratch_path(self) -> PathBuf {
        use std::sync::atomic::{AtomicU64, Ordering};
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let ext = if self == PeerKind::Pmdk { ".pool" } else { "" };
        crate::pmem::scratch_dir().join(format!(
            "pmtx-peer-{}-{}-{n}{ext}",
            self.name(),
            std::process::id()
        ))
    }
}

impl std::fmt::Display for PeerKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for PeerKind {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        PeerKind::ALL
            .into_iter()
            .find(|p| p.name() == s)
            .ok_or_else(|| {
                let names: Vec<&str> = PeerKind::ALL.iter().map(|p| p.name()).collect();
                format!("unknown peer '{s}'; peers: {}", names.join(", "))
            })
    }
}

/// A store opened by [`PeerKind::create`] or [`PeerKind::open`].
pub type StoreResult = Result<Box<dyn PeerStore>, PeerError>;

/// A peer's error.
#[derive(Debug, thiserror::Error)]
pub enum PeerError {
    /// The binary was built without the peer's feature.
    #[error(
        "peer {peer} is not built into this pmtx: rebuild with `cargo build --release --features \
         {feature}` (scripts/peers.sh installs what it needs and builds every peer)"
    )]
    NotBuilt {
        /// The peer asked for.
        peer: &'static str,
        /// The cargo feature that builds it.
        feature: &'static str,
    },
    /// Bad parameters.
    #[error("{0}")]
    Config(String),
    /// The peer's library failed.
    #[error("{peer}: {message}")]
    Store {
        /// Which peer.
        peer: &'static str,
        /// What failed, with the library's message.
        message: String,
    },
    /// A key the transaction reads or writes is not stored.
    #[error("key {0:#x} is not stored")]
    Missing(u64),
    /// The store is full.
    #[error("the store is full ({0} records)")]
    Full(u64),
}

/// One transaction's view of a peer store: whole-record reads and in-place partial writes of
/// existing records.
pub trait PeerTx {
    /// Copies record `key` into `out` (its length is the record length).
    fn read(&mut self, key: u64, out: &mut [u8]) -> Result<(), PeerError>;
    /// Overwrites `bytes.len()` bytes of record `key` at `offset`.
    fn write(&mut self, key: u64, offset: usize, bytes: &[u8]) -> Result<(), PeerError>;
}

/// A store opened for a run, shared by the run's threads.
pub trait PeerStore: Send + Sync {
    /// Which peer this is.
    fn kind(&self) -> PeerKind;
    /// Inserts `rows` (key, record) in one durable transaction.
    fn insert_batch(&self, rows: &[(u64, &[u8])]) -> Result<(), PeerError>;
    /// Runs `body` as one transaction over the keys of `access` (sorted by key, each once, with
    /// whether the transaction writes it; see [`Access`]) and commits it durably (in a durable
    /// mode). An error from `body` aborts the transaction: nothing it wrote stays.
    fn run(
        &self,
        access: &Access,
        body: &mut dyn FnMut(&mut dyn PeerTx) -> Result<(), PeerError>,
    ) -> Result<(), PeerError>;
    /// Records stored.
    fn len(&self) -> Result<u64, PeerError>;
    /// Whether no record is stored.
    fn is_empty(&self) -> Result<bool, PeerError> {
        Ok(self.len()? == 0)
    }
}

/// The keys one transaction touches, sorted, each once, with whether it writes the key: PMDK
/// locks them in this order (so two transactions never wait on each other in a cycle), LMDB
/// opens a write transaction when any is written.
#[derive(Clone, Debug, Default)]
pub struct Access {
    keys: Vec<(u64, bool)>,
}

impl Access {
    /// Starts an empty set.
    pub fn clear(&mut self) {
        self.keys.clear();
    }
    /// Adds `key`, written or only read.
    pub fn add(&mut self, key: u64, write: bool) {
        self.keys.push((key, write));
    }
    /// Sorts and merges duplicates (a key both read and written is written). Call after the
    /// last [`Access::add`].
    pub fn seal(&mut self) {
        self.keys.sort_unstable();
        self.keys.dedup_by(|later, kept| {
            if later.0 == kept.0 {
                kept.1 |= later.1;
                true
            } else {
                false
            }
        });
    }
    /// The keys, sorted, with their write flag.
    pub fn keys(&self) -> &[(u64, bool)] {
        &self.keys
    }
    /// Whether any key is written.
    pub fn writes(&self) -> bool {
        self.keys.iter().any(|&(_, w)| w)
    }
}

/// Rows per load transaction.
const LOAD_BATCH: u64 = 256;

/// Loads YCSB records `0..records` (the rows the pmtx loader writes,
/// [`crate::workload::ycsb::driver::initial_row`]).
pub fn load_ycsb(
    store: &dyn PeerStore,
    workload: &Workload,
    records: u64,
) -> Result<(), PeerError> {
    let row_len = workload.field_count as usize * workload.field_len;
    load_rows(store, records, row_len, &|r, row| {
        crate::workload::ycsb::driver::initial_row(workload, r, row);
        build_key(r)
    })
}

/// Loads `accounts` bank accounts with [`crate::workload::bank::INITIAL_BALANCE`] each.
pub fn load_bank(store: &dyn PeerStore, accounts: u64) -> Result<(), PeerError> {
    load_rows(store, accounts, BANK_ROW, &|k, row| {
        row[..8].copy_from_slice(&crate::workload::bank::INITIAL_BALANCE.to_le_bytes());
        row[8..].fill(0);
        k
    })
}

fn load_rows(
    store: &dyn PeerStore,
    n: u64,
    row_len: usize,
    fill: &dyn Fn(u64, &mut [u8]) -> u64,
) -> Result<(), PeerError> {
    let mut rows = vec![0u8; row_len * LOAD_BATCH as usize];
    let mut start = 0;
    while start < n {
        let end = n.min(start + LOAD_BATCH);
        let mut batch = Vec::with_capacity((end - start) as usize);
        for (r, row) in (start..end).zip(rows.chunks_mut(row_len)) {
            batch.push((fill(r, row), &row[..]));
        }
        store.insert_batch(&batch)?;
        start = end;
    }
    Ok(())
}

/// Bytes of a bank account: balance (i64) and transfer count (u64), little-endian.
pub const BANK_ROW: usize = 16;

/// Rejects YCSB workloads a peer cannot run: the peers store a fixed set of records (no inserts)
/// and are hash maps (no scans).
pub fn check_ycsb_workload(workload: &Workload) -> Result<(), PeerError> {
    if workload.insert_proportion > 0.0 || workload.scan_proportion > 0.0 {
        return Err(PeerError::Config(format!(
            "YCSB workload {} inserts or scans; the peers run reads, updates and \
             read-modify-writes only (workloads a, b, c, f and the read/write mixes)",
            workload.name
        )));
    }
    if workload.value_type != crate::workload::ycsb::driver::ValueType::Bytes {
        return Err(PeerError::Config(
            "the peers store YCSB fields as raw bytes only: compare with --value-type bytes".into(),
        ));
    }
    Ok(())
}

/// One thread's YCSB transactions on a peer: the same [`OpGenerator`] (key choice, mix, fields)
/// and the same written bytes as the pmtx driver ([`crate::workload::ycsb::driver::YcsbDriver`]).
pub struct PeerYcsbDriver<'s> {
    store: &'s dyn PeerStore,
    generator: OpGenerator,
    rng: StdRng,
    ops: Vec<Op>,
    access: Access,
    row: Vec<u8>,
    field: Vec<u8>,
    version: u64,
    field_len: usize,
    field_count: u32,
}

impl<'s> PeerYcsbDriver<'s> {
    /// A driver with a per-thread seed.
    pub fn new(
        store: &'s dyn PeerStore,
        workload: &Workload,
        records: u64,
        seed: u64,
    ) -> Result<Self, PeerError> {
        check_ycsb_workload(workload)?;
        let inserts = Arc::new(AcknowledgedCounter::new(records));
        let generator = OpGenerator::new(workload.clone(), records, inserts)
            .map_err(|e| PeerError::Config(e.to_string()))?;
        Ok(PeerYcsbDriver {
            store,
            generator,
            rng: StdRng::seed_from_u64(seed),
            ops: Vec::new(),
            access: Access::default(),
            row: vec![0; workload.field_count as usize * workload.field_len],
            field: vec![0; workload.field_len],
            version: 0,
            field_len: workload.field_len,
            field_count: workload.field_count,
        })
    }

    /// Runs one generated transaction; returns whether it was read-only.
    pub fn run_one(&mut self) -> Result<bool, PeerError> {
        self.generator.next_txn(&mut self.rng, &mut self.ops);
        self.access.clear();
        for op in &self.ops {
            self.access.add(op.key(), op.is_write());
        }
        self.access.seal();
        let read_only = !self.access.writes();
        self.version += 1;
        // The bytes an update writes, as the pmtx driver writes them: the version in the first
        // 8 bytes of the field, zeros after.
        self.field.fill(0);
        self.field[..8.min(self.field_len)]
            .copy_from_slice(&self.version.to_le_bytes()[..8.min(self.field_len)]);
        let (ops, row, field) = (&self.ops, &mut self.row, &self.field);
        let (field_len, field_count) = (self.field_len, self.field_count);
        self.store.run(&self.access, &mut |tx| {
            for op in ops {
                match *op {
                    Op::Read { key } => tx.read(key, row)?,
                    Op::Update { key, field: f } | Op::ReadModifyWrite { key, field: f } => {
                        if matches!(op, Op::ReadModifyWrite { .. }) {
                            tx.read(key, row)?;
                        }
                        match f {
                            Some(f) => tx.write(key, f as usize * field_len, field)?,
                            None => {
                                for f in 0..field_count as usize {
                                    tx.write(key, f * field_len, field)?;
                                }
                            }
                        }
                    }
                    Op::Insert { .. } | Op::Scan { .. } => {
                        return Err(PeerError::Config("peers run no inserts or scans".into()))
                    }
                }
            }
            Ok(())
        })?;
        Ok(read_only)
    }
}

impl TxnDriver for PeerYcsbDriver<'_> {
    fn run_txn(&mut self) -> Result<TxnOutcome, DriverError> {
        let read_only = self.run_one().map_err(|e| Box::new(e) as DriverError)?;
        Ok(TxnOutcome {
            kind: usize::from(read_only),
            committed: true,
            aborts: 0,
        })
    }
}

/// One thread's bank transfers on a peer: the pmtx bank workload's choice of accounts and
/// amounts ([`crate::workload::bank::choose_transfer`]), the same rule (no transfer that would
/// overdraw).
pub struct PeerBankDriver<'s> {
    store: &'s dyn PeerStore,
    accounts: u64,
    rng: StdRng,
    access: Access,
}

impl<'s> PeerBankDriver<'s> {
    /// A driver with a per-thread seed.
    pub fn new(store: &'s dyn PeerStore, accounts: u64, seed: u64) -> Self {
        PeerBankDriver {
            store,
            accounts,
            rng: StdRng::seed_from_u64(seed),
            access: Access::default(),
        }
    }

    /// Runs one transfer.
    pub fn run_one(&mut self) -> Result<(), PeerError> {
        let (from, to, amount) =
            crate::workload::bank::choose_transfer(&mut self.rng, self.accounts);
        self.access.clear();
        self.access.add(from, true);
        self.access.add(to, true);
        self.access.seal();
        self.store.run(&self.access, &mut |tx| {
            let (mut a, mut b) = ([0u8; BANK_ROW], [0u8; BANK_ROW]);
            tx.read(from, &mut a)?;
            tx.read(to, &mut b)?;
            let (a, b) = (Account::from(a), Account::from(b));
            if a.balance < amount {
                return Ok(());
            }
            tx.write(from, 0, &a.after(-amount))?;
            tx.write(to, 0, &b.after(amount))?;
            Ok(())
        })
    }
}

impl TxnDriver for PeerBankDriver<'_> {
    fn run_txn(&mut self) -> Result<TxnOutcome, DriverError> {
        self.run_one().map_err(|e| Box::new(e) as DriverError)?;
        Ok(TxnOutcome {
            kind: 0,
            committed: true,
            aborts: 0,
        })
    }
}

/// A bank account record.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Account {
    balance: i64,
    transfers: u64,
}

impl From<[u8; BANK_ROW]> for Account {
    fn from(b: [u8; BANK_ROW]) -> Self {
        let (bal, n) = b.split_at(8);
        Account {
            balance: i64::from_le_bytes(bal.try_into().expect("8 bytes")),
            transfers: u64::from_le_bytes(n.try_into().expect("8 bytes")),
        }
    }
}

impl Account {
    /// The record after adding `delta` to the balance and counting the transfer.
    fn after(self, delta: i64) -> [u8; BANK_ROW] {
        let mut out = [0u8; BANK_ROW];
        out[..8].copy_from_slice(&(self.balance + delta).to_le_bytes());
        out[8..].copy_from_slice(&(self.transfers + 1).to_le_bytes());
        out
    }
}

/// Checks the bank invariant on a peer: every account present, none negative, the total
/// unchanged. Returns the number of transfers recorded (each counted on both accounts).
pub fn check_bank(store: &dyn PeerStore, accounts: u64) -> Result<u64, String> {
    let mut total: i128 = 0;
    let mut transfers: u64 = 0;
    let mut access = Access::default();
    for k in 0..accounts {
        access.add(k, false);
    }
    access.seal();
    store
        .run(&access, &mut |tx| {
            let mut b = [0u8; BANK_ROW];
            for k in 0..accounts {
                tx.read(k, &mut b)?;
                let a = Account::from(b);
                if a.balance < 0 {
                    return Err(PeerError::Config(format!(
                        "account {k} has a negative balance {}",
                        a.balance
                    )));
                }
                total += i128::from(a.balance);
                transfers += a.transfers;
            }
            Ok(())
        })
        .map_err(|e| e.to_string())?;
    let expected = i128::from(accounts) * i128::from(crate::workload::bank::INITIAL_BALANCE);
    if total != expected {
        return Err(format!("total balance {total}, expected {expected}"));
    }
    Ok(transfers)
}

/// Reads every YCSB record back and checks each field holds either its loaded value or a value
/// an update wrote (a version in the first 8 bytes, zeros after). Returns the records whose
/// fields were updated.
pub fn check_ycsb(store: &dyn PeerStore, workload: &Workload, records: u64) -> Result<u64, String> {
    let row_len = workload.field_count as usize * workload.field_len;
    let mut row = vec![0u8; row_len];
    let mut loaded = vec![0u8; workload.field_len];
    let mut updated = 0;
    let mut access = Access::default();
    for r in 0..records {
        access.clear();
        access.add(build_key(r), false);
        store
            .run(&access, &mut |tx| tx.read(build_key(r), &mut row))
            .map_err(|e| format!("record {r}: {e}"))?;
        let mut changed = false;
        for (f, got) in row.chunks(workload.field_len).enumerate() {
            deterministic_field(build_key(r), f as u32, 0, &mut loaded);
            if got == &loaded[..] {
                continue;
            }
            let rest = &got[8.min(got.len())..];
            if rest.iter().any(|&b| b != 0) || got[..8.min(got.len())].iter().all(|&b| b == 0) {
                return Err(format!(
                    "record {r} field {f}: neither loaded nor updated bytes"
                ));
            }
            changed = true;
        }
        updated += u64::from(changed);
    }
    Ok(updated)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_parse_back_and_unknown_names_list_the_peers() {
        for p in PeerKind::ALL {
            assert_eq!(p.name().parse::<PeerKind>(), Ok(p));
        }
        let e = "rocksdb".parse::<PeerKind>().unwrap_err();
        assert!(e.contains("lmdb") && e.contains("pmdk"), "{e}");
    }

    #[test]
    fn an_access_set_is_sorted_once_per_key_and_write_wins() {
        let mut a = Access::default();
        a.add(9, false);
        a.add(3, false);
        a.add(9, true);
        a.add(3, false);
        a.seal();
        assert_eq!(a.keys(), &[(3, false), (9, true)]);
        assert!(a.writes());
    }

    #[test]
    fn a_peer_not_built_names_its_feature() {
        for p in PeerKind::ALL.into_iter().filter(|p| !p.built()) {
            let e = p.create(&p.scratch_path(), 10, 8).err().expect("not built");
            assert!(
                e.to_string()
                    .contains(&format!("--features {}", p.feature())),
                "{e}"
            );
        }
    }
}
