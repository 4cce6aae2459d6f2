//! Workloads the crash harness runs, and the oracle of committed writes it keeps outside PM.
//!
//! A [`CrashWorkload`] runs its transactions through [`TxCtx::run`], which records each attempt's
//! write set (full after-images) in a [`Recorder`] *before* the commit call and its tid *after* the
//! commit returned. The [`Oracle`] built from those events knows, at any crash point, the state
//! every acknowledged transaction produced and the few transactions whose fate is open (in flight,
//! or returned but not yet reported durable by [`Engine::durable_tid`](crate::engine::Engine)).

use crate::catalog::{ColumnType, Schema, TableId};
use crate::db::{Db, Tx, Worker};
use crate::engine::{DbError, FieldWrite, TxError};
use crate::workload::{bank, ycsb};
use parking_lot::Mutex;
use rand::rngs::StdRng;
use rand::Rng;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// One write of a transaction: the row's after-image, or `None` for a delete.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Write {
    /// The workload's table index (position in [`CrashWorkload::schemas`]).
    pub table: usize,
    /// The primary key.
    pub key: u64,
    /// The whole row after the transaction, `None` if deleted.
    pub row: Option<Vec<u8>>,
    /// The transaction read the key (or, inserting it, found it absent) before writing it, so
    /// its write replaces the version it read: it cannot be serialised after a write of the key
    /// that committed after that read (a lost update). A blind write can.
    #[serde(default)]
    pub read: bool,
}

/// What the harness learns while a workload runs, in order.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum OracleEvent {
    /// Every table of the workload exists (`create_table` returned).
    TablesCreated,
    /// Thread `thread` is about to commit these writes.
    InFlight {
        /// The worker thread (0-based).
        thread: usize,
        /// Its write set.
        writes: Vec<Write>,
    },
    /// Thread `thread`'s commit returned with `tid`.
    Returned {
        /// The worker thread.
        thread: usize,
        /// The commit tid.
        tid: u64,
    },
    /// The engine reports every commit up to `tid` durable.
    DurableUpTo {
        /// The durable tid.
        tid: u64,
    },
    /// Thread `thread`'s transaction did not commit (abort, error).
    Failed {
        /// The worker thread.
        thread: usize,
    },
}

/// A transaction whose fate a crash leaves open: it may be wholly visible or wholly absent.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Uncertain {
    /// Its writes.
    pub writes: Vec<Write>,
    /// The oracle sequence number when it went in flight (its reads are all before it):
    /// acknowledged writes to the same key with a later sequence number may have been ordered
    /// after it.
    pub since: u64,
    /// Its commit tid, if its commit returned (it is then only waiting to become durable).
    pub tid: Option<u64>,
}

/// The last durable write of a key.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AckedWrite {
    /// Its commit tid.
    pub tid: u64,
    /// The oracle sequence number when it became durable.
    pub acked: u64,
    /// The oracle sequence number when its transaction went in flight: it committed after that.
    pub since: u64,
    /// The row, or `None` for a delete.
    pub row: Option<Vec<u8>>,
}

/// Where a child process forwards oracle events.
pub type EventSink = Box<dyn Fn(&OracleEvent) + Send + Sync>;

/// The committed state a correct recovery must reproduce, kept in DRAM outside the pool.
#[derive(Clone, Debug, Default)]
pub struct Oracle {
    /// Whether the workload's tables were created.
    pub tables_created: bool,
    /// Per table: key → (tid, sequence number, row or tombstone) of the last durable write.
    pub acked: Vec<BTreeMap<u64, AckedWrite>>,
    /// Per thread: the write set about to commit, with its sequence number.
    in_flight: BTreeMap<usize, (Vec<Write>, u64)>,
    /// Commits that returned but are not yet reported durable: (tid, writes, since).
    returned: Vec<(u64, Vec<Write>, u64)>,
    /// Events applied (a logical clock).
    seq: u64,
    /// Acknowledged transactions.
    pub commits: u64,
}

impl Oracle {
    /// An empty oracle for `tables` tables.
    pub fn new(tables: usize) -> Oracle {
        Oracle {
            acked: vec![BTreeMap::new(); tables],
            ..Oracle::default()
        }
    }

    /// An oracle whose acknowledged state is `rows` (per table), e.g. a recovered database.
    pub fn from_state(rows: &[BTreeMap<u64, Vec<u8>>]) -> Oracle {
        let mut o = Oracle::new(rows.len());
        o.tables_created = true;
        for (t, table) in rows.iter().enumerate() {
            for (k, r) in table {
                o.acked[t].insert(
                    *k,
                    AckedWrite {
                        tid: 0,
                        acked: 0,
                        since: 0,
                        row: Some(r.clone()),
                    },
                );
            }
        }
        o
    }

    /// Applies one event.
    pub fn apply(&mut self, event: &OracleEvent) {
        self.seq += 1;
        match event {
            OracleEvent::TablesCreated => self.tables_created = true,
            OracleEvent::InFlight { thread, writes } => {
                self.in_flight.insert(*thread, (writes.clone(), self.seq));
            }
            OracleEvent::Failed { thread } => {
                self.in_flight.remove(thread);
            }
            OracleEvent::Returned { thread, tid } => {
                if let Some((writes, since)) = self.in_flight.remove(thread) {
                    self.returned.push((*tid, writes, since));
                }
            }
            OracleEvent::DurableUpTo { tid } => {
                let (done, open): (Vec<_>, Vec<_>) =
                    self.returned.drain(..).partition(|(t, _, _)| t <= tid);
                self.returned = open;
                for (t, writes, since) in done {
                    self.commits += 1;
                    for w in writes {
                        let acked = AckedWrite {
                            tid: t,
                            acked: self.seq,
                            since,
                            row: w.row,
                        };
                        // Commit tids order conflicting writes (a later ack may carry an older tid).
                        match self.acked[w.table].entry(w.key) {
                            std::collections::btree_map::Entry::Vacant(e) => {
                                e.insert(acked);
                            }
                            std::collections::btree_map::Entry::Occupied(mut e) => {
                                if t >= e.get().tid {
                                    e.insert(acked);
                                }
                            }
                        }
                    }
                }
            }
        }
    }

