//! The pool: a file of persistent memory, mapped into the process (fixed-size, or growable up to
//! a maximum set at creation), and the only API through which PM is mutated (so that counting, crash simulation and, later, NVM latency emulation
//! and the media model can observe every store, flush and fence).

use super::cpu::{self, FlushInstruction, CACHE_LINE};
use super::crashsim::{CrashSim, CrashTrigger, Event, OnCrash};
use super::domain::PersistenceDomain;
use super::error::{PoolError, PoolResult};
use super::header::{Header, FORMAT_VERSION, RESERVED_BYTES, ROOT_OFFSET_WORD, SIZE_WORD};
use super::mapping::{Mapping, MappingKind};
use super::media::{Media, MediaOptions};
use super::stats;
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// The smallest pool: the reserved header page plus room to work.
pub const MIN_POOL_SIZE: u64 = 64 * 1024;
/// The largest pool: 64 TiB (file offsets are signed 64-bit, and a mapping must fit in the
/// 47-bit user address space with room to spare).
pub const MAX_POOL_SIZE: u64 = 1 << 46;

/// How to create or open a pool.
#[derive(Clone, Debug)]
pub struct PoolOptions {
    /// The persistence domain: decides what flush, fence and persist do.
    pub domain: PersistenceDomain,
    /// The layout (engine) name recorded at creation and required at open.
    pub layout: String,
    /// Count PM bytes, flushes and fences per thread (see [`stats`](super::stats)).
    pub counting: bool,
    /// Attach a crash simulator (needs a durable domain).
    pub crash_sim: Option<CrashSimOptions>,
    /// Delete the pool file when the pool is dropped (for scratch pools).
    pub remove_on_drop: bool,
    /// Open a pool created for another persistence domain (refused otherwise).
    pub allow_domain_change: bool,
    /// At creation: the size the pool may grow to ([`Pool::grow`]); `None` (the default) makes a
    /// fixed-size pool. Recorded in the header, so it holds for every later open.
    pub max_size: Option<u64>,
    /// A PM media model, with or without NVM latency emulation ([`media`](super::media)); off by
    /// default.
    pub media: Option<MediaOptions>,
}

/// Settings of a crash simulator attached at open.
#[derive(Clone, Copy, Debug)]
pub struct CrashSimOptions {
    /// Where power fails.
    pub trigger: CrashTrigger,
    /// What threads do at PM events after the crash.
    pub on_crash: OnCrash,
}

impl PoolOptions {
    /// Options for `layout` in `domain`, counting on, no simulator.
    pub fn new(layout: &str, domain: PersistenceDomain) -> PoolOptions {
        PoolOptions {
            domain,
            layout: layout.to_string(),
            counting: true,
            crash_sim: None,
            remove_on_drop: false,
            allow_domain_change: false,
            max_size: None,
            media: None,
        }
    }

    /// Creates a growable pool that may grow to `max_size` bytes (see [`Pool::grow`]).
    pub fn growable_to(mut self, max_size: Option<u64>) -> PoolOptions {
        self.max_size = max_size;
        self
    }

    /// Opens the pool even if it was created for another persistence domain (after moving it to
    /// other hardware, say); without this, [`Pool::open`] refuses with
    /// [`PoolError::DomainMismatch`].
    pub fn allowing_domain_change(mut self, allow: bool) -> PoolOptions {
        self.allow_domain_change = allow;
        self
    }

    /// Attaches a crash simulator with `trigger`, unwinding threads after the crash.
    pub fn with_crash_sim(mut self, trigger: CrashTrigger) -> PoolOptions {
        self.crash_sim = Some(CrashSimOptions {
            trigger,
            on_crash: OnCrash::Unwind,
        });
        self
    }

    /// Attaches a PM media model (and latency emulation, if it has one); `None` detaches it.
    pub fn with_media(mut self, media: Option<MediaOptions>) -> PoolOptions {
        self.media = media;
        self
    }

    /// Turns counting on or off.
    pub fn with_counting(mut self, counting: bool) -> PoolOptions {
        self.counting = counting;
        self
    }

    /// Deletes the file when the pool is dropped.
    pub fn removing_on_drop(mut self) -> PoolOptions {
        self.remove_on_drop = true;
        self
    }
}

/// What `pmtx inspect` reports about a pool.
#[derive(Clone, Debug, serde::Serialize)]
pub struct PoolInfo {
    /// The pool file, if any.
    pub path: Option<PathBuf>,
    /// The decoded header.
    pub header: Header,
    /// How the pool is mapped.
    pub mapping: MappingKind,
    /// The domain it was opened with.
    pub domain: PersistenceDomain,
    /// The flush instruction in use.
    pub flush_instruction: FlushInstruction,
    /// The root offset (0: none yet).
    pub root: u64,
}

/// A mapped pool. Share it between threads with `Arc<Pool>`.
///
/// Offsets are bytes from the start of the pool. The first [`RESERVED_BYTES`] hold the header and
/// root word and cannot be written through this API. Accesses out of range, and misaligned atomic
/// or word accesses, panic: they are bugs in the layer above, which must validate any offset it
/// reads from PM (see [`Pool::check_range`]) before using it.
pub struct Pool {
    map: Mapping,
    header: Header,
    path: Option<PathBuf>,
    domain: PersistenceDomain,
    flush_insn: FlushInstruction,
    counting: bool,
    /// Opened read-only: every write panics.
    read_only: bool,
    sim: Option<Arc<CrashSim>>,
    /// The media model, if attached: every PM event also goes through it.
    media: Option<Media>,
    msync_dirty: parking_lot::Mutex<Vec<(u64, u64)>>,
    remove_on_drop: bool,
    /// The pool file: holds the `flock` for as long as the pool is open, and is what growth
    /// extends.
    file: Option<File>,
    /// Serialises [`Pool::grow`].
    grow_lock: parking_lot::Mutex<()>,
}

fn io_err<'a>(path: &'a Path, op: &'static str) -> impl FnOnce(std::io::Error) -> PoolError + 'a {
    move |source| PoolError::Io {
        path: path.to_path_buf(),
        op,
        source,
    }
}

