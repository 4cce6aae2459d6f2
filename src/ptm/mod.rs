//! The persistent-object API: a persistent transactional memory (PTM) in the manner of PMDK's
//! libpmemobj, for arbitrary data structures rather than tables.
//!
//! A [`Ptm`] is a pool with a typed *root object*. Objects are plain old data ([`PObject`]),
//! named by typed persistent handles ([`PPtr`]): an engine-defined 64-bit name (for ArchTM an
//! object id and a generation), never a raw address, so a handle stays valid across restarts and
//! remappings and a stale handle to a freed object is refused ([`PtmError::InvalidHandle`]) rather
//! than read. Everything happens in a transaction closure given to [`Ptm::run`]:
//! [`alloc`](PTx::alloc), [`free`](PTx::free), [`read`](PTx::read), [`write`](PTx::write),
//! [`update`](PTx::update) and field-level [`read_at`](PTx::read_at) /
//! [`write_at`](PTx::write_at). A conflict aborts the attempt and `run` retries it with backoff,
//! as [`Db::run`](crate::Db::run) does; any other error aborts and is returned. When `run`
//! returns `Ok` the transaction is durable.
//!
//! **Isolation: snapshot isolation** (ArchTM §5.3). A transaction reads the versions committed
//! before it began (plus its own writes); two transactions that write the same object conflict
//! (first committer wins: the second aborts and is retried). Write skew is possible: two
//! transactions that each read what the other writes may both commit. Make such a transaction
//! write (e.g. [`touch`](PTx::touch)) the object whose read it depends on, to serialise it.
//!
//! Engines: the API drives a [`PtmEngine`]; [`archtm`] is the first (logless copy-on-write
//! objects, ArchTM FAST'21 §5). DUDETx (its §3.6: shadow DRAM pages over a persistent pool,
//! addressed by virtual address) fits behind the same trait: its handle would be the object's
//! offset in the persistent address space, and a read or write of `(handle, offset, bytes)` a
//! `dtmRead`/`dtmWrite` of the words there.
//!
//! Code written against [`PTx`] runs on any [`PtmRunner`]: a [`Ptm`], or a transactional memory
//! outside it (PMDK's libpmemobj for `pmtx bench ptm --engine pmdk`, in `pmtx::peers`).
//!
//! ```
//! use pmtx::ptm::{Ptm, PtmConfig, PPtr};
//! pmtx::pobject! {
//!     /// A list node.
//!     #[derive(Clone, Copy, Debug, Default, PartialEq)]
//!     pub struct Node { pub value: u64, pub next: PPtr<Node> }
//! }
//! pmtx::pobject! {
//!     #[derive(Clone, Copy, Debug, Default)]
//!     pub struct Root { pub head: PPtr<Node>, pub len: u64 }
//! }
//! let ptm = Ptm::<Root>::create(PtmConfig::temporary())?;
//! ptm.run(|tx| {
//!     let root = tx.root();
//!     let mut r = tx.read(root)?;
//!     r.head = tx.alloc(&Node { value: 7, next: r.head })?;
//!     r.len += 1;
//!     tx.write(root, &r)
//! })?;
//! let head = ptm.run(|tx| { let r = tx.read(tx.root())?; tx.read(r.head) })?;
//! assert_eq!(head.value, 7);
//! # Ok::<(), pmtx::ptm::PtmError>(())
//! ```

pub mod archtm;

use crate::pmem::PersistenceDomain;
use std::marker::PhantomData;
use std::path::PathBuf;

/// Errors of the persistent-object API.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum PtmError {
    /// No free persistent memory for an object of this size.
    #[error("persistent memory is full: no room for an object of {bytes} bytes ({detail})")]
    PoolFull {
        /// The object's size.
        bytes: usize,
        /// What is full.
        detail: String,
    },
    /// The handle names no live object in this transaction's snapshot (never allocated, freed, a
    /// null handle, or a handle of another pool).
    #[error("invalid handle {handle:#x}: {reason}")]
    InvalidHandle {
        /// The handle's raw value.
        handle: u64,
        /// Why it is refused.
        reason: String,
    },
    /// An object larger than the engine's largest object, or an access past an object's end.
    #[error("object too large or access out of bounds: {0}")]
    TooLarge(String),
    /// A concurrent transaction holds an object this one must write (or wrote it after this one's
    /// snapshot): the attempt aborts. [`Ptm::run`] retries it; it surfaces only after
    /// `max_retries` attempts.
    #[error("write conflict on object {handle:#x} (retried {retries} times)")]
    Conflict {
        /// The contended object.
        handle: u64,
        /// Attempts that failed before giving up (0 inside a transaction).
        retries: u32,
    },
    /// The closure asked to abort ([`PTx::abort`]): nothing it did persists.
    #[error("the transaction aborted itself")]
    UserAbort,
    /// Every thread slot of the pool is in use by a running transaction.
    #[error("all {0} thread slots are busy: raise PtmConfig::max_threads")]
    TooManyThreads(usize),
    /// The pool cannot be created or opened, or its contents are damaged.
    #[error("{0}")]
    Pool(String),
}

