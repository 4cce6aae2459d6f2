//! A small key-value store on the persistent-object API, the stand-in for PMEMKV's `cmap`
//! engine on which ArchTM §6.2 runs TPC-C New-Order and TATP ([`ptm_neworder`] and
//! [`ptm_tatp`]): up to [`MAX_TABLES`] tables, each a chained hash table of `u64` keys and
//! fixed-size records (any [`PObject`]), each pair one object ([`Node`]: key, next, record).
//!
//! Bucket heads are grouped [`SEG_BUCKETS`] to an object (64 bytes: one ArchTM size class), so
//! an insert into a bucket copies 64 bytes of heads under copy-on-write rather than a large
//! bucket array. The bucket count is fixed when the table is created (no rehashing: the
//! workloads size their tables). A whole record is read and written at once, as a key-value
//! store's `get` and `put` do: that is what the workloads' write amplification is measured
//! against ("bytes the application asked to change" = the records put).
//!
//! [`ptm_neworder`]: super::ptm_neworder
//! [`ptm_tatp`]: super::ptm_tatp

use crate::ptm::{PObject, PPtr, PTx, PtmError, PtmRunner};
use std::marker::PhantomData;

/// Tables a store can hold.
pub const MAX_TABLES: usize = 16;
/// Bucket heads per segment object.
pub const SEG_BUCKETS: usize = 8;
/// Segments a table's directory holds (so at most `MAX_SEGS * SEG_BUCKETS` buckets).
pub const MAX_SEGS: usize = 1 << 16;
/// Directory entries per directory page object.
const DIR_PAGE: usize = 512;

/// A pair: key, the next node of its chain, the record.
#[derive(Clone, Copy, Debug)]
pub struct Node<V> {
    /// The key.
    pub key: u64,
    /// The next node of the chain (raw handle, 0 at the end).
    pub next: u64,
    /// The record.
    pub value: V,
}

impl<V: PObject> PObject for Node<V> {
    const SIZE: usize = 16 + V::SIZE;
    fn store(&self, out: &mut [u8]) {
        out[..8].copy_from_slice(&self.key.to_le_bytes());
        out[8..16].copy_from_slice(&self.next.to_le_bytes());
        self.value.store(&mut out[16..]);
    }
    fn load(bytes: &[u8]) -> Self {
        Node {
            key: u64::load(&bytes[..8]),
            next: u64::load(&bytes[8..16]),
            value: V::load(&bytes[16..]),
        }
    }
}

/// A node and its predecessor in its chain (null: the bucket head).
type NodeAndPrev<V> = (PPtr<Node<V>>, PPtr<Node<V>>);

/// A segment of bucket heads (raw node handles).
pub type Segment = [u64; SEG_BUCKETS];
/// A page of the segment directory (raw segment handles).
pub type DirPage = [u64; DIR_PAGE];

crate::pobject! {
    /// A table's header.
    #[derive(Clone, Copy, Debug, PartialEq)]
    pub struct TableHead {
        /// Bytes of a record (checked when the table is opened with a record type).
        pub record_size: u64,
        /// Buckets.
        pub buckets: u64,
        /// Pages of the segment directory.
        pub pages: [u64; MAX_SEGS / DIR_PAGE],
    }
}

crate::pobject! {
    /// The store's root: its tables and a few words the workload keeps (its scale).
    #[derive(Clone, Copy, Debug, Default)]
    pub struct KvRoot {
        /// Table headers by table number (null: no table).
        pub tables: [PPtr<TableHead>; MAX_TABLES],
        /// The workload's words (e.g. TPC-C's warehouse count).
        pub meta: [u64; 8],
    }
}

/// A table of records of type `V`, by number (its header handle cached).
pub struct Table<V> {
    head: PPtr<TableHead>,
    buckets: u64,
    pages: Box<[u64]>,
    _v: PhantomData<fn() -> V>,
}

impl<V> Clone for Table<V> {
    fn clone(&self) -> Self {
        Table {
            head: self.head,
            buckets: self.buckets,
            pages: self.pages.clone(),
            _v: PhantomData,
        }
    }
}

fn missing(what: String) -> PtmError {
    PtmError::Pool(what)
}