/// Where a pool goes when the caller gives no path: a new file in `$PMTX_SCRATCH_DIR` when that is
/// set, else under /dev/shm when it exists (DRAM standing in for PM), else under the temporary
/// directory.
pub fn default_pool_path(layout: &str) -> PathBuf {
    let id = uuid::Uuid::new_v4().simple().to_string();
    scratch_dir().join(format!("pmtx-{layout}-{}.pool", &id[..12]))
}

/// The directory for scratch pools and peers' files: `$PMTX_SCRATCH_DIR` when that is set, else
/// /dev/shm when it exists (DRAM standing in for PM), else the temporary directory.
pub fn scratch_dir() -> PathBuf {
    let shm = Path::new("/dev/shm");
    if let Some(dir) = std::env::var_os("PMTX_SCRATCH_DIR") {
        PathBuf::from(dir)
    } else if shm.is_dir() {
        shm.to_path_buf()
    } else {
        std::env::temp_dir()
    }
}

/// How long opening waits for a lock held by someone else before reporting
/// [`PoolError::Locked`]. A lock belongs to the open file description, which a child process
/// forked by another thread shares until its `exec` closes it: a pool closed and reopened in
/// one process can look locked for that instant. A real second opener holds it far longer.
#[cfg(not(miri))]
const LOCK_GRACE: std::time::Duration = std::time::Duration::from_millis(200);

#[cfg(not(miri))]
fn lock_exclusive(file: &File, path: &Path) -> PoolResult<()> {
    use std::os::fd::AsRawFd;
    let started = std::time::Instant::now();
    let err = loop {
        // SAFETY: flock on a file descriptor we own; it has no memory effects.
        let rc = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
        if rc == 0 {
            return Ok(());
        }
        let err = std::io::Error::last_os_error();
        if err.raw_os_error() != Some(libc::EWOULDBLOCK) || started.elapsed() >= LOCK_GRACE {
            break err;
        }
        std::thread::sleep(std::time::Duration::from_millis(2));
    };
    if err.raw_os_error() == Some(libc::EWOULDBLOCK) {
        Err(PoolError::Locked {
            path: path.to_path_buf(),
        })
    } else {
        Err(PoolError::Io {
            path: path.to_path_buf(),
            op: "flock",
            source: err,
        })
    }
}

#[cfg(miri)]
fn lock_exclusive(_: &File, _: &Path) -> PoolResult<()> {
    Ok(())
}

#[cfg(not(miri))]
fn preallocate(file: &File, path: &Path, size: u64) -> PoolResult<()> {
    preallocate_range(file, path, 0, size)
}

/// Gives the file blocks for bytes `[from, size)`, extending it to at least `size` bytes.
#[cfg(not(miri))]
fn preallocate_range(file: &File, path: &Path, from: u64, size: u64) -> PoolResult<()> {
    use std::os::fd::AsRawFd;
    // SAFETY: posix_fallocate on a file descriptor we own; it only changes the file's extent.
    // Reserving the blocks now means a full /dev/shm fails here, not with SIGBUS on a later store.
    let rc = unsafe {
        libc::posix_fallocate(
            file.as_raw_fd(),
            from as libc::off_t,
            (size - from) as libc::off_t,
        )
    };
    match rc {
        0 => Ok(()),
        libc::ENOSPC | libc::EFBIG => Err(PoolError::NoSpace {
            path: path.to_path_buf(),
            size,
        }),
        libc::EOPNOTSUPP | libc::EINVAL => file.set_len(size).map_err(io_err(path, "set_len")),
        other => Err(PoolError::Io {
            path: path.to_path_buf(),
            op: "posix_fallocate",
            source: std::io::Error::from_raw_os_error(other),
        }),
    }
}

#[cfg(miri)]
fn preallocate(file: &File, path: &Path, size: u64) -> PoolResult<()> {
    file.set_len(size).map_err(io_err(path, "set_len"))
}

#[cfg(miri)]
fn preallocate_range(file: &File, path: &Path, _: u64, size: u64) -> PoolResult<()> {
    preallocate(file, path, size)
}

impl Pool {
    /// Creates a pool of `size` bytes (rounded up to 4 KiB) at `path`, or at
    /// [`default_pool_path`] when `path` is `None`. Never overwrites an existing file.
    pub fn create(path: Option<&Path>, size: u64, opts: &PoolOptions) -> PoolResult<Pool> {
        let size = Self::validate_new(size, opts)?;
        let max_size = Self::validate_max(size, opts)?;
        let path = path
            .map(Path::to_path_buf)
            .unwrap_or_else(|| default_pool_path(&opts.layout));
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .open(&path)
            .map_err(|e| match e.kind() {
                std::io::ErrorKind::AlreadyExists => {
                    PoolError::AlreadyExists { path: path.clone() }
                }
                _ => PoolError::Io {
                    path: path.clone(),
                    op: "create",
                    source: e,
                },
            })?;
        let made = (|| {
            lock_exclusive(&file, &path)?;
            preallocate(&file, &path, size)?;
            let mut header = Self::new_header(size, opts);
            header.max_size = max_size;
            // The magic goes last, so a crash during creation leaves "not a pool", never a pool
            // with a half-written header.
            let mut bytes = header.encode();
            let magic: [u8; 8] = bytes[..8].try_into().unwrap();
            bytes[..8].fill(0);
            file.write_all_at(&bytes, 0)
                .map_err(io_err(&path, "write header"))?;
            file.sync_data().map_err(io_err(&path, "fdatasync"))?;
            file.write_all_at(&magic, 0)
                .map_err(io_err(&path, "write header"))?;
            file.sync_data().map_err(io_err(&path, "fdatasync"))?;
            let reserve = header.max_size.unwrap_or(size);
            let map = Mapping::map_file(&file, &path, size, true, reserve)?;
            Self::assemble(map, header, Some(path.clone()), Some(file), opts)
        })();
        match &made {
            Err(_) => {
                let _ = std::fs::remove_file(&path);
            }
            Ok(_) if opts.remove_on_drop => super::scratch::register(&path),
            Ok(_) => {}
        }
        made
    }