impl PtmError {
    /// Whether [`Ptm::run`] retries the attempt.
    pub fn is_retryable(&self) -> bool {
        matches!(self, PtmError::Conflict { .. })
    }
}

impl From<crate::pmem::PoolError> for PtmError {
    fn from(e: crate::pmem::PoolError) -> Self {
        PtmError::Pool(e.to_string())
    }
}

impl From<crate::engine::DbError> for PtmError {
    fn from(e: crate::engine::DbError) -> Self {
        PtmError::Pool(e.to_string())
    }
}

impl From<crate::alloc::AllocError> for PtmError {
    fn from(e: crate::alloc::AllocError) -> Self {
        PtmError::Pool(e.to_string())
    }
}

/// A plain-old-data object that can live in persistent memory: a fixed size and a byte encoding.
///
/// Implemented for the integer types, `bool`, `f64`, byte and word arrays, [`PPtr`] and `()`;
/// declare your own structs with [`pobject!`](crate::pobject), whose encoding is the fields' in
/// declaration order (so the byte offset of a field, for [`PTx::read_at`] / [`PTx::write_at`], is
/// the sum of the sizes of the fields before it). Safe Rust throughout: no `unsafe impl`.
pub trait PObject: Sized + Copy + 'static {
    /// Encoded bytes.
    const SIZE: usize;
    /// Writes the encoding into `out` (`out.len() == SIZE`).
    fn store(&self, out: &mut [u8]);
    /// Decodes from `bytes` (`bytes.len() == SIZE`).
    fn load(bytes: &[u8]) -> Self;
    /// The encoding as a vector.
    fn to_bytes(&self) -> Vec<u8> {
        let mut v = vec![0u8; Self::SIZE];
        self.store(&mut v);
        v
    }
}

macro_rules! int_pobject {
    ($($t:ty),*) => {$(
        impl PObject for $t {
            const SIZE: usize = std::mem::size_of::<$t>();
            fn store(&self, out: &mut [u8]) { out.copy_from_slice(&self.to_le_bytes()) }
            fn load(bytes: &[u8]) -> Self { <$t>::from_le_bytes(bytes.try_into().expect("size")) }
        }
    )*};
}
int_pobject!(u8, u16, u32, u64, u128, i8, i16, i32, i64, i128, f32, f64);

impl PObject for bool {
    const SIZE: usize = 1;
    fn store(&self, out: &mut [u8]) {
        out[0] = u8::from(*self);
    }
    fn load(bytes: &[u8]) -> Self {
        bytes[0] != 0
    }
}

impl PObject for () {
    const SIZE: usize = 0;
    fn store(&self, _: &mut [u8]) {}
    fn load(_: &[u8]) -> Self {}
}

impl<T: PObject, const N: usize> PObject for [T; N] {
    const SIZE: usize = T::SIZE * N;
    fn store(&self, out: &mut [u8]) {
        for (i, x) in self.iter().enumerate() {
            x.store(&mut out[i * T::SIZE..(i + 1) * T::SIZE]);
        }
    }
    fn load(bytes: &[u8]) -> Self {
        std::array::from_fn(|i| T::load(&bytes[i * T::SIZE..(i + 1) * T::SIZE]))
    }
}

