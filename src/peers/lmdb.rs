//! LMDB through heed: one environment directory, one database of `u64` keys (big-endian, so
//! the B+tree is in key order) to fixed-size records.
//!
//! LMDB is copy-on-write with a single writer: `write_txn` takes the environment's writer lock,
//! so write transactions run one at a time whatever the thread count; read transactions run
//! concurrently on a snapshot. A partial write reads the record and puts it back whole (LMDB
//! has no in-place partial update outside MDB_WRITEMAP's `put_reserved`, which also rewrites it).

use super::{Access, PeerError, PeerKind, PeerStore, PeerTx};
use heed::types::{Bytes, U64};
use heed::{byteorder::BigEndian, Database, Env, EnvFlags, EnvOpenOptions, RoTxn, RwTxn};
use std::path::Path;

type Db = Database<U64<BigEndian>, Bytes>;

/// An LMDB environment for a run.
pub(super) struct LmdbStore {
    kind: PeerKind,
    env: Env,
    db: Db,
    row_len: usize,
}

fn err(e: heed::Error) -> PeerError {
    PeerError::Store {
        peer: "lmdb",
        message: e.to_string(),
    }
}

impl LmdbStore {
    /// Opens (with `create`, makes) the environment at `dir` in `kind`'s mode, with a map large
    /// enough for `capacity` records of `row_len` bytes and copy-on-write's extra pages.
    pub(super) fn open(
        kind: PeerKind,
        dir: &Path,
        capacity: u64,
        row_len: usize,
        create: bool,
    ) -> Result<Self, PeerError> {
        if create {
            std::fs::create_dir(dir)
                .map_err(|e| PeerError::Config(format!("{}: cannot create: {e}", dir.display())))?;
        }
        // Leaf pages hold records of up to ~2 KiB two or more to a page; larger ones take
        // overflow pages. Four times the data leaves room for the pages a copy-on-write commit
        // dirties before the old ones are freed; the map is sparse, so unused room costs nothing.
        let per_record = (row_len as u64 + 64).next_multiple_of(16);
        let map = capacity
            .saturating_mul(per_record)
            .saturating_mul(4)
            .saturating_add(64 << 20)
            // LMDB wants a multiple of the page size.
            .next_multiple_of(1 << 20);
        let map =
            usize::try_from(map).map_err(|_| PeerError::Config("LMDB map too large".into()))?;
        let flags = match kind {
            PeerKind::LmdbWritemap => EnvFlags::WRITE_MAP,
            PeerKind::LmdbNosync => EnvFlags::NO_SYNC,
            PeerKind::LmdbMapasync => EnvFlags::WRITE_MAP | EnvFlags::MAP_ASYNC,
            _ => EnvFlags::empty(),
        };
        let mut options = EnvOpenOptions::new();
        options.map_size(map).max_dbs(1).max_readers(512);
        // SAFETY: NO_SYNC and MAP_ASYNC are the fast modes that may lose the last commits on a
        // crash (heed marks setting them unsafe for that reason); they are chosen only for the
        // peers labelled "NOT durable" (PeerKind::durable).
        unsafe {
            options.flags(flags);
        }
        // SAFETY: heed requires that the environment is opened once per process and not
        // modified by another process: each run opens its own fresh scratch directory
        // (PeerKind::scratch_path), and a reopen happens only after the store was dropped.
        let env = unsafe { options.open(dir) }.map_err(err)?;
        let mut wtxn = env.write_txn().map_err(err)?;
        let db: Db = env
            .create_database(&mut wtxn, Some("records"))
            .map_err(err)?;
        wtxn.commit().map_err(err)?;
        Ok(LmdbStore {
            kind,
            env,
            db,
            row_len,
        })
    }

    fn check_len(&self, len: usize) -> Result<(), PeerError> {
        if len == self.row_len {
            Ok(())
        } else {
            Err(PeerError::Config(format!(
                "a record is {} bytes, not {len}",
                self.row_len
            )))
        }
    }
}

enum Txn<'e> {
    Read(RoTxn<'e, heed::WithTls>),
    Write(RwTxn<'e>),
}

struct LmdbTx<'e> {
    txn: Txn<'e>,
    db: Db,
    row: Vec<u8>,
}

impl LmdbTx<'_> {
    fn ro(&self) -> &RoTxn<'_> {
        match &self.txn {
            Txn::Read(t) => t,
            Txn::Write(t) => t,
        }
    }
}

impl PeerTx for LmdbTx<'_> {
    fn read(&mut self, key: u64, out: &mut [u8]) -> Result<(), PeerError> {
        let got = self.db.get(self.ro(), &key).map_err(err)?;
        match got {
            Some(v) if v.len() == out.len() => {
                out.copy_from_slice(v);
                Ok(())
            }
            Some(v) => Err(PeerError::Config(format!(
                "key {key:#x}: record of {} bytes, read into {}",
                v.len(),
                out.len()
            ))),
            None => Err(PeerError::Missing(key)),
        }
    }

    fn write(&mut self, key: u64, offset: usize, bytes: &[u8]) -> Result<(), PeerError> {
        let mut row = std::mem::take(&mut self.row);
        let result = (|| {
            let Txn::Write(w) = &mut self.txn else {
                return Err(PeerError::Config(format!(
                    "key {key:#x} written in a transaction that declared it read-only"
                )));
            };
            let cur = self
                .db
                .get(w, &key)
                .map_err(err)?
                .ok_or(PeerError::Missing(key))?;
            if offset + bytes.len() > cur.len() {
                return Err(PeerError::Config(format!(
                    "write of {} bytes at {offset} past a {}-byte record",
                    bytes.len(),
                    cur.len()
                )));
            }
            row.clear();
            row.extend_from_slice(cur);
            row[offset..offset + bytes.len()].copy_from_slice(bytes);
            self.db.put(w, &key, &row).map_err(err)
        })();
        self.row = row;
        result
    }
}

impl PeerStore for LmdbStore {
    fn kind(&self) -> PeerKind {
        self.kind
    }

    fn insert_batch(&self, rows: &[(u64, &[u8])]) -> Result<(), PeerError> {
        let mut w = self.env.write_txn().map_err(err)?;
        for &(key, row) in rows {
            self.check_len(row.len())?;
            self.db.put(&mut w, &key, row).map_err(err)?;
        }
        w.commit().map_err(err)
    }

    fn run(
        &self,
        access: &Access,
        body: &mut dyn FnMut(&mut dyn PeerTx) -> Result<(), PeerError>,
    ) -> Result<(), PeerError> {
        let txn = if access.writes() {
            Txn::Write(self.env.write_txn().map_err(err)?)
        } else {
            Txn::Read(self.env.read_txn().map_err(err)?)
        };
        let mut tx = LmdbTx {
            txn,
            db: self.db,
            row: Vec::with_capacity(self.row_len),
        };
        // An error drops the transaction, which aborts it.
        body(&mut tx)?;
        match tx.txn {
            Txn::Write(w) => w.commit().map_err(err),
            Txn::Read(r) => r.commit().map_err(err),
        }
    }

    fn len(&self) -> Result<u64, PeerError> {
        let r = self.env.read_txn().map_err(err)?;
        self.db.len(&r).map_err(err)
    }
}