    /// Opens an existing pool for writing, taking its lock. Refuses, without writing a byte, a file
    /// that is not a pool, is truncated, has a bad header, an unknown version, a size that disagrees
    /// with its header, another layout than `opts.layout`, or another persistence domain than the
    /// one it was created for (unless `opts.allow_domain_change`).
    pub fn open(path: &Path, opts: &PoolOptions) -> PoolResult<Pool> {
        let (file, header) = Self::open_and_validate(path, true)?;
        Self::check_layout(path, &header, &opts.layout)?;
        Self::check_domain_matches(path, &header, opts)?;
        Self::check_domain_fits(opts, false)?;
        Self::drop_interrupted_growth(&file, path, &header)?;
        let reserve = header.max_size.unwrap_or(header.size);
        let map = Mapping::map_file(&file, path, header.size, true, reserve)?;
        Self::assemble(map, header, Some(path.to_path_buf()), Some(file), opts)
    }

    /// A growable pool's file may be longer than its recorded size: a crash came after the file
    /// was extended and before the new size was durable (see [`Pool::grow`]). Nothing was ever
    /// stored in those bytes (pages beyond the recorded size are handed out only after it is
    /// durable), so they are cut off, and the file is as before the interrupted growth.
    fn drop_interrupted_growth(file: &File, path: &Path, header: &Header) -> PoolResult<()> {
        let file_len = file.metadata().map_err(io_err(path, "stat"))?.len();
        if file_len > header.size {
            file.set_len(header.size)
                .map_err(io_err(path, "truncate after an interrupted growth"))?;
            file.sync_all().map_err(io_err(path, "fsync"))?;
        }
        Ok(())
    }

    /// Opens a pool for inspection: as [`Pool::open`] (writable mapping, so `MAP_SYNC` is tried,
    /// and the lock is taken), but whatever its layout. Nothing is written unless the caller writes.
    pub fn open_any_layout(path: &Path, domain: PersistenceDomain) -> PoolResult<Pool> {
        let (file, header) = Self::open_and_validate(path, true)?;
        let opts = PoolOptions::new(&header.layout.clone(), domain);
        Self::drop_interrupted_growth(&file, path, &header)?;
        let reserve = header.max_size.unwrap_or(header.size);
        let map = Mapping::map_file(&file, path, header.size, true, reserve)?;
        Self::assemble(map, header, Some(path.to_path_buf()), Some(file), &opts)
    }

    /// Reads and validates a pool's header without mapping or locking the file (what `Db::open`,
    /// `pmtx recover` and `pmtx check` use to learn the engine and domain a pool was made for).
    pub fn read_header(path: &Path) -> PoolResult<Header> {
        Self::open_and_validate(path, false).map(|(_, h)| h)
    }

    /// Opens a private, copy-on-write view of a pool file for checking (`pmtx check`): the file is
    /// opened read-only and mapped `MAP_PRIVATE`, so recovery can run on the view while no byte
    /// can reach the file; no lock is taken, so this works on a pool another process has open
    /// (which then is seen as a crash image, not necessarily a consistent one). The view's domain
    /// is the one the pool was created for.
    pub fn open_private_view(path: &Path) -> PoolResult<Pool> {
        let (file, header) = Self::open_and_validate(path, false)?;
        let map = Mapping::map_file_private(&file, path, header.size)?;
        let opts = PoolOptions::new(&header.layout.clone(), header.domain);
        Self::assemble(map, header, Some(path.to_path_buf()), None, &opts)
    }

    /// Opens a pool read-only, without its lock and whatever its layout (for `pmtx inspect`).
    /// Any write through the returned pool panics.
    pub fn open_read_only(path: &Path) -> PoolResult<Pool> {
        let (file, header) = Self::open_and_validate(path, false)?;
        let map = Mapping::map_file(&file, path, header.size, false, header.size)?;
        let opts = PoolOptions::new(&header.layout.clone(), PersistenceDomain::Volatile);
        let mut pool = Self::assemble(map, header, Some(path.to_path_buf()), None, &opts)?;
        pool.read_only = true;
        Ok(pool)
    }

    /// Creates a pool in DRAM (nothing outlives the process): for the volatile engine, for tests,
    /// and under Miri.
    pub fn create_in_memory(size: u64, opts: &PoolOptions) -> PoolResult<Pool> {
        let size = Self::validate_new(size, opts)?;
        Self::check_domain_fits(opts, true)?;
        if opts.max_size.is_some() {
            return Err(PoolError::InvalidArgument(
                "an in-memory pool cannot grow (growth extends and maps the pool file): give it \
                 its full size, or a file"
                    .into(),
            ));
        }
        let header = Self::new_header(size, opts);
        let map = Mapping::heap(size)?;
        map.store(0, &header.encode());
        Self::assemble(map, header, None, None, opts)
    }

    /// Opens a pool held in memory, such as a crash image, validating it as [`Pool::open`] would.
    pub fn from_image(bytes: &[u8], opts: &PoolOptions) -> PoolResult<Pool> {
        let name = Path::new("<in-memory image>");
        let header = Header::decode(name, bytes, bytes.len() as u64)?;
        Self::check_size(name, &header)?;
        Self::check_layout(name, &header, &opts.layout)?;
        Self::check_domain_matches(name, &header, opts)?;
        Self::check_domain_fits(opts, true)?;
        // An image of a growable pool may be longer than its recorded size (an interrupted
        // growth): those bytes are not part of the pool.
        let map = Mapping::heap_copy(&bytes[..header.size as usize])?;
        Self::assemble(map, header, None, None, opts)
    }

    fn validate_new(size: u64, opts: &PoolOptions) -> PoolResult<u64> {
        Header::validate_layout(&opts.layout)?;
        let rounded = size
            .checked_add(4095)
            .map(|s| s & !4095)
            .ok_or_else(|| PoolError::InvalidArgument(format!("pool size {size} is too large")))?;
        if rounded < MIN_POOL_SIZE {
            return Err(PoolError::InvalidArgument(format!(
                "pool size {size} is below the minimum of {MIN_POOL_SIZE} bytes"
            )));
        }
        if rounded > MAX_POOL_SIZE {
            return Err(PoolError::InvalidArgument(format!(
                "pool size {size} is above the maximum of {MAX_POOL_SIZE} bytes (64 TiB)"
            )));
        }
        Self::check_domain_fits(opts, false)?;
        Ok(rounded)
    }