/// Declares a struct of [`PObject`] fields and implements [`PObject`] for it (fields encoded in
/// declaration order, no padding). Attributes and doc comments pass through.
///
/// ```
/// pmtx::pobject! {
///     #[derive(Clone, Copy, Debug, Default, PartialEq)]
///     pub struct Pair { pub key: u64, pub value: [u8; 16] }
/// }
/// use pmtx::ptm::PObject;
/// assert_eq!(Pair::SIZE, 24);
/// let p = Pair { key: 1, value: [2; 16] };
/// assert_eq!(Pair::load(&p.to_bytes()), p);
/// ```
#[macro_export]
macro_rules! pobject {
    ($(#[$m:meta])* $vis:vis struct $name:ident { $($(#[$fm:meta])* $fvis:vis $field:ident : $ty:ty),* $(,)? }) => {
        $(#[$m])*
        $vis struct $name { $($(#[$fm])* $fvis $field: $ty),* }
        impl $crate::ptm::PObject for $name {
            const SIZE: usize = 0 $(+ <$ty as $crate::ptm::PObject>::SIZE)*;
            #[allow(unused_assignments, unused_variables, unused_mut)]
            fn store(&self, out: &mut [u8]) {
                let mut at = 0usize;
                $(
                    let n = <$ty as $crate::ptm::PObject>::SIZE;
                    $crate::ptm::PObject::store(&self.$field, &mut out[at..at + n]);
                    at += n;
                )*
            }
            #[allow(unused_assignments, unused_variables, unused_mut)]
            fn load(bytes: &[u8]) -> Self {
                let mut at = 0usize;
                $(
                    let n = <$ty as $crate::ptm::PObject>::SIZE;
                    let $field = <$ty as $crate::ptm::PObject>::load(&bytes[at..at + n]);
                    at += n;
                )*
                $name { $($field),* }
            }
        }
    };
}

/// A typed persistent handle: the engine's 64-bit name of an object of type `T`, valid across
/// restarts and remappings (not an address). The null handle ([`PPtr::null`], also `Default`)
/// names nothing. Stored inside objects like any other field.
pub struct PPtr<T> {
    raw: u64,
    _t: PhantomData<fn() -> T>,
}

impl<T> PPtr<T> {
    /// The null handle.
    pub const fn null() -> PPtr<T> {
        PPtr {
            raw: 0,
            _t: PhantomData,
        }
    }
    /// A handle from its raw value (as [`PPtr::raw`] gave it).
    pub const fn from_raw(raw: u64) -> PPtr<T> {
        PPtr {
            raw,
            _t: PhantomData,
        }
    }
    /// The raw value.
    pub const fn raw(self) -> u64 {
        self.raw
    }
    /// Whether this is the null handle.
    pub const fn is_null(self) -> bool {
        self.raw == 0
    }
}

impl<T> Clone for PPtr<T> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<T> Copy for PPtr<T> {}
impl<T> PartialEq for PPtr<T> {
    fn eq(&self, o: &Self) -> bool {
        self.raw == o.raw
    }
}
impl<T> Eq for PPtr<T> {}
impl<T> std::hash::Hash for PPtr<T> {
    fn hash<H: std::hash::Hasher>(&self, h: &mut H) {
        self.raw.hash(h)
    }
}
impl<T> Default for PPtr<T> {
    fn default() -> Self {
        PPtr::null()
    }
}
impl<T> std::fmt::Debug for PPtr<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "PPtr({:#x})", self.raw)
    }
}
impl<T: 'static> PObject for PPtr<T> {
    const SIZE: usize = 8;
    fn store(&self, out: &mut [u8]) {
        out.copy_from_slice(&self.raw.to_le_bytes())
    }
    fn load(bytes: &[u8]) -> Self {
        PPtr::from_raw(u64::from_le_bytes(bytes.try_into().expect("8 bytes")))
    }
}

/// The engine under the API: opens and creates pools and hands out workers. Object-granular
/// engines (ArchTM) and word-granular ones (DUDETx) both implement it: the API speaks in
/// `(handle, byte offset, bytes)`.
pub trait PtmEngine: Send + Sync {
    /// The engine's name ("archtm").
    fn name(&self) -> &'static str;
    /// A worker for one thread: its transaction state slot. Fails with
    /// [`PtmError::TooManyThreads`] when every slot is taken.
    fn worker(&self) -> Result<Box<dyn PtmWorker>, PtmError>;
    /// The root object's handle.
    fn root(&self) -> u64;
    /// Bytes of the root object (checked against the root type at open).
    fn root_size(&self) -> usize;
    /// The engine's statistics (live objects, bytes in use, ...) as `(name, value)` pairs.
    fn stats(&self) -> Vec<(&'static str, u64)>;
    /// The pool underneath (its crash simulator, its counters).
    fn pool(&self) -> &crate::pmem::Pool;
    /// Online defragmentation (ArchTM §4.5): moves the objects of underused regions so the
    /// regions become free; returns `(regions found, objects moved)`. An engine without it
    /// returns `(0, 0)`.
    fn defragment(&self) -> Result<(u64, u64), PtmError> {
        Ok((0, 0))
    }
    /// Takes a checkpoint that shortens recovery (ArchTM §5.6), waiting for running
    /// transactions to finish. Not from inside a transaction. An engine without one does nothing.
    fn checkpoint(&self) -> Result<(), PtmError> {
        Ok(())
    }
    /// Checks the engine's invariants (allocator, object table): what a crash test asserts after
    /// recovery. Call it while no transaction runs.
    fn check_invariants(&self) -> Result<(), String>;
    /// The id of the last transaction known durable, for an engine that separates "committed"
    /// from "durable" (DUDETx's asynchronous mode): a crash keeps every transaction up to it.
    /// `None`: every commit is durable when `run` returns.
    fn durable_id(&self) -> Option<u64> {
        None
    }
    /// The id of the last commit (same engines as [`PtmEngine::durable_id`]).
    fn committed_id(&self) -> Option<u64> {
        None
    }
}

/// One thread's transactions on a [`PtmEngine`]. Calls between `begin` and `commit`/`abort` form
/// one transaction; any error leaves it to be aborted by the caller.
pub trait PtmWorker: Send {
    /// Starts a transaction (takes its snapshot).
    fn begin(&mut self);
    /// Copies `dst.len()` bytes of object `h` from byte `offset` into `dst`.
    fn read(&mut self, h: u64, offset: usize, dst: &mut [u8]) -> Result<(), PtmError>;
    /// Writes `src` into object `h` at byte `offset`.
    fn write(&mut self, h: u64, offset: usize, src: &[u8]) -> Result<(), PtmError>;
    /// Allocates an object holding `init`; returns its handle.
    fn alloc(&mut self, init: &[u8]) -> Result<u64, PtmError>;
    /// Frees object `h` (when the transaction commits).
    fn free(&mut self, h: u64) -> Result<(), PtmError>;
    /// The size in bytes of object `h`.
    fn size_of(&mut self, h: u64) -> Result<usize, PtmError>;
    /// Commits: durable when it returns `Ok`.
    fn commit(&mut self) -> Result<(), PtmError>;
    /// Aborts: nothing of the transaction persists or stays visible.
    fn abort(&mut self);
}

/// Which engine a [`Ptm`] runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum PtmEngineKind {
    /// ArchTM (FAST'21): logless copy-on-write objects.
    #[default]
    Archtm,
    /// DUDETx (ASPLOS'17): perform on a DRAM shadow, persist a redo log, reproduce in the
    /// background (`crate::engine::dudetx::ptm`).
    Dudetx,
}

impl PtmEngineKind {
    /// The engine's name.
    pub fn name(self) -> &'static str {
        match self {
            PtmEngineKind::Archtm => "archtm",
            PtmEngineKind::Dudetx => "dudetx",
        }
    }
}

