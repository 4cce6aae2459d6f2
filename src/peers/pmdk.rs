//! PMDK libpmemobj through hand-written FFI: a fixed-capacity hash map of fixed-size records in
//! a pmemobj pool, transactions with pmemobj's undo log, isolation from a readers-writer lock
//! per record taken in key order.
//!
//! Layout: the pool's root object holds the capacity, the record length and the `PMEMoid` of
//! one zeroed array of slots; a slot is `[key: u64][used: u64][record]`, found by linear
//! probing from a hash of the key. Records are only inserted at load (no deletes), so a probe
//! never races with a change of the map's shape and needs no lock; the per-record locks (in
//! DRAM, one per slot) order the transactions on the records.
//!
//! Transactions use the function API with a NULL `jmp_buf` (`pmemobj_tx_begin(pop, NULL,
//! TX_PARAM_NONE)`): a failing pmemobj call then aborts the transaction and returns an error
//! code instead of `longjmp`ing through Rust frames. Every write first snapshots its range
//! (`pmemobj_tx_add_range_direct`, the undo log), so an aborted or interrupted transaction
//! rolls back at the next open.

use super::{Access, PeerError, PeerKind, PeerStore, PeerTx};
use parking_lot::lock_api::RawRwLock as _;
use parking_lot::RawRwLock;
use std::ffi::{c_char, c_int, c_void, CStr, CString};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

/// `PMEMoid`: a pool's uuid (low half) and an object's offset in the pool.
#[repr(C)]
#[derive(Clone, Copy)]
pub(super) struct PmemOid {
    pub(super) pool_uuid_lo: u64,
    pub(super) off: u64,
}

/// `PMEMobjpool` (opaque).
#[repr(C)]
pub(super) struct PmemObjPool {
    _opaque: [u8; 0],
}

/// `TX_PARAM_NONE` of `enum pobj_tx_param`: ends `pmemobj_tx_begin`'s parameter list.
pub(super) const TX_PARAM_NONE: c_int = 0;
/// `TX_STAGE_WORK` of `enum pobj_tx_stage`.
pub(super) const TX_STAGE_WORK: c_int = 1;
/// `POBJ_XADD_NO_SNAPSHOT`: register a range to be flushed at commit without an undo copy (for
/// objects allocated in the same transaction).
pub(super) const POBJ_XADD_NO_SNAPSHOT: u64 = 1 << 2;

// The sibling pmdk_ptm.rs calls these too: one declaration of the C API.
#[link(name = "pmemobj")]
extern "C" {
    pub(super) fn pmemobj_create(
        path: *const c_char,
        layout: *const c_char,
        poolsize: usize,
        mode: libc::mode_t,
    ) -> *mut PmemObjPool;
    pub(super) fn pmemobj_open(path: *const c_char, layout: *const c_char) -> *mut PmemObjPool;
    pub(super) fn pmemobj_close(pop: *mut PmemObjPool);
    pub(super) fn pmemobj_root(pop: *mut PmemObjPool, size: usize) -> PmemOid;
    pub(super) fn pmemobj_direct(oid: PmemOid) -> *mut c_void;
    pub(super) fn pmemobj_zalloc(
        pop: *mut PmemObjPool,
        oidp: *mut PmemOid,
        size: usize,
        type_num: u64,
    ) -> c_int;
    pub(super) fn pmemobj_persist(pop: *mut PmemObjPool, addr: *const c_void, len: usize);
    pub(super) fn pmemobj_errormsg() -> *const c_char;
    pub(super) fn pmemobj_tx_begin(pop: *mut PmemObjPool, env: *mut c_void, ...) -> c_int;
    pub(super) fn pmemobj_tx_add_range_direct(ptr: *const c_void, size: usize) -> c_int;
    pub(super) fn pmemobj_tx_commit() -> c_int;
    pub(super) fn pmemobj_tx_abort(errnum: c_int);
    pub(super) fn pmemobj_tx_end() -> c_int;
    pub(super) fn pmemobj_tx_stage() -> c_int;
    pub(super) fn pmemobj_tx_zalloc(size: usize, type_num: u64) -> PmemOid;
    pub(super) fn pmemobj_tx_free(oid: PmemOid) -> c_int;
    pub(super) fn pmemobj_tx_xadd_range_direct(
        ptr: *const c_void,
        size: usize,
        flags: u64,
    ) -> c_int;
    pub(super) fn pmemobj_first(pop: *mut PmemObjPool) -> PmemOid;
    pub(super) fn pmemobj_next(oid: PmemOid) -> PmemOid;
    pub(super) fn pmemobj_type_num(oid: PmemOid) -> u64;
}