    /// The maximum size, if any, rounded up to 4 KiB: at least the pool's (rounded) size and at
    /// most [`MAX_POOL_SIZE`].
    fn validate_max(size: u64, opts: &PoolOptions) -> PoolResult<Option<u64>> {
        let Some(max) = opts.max_size else {
            return Ok(None);
        };
        match max.checked_add(4095).map(|m| m & !4095) {
            Some(rounded) if rounded >= size && rounded <= MAX_POOL_SIZE => Ok(Some(rounded)),
            _ => Err(PoolError::InvalidArgument(format!(
                "maximum pool size {max} must be from the pool size ({size} bytes) up to \
                 {MAX_POOL_SIZE} bytes (64 TiB)"
            ))),
        }
    }

    fn check_domain_fits(opts: &PoolOptions, in_memory: bool) -> PoolResult<()> {
        if in_memory && opts.domain == PersistenceDomain::Msync {
            return Err(PoolError::InvalidArgument(
                "the msync domain needs a pool file; an in-memory pool has nothing to msync".into(),
            ));
        }
        if opts.crash_sim.is_some() && !opts.domain.is_durable() {
            return Err(PoolError::InvalidArgument(
                "crash simulation needs a durable domain (adr, eadr or msync), not volatile".into(),
            ));
        }
        Ok(())
    }

    fn check_domain_matches(path: &Path, header: &Header, opts: &PoolOptions) -> PoolResult<()> {
        if header.domain != opts.domain && !opts.allow_domain_change {
            return Err(PoolError::DomainMismatch {
                path: path.to_path_buf(),
                recorded: header.domain,
                requested: opts.domain,
            });
        }
        Ok(())
    }

    fn new_header(size: u64, opts: &PoolOptions) -> Header {
        let created_unix_ns = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(0);
        Header {
            version: FORMAT_VERSION,
            uuid: uuid::Uuid::new_v4(),
            size,
            initial_size: size,
            max_size: opts.max_size,
            created_unix_ns,
            layout: opts.layout.clone(),
            domain: opts.domain,
        }
    }