    /// The acknowledged row of `key` (None: absent or deleted).
    pub fn acked_row(&self, table: usize, key: u64) -> Option<&Vec<u8>> {
        self.acked[table].get(&key).and_then(|a| a.row.as_ref())
    }

    /// The last acknowledged write of `key`, if any.
    pub fn acked_write(&self, table: usize, key: u64) -> Option<&AckedWrite> {
        self.acked[table].get(&key)
    }

    /// Transactions whose fate a crash now leaves open.
    pub fn uncertain(&self) -> Vec<Uncertain> {
        self.in_flight
            .values()
            .map(|(w, s)| Uncertain {
                writes: w.clone(),
                since: *s,
                tid: None,
            })
            .chain(self.returned.iter().map(|(t, w, s)| Uncertain {
                writes: w.clone(),
                since: *s,
                tid: Some(*t),
            }))
            .filter(|u| !u.writes.is_empty())
            .collect()
    }

    /// Every key the oracle knows of, per table.
    pub fn keys(&self) -> Vec<std::collections::BTreeSet<u64>> {
        let mut keys: Vec<std::collections::BTreeSet<u64>> = self
            .acked
            .iter()
            .map(|m| m.keys().copied().collect())
            .collect();
        for u in self.uncertain() {
            for w in u.writes {
                keys[w.table].insert(w.key);
            }
        }
        keys
    }
}

/// Where oracle events go: the oracle itself and, for a child process under real kills, a sink
/// that forwards them to the parent.
pub struct Recorder {
    oracle: Mutex<Oracle>,
    sink: Option<EventSink>,
}

impl Recorder {
    /// A recorder starting from `oracle`.
    pub fn new(oracle: Oracle) -> Recorder {
        Recorder {
            oracle: Mutex::new(oracle),
            sink: None,
        }
    }

    /// Also hands every event to `sink`.
    pub fn with_sink(mut self, sink: EventSink) -> Recorder {
        self.sink = Some(sink);
        self
    }

    /// Records one event.
    pub fn record(&self, event: OracleEvent) {
        let mut o = self.oracle.lock();
        o.apply(&event);
        if let Some(sink) = &self.sink {
            sink(&event);
        }
    }

    fn has_in_flight(&self, thread: usize) -> bool {
        self.oracle.lock().in_flight.contains_key(&thread)
    }

    /// A copy of the oracle now.
    pub fn snapshot(&self) -> Oracle {
        self.oracle.lock().clone()
    }
}

/// A transaction of a crash workload: reads and whole-row writes, recorded for the oracle.
pub struct OTx<'a, 'b> {
    tx: &'a mut Tx<'b>,
    tables: &'a [TableId],
    writes: Vec<Write>,
    /// Keys read before this transaction wrote them ([`Write::read`]).
    reads: Vec<(usize, u64)>,
}

impl<'b> OTx<'_, 'b> {
    /// The row of `key` in workload table `table`, `None` if there is none.
    pub fn get(&mut self, table: usize, key: u64) -> Result<Option<Vec<u8>>, TxError> {
        if !self.writes.iter().any(|w| w.table == table && w.key == key) {
            self.reads.push((table, key));
        }
        match self.tx.get(self.tables[table], key) {
            Ok(row) => Ok(Some(row.bytes().to_vec())),
            Err(TxError::NotFound { .. }) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Notes the write of `key`; `read`: it is based on a read of the key (or its absence)
    /// whatever this transaction read before.
    fn note(&mut self, table: usize, key: u64, row: Option<Vec<u8>>, read: bool) {
        let read = read || self.reads.contains(&(table, key));
        let earlier = self
            .writes
            .iter()
            .position(|w| w.table == table && w.key == key);
        let read = read || earlier.is_some_and(|i| self.writes[i].read);
        if let Some(i) = earlier {
            self.writes.remove(i);
        }
        self.writes.push(Write {
            table,
            key,
            row,
            read,
        });
    }

    /// Replaces the whole row of `key`.
    pub fn put(&mut self, table: usize, key: u64, row: &[u8]) -> Result<(), TxError> {
        self.tx.update_bytes(
            self.tables[table],
            key,
            &[FieldWrite {
                offset: 0,
                bytes: row,
            }],
        )?;
        self.note(table, key, Some(row.to_vec()), false);
        Ok(())
    }

    /// Inserts a row (an insert reads the key's absence).
    pub fn insert(&mut self, table: usize, key: u64, row: &[u8]) -> Result<(), TxError> {
        self.tx.insert_bytes(self.tables[table], key, row)?;
        self.note(table, key, Some(row.to_vec()), true);
        Ok(())
    }

    /// Deletes the row of `key` (a delete reads the key's presence).
    pub fn delete(&mut self, table: usize, key: u64) -> Result<(), TxError> {
        self.tx.delete(self.tables[table], key)?;
        self.note(table, key, None, true);
        Ok(())
    }

    /// The transaction itself, for workloads whose transactions are written against [`Tx`]
    /// (TPC-C). What it writes that way is unknown to the oracle until [`OTx::record`] notes it.
    pub fn tx(&mut self) -> &mut Tx<'b> {
        self.tx
    }

    /// Notes the row of `key` as this transaction leaves it (its whole after-image, read back
    /// through the transaction; `None` when deleted) in the write set the oracle records. A
    /// workload writing through [`OTx::tx`] notes every key it wrote; one it forgets differs from
    /// its acknowledged value after recovery and is reported as lost. The write counts as based
    /// on a read ([`Write::read`]): TPC-C's transactions read every row they update, and insert
    /// or delete only keys whose presence they checked.
    pub fn record(&mut self, table: usize, key: u64) -> Result<(), TxError> {
        let row = match self.tx.get(self.tables[table], key) {
            Ok(row) => Some(row.bytes().to_vec()),
            Err(TxError::NotFound { .. }) => None,
            Err(e) => return Err(e),
        };
        self.note(table, key, row, true);
        Ok(())
    }
}