const LAYOUT: &CStr = c"pmtx-peer-hashmap";

/// The root object.
#[repr(C)]
struct Root {
    capacity: u64,
    row_len: u64,
    slots: PmemOid,
}

/// Bytes of a slot's header: key and used flag.
const SLOT_HEADER: usize = 16;

fn last_error(what: &str) -> PeerError {
    PeerError::Store {
        peer: "pmdk",
        message: last_error_text(what),
    }
}

/// `what`, libpmemobj's message for the calling thread's last failure, and errno.
pub(super) fn last_error_text(what: &str) -> String {
    // SAFETY: pmemobj_errormsg returns a thread-local NUL-terminated string (never NULL).
    let msg = unsafe { CStr::from_ptr(pmemobj_errormsg()) };
    format!(
        "{what}: {} ({})",
        msg.to_string_lossy(),
        std::io::Error::last_os_error()
    )
}

/// A pmemobj pool holding the map, and the DRAM locks of its records.
pub(super) struct PmdkStore {
    pop: *mut PmemObjPool,
    /// First slot, in the pool's mapping.
    slots: *mut u8,
    capacity: u64,
    slot_len: usize,
    row_len: usize,
    locks: Vec<RawRwLock>,
}

// SAFETY: the pool handle is thread-safe in libpmemobj (its API is documented MT-safe), and the
// slots it maps are read and written only under the per-record locks (`run`) or by one thread
// at load (`insert_batch` takes every lock it touches exclusively).
unsafe impl Send for PmdkStore {}
// SAFETY: as for Send.
unsafe impl Sync for PmdkStore {}

impl PmdkStore {
    /// Creates a pool at `path` for `capacity` records of `row_len` bytes (the map at most
    /// half full).
    pub(super) fn create(path: &Path, capacity: u64, row_len: usize) -> Result<Self, PeerError> {
        force_pmem_flushes();
        let slots = capacity.max(1).saturating_mul(2).next_power_of_two();
        let slot_len = (SLOT_HEADER + row_len).next_multiple_of(8);
        let array = slots
            .checked_mul(slot_len as u64)
            .filter(|&b| b < (15 << 30))
            .ok_or_else(|| PeerError::Config("PMDK map larger than pmemobj allocates".into()))?;
        // The array, plus room for the undo logs of concurrent transactions and the heap's
        // metadata.
        let pool_size = array + array / 8 + (64 << 20);
        let cpath = c_path(path)?;
        // SAFETY: both strings are NUL-terminated and live across the call.
        let pop =
            unsafe { pmemobj_create(cpath.as_ptr(), LAYOUT.as_ptr(), pool_size as usize, 0o600) };
        if pop.is_null() {
            return Err(last_error(&format!("pmemobj_create {}", path.display())));
        }
        // SAFETY: pop is an open pool; the root object is allocated zeroed if absent.
        let root_oid = unsafe { pmemobj_root(pop, std::mem::size_of::<Root>()) };
        // SAFETY: root_oid is the pool's root object, at least size_of::<Root>() bytes.
        let root = unsafe { pmemobj_direct(root_oid) }.cast::<Root>();
        if root.is_null() {
            // SAFETY: pop is open and closed once.
            unsafe { pmemobj_close(pop) };
            return Err(last_error("pmemobj_root"));
        }
        // The slot array is allocated zeroed and its oid published into the root atomically by
        // pmemobj_zalloc (a crash leaves either no array or a zeroed one).
        // SAFETY: root points to the root object in the mapping; `slots` is a field of it.
        let rc = unsafe {
            pmemobj_zalloc(
                pop,
                std::ptr::addr_of_mut!((*root).slots),
                array as usize,
                1,
            )
        };
        if rc != 0 {
            let e = last_error(&format!("pmemobj_zalloc of {array} bytes"));
            // SAFETY: pop is open and closed once.
            unsafe { pmemobj_close(pop) };
            return Err(e);
        }
        // SAFETY: root is valid; capacity and row_len are written and persisted before any
        // record, and `open` checks them.
        unsafe {
            (*root).capacity = slots;
            (*root).row_len = row_len as u64;
            pmemobj_persist(pop, root.cast(), 16);
        }
        Self::from_root(pop, root, row_len)
    }

