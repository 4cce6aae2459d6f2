//! The bank-transfer workload: accounts with balances, transfers between random pairs. Its
//! invariant — the total never changes and no balance is negative — must hold after any crash.

use crate::bench::{DriverError, TxnDriver, TxnOutcome};
use crate::catalog::{ColumnType, Schema, TableId};
use crate::db::{Db, Value, Worker};
use crate::engine::{DbError, TxError};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// Every account's opening balance.
pub const INITIAL_BALANCE: i64 = 1_000;

/// The accounts table: balance and a transfer counter.
pub fn schema() -> Schema {
    Schema::new(
        "bank_accounts",
        &[("balance", ColumnType::I64), ("transfers", ColumnType::U64)],
    )
}

/// Most accounts `load` opens (the pool and the DRAM index grow with them).
pub const MAX_ACCOUNTS: u64 = 1 << 30;

/// Accounts opened per load transaction: one huge transaction would make every insert search an
/// ever longer write set (quadratic), so the load commits in batches of this many.
pub const LOAD_BATCH: u64 = 1024;

/// The table that marks a complete load: one row, key 0, holding the number of accounts.
pub fn loaded_schema() -> Schema {
    Schema::new("bank_loaded", &[("accounts", ColumnType::U64)])
}

/// Creates the tables and opens `accounts` accounts, [`LOAD_BATCH`] per transaction, then commits
/// the `bank_loaded` marker. A crash before the marker leaves a load that never finished (and
/// promised nothing); [`check`] holds a database to its accounts only once the marker is there.
pub fn load(db: &Db, accounts: u64) -> Result<TableId, DbError> {
    if accounts > MAX_ACCOUNTS {
        return Err(DbError::Config(format!(
            "at most {MAX_ACCOUNTS} bank accounts, not {accounts}"
        )));
    }
    let table = db.create_table(schema())?;
    let marker = db.create_table(loaded_schema())?;
    let mut start = 0;
    while start < accounts {
        let end = accounts.min(start + LOAD_BATCH);
        db.run(|tx| {
            (start..end).try_for_each(|k| {
                tx.insert(table, k, &[Value::I64(INITIAL_BALANCE), Value::U64(0)])
            })
        })?;
        start = end;
    }
    db.run(|tx| tx.insert(marker, 0, &[Value::U64(accounts)]))?;
    Ok(table)
}

/// Checks the invariant: either the load never finished (no `bank_loaded` marker: nothing was
/// promised), or exactly `accounts` accounts whose balances sum to `accounts × INITIAL_BALANCE`,
/// none negative.
pub fn check(db: &Db, accounts: u64) -> Result<(), String> {
    let (Some(table), Some(marker)) = (db.table("bank_accounts"), db.table("bank_loaded")) else {
        return Ok(());
    };
    let rows = db.check_structure()?;
    if rows[marker as usize] == 0 {
        return Ok(());
    }
    let loaded = db
        .run(|tx| Ok(tx.get(marker, 0)?.u64(0)))
        .map_err(|e| e.to_string())?;
    if loaded != accounts {
        return Err(format!(
            "the load marker records {loaded} accounts, expected {accounts}"
        ));
    }
    let count = rows[table as usize];
    if count != accounts {
        return Err(format!("{count} accounts, expected {accounts}"));
    }
    let balances: Vec<i64> = db
        .run(|tx| {
            (0..accounts)
                .map(|k| Ok(tx.get(table, k)?.i64(0)))
                .collect()
        })
        .map_err(|e| e.to_string())?;
    if let Some((k, b)) = balances.iter().enumerate().find(|(_, &b)| b < 0) {
        return Err(format!("account {k} has a negative balance {b}"));
    }
    let total: i128 = balances.iter().map(|&b| i128::from(b)).sum();
    let expected = i128::from(accounts) * i128::from(INITIAL_BALANCE);
    if total != expected {
        return Err(format!("total balance {total}, expected {expected}"));
    }
    Ok(())
}

/// A transfer's accounts and amount: two different accounts, uniform, and 1 to 100. `pmtx
/// compare` draws the peers' transfers from it too, so both run the same workload.
pub fn choose_transfer(rng: &mut StdRng, accounts: u64) -> (u64, u64, i64) {
    let from = rng.gen_range(0..accounts);
    let to = (from + rng.gen_range(1..accounts.max(2))) % accounts;
    let amount = rng.gen_range(1..=100i64);
    (from, to, amount)
}