/// One thread's context: its worker, its oracle thread number and its own key range for inserts.
pub struct TxCtx<'db, 'r> {
    /// The database.
    pub db: &'db Db,
    worker: Worker<'db>,
    thread: usize,
    tables: Vec<TableId>,
    recorder: &'r Recorder,
    /// The next key this thread inserts (threads insert disjoint key ranges).
    pub next_key: u64,
    /// Keys this thread inserted and may delete.
    pub own_keys: Vec<u64>,
}

/// Key ranges of thread inserts start here (above any loaded key).
pub const INSERT_KEY_BASE: u64 = 1 << 40;

impl<'db, 'r> TxCtx<'db, 'r> {
    /// A context on a new worker of `db`; `tables` maps workload table indexes to table ids.
    /// `epoch` separates the insert key ranges of successive runs on one database.
    pub fn new(
        db: &'db Db,
        tables: Vec<TableId>,
        recorder: &'r Recorder,
        thread: usize,
        epoch: u64,
    ) -> Result<TxCtx<'db, 'r>, DbError> {
        Ok(TxCtx {
            db,
            worker: db.worker()?,
            thread,
            tables,
            recorder,
            next_key: INSERT_KEY_BASE + (epoch << 32) + ((thread as u64) << 24),
            own_keys: Vec::new(),
        })
    }

    /// The thread's worker (for reads outside the recorded transactions).
    pub fn worker(&mut self) -> &mut Worker<'db> {
        &mut self.worker
    }

    /// Records `writes` as acknowledged by a load that ran outside [`TxCtx::run`] and has
    /// returned (on the synchronous engines every commit that returned is durable). It gets tid
    /// 0, so that any later commit orders after it.
    pub fn record_loaded(&mut self, writes: Vec<Write>) {
        let thread = self.thread;
        self.recorder
            .record(OracleEvent::InFlight { thread, writes });
        self.recorder
            .record(OracleEvent::Returned { thread, tid: 0 });
        self.recorder.record(OracleEvent::DurableUpTo { tid: 0 });
    }

    /// Inserts into workload table `table` a row under this thread's next key (`row` builds it
    /// from the key); the key joins [`TxCtx::own_keys`] if the insert committed.
    pub fn insert_own(
        &mut self,
        table: usize,
        row: impl FnOnce(u64) -> Vec<u8>,
    ) -> Result<(), DbError> {
        let row = row(self.next_key);
        self.insert_own_with(|tx, key| tx.insert(table, key, &row))
    }

    /// Inserts a row with the next key of this thread's key range through `insert` (given the
    /// key; it records what it writes); the key joins this thread's keys if it committed.
    pub fn insert_own_with(
        &mut self,
        mut insert: impl FnMut(&mut OTx<'_, '_>, u64) -> Result<(), TxError>,
    ) -> Result<(), DbError> {
        let key = self.next_key;
        self.next_key += 1;
        if self.run(|tx| insert(tx, key))? {
            self.own_keys.push(key);
        }
        Ok(())
    }

    /// Deletes from workload table `table` one of this thread's keys, drawn with `rng` (none
    /// left: nothing).
    pub fn delete_own(&mut self, table: usize, rng: &mut StdRng) -> Result<(), DbError> {
        if self.own_keys.is_empty() {
            return Ok(());
        }
        self.delete_own_with(rng, |tx, key| tx.delete(table, key))
    }

    /// Deletes one of this thread's keys, drawn with `rng`, through `delete` (given the key; it
    /// records what it writes); none left: nothing.
    pub fn delete_own_with(
        &mut self,
        rng: &mut StdRng,
        mut delete: impl FnMut(&mut OTx<'_, '_>, u64) -> Result<(), TxError>,
    ) -> Result<(), DbError> {
        if self.own_keys.is_empty() {
            return Ok(());
        }
        let i = rng.gen_range(0..self.own_keys.len());
        let key = self.own_keys.swap_remove(i);
        self.run(|tx| delete(tx, key))?;
        Ok(())
    }

    /// Runs `f` as a transaction (retrying conflicts), recording its writes before the commit and
    /// its tid after. `Ok(false)`: it failed with a non-retryable transaction error (e.g. a
    /// duplicate key), which the workload may treat as a skipped operation.
    pub fn run(
        &mut self,
        mut f: impl FnMut(&mut OTx<'_, '_>) -> Result<(), TxError>,
    ) -> Result<bool, DbError> {
        let (thread, recorder, tables) = (self.thread, self.recorder, &self.tables);
        let sim = self.db.engine().pool().and_then(|p| p.crash_sim()).cloned();
        let result = self.worker.run_counted(false, |tx| {
            // After a simulated crash another thread may spin on a lock the crashed one held
            // without reaching a PM event (where it would stop): stop it here.
            if let Some(sim) = &sim {
                if sim.has_crashed() {
                    let event = sim.crashed_at().unwrap_or(0);
                    std::panic::resume_unwind(Box::new(crate::pmem::SimulatedCrash { event }));
                }
            }
            if recorder.has_in_flight(thread) {
                recorder.record(OracleEvent::Failed { thread });
            }
            let mut otx = OTx {
                tx,
                tables,
                writes: Vec::new(),
                reads: Vec::new(),
            };
            f(&mut otx)?;
            if !otx.writes.is_empty() {
                recorder.record(OracleEvent::InFlight {
                    thread,
                    writes: otx.writes,
                });
            }
            Ok(())
        });
        match result {
            Ok(outcome) => {
                if recorder.has_in_flight(thread) {
                    recorder.record(OracleEvent::Returned {
                        thread,
                        tid: outcome.tid,
                    });
                    let durable = self.db.engine().durable_tid();
                    recorder.record(OracleEvent::DurableUpTo { tid: durable });
                }
                Ok(true)
            }
            Err(DbError::Tx(e)) if !matches!(e, TxError::PmFull(_)) => {
                if recorder.has_in_flight(thread) {
                    recorder.record(OracleEvent::Failed { thread });
                }
                if e == TxError::UserAbort
                    || matches!(e, TxError::DuplicateKey { .. } | TxError::NotFound { .. })
                {
                    Ok(false)
                } else {
                    Err(DbError::Tx(e))
                }
            }
            Err(e) => Err(e),
        }
    }
}