    /// Opens the pool at `path` (pmemobj rolls back an unfinished transaction).
    pub(super) fn open(path: &Path, row_len: usize) -> Result<Self, PeerError> {
        force_pmem_flushes();
        let cpath = c_path(path)?;
        // SAFETY: both strings are NUL-terminated and live across the call.
        let pop = unsafe { pmemobj_open(cpath.as_ptr(), LAYOUT.as_ptr()) };
        if pop.is_null() {
            return Err(last_error(&format!("pmemobj_open {}", path.display())));
        }
        // SAFETY: pop is open; the root exists since create made it.
        let root = unsafe { pmemobj_direct(pmemobj_root(pop, std::mem::size_of::<Root>())) }
            .cast::<Root>();
        Self::from_root(pop, root, row_len)
    }

    fn from_root(
        pop: *mut PmemObjPool,
        root: *mut Root,
        row_len: usize,
    ) -> Result<Self, PeerError> {
        // SAFETY: root points to the root object (null checked below before use of fields).
        let (capacity, stored_len, slots_oid) = if root.is_null() {
            (
                0,
                0,
                PmemOid {
                    pool_uuid_lo: 0,
                    off: 0,
                },
            )
        } else {
            unsafe { ((*root).capacity, (*root).row_len, (*root).slots) }
        };
        // SAFETY: slots_oid is the zalloc'ed array or null (pmemobj_direct maps null to null).
        let slots = unsafe { pmemobj_direct(slots_oid) }.cast::<u8>();
        if slots.is_null() || capacity == 0 || stored_len != row_len as u64 {
            // SAFETY: pop is open and closed once.
            unsafe { pmemobj_close(pop) };
            return Err(PeerError::Config(format!(
                "the PMDK pool holds {stored_len}-byte records in {capacity} slots, not \
                 {row_len}-byte records (or was never completely created)"
            )));
        }
        Ok(PmdkStore {
            pop,
            slots,
            capacity,
            slot_len: (SLOT_HEADER + row_len).next_multiple_of(8),
            row_len,
            locks: (0..capacity).map(|_| RawRwLock::INIT).collect(),
        })
    }

    /// The slot of `key`, or of the first free slot of its probe sequence.
    fn probe(&self, key: u64) -> Result<(u64, bool), PeerError> {
        let mask = self.capacity - 1;
        let mut i = crate::workload::ycsb::fnv_hash64(key) & mask;
        for _ in 0..self.capacity {
            let (k, used) = self.header(i);
            if used == 0 {
                return Ok((i, false));
            }
            if k == key {
                return Ok((i, true));
            }
            i = (i + 1) & mask;
        }
        Err(PeerError::Full(self.capacity))
    }

    fn slot_ptr(&self, i: u64) -> *mut u8 {
        debug_assert!(i < self.capacity);
        // SAFETY: i < capacity, so the offset is inside the slot array.
        unsafe { self.slots.add(i as usize * self.slot_len) }
    }

    fn header(&self, i: u64) -> (u64, u64) {
        let p = self.slot_ptr(i).cast::<u64>();
        // SAFETY: the slot's first 16 bytes, 8-aligned (slot_len is a multiple of 8 and the
        // array is allocated 8-aligned); written only at load, before the run's threads start.
        unsafe { (p.read(), p.add(1).read()) }
    }

    fn row(&self, i: u64) -> *mut u8 {
        // SAFETY: the record follows the 16-byte header inside the slot.
        unsafe { self.slot_ptr(i).add(SLOT_HEADER) }
    }

    fn slot_of(&self, key: u64) -> Result<u64, PeerError> {
        match self.probe(key)? {
            (i, true) => Ok(i),
            (_, false) => Err(PeerError::Missing(key)),
        }
    }