impl std::str::FromStr for PtmEngineKind {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "archtm" => Ok(PtmEngineKind::Archtm),
            "dudetx" => Ok(PtmEngineKind::Dudetx),
            _ => Err(format!(
                "unknown PTM engine '{s}' (expected: archtm or dudetx)"
            )),
        }
    }
}

/// How to create or open a PTM pool.
#[derive(Clone, Debug)]
pub struct PtmConfig {
    /// The pool file (`None`: an in-memory pool that nothing outlives).
    pub path: Option<PathBuf>,
    /// Pool size in bytes at creation.
    pub size: u64,
    /// Persistence domain (ADR: flush + fence; eADR: fences order stores).
    pub domain: PersistenceDomain,
    /// The engine.
    pub engine: PtmEngineKind,
    /// Thread slots (concurrent transactions), at most 255.
    pub max_threads: usize,
    /// Conflict aborts [`Ptm::run`] retries before returning [`PtmError::Conflict`].
    pub max_retries: u32,
    /// Count PM traffic (`pmem::stats`).
    pub counting: bool,
    /// Remove the pool file when the `Ptm` is dropped.
    pub remove_on_drop: bool,
    /// Crash simulation (tests): attach a simulator with this trigger.
    pub crash_sim: Option<crate::pmem::CrashTrigger>,
    /// ArchTM: a deliberate ordering bug (tests of the crash harness).
    pub archtm_fault: Option<archtm::ArchtmFault>,
    /// ArchTM: deallocations a thread collects before its commit asks for garbage collection
    /// (wakes the GC thread, or collects inline without one).
    pub gc_threshold: usize,
    /// ArchTM: run the GC thread (§5.4), which also collects at least this often; `None`:
    /// commits collect inline (deterministic: what the crash simulator's image sweep uses).
    pub gc_interval: Option<std::time::Duration>,
    /// ArchTM: run the defragmentation thread (§4.5), which looks this often whether a pass
    /// is due (see `defrag_eager`); `None`: only [`Ptm::defragment`] defragments.
    pub defrag_interval: Option<std::time::Duration>,
    /// ArchTM: the defragmentation thread's policy. `false` (the default): a pass only when
    /// the recycled blocks of size classes no slot allocated from for 50 ms exceed a quarter
    /// of the data area (the pass returns them to the free list, then drains the regions below
    /// half used). `true`: §4.5's rule alone, a pass whenever blocks were recycled since the
    /// last, draining every region below half used. [`Ptm::defragment`] always uses §4.5's.
    pub defrag_eager: bool,
    /// ArchTM: take a lookup-table checkpoint (§5.6) every this many commits (0: only on
    /// [`Ptm::checkpoint`]).
    pub checkpoint_every: u64,
    /// ArchTM: bytes a thread fetches from the global free list at once for objects above
    /// 4 KiB (§5.4's segment), the most it takes of a size class at once (at most 16 KiB), and
    /// the chunk a CHKP-diff record covers (§5.6); rounded up to a power of two from 64 bytes
    /// to 2 MiB.
    pub segment_bytes: u64,
    /// DUDETx: durability mode, group size, perform mode, fault.
    pub dudetx: crate::engine::dudetx::ptm::DudetxPtmOptions,
}