/// The state read back from a recovered database: per workload table, key → row.
pub type Observed = Vec<BTreeMap<u64, Vec<u8>>>;

/// A workload the crash harness can run: tables, an initial load, one transaction at a time, and
/// the invariants any consistent state satisfies. TPC-C (`check_consistency`) and TATP plug in
/// by implementing it.
pub trait CrashWorkload: Send + Sync {
    /// Its name on the command line.
    fn name(&self) -> &'static str;
    /// Its tables (created by the harness, in this order).
    fn schemas(&self) -> Vec<Schema>;
    /// Loads the initial rows (run once, on thread 0, before the transactions).
    fn load(&self, ctx: &mut TxCtx<'_, '_>) -> Result<(), DbError>;
    /// Runs one transaction.
    fn step(&self, ctx: &mut TxCtx<'_, '_>, rng: &mut StdRng) -> Result<(), DbError>;
    /// Invariants of a state (empty: all hold); `rows` holds every row the oracle knows of.
    fn check(&self, rows: &Observed) -> Vec<String>;
    /// Invariants checked on the whole recovered database rather than the rows the oracle knows
    /// (TPC-C's consistency conditions); empty: all hold.
    fn check_db(&self, _db: &Db) -> Vec<String> {
        Vec::new()
    }
    /// The first PM event of a run crash points are drawn from: a workload that loads outside
    /// the crash window records the event count at the end of its load here (during the
    /// crash-free run that counts events). 0: the whole run, creation and load included.
    fn crash_window_start(&self) -> u64 {
        0
    }
    /// Heap pages per thread the workload needs beyond one per table (the pool is sized from it).
    fn extra_pages_per_thread(&self) -> u64 {
        0
    }
}

/// The workloads the harness knows.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum WorkloadKind {
    /// Transfers between accounts (total constant, no negative balance).
    Bank,
    /// YCSB-style reads, two-record updates, inserts and deletes with per-record checksums.
    Ycsb,
    /// A very small TPC-C (loaded before the crash window): New-Order, Payment, Delivery; the
    /// consistency conditions of clause 3.3.2 after every recovery.
    Tpcc,
    /// Inserts of 4000-byte rows in batches, updates and deletes, until the table needs more than
    /// one 2 MiB heap page per thread: crash-tests heap growth.
    Grow,
    /// YCSB's records under an *ordered* primary index, insert-heavy (batches of four keys)
    /// with deletes: with `--index pm` (issue 17) the persistent ordered index's leaf inserts,
    /// removals and splits (the load alone overfills the first leaf) meet the crash images.
    YcsbOrdered,
    /// Rows with variable-length values, many out of line (issue 21): every recovered value must
    /// be exactly a committed one, and the hidden chunk table hold exactly its chunks.
    Varlen,
    /// Rows under a secondary index whose key changes: transactions move rows between
    /// secondary keys, insert and delete them (issue 17: with `--index pm`, the PM secondary
    /// index's ordering steps, from the `SecondaryOld` log entry to the index change, meet the
    /// crash images; the structure check compares the index with the rows).
    Secondary,
    /// A table with byte-string keys (issue 21) and small index nodes: inserts splitting nodes
    /// at several levels, updates and deletes, a ledger the oracle checks, and after each
    /// recovery a check that the index is well-formed and maps exactly the ledger's keys.
    ByteKeys,
    /// `ByteKeys` whose rows also carry a variable-length value, most of them longer than the
    /// 128-byte inline part (out of line in the hidden chunk table): after each recovery every
    /// value is read back whole and the chunk table must hold exactly the chunks they need.
    ByteKeysLong,
}

impl WorkloadKind {
    /// Every workload.
    pub const ALL: [WorkloadKind; 9] = [
        WorkloadKind::Bank,
        WorkloadKind::Ycsb,
        WorkloadKind::Tpcc,
        WorkloadKind::Grow,
        WorkloadKind::YcsbOrdered,
        WorkloadKind::Varlen,
        WorkloadKind::Secondary,
        WorkloadKind::ByteKeys,
        WorkloadKind::ByteKeysLong,
    ];