impl<V: PObject> Table<V> {
    /// Creates table `id` with `buckets` buckets (rounded up to a whole segment): the bucket
    /// segments a directory page at a time (a transaction each, so that an engine with a
    /// bounded log, DUDETx, takes a large table), then the header and its entry in the root.
    /// A crash before the last transaction leaks the segments made so far (the table does not
    /// exist; creating it again allocates new ones).
    pub fn create(ptm: &dyn PtmRunner<KvRoot>, id: usize, buckets: u64) -> Result<Self, PtmError> {
        if id >= MAX_TABLES {
            return Err(PtmError::TooLarge(format!(
                "table {id}: a store holds {MAX_TABLES} tables"
            )));
        }
        let segs = buckets.max(1).div_ceil(SEG_BUCKETS as u64) as usize;
        if segs > MAX_SEGS {
            return Err(PtmError::TooLarge(format!(
                "{buckets} buckets: a table holds at most {}",
                MAX_SEGS * SEG_BUCKETS
            )));
        }
        let exists = |tx: &mut PTx<'_, KvRoot>| -> Result<(), PtmError> {
            if tx.read(tx.root())?.tables[id].is_null() {
                Ok(())
            } else {
                Err(PtmError::Pool(format!("table {id} exists")))
            }
        };
        ptm.run(exists)?;
        let mut head = TableHead {
            record_size: V::SIZE as u64,
            buckets: (segs * SEG_BUCKETS) as u64,
            pages: [0; MAX_SEGS / DIR_PAGE],
        };
        for (p, first) in (0..segs).step_by(DIR_PAGE).enumerate() {
            let n = (segs - first).min(DIR_PAGE);
            head.pages[p] = ptm.run(|tx| {
                let mut page = [0u64; DIR_PAGE];
                for slot in &mut page[..n] {
                    *slot = tx.alloc(&[0u64; SEG_BUCKETS])?.raw();
                }
                Ok(tx.alloc(&page)?.raw())
            })?;
        }
        let h = ptm.run(|tx| {
            exists(tx)?;
            let h = tx.alloc(&head)?;
            let root = tx.root();
            tx.update(root, |r| r.tables[id] = h)?;
            Ok(h)
        })?;
        Self::from_head(h, &head)
    }

    /// Opens table `id`, checking its record size.
    pub fn open(tx: &mut PTx<'_, KvRoot>, id: usize) -> Result<Self, PtmError> {
        let r = tx.read(tx.root())?;
        let h = *r
            .tables
            .get(id)
            .ok_or_else(|| missing(format!("no table {id}")))?;
        if h.is_null() {
            return Err(missing(format!("no table {id}")));
        }
        let head = tx.read(h)?;
        Self::from_head(h, &head)
    }

    fn from_head(h: PPtr<TableHead>, head: &TableHead) -> Result<Self, PtmError> {
        if head.record_size != V::SIZE as u64 {
            return Err(PtmError::Pool(format!(
                "the table holds {}-byte records, the type {} has {}",
                head.record_size,
                std::any::type_name::<V>(),
                V::SIZE
            )));
        }
        let pages = head.buckets.div_ceil((SEG_BUCKETS * DIR_PAGE) as u64) as usize;
        Ok(Table {
            head: h,
            buckets: head.buckets,
            pages: head.pages[..pages].into(),
            _v: PhantomData,
        })
    }

    /// Buckets.
    pub fn buckets(&self) -> u64 {
        self.buckets
    }

    /// The segment of bucket `b` and the byte offset of its head there.
    fn bucket(&self, tx: &mut PTx<'_, KvRoot>, b: u64) -> Result<(PPtr<Segment>, usize), PtmError> {
        let seg = b as usize / SEG_BUCKETS;
        let page = PPtr::<DirPage>::from_raw(self.pages[seg / DIR_PAGE]);
        let s: u64 = tx.read_at(page, seg % DIR_PAGE * 8)?;
        Ok((PPtr::from_raw(s), b as usize % SEG_BUCKETS * 8))
    }

    fn slot(&self, tx: &mut PTx<'_, KvRoot>, key: u64) -> Result<(PPtr<Segment>, usize), PtmError> {
        let b = (crate::index::mix64(key) >> 16) % self.buckets;
        self.bucket(tx, b)
    }

    /// The node of `key`, with its predecessor in the chain (null: the bucket head).
    fn find(&self, tx: &mut PTx<'_, KvRoot>, key: u64) -> Result<Option<NodeAndPrev<V>>, PtmError> {
        let (seg, at) = self.slot(tx, key)?;
        let mut prev = PPtr::null();
        let mut p: u64 = tx.read_at(seg, at)?;
        while p != 0 {
            let node = PPtr::<Node<V>>::from_raw(p);
            let [k, next]: [u64; 2] = tx.read_at(node, 0)?;
            if k == key {
                return Ok(Some((node, prev)));
            }
            prev = node;
            p = next;
        }
        Ok(None)
    }

    /// The record of `key`.
    pub fn get(&self, tx: &mut PTx<'_, KvRoot>, key: u64) -> Result<Option<V>, PtmError> {
        match self.find(tx, key)? {
            Some((node, _)) => Ok(Some(tx.read_at::<Node<V>, V>(node, 16)?)),
            None => Ok(None),
        }
    }

    /// Replaces the record of `key`; false if there is none.
    pub fn put(&self, tx: &mut PTx<'_, KvRoot>, key: u64, value: &V) -> Result<bool, PtmError> {
        match self.find(tx, key)? {
            Some((node, _)) => tx.write_at(node, 16, value).map(|()| true),
            None => Ok(false),
        }
    }

    /// Inserts `key` with `value`; false (and nothing changed) if it exists.
    pub fn insert(&self, tx: &mut PTx<'_, KvRoot>, key: u64, value: &V) -> Result<bool, PtmError> {
        if self.find(tx, key)?.is_some() {
            return Ok(false);
        }
        self.insert_new(tx, key, value).map(|()| true)
    }

    /// Inserts `key`, which the caller knows is absent (e.g. an order id just drawn from its
    /// district's counter): no chain walk. A duplicate would shadow the older pair.
    pub fn insert_new(
        &self,
        tx: &mut PTx<'_, KvRoot>,
        key: u64,
        value: &V,
    ) -> Result<(), PtmError> {
        let (seg, at) = self.slot(tx, key)?;
        let head: u64 = tx.read_at(seg, at)?;
        let node = tx.alloc(&Node {
            key,
            next: head,
            value: *value,
        })?;
        tx.write_at(seg, at, &node.raw())
    }

    /// Removes `key`; false if it is absent.
    pub fn delete(&self, tx: &mut PTx<'_, KvRoot>, key: u64) -> Result<bool, PtmError> {
        let Some((node, prev)) = self.find(tx, key)? else {
            return Ok(false);
        };
        let next: u64 = tx.read_at(node, 8)?;
        if prev.is_null() {
            let (seg, at) = self.slot(tx, key)?;
            tx.write_at(seg, at, &next)?;
        } else {
            tx.write_at(prev, 8, &next)?;
        }
        tx.free(node).map(|()| true)
    }

    /// Every key of buckets `from..to` (for checks: a scan in bounded transactions).
    pub fn keys_in(
        &self,
        tx: &mut PTx<'_, KvRoot>,
        from: u64,
        to: u64,
    ) -> Result<Vec<u64>, PtmError> {
        let mut out = Vec::new();
        for b in from..to.min(self.buckets) {
            let (seg, at) = self.bucket(tx, b)?;
            let mut p: u64 = tx.read_at(seg, at)?;
            while p != 0 {
                let [k, next]: [u64; 2] = tx.read_at(PPtr::<Node<V>>::from_raw(p), 0)?;
                out.push(k);
                p = next;
            }
        }
        Ok(out)
    }

    /// The header's handle.
    pub fn handle(&self) -> PPtr<TableHead> {
        self.head
    }
}