impl PtmConfig {
    /// An in-memory pool of 64 MiB under ADR, for tests and examples.
    pub fn temporary() -> PtmConfig {
        PtmConfig {
            path: None,
            size: 64 << 20,
            domain: PersistenceDomain::Adr,
            engine: PtmEngineKind::Archtm,
            max_threads: 16,
            max_retries: 10_000,
            counting: true,
            remove_on_drop: false,
            crash_sim: None,
            archtm_fault: None,
            gc_threshold: archtm::alloc::GC_THRESHOLD,
            gc_interval: Some(archtm::background::GC_INTERVAL),
            defrag_interval: Some(archtm::background::DEFRAG_INTERVAL),
            defrag_eager: false,
            checkpoint_every: 1 << 16,
            segment_bytes: archtm::alloc::FETCH,
            dudetx: Default::default(),
        }
    }
    /// Sets the pool file.
    pub fn path(mut self, p: impl Into<PathBuf>) -> Self {
        self.path = Some(p.into());
        self
    }
    /// Sets the pool size at creation.
    pub fn size(mut self, bytes: u64) -> Self {
        self.size = bytes;
        self
    }
    /// Sets the persistence domain.
    pub fn domain(mut self, d: PersistenceDomain) -> Self {
        self.domain = d;
        self
    }
    /// Sets the engine.
    pub fn engine(mut self, e: PtmEngineKind) -> Self {
        self.engine = e;
        self
    }
    /// Sets the number of thread slots.
    pub fn max_threads(mut self, n: usize) -> Self {
        self.max_threads = n;
        self
    }
    /// ArchTM: no background threads; garbage collection runs on the committing thread and
    /// defragmentation only on [`Ptm::defragment`] (deterministic PM events).
    pub fn inline_background(mut self) -> Self {
        self.gc_interval = None;
        self.defrag_interval = None;
        self
    }
}

/// A persistent object pool with a root object of type `R`, driven by one engine.
pub struct Ptm<R: PObject> {
    engine: Box<dyn PtmEngine>,
    workers: parking_lot::Mutex<Vec<Box<dyn PtmWorker>>>,
    max_retries: u32,
    _r: PhantomData<fn() -> R>,
}

impl<R: PObject + Default> Ptm<R> {
    /// Creates a pool whose root object is `R::default()`.
    pub fn create(config: PtmConfig) -> Result<Ptm<R>, PtmError> {
        Self::create_with(config, &R::default())
    }

    /// Opens the pool at `config.path` (recovering it) or, if there is no file, creates it.
    pub fn open_or_create(config: PtmConfig) -> Result<Ptm<R>, PtmError> {
        match &config.path {
            Some(p) if p.exists() => Self::open(config),
            _ => Self::create(config),
        }
    }
}

impl<R: PObject> Ptm<R> {
    /// Creates a pool whose root object is `root`.
    pub fn create_with(config: PtmConfig, root: &R) -> Result<Ptm<R>, PtmError> {
        let engine: Box<dyn PtmEngine> = match config.engine {
            PtmEngineKind::Archtm => Box::new(archtm::ArchTm::create(&config, &root.to_bytes())?),
            PtmEngineKind::Dudetx => Box::new(crate::engine::dudetx::ptm::DudetxPtm::create(
                &config,
                &root.to_bytes(),
            )?),
        };
        Ok(Self::wrap(engine, &config))
    }

    /// Opens an existing pool, running the engine's recovery.
    pub fn open(config: PtmConfig) -> Result<Ptm<R>, PtmError> {
        let engine: Box<dyn PtmEngine> = match config.engine {
            PtmEngineKind::Archtm => Box::new(archtm::ArchTm::open(&config)?),
            PtmEngineKind::Dudetx => {
                Box::new(crate::engine::dudetx::ptm::DudetxPtm::open(&config)?)
            }
        };
        Self::checked(engine, &config)
    }

    /// Wraps an engine already opened.
    pub fn from_engine(engine: Box<dyn PtmEngine>, max_retries: u32) -> Ptm<R> {
        Ptm {
            engine,
            workers: parking_lot::Mutex::new(Vec::new()),
            max_retries,
            _r: PhantomData,
        }
    }

    fn wrap(engine: Box<dyn PtmEngine>, config: &PtmConfig) -> Ptm<R> {
        Self::from_engine(engine, config.max_retries)
    }