    /// The command-line name.
    pub fn name(self) -> &'static str {
        match self {
            WorkloadKind::Bank => "bank",
            WorkloadKind::Ycsb => "ycsb",
            WorkloadKind::Tpcc => "tpcc",
            WorkloadKind::Grow => "grow",
            WorkloadKind::YcsbOrdered => "ycsb-ordered",
            WorkloadKind::Varlen => "varlen",
            WorkloadKind::Secondary => "secondary",
            WorkloadKind::ByteKeys => "bytekeys",
            WorkloadKind::ByteKeysLong => "bytekeys-long",
        }
    }

    /// The workload, sized for crash testing (small: many crash points per second).
    pub fn build(self) -> Box<dyn CrashWorkload> {
        match self {
            WorkloadKind::Bank => Box::new(BankCrash { accounts: 8 }),
            WorkloadKind::Ycsb => Box::new(YcsbCrash {
                records: 16,
                ordered: false,
            }),
            // 40 records: more than a PM ordered leaf holds (32), so the load splits.
            WorkloadKind::YcsbOrdered => Box::new(YcsbCrash {
                records: 40,
                ordered: true,
            }),
            WorkloadKind::Tpcc => {
                Box::new(super::tpcc::TpccCrash::new(super::tpcc::crash_config()))
            }
            WorkloadKind::Grow => Box::new(GrowCrash { rows_per_step: 192 }),
            WorkloadKind::Varlen => Box::new(super::varlen::VarlenCrash { records: 6 }),
            WorkloadKind::Secondary => Box::new(SecondaryCrash { rows: 12, keys: 5 }),
            WorkloadKind::ByteKeys => Box::new(super::bytekey::ByteKeyCrash {
                keys: 48,
                long_values: false,
            }),
            WorkloadKind::ByteKeysLong => Box::new(super::bytekey::ByteKeyCrash {
                keys: 48,
                long_values: true,
            }),
        }
    }
}

impl std::fmt::Display for WorkloadKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for WorkloadKind {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        WorkloadKind::ALL
            .into_iter()
            .find(|w| w.name() == s)
            .ok_or_else(|| {
                let names: Vec<&str> = WorkloadKind::ALL.iter().map(|w| w.name()).collect();
                format!(
                    "unknown crash workload '{s}' (expected one of: {})",
                    names.join(", ")
                )
            })
    }
}

/// The bank workload of [`crate::workload::bank`] under the oracle.
pub struct BankCrash {
    /// Accounts.
    pub accounts: u64,
}

fn bank_row(balance: i64, transfers: u64) -> Vec<u8> {
    let mut row = balance.to_le_bytes().to_vec();
    row.extend_from_slice(&transfers.to_le_bytes());
    row
}

fn word(row: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(row[at..at + 8].try_into().expect("8 bytes"))
}

impl CrashWorkload for BankCrash {
    fn name(&self) -> &'static str {
        "bank"
    }

    fn schemas(&self) -> Vec<Schema> {
        vec![bank::schema()]
    }

    fn load(&self, ctx: &mut TxCtx<'_, '_>) -> Result<(), DbError> {
        let accounts = self.accounts;
        ctx.run(|tx| {
            (0..accounts).try_for_each(|k| tx.insert(0, k, &bank_row(bank::INITIAL_BALANCE, 0)))
        })?;
        Ok(())
    }

    fn step(&self, ctx: &mut TxCtx<'_, '_>, rng: &mut StdRng) -> Result<(), DbError> {
        let n = self.accounts;
        let from = rng.gen_range(0..n);
        let to = (from + rng.gen_range(1..n.max(2))) % n;
        let amount = rng.gen_range(1..=400i64);
        ctx.run(|tx| {
            let (Some(a), Some(b)) = (tx.get(0, from)?, tx.get(0, to)?) else {
                return Ok(());
            };
            let (ba, bb) = (word(&a, 0) as i64, word(&b, 0) as i64);
            if ba < amount {
                return Ok(());
            }
            tx.put(0, from, &bank_row(ba - amount, word(&a, 8) + 1))?;
            tx.put(0, to, &bank_row(bb + amount, word(&b, 8) + 1))
        })?;
        Ok(())
    }

    fn check(&self, rows: &Observed) -> Vec<String> {
        let table = &rows[0];
        let mut problems = Vec::new();
        if table.is_empty() {
            return problems;
        }
        if table.len() as u64 != self.accounts {
            problems.push(format!(
                "{} accounts, expected 0 or {}",
                table.len(),
                self.accounts
            ));
        }
        let mut total = 0i64;
        for (k, row) in table {
            let b = word(row, 0) as i64;
            if b < 0 {
                problems.push(format!("account {k} has a negative balance {b}"));
            }
            total += b;
        }
        let expected = table.len() as i64 * bank::INITIAL_BALANCE;
        if total != expected {
            problems.push(format!("total balance {total}, expected {expected}"));
        }
        problems
    }
}

/// YCSB-style records with per-record checksums: each field holds a version and the bytes
/// [`ycsb::deterministic_field`] derives from (key, field, version); a last column holds a CRC of
/// the fields. A torn or mixed record fails one of the two.
pub struct YcsbCrash {
    /// Records loaded.
    pub records: u64,
    /// An ordered primary index and insert-heavy steps ([`WorkloadKind::YcsbOrdered`]).
    pub ordered: bool,
}