    fn open_and_validate(path: &Path, writable: bool) -> PoolResult<(File, Header)> {
        match std::fs::metadata(path) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Err(PoolError::NotFound {
                    path: path.to_path_buf(),
                })
            }
            Ok(meta) if meta.is_dir() => {
                return Err(PoolError::IsADirectory {
                    path: path.to_path_buf(),
                })
            }
            Ok(meta) if !meta.is_file() => {
                return Err(PoolError::NotAPool {
                    path: path.to_path_buf(),
                })
            }
            _ => {}
        }
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(writable)
            .open(path)
            .map_err(|e| match e.kind() {
                std::io::ErrorKind::NotFound => PoolError::NotFound {
                    path: path.to_path_buf(),
                },
                _ => PoolError::Io {
                    path: path.to_path_buf(),
                    op: "open",
                    source: e,
                },
            })?;
        let meta = file.metadata().map_err(io_err(path, "stat"))?;
        if !meta.is_file() {
            return Err(PoolError::NotAPool {
                path: path.to_path_buf(),
            });
        }
        if writable {
            lock_exclusive(&file, path)?;
        }
        let file_len = meta.len();
        let mut first = vec![0u8; file_len.min(RESERVED_BYTES) as usize];
        file.read_exact_at(&mut first, 0)
            .map_err(io_err(path, "read header"))?;
        let header = Header::decode(path, &first, file_len)?;
        Self::check_size(path, &header)?;
        Ok((file, header))
    }

    /// A header whose size (checksummed, and equal to the file's) is below the minimum would
    /// leave the root word outside the mapping.
    fn check_size(path: &Path, header: &Header) -> PoolResult<()> {
        if header.size < MIN_POOL_SIZE {
            return Err(PoolError::Truncated {
                path: path.to_path_buf(),
                expected: MIN_POOL_SIZE,
                actual: header.size,
            });
        }
        Ok(())
    }

    fn check_layout(path: &Path, header: &Header, expected: &str) -> PoolResult<()> {
        if header.layout != expected {
            return Err(PoolError::LayoutMismatch {
                path: path.to_path_buf(),
                expected: expected.to_string(),
                found: header.layout.clone(),
            });
        }
        Ok(())
    }

    fn assemble(
        map: Mapping,
        header: Header,
        path: Option<PathBuf>,
        file: Option<File>,
        opts: &PoolOptions,
    ) -> PoolResult<Pool> {
        let sim = opts
            .crash_sim
            .map(|s| Arc::new(CrashSim::new(opts.domain, &map, s.trigger, s.on_crash)));
        let media = opts
            .media
            .map(|m| Media::new(m, opts.domain))
            .transpose()
            .map_err(PoolError::InvalidArgument)?;
        Ok(Pool {
            media,
            read_only: false,
            map,
            header,
            path,
            domain: opts.domain,
            flush_insn: cpu::flush_instruction(),
            counting: opts.counting,
            sim,
            msync_dirty: parking_lot::Mutex::new(Vec::new()),
            remove_on_drop: opts.remove_on_drop,
            file,
            grow_lock: parking_lot::Mutex::new(()),
        })
    }

    // ---- facts ----

    /// Pool size in bytes (grows with [`Pool::grow`]).
    pub fn len(&self) -> u64 {
        self.map.len()
    }

    /// The size the pool may grow to (`None`: a fixed-size pool).
    pub fn max_size(&self) -> Option<u64> {
        self.header.max_size
    }

    /// Whether the pool was opened read-only.
    pub fn is_read_only(&self) -> bool {
        self.read_only
    }

    /// Grows the pool to `new_len` bytes (a multiple of 4 KiB, at most [`Pool::max_size`]);
    /// nothing to do when it already is that large. Crash-safe and safe to call while other
    /// threads read and write the pool: the base address never moves (the maximum's address
    /// space was reserved at open), and existing bytes are not touched.
    ///
    /// Steps, each durable before the next: (1) the file is extended (`posix_fallocate`, then
    /// `fsync`, so the new length survives a power failure); (2) the extension is mapped in place
    /// right after the current mapping; (3) the new size is stored in the header's size word and
    /// persisted. A crash before (3) leaves the old size in the header and a file that may be
    /// longer: the next open cuts the extra bytes off. Only after `grow` returns may the caller
    /// hand out the new bytes (the page manager publishes its new pages then), so nothing is ever
    /// written beyond the durable size.
    ///
    /// Refused ([`PoolError::GrowFailed`], the pool unchanged) for a fixed-size pool, beyond the
    /// maximum, for an in-memory pool or crash image (no file to extend), with a crash simulator
    /// attached (it models a fixed-size image), and when the file system has no room.
    pub fn grow(&self, new_len: u64) -> PoolResult<()> {
        let _serial = self.grow_lock.lock();
        let old = self.len();
        if new_len <= old {
            return Ok(());
        }
        let fail = |reason: &str| PoolError::GrowFailed {
            path: self
                .path
                .clone()
                .unwrap_or_else(|| PathBuf::from("<in-memory>")),
            from: old,
            to: new_len,
            reason: reason.to_string(),
        };
        let Some(max) = self.header.max_size else {
            return Err(fail(
                "it is a fixed-size pool (created without a maximum size)",
            ));
        };
        if new_len > max {
            return Err(fail(&format!("its maximum size is {max} bytes")));
        }
        if new_len % 4096 != 0 {
            return Err(fail("pool sizes are multiples of 4 KiB"));
        }
        if self.sim.is_some() {
            return Err(fail(
                "a crash simulator is attached, and it models a fixed-size pool (growth is not \
                 simulated; crash-test growth with real files)",
            ));
        }
        if self.read_only {
            return Err(fail("the pool is open read-only"));
        }
        let (Some(file), Some(path)) = (&self.file, &self.path) else {
            return Err(fail(
                "an in-memory pool or crash image has no file to extend",
            ));
        };
        if !self.map.can_extend_to(new_len) {
            return Err(fail("the mapping has no address space reserved for growth"));
        }
        preallocate_range(file, path, old, new_len).map_err(|e| match e {
            PoolError::NoSpace { .. } => fail("its file system has no room"),
            other => other,
        })?;
        file.sync_all().map_err(io_err(path, "fsync"))?;
        self.map.extend(file, path, new_len)?;
        self.store_word_raw(SIZE_WORD, new_len);
        self.persist_raw(SIZE_WORD, 8);
        Ok(())
    }

    /// Always false: a pool has at least [`MIN_POOL_SIZE`] bytes.
    pub fn is_empty(&self) -> bool {
        false
    }

    /// The pool file, if the pool has one.
    pub fn path(&self) -> Option<&Path> {
        self.path.as_deref()
    }

    /// The header as decoded at open (its `size` is the size then; [`Pool::len`] is the size now).
    pub fn header(&self) -> &Header {
        &self.header
    }

    /// The persistence domain the pool was opened with.
    pub fn domain(&self) -> PersistenceDomain {
        self.domain
    }

    /// How the pool is mapped (DAX with `MAP_SYNC`, shared, read-only, heap).
    pub fn mapping_kind(&self) -> MappingKind {
        self.map.kind()
    }

    /// The flush instruction this pool issues.
    pub fn flush_instruction(&self) -> FlushInstruction {
        self.flush_insn
    }

    /// The media model (and latency emulation) attached, if any.
    pub fn media(&self) -> Option<MediaOptions> {
        self.media.as_ref().map(Media::options)
    }

    /// The crash simulator, if one is attached.
    pub fn crash_sim(&self) -> Option<&Arc<CrashSim>> {
        self.sim.as_ref()
    }

    /// After a simulated crash, unwinds this thread as its next PM event would (no-op before the
    /// crash and without a simulator). For waits on DRAM state that a thread which unwound at the
    /// crash may hold forever (a latch): the waiter reaches no PM event to unwind at otherwise.
    pub fn unwind_if_crashed(&self) {
        if let Some(sim) = self.sim.as_ref().filter(|s| s.has_crashed()) {
            sim.after_crash();
        }
    }

    /// Fails power now in the attached simulator (no-op without one). Later events are not recorded.
    pub fn crash_now(&self) {
        if let Some(sim) = &self.sim {
            sim.crash_now();
        }
    }

    /// The first offset the layers above may use.
    pub fn first_usable(&self) -> u64 {
        RESERVED_BYTES
    }

    /// The root offset recorded in the pool (0: none yet). Recovery starts from it.
    pub fn root(&self) -> u64 {
        self.map.word(ROOT_OFFSET_WORD).load(Ordering::Acquire)
    }

    /// Records `root` as the pool's root offset, durably (one atomic 8-byte store, then persist).
    pub fn set_root(&self, root: u64) -> PoolResult<()> {
        self.check_range(root, 0)?;
        self.assert_writable(ROOT_OFFSET_WORD, 8);
        self.store_word_raw(ROOT_OFFSET_WORD, root);
        self.persist_raw(ROOT_OFFSET_WORD, 8);
        Ok(())
    }

    /// A summary for `pmtx inspect`.
    pub fn info(&self) -> PoolInfo {
        let mut header = self.header.clone();
        header.size = self.len();
        PoolInfo {
            path: self.path.clone(),
            header,
            mapping: self.map.kind(),
            domain: self.domain,
            flush_instruction: self.flush_insn,
            root: self.root(),
        }
    }

    /// Checks that `[off, off + len)` lies in the pool's usable range, for offsets read from PM
    /// (which a corrupt pool could make anything).
    pub fn check_range(&self, off: u64, len: u64) -> PoolResult<()> {
        match off.checked_add(len) {
            Some(end) if off >= RESERVED_BYTES && end <= self.map.len() => Ok(()),
            _ => Err(PoolError::InvalidArgument(format!(
                "range {off}+{len} is outside the usable pool range {RESERVED_BYTES}..{}",
                self.map.len()
            ))),
        }
    }

    // ---- bounds ----

    #[inline(always)]
    fn assert_readable(&self, off: u64, len: u64) {
        match off.checked_add(len) {
            Some(end) if end <= self.map.len() => {}
            _ => out_of_range("read", off, len, self.map.len()),
        }
    }

    /// One past the last writable byte: the pool size, or 0 for a read-only pool.
    #[inline(always)]
    fn write_end(&self) -> u64 {
        if self.read_only {
            0
        } else {
            self.map.len()
        }
    }

    #[inline(always)]
    fn assert_writable(&self, off: u64, len: u64) {
        match off.checked_add(len) {
            Some(end) if end <= self.write_end() && off >= ROOT_OFFSET_WORD => {}
            _ => out_of_range_write(off, len, self.write_end()),
        }
    }

    #[inline(always)]
    fn assert_user_writable(&self, off: u64, len: u64) {
        if off < RESERVED_BYTES {
            out_of_range_write(off, len, self.write_end());
        }
        self.assert_writable(off, len);
    }

    #[inline(always)]
    fn assert_aligned(off: u64) {
        if off % 8 != 0 {
            misaligned(off);
        }
    }

    // ---- reads ----

    /// Reads the 8-byte word at `off` (8-byte aligned) with `ordering`.
    #[inline]
    pub fn load_u64(&self, off: u64, ordering: Ordering) -> u64 {
        self.assert_readable(off, 8);
        Self::assert_aligned(off);
        if let Some(m) = &self.media {
            m.read(off, 8);
        }
        self.map.word(off).load(ordering)
    }

    /// Reads the 8-byte word at `off` (8-byte aligned), relaxed.
    #[inline]
    pub fn read_u64(&self, off: u64) -> u64 {
        self.load_u64(off, Ordering::Relaxed)
    }

    /// Copies `dst.len()` bytes at `off` into `dst`.
    #[inline]
    pub fn read_bytes(&self, off: u64, dst: &mut [u8]) {
        self.assert_readable(off, dst.len() as u64);
        if let Some(m) = &self.media {
            m.read(off, dst.len() as u64);
        }
        self.map.load(off, dst);
    }

    /// Copies `dst.len()` 8-byte words at `off` (8-byte aligned) into `dst` (relaxed loads and
    /// stores): reads PM straight into a DRAM structure of atomic words (e.g. Zen's Met-Cache
    /// entry) without a bounce buffer.
    #[inline]
    pub fn read_words(&self, off: u64, dst: &[std::sync::atomic::AtomicU64]) {
        self.assert_readable(off, dst.len() as u64 * 8);
        Self::assert_aligned(off);
        if let Some(m) = &self.media {
            m.read(off, dst.len() as u64 * 8);
        }
        for (i, d) in dst.iter().enumerate() {
            d.store(
                self.map.word(off + i as u64 * 8).load(Ordering::Relaxed),
                Ordering::Relaxed,
            );
        }
    }

    /// Returns `len` bytes at `off` as a new vector.
    pub fn read_vec(&self, off: u64, len: usize) -> Vec<u8> {
        let mut v = vec![0u8; len];
        self.read_bytes(off, &mut v);
        v
    }

    /// Hints the CPU to start loading the lines of `[off, off + len)` (see [`super::prefetch`]):
    /// no architectural effect, not a PM event. For a reader that knows which PM bytes it will
    /// read shortly and has other work to overlap with the misses.
    #[inline]
    pub fn prefetch(&self, off: u64, len: u64) {
        if len == 0 {
            return;
        }
        self.assert_readable(off, len);
        if let Some(m) = &self.media {
            m.prefetch(off, len);
        }
        let first = off & !(CACHE_LINE - 1);
        for i in 0..Self::lines_of(off, len) {
            cpu::prefetch(self.map.ptr(first + i * CACHE_LINE));
        }
    }

    // ---- stores ----

    /// `Msync` domain: remembers a flushed range for the next fence's `msync`. Out of line, as
    /// [`simulated`] is, so that the flush of the other domains stays small enough to inline.
    #[cold]
    #[inline(never)]
    fn queue_msync(&self, off: u64, len: u64) {
        self.msync_dirty.lock().push((off, len));
    }

    /// `Msync` domain, at a fence: `msync`s every range flushed since the last one.
    #[cold]
    #[inline(never)]
    fn msync_queued(&self) {
        let dirty = std::mem::take(&mut *self.msync_dirty.lock());
        for (off, len) in dirty {
            if let Err(e) = self.map.msync(off, len) {
                // A failed msync means the durability promise cannot be kept: stop loudly
                // rather than report a commit that is not durable.
                panic!("msync of pool {:?} failed: {e}", self.path);
            }
        }
    }

    /// Runs one store event: through the simulator when attached, else directly.
    #[inline(always)]
    fn store_event(&self, off: u64, len: u64, apply: impl FnOnce() -> bool) {
        match &self.sim {
            None => {
                apply();
            }
            Some(sim) => simulated(sim, &self.map, Event::Store, off, len, apply),
        }
        if self.counting {
            stats::count_write(len);
        }
        if let Some(m) = &self.media {
            m.store(off, len);
        }
    }

    /// Stores the 8-byte word `value` at `off` (8-byte aligned). Aligned 8-byte stores are never
    /// torn by a crash.
    #[inline]
    pub fn write_u64(&self, off: u64, value: u64) {
        self.store_u64(off, value, Ordering::Relaxed)
    }

    /// Stores the 8-byte word `value` at `off` (8-byte aligned) with `ordering`.
    #[inline]
    pub fn store_u64(&self, off: u64, value: u64, ordering: Ordering) {
        self.assert_user_writable(off, 8);
        Self::assert_aligned(off);
        let word = self.map.word(off);
        self.store_event(off, 8, || {
            word.store(value, ordering);
            true
        });
    }

    /// Stores the 8-byte word `value` at `off` (8-byte aligned) as an *ordering point*: every PM
    /// store the code makes before this call is emitted before it, and every store after it is
    /// emitted after it (a compiler fence on each side, and a Release store, so other threads
    /// that acquire the word also see the earlier stores).
    ///
    /// Under eADR every executed store is durable and x86 executes ordinary stores in program
    /// order (TSO), so program order *is* persistence order; but a Relaxed store or a plain copy
    /// may be moved by the compiler across other stores to different addresses. Use this for a
    /// word whose persistence must follow the stores before it and precede those after it: a
    /// commit mark after its log entries and before the in-place updates it covers, a timestamp
    /// after the data it vouches for, an invalidation before the bytes it stops covering. Under
    /// ADR flushes and fences still decide durability; this only fixes the order of the stores.
    /// Non-temporal stores ([`write_bytes_nt`](Pool::write_bytes_nt)) are not ordered by it:
    /// they need a [`fence`](Pool::fence).
    ///
    /// No run-time cost: a compiler fence emits no instruction and a Release store is a plain
    /// `mov` on x86.
    #[inline]
    pub fn write_u64_ordered(&self, off: u64, value: u64) {
        std::sync::atomic::compiler_fence(Ordering::SeqCst);
        self.store_u64(off, value, Ordering::Release);
        std::sync::atomic::compiler_fence(Ordering::SeqCst);
    }

    /// Copies `src` to PM at `off`.
    #[inline]
    pub fn write_bytes(&self, off: u64, src: &[u8]) {
        self.assert_user_writable(off, src.len() as u64);
        self.store_event(off, src.len() as u64, || {
            self.map.store(off, src);
            true
        });
    }

    /// Copies `src` to PM at `off` with non-temporal (streaming) stores, for data the writer will
    /// not read back soon (e.g. a new out-of-place version): the destination lines are not read
    /// first and no flush is needed. The bytes are durable after the calling thread's next
    /// [`fence`], and not before, under ADR *and* eADR: until then they sit in write-combining
    /// buffers, so a crash may keep any subset of them, in any order, and a later ordinary store
    /// (e.g. a commit mark) may reach PM first. The crash simulator models exactly that (one
    /// event; each 8-byte piece pending on its own until the thread's fence). Counted as a write
    /// and a flush of the range.
    ///
    /// Until that fence the streaming stores are not ordered with later stores, even for other
    /// threads' loads: a caller that publishes the data (a lock release, an index update, a
    /// commit mark) must fence in between. Bytes of `[off, off + len)` not covered by whole aligned 8-byte words
    /// are stored normally and flushed. The volatile domain stores normally (nothing to persist);
    /// `Msync`, the simulator and targets without streaming stores store and flush.
    ///
    /// [`fence`]: Pool::fence
    #[inline]
    pub fn write_bytes_nt(&self, off: u64, src: &[u8]) {
        let len = src.len() as u64;
        self.assert_user_writable(off, len);
        if len == 0 {
            return;
        }
        let native = self.sim.is_none()
            && matches!(
                self.domain,
                PersistenceDomain::Adr | PersistenceDomain::Eadr
            )
            && self.flush_insn != FlushInstruction::None;
        if !native {
            if let Some(sim) = &self.sim {
                let apply = || {
                    self.map.store(off, src);
                    true
                };
                if let Err(apply) = sim.record(&self.map, Event::StoreNonTemporal, off, len, apply)
                {
                    sim.after_crash();
                    apply();
                }
                if self.counting {
                    stats::count_write(len);
                    stats::count_flush(Self::lines_of(off, len));
                }
                if let Some(m) = &self.media {
                    m.store_non_temporal(off, len);
                }
            } else {
                // Ordinary stores and a flush, which the media model sees as such.
                self.write_bytes(off, src);
                self.flush(off, len);
            }
            return;
        }
        // SAFETY: `[off, off + len)` was bounds-checked above against the writable range of the
        // live mapping, which is shared memory no Rust reference covers (all access goes through
        // raw pointers and atomics), and `src` is a Rust slice, so not inside the mapping.
        let (head, tail) = unsafe { cpu::stream_copy(self.map.ptr(off), src) };
        if head > 0 {
            self.flush_native(off, head as u64);
        }
        if tail > 0 {
            self.flush_native(off + len - tail as u64, tail as u64);
        }
        if self.counting {
            stats::count_write(len);
            stats::count_flush(Self::lines_of(off, len));
        }
        if let Some(m) = &self.media {
            m.store_non_temporal(off, len);
        }
    }

    #[inline(always)]
    fn lines_of(off: u64, len: u64) -> u64 {
        let first = off & !(CACHE_LINE - 1);
        (off + len - first).div_ceil(CACHE_LINE)
    }

    /// Writes back the lines of a range already bounds-checked (no simulator, no counting).
    #[inline(always)]
    fn flush_native(&self, off: u64, len: u64) {
        let first = off & !(CACHE_LINE - 1);
        for i in 0..Self::lines_of(off, len) {
            // SAFETY: the caller bounds-checked `[off, off + len)`, so every line start from
            // `first` up to `off + len` lies in the live mapping.
            unsafe { cpu::flush_line(self.flush_insn, self.map.ptr(first + i * CACHE_LINE)) };
        }
    }

    /// Sets `len` bytes at `off` to `byte`.
    pub fn fill(&self, off: u64, byte: u8, len: u64) {
        self.assert_user_writable(off, len);
        self.store_event(off, len, || {
            self.map.fill(off, byte, len);
            true
        });
    }

    /// Copies `len` bytes from `src` to `dst`, both in this pool (the ranges may overlap).
    pub fn copy(&self, src: u64, dst: u64, len: u64) {
        self.assert_readable(src, len);
        self.assert_user_writable(dst, len);
        if let Some(m) = &self.media {
            m.read(src, len);
        }
        self.store_event(dst, len, || {
            self.map.copy_within(src, dst, len);
            true
        });
    }

    /// Compare-and-swap of the word at `off` (8-byte aligned): `Ok(previous)` when it held
    /// `current` and now holds `new`, else `Err(actual)`. Acquire-release ordering.
    #[inline]
    pub fn cas_u64(&self, off: u64, current: u64, new: u64) -> Result<u64, u64> {
        self.assert_user_writable(off, 8);
        Self::assert_aligned(off);
        let word = self.map.word(off);
        let mut result = Err(current);
        self.store_event(off, 8, || {
            result = word.compare_exchange(current, new, Ordering::AcqRel, Ordering::Acquire);
            result.is_ok()
        });
        result
    }

    /// Adds `delta` (wrapping) to the word at `off` (8-byte aligned); returns the previous value.
    #[inline]
    pub fn fetch_add_u64(&self, off: u64, delta: u64) -> u64 {
        self.rmw_u64(off, |w| w.fetch_add(delta, Ordering::AcqRel))
    }

    /// ORs `bits` into the word at `off`; returns the previous value.
    #[inline]
    pub fn fetch_or_u64(&self, off: u64, bits: u64) -> u64 {
        self.rmw_u64(off, |w| w.fetch_or(bits, Ordering::AcqRel))
    }

    /// ANDs `bits` into the word at `off`; returns the previous value.
    #[inline]
    pub fn fetch_and_u64(&self, off: u64, bits: u64) -> u64 {
        self.rmw_u64(off, |w| w.fetch_and(bits, Ordering::AcqRel))
    }

    #[inline(always)]
    fn rmw_u64(&self, off: u64, op: impl FnOnce(&std::sync::atomic::AtomicU64) -> u64) -> u64 {
        self.assert_user_writable(off, 8);
        Self::assert_aligned(off);
        let word = self.map.word(off);
        let mut previous = 0;
        self.store_event(off, 8, || {
            previous = op(word);
            true
        });
        previous
    }

    fn store_word_raw(&self, off: u64, value: u64) {
        let word = self.map.word(off);
        self.store_event(off, 8, || {
            word.store(value, Ordering::Release);
            true
        });
    }

    // ---- persistence ----

    /// Writes back the cache lines covering `[off, off + len)`: durable after the next [`fence`].
    /// Under eADR the lines are already durable and this is a write-combining hint (Falcon §4.3);
    /// under `Msync` the pages are queued for the next fence's `msync`; volatile: nothing.
    ///
    /// [`fence`]: Pool::fence
    #[inline]
    pub fn flush(&self, off: u64, len: u64) {
        if len == 0 || self.domain == PersistenceDomain::Volatile {
            return;
        }
        self.assert_readable(off, len);
        let first = off & !(CACHE_LINE - 1);
        let lines = (off + len - first).div_ceil(CACHE_LINE);
        if let Some(sim) = &self.sim {
            simulated(sim, &self.map, Event::Flush, off, len, || false);
        } else {
            match self.domain {
                PersistenceDomain::Msync => self.queue_msync(off, len),
                _ => {
                    for i in 0..lines {
                        // SAFETY: the range was bounds-checked above, so every line start
                        // from `first` up to `off + len` lies in the live mapping.
                        unsafe {
                            cpu::flush_line(self.flush_insn, self.map.ptr(first + i * CACHE_LINE))
                        };
                    }
                }
            }
        }
        if self.counting {
            stats::count_flush(lines);
        }
        if let Some(m) = &self.media {
            m.flush(off, len);
        }
    }

    /// Orders earlier flushes and stores (non-temporal ones included) before later stores
    /// (`sfence`, and a compiler fence); under ADR this is what makes flushed lines durable, and
    /// under both ADR and eADR what makes the calling thread's non-temporal stores durable.
    /// Under `Msync` it `msync`s every page flushed since the last fence. Volatile: a compiler
    /// fence only.
    #[inline]
    pub fn fence(&self) {
        if self.domain == PersistenceDomain::Volatile {
            std::sync::atomic::compiler_fence(Ordering::SeqCst);
            return;
        }
        if let Some(sim) = &self.sim {
            simulated(sim, &self.map, Event::Fence, 0, 0, || false);
        } else if self.domain == PersistenceDomain::Msync {
            self.msync_queued();
        } else {
            cpu::store_fence();
            // `sfence` is also a compiler barrier here (the intrinsic touches memory); say so
            // explicitly, since under eADR the order of the stores around it is their
            // persistence order.
            std::sync::atomic::compiler_fence(Ordering::SeqCst);
        }
        if self.counting {
            stats::count_fence();
        }
        if let Some(m) = &self.media {
            m.fence();
        }
    }

    /// Makes `[off, off + len)` durable before returning: flush then fence under ADR and `Msync`.
    /// Under eADR stores are durable once visible and x86 keeps them in program order, so only the
    /// compiler is fenced; volatile does nothing.
    #[inline]
    pub fn persist(&self, off: u64, len: u64) {
        match self.domain {
            PersistenceDomain::Adr | PersistenceDomain::Msync => {
                self.flush(off, len);
                self.fence();
            }
            PersistenceDomain::Eadr | PersistenceDomain::Volatile => {
                std::sync::atomic::compiler_fence(Ordering::SeqCst);
            }
        }
    }

    fn persist_raw(&self, off: u64, len: u64) {
        self.persist(off, len)
    }
}