    /// The engine underneath.
    pub fn engine(&self) -> &dyn PtmEngine {
        &*self.engine
    }

    /// Runs `f` as a transaction, retrying conflict aborts with randomised backoff up to
    /// `max_retries`; any other error aborts and is returned. Durable when it returns `Ok`.
    ///
    /// Do not call `run` inside a `run` closure on the same `Ptm`: the inner transaction's
    /// versions are not retired before the outer one finishes (post-commit, ArchTM Alg. 2),
    /// so the outer one cannot write them (conflicts until `max_retries`).
    pub fn run<T>(
        &self,
        f: impl FnMut(&mut PTx<'_, R>) -> Result<T, PtmError>,
    ) -> Result<T, PtmError> {
        self.run_counted(f).map(|(v, _)| v)
    }

    /// As [`Ptm::run`], also returning the conflict aborts the transaction took.
    pub fn run_counted<T>(
        &self,
        f: impl FnMut(&mut PTx<'_, R>) -> Result<T, PtmError>,
    ) -> Result<(T, u32), PtmError> {
        let mut worker = match self.workers.lock().pop() {
            Some(w) => w,
            None => self.engine.worker()?,
        };
        let result = run_on_worker(&mut *worker, self.engine.root(), self.max_retries, f);
        self.workers.lock().push(worker);
        result
    }

    /// Opens a crash image (the bytes of a whole pool) in memory and recovers it: for crash
    /// tests.
    pub fn open_image(bytes: &[u8], config: PtmConfig) -> Result<Ptm<R>, PtmError> {
        let engine: Box<dyn PtmEngine> = match config.engine {
            PtmEngineKind::Archtm => Box::new(archtm::ArchTm::open_image(bytes, &config)?),
            PtmEngineKind::Dudetx => Box::new(crate::engine::dudetx::ptm::DudetxPtm::open_image(
                bytes, &config,
            )?),
        };
        Self::checked(engine, &config)
    }

    fn checked(engine: Box<dyn PtmEngine>, config: &PtmConfig) -> Result<Ptm<R>, PtmError> {
        if engine.root_size() != R::SIZE {
            return Err(PtmError::Pool(format!(
                "the pool's root object has {} bytes, the root type {} has {}",
                engine.root_size(),
                std::any::type_name::<R>(),
                R::SIZE
            )));
        }
        Ok(Self::wrap(engine, config))
    }

    /// Online defragmentation (see [`PtmEngine::defragment`]): `(regions found, objects moved)`.
    /// Runs on the calling thread, concurrently with transactions.
    pub fn defragment(&self) -> Result<(u64, u64), PtmError> {
        self.engine.defragment()
    }

    /// Takes a checkpoint (see [`PtmEngine::checkpoint`]): waits for running transactions; do
    /// not call it inside a `run` closure.
    pub fn checkpoint(&self) -> Result<(), PtmError> {
        self.engine.checkpoint()
    }

    /// Checks the engine's invariants (see [`PtmEngine::check_invariants`]).
    pub fn check_invariants(&self) -> Result<(), String> {
        self.engine.check_invariants()
    }

    /// The last transaction id known durable, where the engine separates "committed" from
    /// "durable" (DUDETx in asynchronous mode; see [`PtmEngine::durable_id`]).
    pub fn durable_id(&self) -> Option<u64> {
        self.engine.durable_id()
    }

    /// The id of the last commit (see [`PtmEngine::committed_id`]).
    pub fn committed_id(&self) -> Option<u64> {
        self.engine.committed_id()
    }

    /// The engine's statistics.
    pub fn stats(&self) -> Vec<(&'static str, u64)> {
        self.engine.stats()
    }
}

/// Runs `f` as one transaction on `worker` (whose root object is `root`) with [`Ptm::run`]'s
/// policy: conflict aborts are retried with randomised backoff up to `max_retries`, any other
/// error aborts and is returned. Returns the value and the conflict aborts taken. For a
/// transactional memory outside [`Ptm`] (a [`PtmRunner`]) that brings its own [`PtmWorker`].
pub fn run_on_worker<R: PObject, T>(
    worker: &mut dyn PtmWorker,
    root: u64,
    max_retries: u32,
    mut f: impl FnMut(&mut PTx<'_, R>) -> Result<T, PtmError>,
) -> Result<(T, u32), PtmError> {
    let mut attempts = 0u32;
    let mut rng = (worker as *const dyn PtmWorker as *const u8 as u64) | 1;
    loop {
        worker.begin();
        let mut tx = PTx {
            w: &mut *worker,
            root,
            _r: PhantomData,
        };
        let r = f(&mut tx).and_then(|v| tx.w.commit().map(|()| v));
        match r {
            Ok(v) => return Ok((v, attempts)),
            Err(e) => {
                worker.abort();
                if !e.is_retryable() {
                    return Err(e);
                }
                if attempts >= max_retries {
                    return Err(match e {
                        PtmError::Conflict { handle, .. } => PtmError::Conflict {
                            handle,
                            retries: attempts,
                        },
                        e => e,
                    });
                }
                attempts += 1;
                backoff(&mut rng, attempts);
            }
        }
    }
}

/// Something that runs [`PTx`] transactions over a root object of type `R`: a [`Ptm`], or
/// another transactional memory behind the same interface (PMDK's libpmemobj in `pmtx bench
/// ptm`, `pmtx::peers`), so that one data-structure implementation (`pmtx::workload::ptm_hash`,
/// `ptm_tree`, `ptm_kv`) runs on each. Call [`run`](#method.run) and
/// [`run_counted`](#method.run_counted) on a `&dyn PtmRunner<R>`.
pub trait PtmRunner<R: PObject>: Sync {
    /// Runs `f` as one transaction with [`Ptm::run`]'s retry policy (see [`run_on_worker`]);
    /// returns the conflict aborts it took. Durable when it returns `Ok`.
    fn run_dyn(
        &self,
        f: &mut dyn FnMut(&mut PTx<'_, R>) -> Result<(), PtmError>,
    ) -> Result<u32, PtmError>;

    /// The engine's counters (see [`Ptm::stats`]); none for engines that keep none.
    fn engine_stats(&self) -> Vec<(&'static str, u64)> {
        Vec::new()
    }
}

impl<R: PObject> PtmRunner<R> for Ptm<R> {
    fn run_dyn(
        &self,
        f: &mut dyn FnMut(&mut PTx<'_, R>) -> Result<(), PtmError>,
    ) -> Result<u32, PtmError> {
        self.run_counted(f).map(|((), aborts)| aborts)
    }

    fn engine_stats(&self) -> Vec<(&'static str, u64)> {
        self.stats()
    }
}

impl<R: PObject> dyn PtmRunner<R> + '_ {
    /// Runs `f` as a transaction (see [`Ptm::run`]).
    pub fn run<T>(
        &self,
        f: impl FnMut(&mut PTx<'_, R>) -> Result<T, PtmError>,
    ) -> Result<T, PtmError> {
        self.run_counted(f).map(|(v, _)| v)
    }

    /// As [`run`](#method.run), also returning the conflict aborts the transaction took.
    pub fn run_counted<T>(
        &self,
        mut f: impl FnMut(&mut PTx<'_, R>) -> Result<T, PtmError>,
    ) -> Result<(T, u32), PtmError> {
        let mut out = None;
        let aborts = self.run_dyn(&mut |tx| {
            out = Some(f(tx)?);
            Ok(())
        })?;
        let v = out.ok_or_else(|| {
            PtmError::Pool("the transaction committed without running its closure".into())
        })?;
        Ok((v, aborts))
    }
}

/// Randomised exponential backoff after `aborts` consecutive conflicts (xorshift spin).
fn backoff(rng: &mut u64, aborts: u32) {
    *rng ^= *rng << 13;
    *rng ^= *rng >> 7;
    *rng ^= *rng << 17;
    let cap = 1u64 << aborts.min(10);
    for _ in 0..(*rng % cap) * 16 {
        std::hint::spin_loop();
    }
    if aborts > 10 {
        std::thread::yield_now();
    }
}

/// A transaction in progress: the argument of the closure given to [`Ptm::run`].
pub struct PTx<'w, R> {
    w: &'w mut dyn PtmWorker,
    root: u64,
    _r: PhantomData<fn() -> R>,
}

impl<R: PObject> PTx<'_, R> {
    /// The root object's handle.
    pub fn root(&self) -> PPtr<R> {
        PPtr::from_raw(self.root)
    }

    /// Reads object `p` (its version in this transaction's snapshot).
    pub fn read<T: PObject>(&mut self, p: PPtr<T>) -> Result<T, PtmError> {
        self.read_at(p, 0)
    }

    /// Reads a field of type `F` at byte `offset` of object `p`.
    pub fn read_at<T: PObject, F: PObject>(
        &mut self,
        p: PPtr<T>,
        offset: usize,
    ) -> Result<F, PtmError> {
        check_field::<T, F>(p.raw, offset)?;
        with_scratch(F::SIZE, |b| {
            self.w.read(p.raw, offset, b)?;
            Ok(F::load(b))
        })
    }

    /// Overwrites object `p` with `value`.
    pub fn write<T: PObject>(&mut self, p: PPtr<T>, value: &T) -> Result<(), PtmError> {
        self.write_at(p, 0, value)
    }

    /// Writes the field `value` at byte `offset` of object `p`.
    pub fn write_at<T: PObject, F: PObject>(
        &mut self,
        p: PPtr<T>,
        offset: usize,
        value: &F,
    ) -> Result<(), PtmError> {
        check_field::<T, F>(p.raw, offset)?;
        with_encoded(value, |b| self.w.write(p.raw, offset, b))
    }

    /// Reads object `p`, applies `f`, and writes back the 8-byte words `f` changed (a
    /// word-granular engine logs only those; a copy-on-write one copies the object once anyway).
    pub fn update<T: PObject>(
        &mut self,
        p: PPtr<T>,
        f: impl FnOnce(&mut T),
    ) -> Result<(), PtmError> {
        with_scratch(T::SIZE, |old| {
            self.w.read(p.raw, 0, old)?;
            let mut v = T::load(old);
            f(&mut v);
            with_encoded(&v, |new| {
                fn word(b: &[u8], i: usize) -> &[u8] {
                    &b[i..(i + 8).min(b.len())]
                }
                let mut i = 0;
                while i < new.len() {
                    if word(new, i) == word(old, i) {
                        i += 8;
                        continue;
                    }
                    let start = i;
                    while i < new.len() && word(new, i) != word(old, i) {
                        i += 8;
                    }
                    let end = i.min(new.len());
                    self.w.write(p.raw, start, &new[start..end])?;
                }
                Ok(())
            })
        })
    }

    /// Makes object `p` part of this transaction's write set without changing it: a later
    /// concurrent writer of `p` conflicts with this transaction (a guard against write skew).
    pub fn touch<T: PObject>(&mut self, p: PPtr<T>) -> Result<(), PtmError> {
        self.w.write(p.raw, 0, &[])
    }

    /// Allocates an object holding `value`.
    pub fn alloc<T: PObject>(&mut self, value: &T) -> Result<PPtr<T>, PtmError> {
        with_encoded(value, |b| self.w.alloc(b)).map(PPtr::from_raw)
    }

    /// Frees object `p` when the transaction commits (its handle is invalid from then on; within
    /// the transaction, at once).
    pub fn free<T: PObject>(&mut self, p: PPtr<T>) -> Result<(), PtmError> {
        self.w.free(p.raw)
    }

    /// Allocates an untyped object holding `init` and returns its raw handle: for buffers too
    /// large to build as a typed value (ArchTM's large objects, §4.4, reach hundreds of MiB).
    pub fn alloc_bytes(&mut self, init: &[u8]) -> Result<u64, PtmError> {
        self.w.alloc(init)
    }

    /// Reads `dst.len()` bytes from byte `offset` of the object with raw handle `h`.
    pub fn read_bytes(&mut self, h: u64, offset: usize, dst: &mut [u8]) -> Result<(), PtmError> {
        self.w.read(h, offset, dst)
    }

    /// Writes `src` at byte `offset` of the object with raw handle `h`.
    pub fn write_bytes(&mut self, h: u64, offset: usize, src: &[u8]) -> Result<(), PtmError> {
        self.w.write(h, offset, src)
    }

    /// Whether `p` names a live object in this transaction's snapshot.
    pub fn is_valid<T: PObject>(&mut self, p: PPtr<T>) -> Result<bool, PtmError> {
        match self.w.size_of(p.raw) {
            Ok(_) => Ok(true),
            Err(PtmError::InvalidHandle { .. }) => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// Aborts the transaction: `run` returns [`PtmError::UserAbort`] without retrying.
    pub fn abort<T>(&mut self) -> Result<T, PtmError> {
        Err(PtmError::UserAbort)
    }
}

/// Runs `f` on a zeroed scratch buffer of `len` bytes: on the stack for objects up to 256
/// bytes (every object of the micro-benchmarks, so their reads and writes allocate nothing),
/// else on the heap.
fn with_scratch<T>(len: usize, f: impl FnOnce(&mut [u8]) -> T) -> T {
    if len <= 64 {
        f(&mut [0u8; 64][..len])
    } else if len <= 256 {
        f(&mut [0u8; 256][..len])
    } else {
        f(&mut vec![0u8; len])
    }
}

/// Runs `f` on the encoding of `value` (in a [`with_scratch`] buffer).
fn with_encoded<V: PObject, T>(value: &V, f: impl FnOnce(&[u8]) -> T) -> T {
    with_scratch(V::SIZE, |b| {
        value.store(b);
        f(b)
    })
}

fn check_field<T: PObject, F: PObject>(raw: u64, offset: usize) -> Result<(), PtmError> {
    if offset
        .checked_add(F::SIZE)
        .map_or(true, |end| end > T::SIZE)
    {
        return Err(PtmError::TooLarge(format!(
            "a field of {} bytes at offset {offset} of object {raw:#x} runs past the object's {} bytes",
            F::SIZE,
            T::SIZE
        )));
    }
    Ok(())
}