const YCSB_FIELDS: usize = 4;
/// 4 × 64 + 8 = 264-byte rows: long enough that Falcon streams their whole-row writes
/// (`STREAM_MIN_BYTES`, non-temporal stores), so the crash suite covers that path too.
const YCSB_FIELD_BYTES: usize = 64;

fn ycsb_row(key: u64, versions: &[u64; YCSB_FIELDS]) -> Vec<u8> {
    let mut row = vec![0u8; YCSB_FIELDS * YCSB_FIELD_BYTES + 8];
    for (f, v) in versions.iter().enumerate() {
        let field = &mut row[f * YCSB_FIELD_BYTES..(f + 1) * YCSB_FIELD_BYTES];
        field[..8].copy_from_slice(&v.to_le_bytes());
        ycsb::deterministic_field(key, f as u32, *v, &mut field[8..]);
    }
    let crc = crc32fast::hash(&row[..YCSB_FIELDS * YCSB_FIELD_BYTES]) as u64;
    let at = YCSB_FIELDS * YCSB_FIELD_BYTES;
    row[at..].copy_from_slice(&crc.to_le_bytes());
    row
}

fn ycsb_versions(row: &[u8]) -> [u64; YCSB_FIELDS] {
    std::array::from_fn(|f| word(row, f * YCSB_FIELD_BYTES))
}

fn ycsb_verify(key: u64, row: &[u8]) -> Result<(), String> {
    let at = YCSB_FIELDS * YCSB_FIELD_BYTES;
    if row.len() != at + 8 {
        return Err(format!("record {key:#x} has {} bytes", row.len()));
    }
    if crc32fast::hash(&row[..at]) as u64 != word(row, at) {
        return Err(format!("record {key:#x}: checksum mismatch"));
    }
    for f in 0..YCSB_FIELDS {
        let field = &row[f * YCSB_FIELD_BYTES..(f + 1) * YCSB_FIELD_BYTES];
        if !ycsb::verify_field(key, f as u32, word(field, 0), &field[8..]) {
            return Err(format!(
                "record {key:#x}: field {f} does not match its version"
            ));
        }
    }
    Ok(())
}

impl CrashWorkload for YcsbCrash {
    fn name(&self) -> &'static str {
        if self.ordered {
            "ycsb-ordered"
        } else {
            "ycsb"
        }
    }

    fn schemas(&self) -> Vec<Schema> {
        let mut columns: Vec<(String, ColumnType)> = (0..YCSB_FIELDS)
            .map(|f| {
                (
                    format!("field{f}"),
                    ColumnType::Bytes(YCSB_FIELD_BYTES as u32),
                )
            })
            .collect();
        columns.push(("crc".into(), ColumnType::U64));
        let refs: Vec<(&str, ColumnType)> = columns.iter().map(|(n, t)| (n.as_str(), *t)).collect();
        let mut schema = Schema::new("ycsb_crash", &refs);
        if self.ordered {
            schema.primary_index = crate::index::PrimaryIndexKind::Ordered;
        }
        vec![schema]
    }

    fn load(&self, ctx: &mut TxCtx<'_, '_>) -> Result<(), DbError> {
        for batch in 0..self.records.div_ceil(8) {
            let range = batch * 8..((batch + 1) * 8).min(self.records);
            ctx.run(|tx| {
                range.clone().try_for_each(|r| {
                    let key = ycsb::build_key(r);
                    tx.insert(0, key, &ycsb_row(key, &[0; YCSB_FIELDS]))
                })
            })?;
        }
        Ok(())
    }

    fn step(&self, ctx: &mut TxCtx<'_, '_>, rng: &mut StdRng) -> Result<(), DbError> {
        let op = rng.gen_range(0..100u32);
        let records = self.records;
        let pick = |rng: &mut StdRng| ycsb::build_key(rng.gen_range(0..records));
        // Percent thresholds of reads, read-modify-writes and inserts (the rest deletes); the
        // ordered variant inserts and deletes more, to split leaves within a short run.
        let (reads, rmws, inserts) = if self.ordered {
            (20, 45, 85)
        } else {
            (30, 80, 92)
        };
        if op < reads {
            let key = pick(rng);
            ctx.run(|tx| tx.get(0, key).map(|_| ()))?;
        } else if op < rmws {
            // Read-modify-write of two records: one field each gets a new version.
            let (k1, k2) = (pick(rng), pick(rng));
            let (f1, f2) = (rng.gen_range(0..YCSB_FIELDS), rng.gen_range(0..YCSB_FIELDS));
            let bump: u64 = rng.gen_range(1..1000);
            ctx.run(|tx| {
                for (k, f) in [(k1, f1), (k2, f2)] {
                    if let Some(row) = tx.get(0, k)? {
                        let mut v = ycsb_versions(&row);
                        v[f] += bump;
                        tx.put(0, k, &ycsb_row(k, &v))?;
                    }
                }
                Ok(())
            })?;
        } else if self.ordered && (op < inserts || ctx.own_keys.is_empty()) {
            // Four keys per transaction: a thread's keys follow each other, so they land in
            // the leaf that also holds the next thread's first keys (splits that move entries)
            // or at the end of the index (appends).
            let first = ctx.next_key;
            ctx.next_key += 4;
            let rows: Vec<(u64, Vec<u8>)> = (first..first + 4)
                .map(|key| {
                    let v: [u64; YCSB_FIELDS] = std::array::from_fn(|_| rng.gen_range(0..1000));
                    (key, ycsb_row(key, &v))
                })
                .collect();
            if ctx.run(|tx| {
                rows.iter()
                    .try_for_each(|(key, row)| tx.insert(0, *key, row))
            })? {
                ctx.own_keys.extend(first..first + 4);
            }
        } else if op < inserts || ctx.own_keys.is_empty() {
            let v: [u64; YCSB_FIELDS] = std::array::from_fn(|_| rng.gen_range(0..1000));
            ctx.insert_own(0, |key| ycsb_row(key, &v))?;
        } else {
            ctx.delete_own(0, rng)?;
        }
        Ok(())
    }

    fn check(&self, rows: &Observed) -> Vec<String> {
        rows[0]
            .iter()
            .filter_map(|(k, r)| ycsb_verify(*k, r).err())
            .collect()
    }
}