impl Drop for Pool {
    fn drop(&mut self) {
        if self.remove_on_drop {
            if let Some(path) = &self.path {
                let _ = std::fs::remove_file(path);
                super::scratch::unregister(path);
            }
        }
    }
}

impl std::fmt::Debug for Pool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pool")
            .field("path", &self.path)
            .field("size", &self.map.len())
            .field("layout", &self.header.layout)
            .field("domain", &self.domain)
            .field("mapping", &self.map.kind())
            .field("crash_sim", &self.sim.is_some())
            .finish()
    }
}

#[cold]
#[inline(never)]
fn out_of_range(what: &str, off: u64, len: u64, size: u64) -> ! {
    panic!("PM {what} of {len} bytes at offset {off} is outside the pool (size {size})")
}

/// Runs a store, flush or fence event through the crash simulator (`apply` does a store's
/// effect; flushes and fences pass one that does nothing). Out of line and cold: with no
/// simulator attached, the PM accessors stay small enough to inline into their callers.
#[cold]
#[inline(never)]
fn simulated(
    sim: &CrashSim,
    map: &Mapping,
    event: Event,
    off: u64,
    len: u64,
    apply: impl FnOnce() -> bool,
) {
    if let Err(apply) = sim.record(map, event, off, len, apply) {
        sim.after_crash();
        // OnCrash::Continue: the program goes on against the live image, unrecorded.
        apply();
    }
}

#[cold]
#[inline(never)]
fn out_of_range_write(off: u64, len: u64, write_end: u64) -> ! {
    if write_end == 0 {
        panic!("PM write at offset {off}: the pool is open read-only")
    }
    panic!(
        "PM write of {len} bytes at offset {off} is outside the writable range {RESERVED_BYTES}..{write_end}"
    )
}

#[cold]
#[inline(never)]
fn misaligned(off: u64) -> ! {
    panic!("PM word access at offset {off} is not 8-byte aligned")
}