/// Every key of `table`, scanned in transactions of 4 096 buckets.
pub fn all_keys<V: PObject>(
    ptm: &dyn PtmRunner<KvRoot>,
    table: &Table<V>,
) -> Result<Vec<u64>, PtmError> {
    let mut out = Vec::new();
    let mut b = 0;
    while b < table.buckets() {
        let end = b + 4096;
        out.extend(ptm.run(|tx| table.keys_in(tx, b, end))?);
        b = end;
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ptm::{Ptm, PtmConfig};
    use std::collections::BTreeMap;

    #[test]
    fn a_table_agrees_with_a_btreemap() {
        let ptm = Ptm::<KvRoot>::create(PtmConfig::temporary().size(32 << 20)).unwrap();
        let run: &dyn PtmRunner<KvRoot> = &ptm;
        let t: Table<[u64; 3]> = Table::create(run, 2, 50).unwrap();
        assert!(Table::<u64>::create(run, 2, 8).is_err(), "table 2 exists");
        assert_eq!(t.buckets(), 56);
        let mut model = BTreeMap::new();
        let mut rng = 3u64;
        for i in 0..3000u64 {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            let key = rng % 400;
            let v = [i, key, !i];
            match i % 4 {
                0 => {
                    let ins = run.run(|tx| t.insert(tx, key, &v)).unwrap();
                    assert_eq!(ins, !model.contains_key(&key));
                    model.entry(key).or_insert(v);
                }
                1 => {
                    let put = run.run(|tx| t.put(tx, key, &v)).unwrap();
                    assert_eq!(put, model.contains_key(&key));
                    if put {
                        model.insert(key, v);
                    }
                }
                2 => {
                    let del = run.run(|tx| t.delete(tx, key)).unwrap();
                    assert_eq!(del, model.remove(&key).is_some());
                }
                _ => assert_eq!(
                    run.run(|tx| t.get(tx, key)).unwrap(),
                    model.get(&key).copied()
                ),
            }
        }
        let mut keys = all_keys(run, &t).unwrap();
        keys.sort_unstable();
        assert_eq!(keys, model.keys().copied().collect::<Vec<_>>());
        let again: Table<[u64; 3]> = run.run(|tx| Table::open(tx, 2)).unwrap();
        assert_eq!(again.buckets(), t.buckets());
        assert!(
            run.run(|tx| Table::<u64>::open(tx, 2)).is_err(),
            "record size checked"
        );
        assert!(
            run.run(|tx| Table::<u64>::open(tx, 3)).is_err(),
            "no table 3"
        );
        ptm.check_invariants().unwrap();
    }
}