/// Rows that move between the keys of a secondary index ([`WorkloadKind::Secondary`]): a row is
/// (secondary key, moves, key × moves + secondary key); steps move two rows to new secondary keys
/// (a whole-row write, so each logs its old key), insert rows and delete them. The rows' own
/// check is the third column; the secondary index is compared with the rows by the structure
/// check and, through the public API, by [`CrashWorkload::check_db`].
pub struct SecondaryCrash {
    /// Rows loaded.
    pub rows: u64,
    /// Distinct secondary keys (small, so that many rows share one).
    pub keys: u64,
}

fn secondary_row(key: u64, sk: u64, moves: u64) -> Vec<u8> {
    let mut row = sk.to_le_bytes().to_vec();
    row.extend_from_slice(&moves.to_le_bytes());
    row.extend_from_slice(&key.wrapping_mul(moves).wrapping_add(sk).to_le_bytes());
    row
}

impl CrashWorkload for SecondaryCrash {
    fn name(&self) -> &'static str {
        "secondary"
    }

    fn schemas(&self) -> Vec<Schema> {
        // An ordered primary index: `check_db` scans the table.
        let mut schema = Schema::new(
            "secondary_crash",
            &[
                ("sk", ColumnType::U64),
                ("moves", ColumnType::U64),
                ("check", ColumnType::U64),
            ],
        )
        .with_secondary("by_sk", &["sk"]);
        schema.primary_index = crate::index::PrimaryIndexKind::Ordered;
        vec![schema]
    }

    fn load(&self, ctx: &mut TxCtx<'_, '_>) -> Result<(), DbError> {
        let (rows, keys) = (self.rows, self.keys);
        ctx.run(|tx| (0..rows).try_for_each(|k| tx.insert(0, k, &secondary_row(k, k % keys, 0))))?;
        Ok(())
    }

    fn step(&self, ctx: &mut TxCtx<'_, '_>, rng: &mut StdRng) -> Result<(), DbError> {
        let op = rng.gen_range(0..100u32);
        let keys = self.keys;
        if op < 60 {
            // Two rows (loaded or this thread's) move to new secondary keys.
            let pick = |rng: &mut StdRng, own: &[u64]| {
                if own.is_empty() || rng.gen_bool(0.7) {
                    rng.gen_range(0..self.rows)
                } else {
                    own[rng.gen_range(0..own.len())]
                }
            };
            let moves: Vec<(u64, u64)> = (0..2)
                .map(|_| (pick(rng, &ctx.own_keys), rng.gen_range(0..keys)))
                .collect();
            ctx.run(|tx| {
                for &(k, sk) in &moves {
                    if let Some(row) = tx.get(0, k)? {
                        tx.put(0, k, &secondary_row(k, sk, word(&row, 8) + 1))?;
                    }
                }
                Ok(())
            })?;
        } else if op < 85 || ctx.own_keys.is_empty() {
            let sk = rng.gen_range(0..keys);
            ctx.insert_own(0, |key| secondary_row(key, sk, 0))?;
        } else {
            ctx.delete_own(0, rng)?;
        }
        Ok(())
    }

    fn check(&self, rows: &Observed) -> Vec<String> {
        rows[0]
            .iter()
            .filter(|(&k, r)| {
                r.len() != 24 || word(r, 16) != k.wrapping_mul(word(r, 8)).wrapping_add(word(r, 0))
            })
            .map(|(k, _)| format!("row {k:#x} is torn or mixed"))
            .collect()
    }

    /// Every row is found through the secondary index under its key, and nothing else is: per
    /// secondary key, the index's primary keys equal the rows holding it.
    fn check_db(&self, db: &Db) -> Vec<String> {
        let Some(table) = db.table("secondary_crash") else {
            return Vec::new();
        };
        let checked = db.worker().and_then(|mut w| {
            w.run_read_only(|tx| {
                let mut want: BTreeMap<u64, Vec<u64>> = BTreeMap::new();
                tx.scan_with(table, 0, false, usize::MAX, &mut |key, row| {
                    want.entry(word(row, 0)).or_default().push(key);
                    true
                })?;
                let mut problems = Vec::new();
                for sk in 0..self.keys {
                    let mut found = tx.lookup_secondary(table, 0, &[crate::db::Value::U64(sk)])?;
                    found.sort_unstable();
                    let mut rows = want.remove(&sk).unwrap_or_default();
                    rows.sort_unstable();
                    if found != rows {
                        problems.push(format!(
                            "secondary key {sk}: the index gives {found:?}, the rows {rows:?}"
                        ));
                    }
                }
                for (sk, rows) in want {
                    problems.push(format!(
                        "rows {rows:?} hold secondary key {sk}, out of range"
                    ));
                }
                Ok(problems)
            })
        });
        checked.unwrap_or_else(|e| vec![format!("reading the secondary index failed: {e}")])
    }
}