    /// Runs `f` in a pmemobj transaction: committed if it returns Ok, aborted otherwise.
    fn in_tx(&self, f: impl FnOnce() -> Result<(), PeerError>) -> Result<(), PeerError> {
        tx_begin(self.pop).map_err(|message| PeerError::Store {
            peer: "pmdk",
            message,
        })?;
        let result = f();
        let ended = tx_finish(result.is_ok());
        result?;
        ended.map_err(|message| PeerError::Store {
            peer: "pmdk",
            message,
        })
    }

    /// Snapshots `len` bytes at `ptr` into the current transaction's undo log.
    fn snapshot(&self, ptr: *const u8, len: usize) -> Result<(), PeerError> {
        // SAFETY: ptr..ptr+len lies inside the pool's mapping, in this thread's transaction.
        let rc = unsafe { pmemobj_tx_add_range_direct(ptr.cast(), len) };
        if rc != 0 {
            return Err(last_error("pmemobj_tx_add_range_direct"));
        }
        Ok(())
    }
}

impl Drop for PmdkStore {
    fn drop(&mut self) {
        // SAFETY: pop is open, and no reference into its mapping outlives self.
        unsafe { pmemobj_close(self.pop) };
    }
}

/// Begins a transaction on the calling thread (libpmemobj's transactions are per thread).
pub(super) fn tx_begin(pop: *mut PmemObjPool) -> Result<(), String> {
    // SAFETY: pop is an open pool; a NULL env makes failures return codes (no longjmp through
    // Rust frames), and TX_PARAM_NONE ends the variadic parameter list.
    let rc = unsafe { pmemobj_tx_begin(pop, std::ptr::null_mut(), TX_PARAM_NONE) };
    if rc != 0 {
        // A failed begin still opened a transaction stage that must be ended.
        // SAFETY: ends the transaction this thread began.
        unsafe { pmemobj_tx_end() };
        return Err(last_error_text("pmemobj_tx_begin"));
    }
    Ok(())
}

/// Ends the calling thread's transaction: commits it if `commit` and it is still in its work
/// stage (a failed pmemobj call has already aborted it), aborts it otherwise. `Err` when it
/// did not commit though asked to.
pub(super) fn tx_finish(commit: bool) -> Result<(), String> {
    // SAFETY: the calling thread's transaction (begun by tx_begin), ended exactly once here.
    unsafe {
        let working = pmemobj_tx_stage() == TX_STAGE_WORK;
        match (commit, working) {
            (true, true) => {
                pmemobj_tx_commit();
            }
            (false, true) => pmemobj_tx_abort(libc::ECANCELED),
            _ => {}
        }
        let rc = pmemobj_tx_end();
        if commit && (rc != 0 || !working) {
            return Err(last_error_text("pmemobj transaction aborted"));
        }
    }
    Ok(())
}

/// libpmemobj on a file that is not DAX would persist with msync; pmtx's pools in /dev/shm
/// persist with cache-line flushes and fences (`--domain adr`). Ask PMDK for the same, so the
/// comparison measures the designs and not two flush mechanisms. libpmem reads the variable at
/// its first persistence check, i.e. at the first create or open.
pub(super) fn force_pmem_flushes() {
    if std::env::var_os("PMEM_IS_PMEM_FORCE").is_none() {
        std::env::set_var("PMEM_IS_PMEM_FORCE", "1");
    }
}

pub(super) fn c_path(path: &Path) -> Result<CString, PeerError> {
    CString::new(path.as_os_str().as_bytes())
        .map_err(|_| PeerError::Config(format!("{}: a NUL in the path", path.display())))
}

/// Which locks a transaction holds, released on drop (also on an error).
struct Held<'s> {
    store: &'s PmdkStore,
    /// (slot, exclusive), in the order taken.
    slots: Vec<(u64, bool)>,
}

impl Drop for Held<'_> {
    fn drop(&mut self) {
        for &(i, exclusive) in self.slots.iter().rev() {
            let lock = &self.store.locks[i as usize];
            // SAFETY: this Held took exactly this lock in this mode (in `run`).
            unsafe {
                if exclusive {
                    lock.unlock_exclusive();
                } else {
                    lock.unlock_shared();
                }
            }
        }
    }
}

struct PmdkTx<'a, 's> {
    store: &'s PmdkStore,
    held: &'a Held<'s>,
}