/// One transfer: moves a random amount between two distinct random accounts, if the payer has it.
pub fn transfer(
    worker: &mut Worker<'_>,
    table: TableId,
    accounts: u64,
    rng: &mut StdRng,
) -> Result<u32, DbError> {
    let (from, to, amount) = choose_transfer(rng, accounts);
    let outcome = worker.run_counted(false, |tx| {
        let a = tx.get(table, from)?;
        let b = tx.get(table, to)?;
        if a.i64(0) < amount {
            return Ok(());
        }
        tx.update(
            table,
            from,
            &[
                (0, Value::I64(a.i64(0) - amount)),
                (1, Value::U64(a.u64(1) + 1)),
            ],
        )?;
        tx.update(
            table,
            to,
            &[
                (0, Value::I64(b.i64(0) + amount)),
                (1, Value::U64(b.u64(1) + 1)),
            ],
        )?;
        Ok::<(), TxError>(())
    })?;
    Ok(outcome.aborts)
}

/// One thread's transfers, for the benchmark harness.
pub struct BankDriver<'db> {
    worker: Worker<'db>,
    table: TableId,
    accounts: u64,
    rng: StdRng,
}

impl<'db> BankDriver<'db> {
    /// A driver on its own worker.
    pub fn new(
        db: &'db Db,
        table: TableId,
        accounts: u64,
        seed: u64,
    ) -> Result<BankDriver<'db>, DbError> {
        Ok(BankDriver {
            worker: db.worker()?,
            table,
            accounts,
            rng: StdRng::seed_from_u64(seed),
        })
    }
}

impl TxnDriver for BankDriver<'_> {
    fn run_txn(&mut self) -> Result<TxnOutcome, DriverError> {
        let aborts = transfer(&mut self.worker, self.table, self.accounts, &mut self.rng)
            .map_err(|e| Box::new(e) as DriverError)?;
        Ok(TxnOutcome {
            kind: 0,
            committed: true,
            aborts,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::db::DbConfig;

    #[test]
    fn transfers_keep_the_invariant_and_the_check_catches_a_broken_one() {
        let db = Db::create(DbConfig::temporary().pool_size(32 << 20).max_threads(4)).unwrap();
        let table = load(&db, 50).unwrap();
        let mut w = db.worker().unwrap();
        let mut rng = StdRng::seed_from_u64(3);
        for _ in 0..500 {
            transfer(&mut w, table, 50, &mut rng).unwrap();
        }
        drop(w);
        check(&db, 50).unwrap();
        db.run(|tx| tx.update(table, 7, &[(0, Value::I64(1))]))
            .unwrap();
        assert!(check(&db, 50).unwrap_err().contains("total balance"));
        db.run(|tx| tx.update(table, 7, &[(0, Value::I64(-5))]))
            .unwrap();
        assert!(check(&db, 50).unwrap_err().contains("negative"));
    }

    #[test]
    fn a_load_of_several_batches_is_checked_only_once_complete() {
        let accounts = 2 * LOAD_BATCH + 7;
        let db = Db::create(DbConfig::temporary().pool_size(32 << 20).max_threads(4)).unwrap();
        load(&db, accounts).unwrap();
        check(&db, accounts).unwrap();
        let marker = db.table("bank_loaded").unwrap();
        let rows = db.check_structure().unwrap();
        assert_eq!(rows[marker as usize], 1);
        assert!(check(&db, accounts + 1).unwrap_err().contains("marker"));
        assert!(load(&db, MAX_ACCOUNTS + 1).is_err());

        // A load stopped between batches (no marker yet) promised nothing.
        let db = Db::create(DbConfig::temporary().pool_size(32 << 20).max_threads(4)).unwrap();
        let table = db.create_table(schema()).unwrap();
        db.create_table(loaded_schema()).unwrap();
        db.run(|tx| tx.insert(table, 0, &[Value::I64(INITIAL_BALANCE), Value::U64(0)]))
            .unwrap();
        check(&db, accounts).unwrap();
    }
}