/// Heap growth: 4000-byte rows (about 520 fill a 2 MiB heap page) inserted 8 per transaction,
/// `rows_per_step` per step (every step until a thread owns `3 * rows_per_step` rows, then 70 %
/// of them), plus single-row updates and deletes, so a short run needs a second heap page per
/// thread and its redo goes through Falcon's spill pages. Each row holds a version,
/// a payload derived from (key, version) and a CRC: a torn or misplaced row fails its check.
pub struct GrowCrash {
    /// Rows inserted by an insert step.
    pub rows_per_step: u64,
}

const GROW_PAYLOAD: usize = 3984;

fn grow_row(key: u64, version: u64) -> Vec<u8> {
    let mut row = Vec::with_capacity(GROW_PAYLOAD + 16);
    row.extend_from_slice(&version.to_le_bytes());
    let mut x = key ^ version.rotate_left(32) ^ 0x9E37_79B9_7F4A_7C15;
    while row.len() < 8 + GROW_PAYLOAD {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        row.extend_from_slice(&x.to_le_bytes());
    }
    row.truncate(8 + GROW_PAYLOAD);
    let crc = crc32fast::hash(&row) as u64;
    row.extend_from_slice(&crc.to_le_bytes());
    row
}

impl CrashWorkload for GrowCrash {
    fn name(&self) -> &'static str {
        "grow"
    }

    fn schemas(&self) -> Vec<Schema> {
        vec![Schema::new(
            "grow_crash",
            &[
                ("version", ColumnType::U64),
                ("payload", ColumnType::Bytes(GROW_PAYLOAD as u32)),
                ("crc", ColumnType::U64),
            ],
        )]
    }

    fn load(&self, _ctx: &mut TxCtx<'_, '_>) -> Result<(), DbError> {
        Ok(())
    }

    fn step(&self, ctx: &mut TxCtx<'_, '_>, rng: &mut StdRng) -> Result<(), DbError> {
        let op = rng.gen_range(0..100u32);
        // The first three steps of a thread insert: 576 rows, more than a heap page holds.
        if op < 70 || (ctx.own_keys.len() as u64) < 3 * self.rows_per_step {
            for _ in 0..self.rows_per_step.div_ceil(8) {
                let first = ctx.next_key;
                ctx.next_key += 8;
                if ctx.run(|tx| {
                    (first..first + 8).try_for_each(|k| tx.insert(0, k, &grow_row(k, 0)))
                })? {
                    ctx.own_keys.extend(first..first + 8);
                }
            }
        } else if op < 90 {
            let key = ctx.own_keys[rng.gen_range(0..ctx.own_keys.len())];
            let version: u64 = rng.gen_range(1..1 << 30);
            ctx.run(|tx| {
                if tx.get(0, key)?.is_some() {
                    tx.put(0, key, &grow_row(key, version))?;
                }
                Ok(())
            })?;
        } else {
            let i = rng.gen_range(0..ctx.own_keys.len());
            let key = ctx.own_keys.swap_remove(i);
            ctx.run(|tx| tx.delete(0, key))?;
        }
        Ok(())
    }

    fn check(&self, rows: &Observed) -> Vec<String> {
        rows[0]
            .iter()
            .filter(|(k, r)| grow_row(**k, word(r, 0)) != **r)
            .map(|(k, _)| format!("grow row {k:#x} is torn or misplaced (checksum or payload)"))
            .collect()
    }

    fn extra_pages_per_thread(&self) -> u64 {
        // A run of 6 steps inserts 576 to 1152 rows per thread (a chain of restarts and the
        // liveness check more): a second and third heap page, and a spill page for the 32 KiB
        // redo of a batch.
        6
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ycsb_rows_verify_and_a_torn_row_does_not() {
        let key = ycsb::build_key(3);
        let row = ycsb_row(key, &[1, 2, 3, 4]);
        ycsb_verify(key, &row).unwrap();
        let mut torn = row.clone();
        torn[40] ^= 1;
        assert!(ycsb_verify(key, &torn).is_err());
        let other = ycsb_row(key, &[1, 2, 9, 4]);
        let mut mixed = row.clone();
        let field_2 = 2 * YCSB_FIELD_BYTES..3 * YCSB_FIELD_BYTES;
        mixed[field_2.clone()].copy_from_slice(&other[field_2]);
        assert!(ycsb_verify(key, &mixed).unwrap_err().contains("checksum"));
    }

    #[test]
    fn oracle_orders_acked_writes_by_tid_and_keeps_uncertain_ones_open() {
        let mut o = Oracle::new(1);
        let w = |v: u8| Write {
            table: 0,
            key: 1,
            row: Some(vec![v]),
            read: true,
        };
        o.apply(&OracleEvent::InFlight {
            thread: 0,
            writes: vec![w(1)],
        });
        o.apply(&OracleEvent::InFlight {
            thread: 1,
            writes: vec![w(2)],
        });
        assert_eq!(o.uncertain().len(), 2);
        // Thread 1 committed later (tid 9) but reports first.
        o.apply(&OracleEvent::Returned { thread: 1, tid: 9 });
        o.apply(&OracleEvent::DurableUpTo { tid: 9 });
        o.apply(&OracleEvent::Returned { thread: 0, tid: 5 });
        o.apply(&OracleEvent::DurableUpTo { tid: 9 });
        assert_eq!(o.acked_row(0, 1), Some(&vec![2]));
        assert!(o.uncertain().is_empty());
        assert_eq!(o.commits, 2);
        o.apply(&OracleEvent::InFlight {
            thread: 0,
            writes: vec![w(3)],
        });
        o.apply(&OracleEvent::Failed { thread: 0 });
        assert!(o.uncertain().is_empty());
    }
}