impl PmdkTx<'_, '_> {
    /// The slot of `key` if this transaction locked it (exclusively if `write`).
    fn locked(&self, key: u64, write: bool) -> Result<u64, PeerError> {
        let i = self.store.slot_of(key)?;
        match self.held.slots.iter().find(|&&(s, _)| s == i) {
            Some(&(_, excl)) if excl || !write => Ok(i),
            _ => Err(PeerError::Config(format!(
                "key {key:#x} {} outside the transaction's declared keys",
                if write { "written" } else { "read" }
            ))),
        }
    }
}

impl PeerTx for PmdkTx<'_, '_> {
    fn read(&mut self, key: u64, out: &mut [u8]) -> Result<(), PeerError> {
        let i = self.locked(key, false)?;
        if out.len() != self.store.row_len {
            return Err(PeerError::Config(format!(
                "a record is {} bytes, not {}",
                self.store.row_len,
                out.len()
            )));
        }
        // SAFETY: the record's row_len bytes, under this transaction's lock on the slot.
        let row = unsafe { std::slice::from_raw_parts(self.store.row(i), self.store.row_len) };
        out.copy_from_slice(row);
        Ok(())
    }

    fn write(&mut self, key: u64, offset: usize, bytes: &[u8]) -> Result<(), PeerError> {
        let i = self.locked(key, true)?;
        if offset + bytes.len() > self.store.row_len {
            return Err(PeerError::Config(format!(
                "write of {} bytes at {offset} past a {}-byte record",
                bytes.len(),
                self.store.row_len
            )));
        }
        // SAFETY: the range is inside the record (checked above).
        let dst = unsafe { self.store.row(i).add(offset) };
        self.store.snapshot(dst, bytes.len())?;
        // SAFETY: the range is inside the record, held exclusively by this transaction, and
        // snapshotted: pmemobj flushes it at commit or restores it on abort.
        unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), dst, bytes.len()) };
        Ok(())
    }
}

impl PeerStore for PmdkStore {
    fn kind(&self) -> PeerKind {
        PeerKind::Pmdk
    }

    fn insert_batch(&self, rows: &[(u64, &[u8])]) -> Result<(), PeerError> {
        // Loading runs on one thread before the measured threads start (`load_rows`), so the
        // probe and the new slot's header need no lock.
        self.in_tx(|| {
            for &(key, row) in rows {
                if row.len() != self.row_len {
                    return Err(PeerError::Config(format!(
                        "a record is {} bytes, not {}",
                        self.row_len,
                        row.len()
                    )));
                }
                let (i, found) = self.probe(key)?;
                let slot = self.slot_ptr(i);
                self.snapshot(slot, SLOT_HEADER + self.row_len)?;
                let mut header = [0u8; SLOT_HEADER];
                header[..8].copy_from_slice(&key.to_ne_bytes());
                header[8..].copy_from_slice(&1u64.to_ne_bytes());
                let _ = found;
                // SAFETY: the slot's header and record, snapshotted above.
                unsafe {
                    std::ptr::copy_nonoverlapping(header.as_ptr(), slot, SLOT_HEADER);
                    std::ptr::copy_nonoverlapping(row.as_ptr(), slot.add(SLOT_HEADER), row.len());
                }
            }
            Ok(())
        })
    }

    fn run(
        &self,
        access: &Access,
        body: &mut dyn FnMut(&mut dyn PeerTx) -> Result<(), PeerError>,
    ) -> Result<(), PeerError> {
        let mut held = Held {
            store: self,
            slots: Vec::with_capacity(access.keys().len()),
        };
        // Two-phase locking in key order (Access is sorted): no cycle of waits.
        for &(key, write) in access.keys() {
            let i = self.slot_of(key)?;
            let lock = &self.locks[i as usize];
            if write {
                lock.lock_exclusive();
            } else {
                lock.lock_shared();
            }
            held.slots.push((i, write));
        }
        let mut tx = PmdkTx {
            store: self,
            held: &held,
        };
        if access.writes() {
            self.in_tx(|| body(&mut tx))
        } else {
            body(&mut tx)
        }
    }

    fn len(&self) -> Result<u64, PeerError> {
        Ok((0..self.capacity)
            .filter(|&i| self.header(i).1 != 0)
            .count() as u64)
    }
}
