//! The memory behind a pool: a shared file mapping (`MAP_SYNC` when the file system offers DAX) or
//! an aligned heap buffer (in-memory pools, crash images, Miri). This file and `cpu.rs` hold the
//! pmem layer's raw-pointer `unsafe`; `Pool` builds a safe, bounds-checked API on top.

use super::error::{PoolError, PoolResult};
use std::fs::File;
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};

/// How the pool's bytes are held.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum MappingKind {
    /// `mmap(MAP_SHARED_VALIDATE | MAP_SYNC)`: a DAX file system, stores reach the media directly.
    DaxSync,
    /// `mmap(MAP_SHARED)` of a regular (or tmpfs) file: page cache between the CPU and the file.
    Shared,
    /// Read-only `mmap(MAP_SHARED)`, for inspection.
    ReadOnly,
    /// `mmap(MAP_PRIVATE)` of a file opened read-only: a copy-on-write view for `pmtx check`;
    /// stores stay in this process.
    Private,
    /// A heap buffer: nothing outlives the process.
    Heap,
}

/// A mapped (or allocated) range of bytes, unmapped or freed on drop.
///
/// A file mapping may own more address space than it maps (`reserved` > `len`): the whole range
/// is reserved `PROT_NONE` up front and the file is mapped over its prefix, so the mapping can
/// grow in place ([`Mapping::extend`]) and its base, hence every pointer into it, never moves.
pub(crate) struct Mapping {
    base: *mut u8,
    /// Bytes mapped and usable; only grows (under the pool's growth lock), published with
    /// Release after the extension is mapped.
    len: AtomicUsize,
    /// Bytes of address space owned from `base` (unmapped on drop).
    reserved: usize,
    /// Nonzero after an extension failed: `[len, lost_until)` may have been unmapped by the failed
    /// call and handed to someone else since, so it is no longer ours to unmap (or to grow into).
    lost_until: AtomicUsize,
    /// `mmap` flags of the file mapping, reused for its extensions.
    flags: i32,
    kind: MappingKind,
}

// SAFETY: the mapping is plain memory owned by this value; the pool's API synchronises access to it
// (atomic words, or exclusive ownership of ranges granted by the layers above).
unsafe impl Send for Mapping {}
// SAFETY: as above; shared references only read, or write through atomics / caller-owned ranges.
unsafe impl Sync for Mapping {}

const HEAP_ALIGN: usize = 4096;

impl Mapping {
    /// Maps `len` bytes of `file` shared, trying `MAP_SYNC` first. With `reserve` > `len` (a
    /// growable pool, writable only) the mapping owns `reserve` bytes of address space so that
    /// [`Mapping::extend`] can map more of the file right after it.
    #[cfg(not(miri))]
    pub(crate) fn map_file(
        file: &File,
        path: &Path,
        len: u64,
        writable: bool,
        reserve: u64,
    ) -> PoolResult<Mapping> {
        use std::os::fd::AsRawFd;
        let too_big =
            |n: u64| PoolError::InvalidArgument(format!("pool size {n} does not fit in memory"));
        let len_u = usize::try_from(len).map_err(|_| too_big(len))?;
        let reserved = usize::try_from(reserve.max(len)).map_err(|_| too_big(reserve))?;
        let fd = file.as_raw_fd();
        let prot = if writable {
            libc::PROT_READ | libc::PROT_WRITE
        } else {
            libc::PROT_READ
        };
        let io = |op| PoolError::Io {
            path: path.to_path_buf(),
            op,
            source: std::io::Error::last_os_error(),
        };
        // The flags are settled before anything is mapped over a reservation: a file system
        // that refuses MAP_SYNC may do so only after the kernel has unmapped the target range
        // (ext4 and xfs without DAX check in their `mmap` method), so a refused MAP_FIXED try
        // would leave a hole in the reservation for another thread's mmap (a malloc arena, say)
        // to land in, and the retry would then map the pool over it.
        let (flags, kind) = if !writable {
            (libc::MAP_SHARED, MappingKind::ReadOnly)
        } else if accepts_map_sync(fd, prot) {
            (
                libc::MAP_SHARED_VALIDATE | libc::MAP_SYNC,
                MappingKind::DaxSync,
            )
        } else {
            (libc::MAP_SHARED, MappingKind::Shared)
        };
        // Without growth the kernel picks the address; with it, the whole range is reserved
        // first (no access, no memory committed) and the file goes over its prefix.
        let (hint, fixed) = if reserved > len_u && writable {
            let r = reserve_address_space(reserved)
                .ok_or_else(|| io("reserve address space (mmap)"))?;
            (r, libc::MAP_FIXED)
        } else {
            (std::ptr::null_mut(), 0)
        };
        let reserved = if fixed != 0 { reserved } else { len_u };
        // SAFETY: either a fresh mapping at an address of the kernel's choosing, or (MAP_FIXED)
        // one over the start of the PROT_NONE reservation made above, which this function owns
        // and nothing references; `fd` is open with the access `prot` needs and the file is at
        // least `len` bytes long.
        let p = unsafe { libc::mmap(hint, len_u, prot, flags | fixed, fd, 0) };
        if p == libc::MAP_FAILED {
            let err = io("mmap");
            if fixed != 0 {
                // Only the tail is certainly still ours: the failed call may have unmapped the
                // head, and another thread may already have been given it. The head's address
                // space (at most `len` bytes, on this error path only) is left alone.
                // SAFETY: `[hint + len, hint + reserved)` is the part of the reservation made
                // above that the failed mmap did not cover; nothing references it.
                unsafe { libc::munmap(hint.cast::<u8>().add(len_u).cast(), reserved - len_u) };
            }
            return Err(err);
        }
        Ok(Mapping {
            base: p.cast(),
            len: AtomicUsize::new(len_u),
            reserved,
            lost_until: AtomicUsize::new(0),
            flags,
            kind,
        })
    }

    /// Whether [`Mapping::extend`] can map up to `len` bytes.
    pub(crate) fn can_extend_to(&self, len: u64) -> bool {
        matches!(self.kind, MappingKind::DaxSync | MappingKind::Shared)
            && len <= self.reserved as u64
            && self.lost_until.load(Ordering::Relaxed) == 0
    }

    /// Maps bytes `[len(), new_len)` of `file` (already that long) right after the current
    /// mapping, inside its reservation, then publishes the new length. The caller serialises
    /// calls and has checked [`Mapping::can_extend_to`]. Existing bytes are not touched, so
    /// other threads keep reading and writing them meanwhile.
    #[cfg(not(miri))]
    pub(crate) fn extend(&self, file: &File, path: &Path, new_len: u64) -> PoolResult<()> {
        use std::os::fd::AsRawFd;
        let old = self.len.load(Ordering::Acquire);
        let new = new_len as usize;
        assert!(self.can_extend_to(new_len) && new > old && old % 4096 == 0);
        // SAFETY: `[base + old, base + new)` lies inside this mapping's PROT_NONE reservation
        // (new ≤ reserved), which no reference covers (bounds checks stop every access at
        // `len` = old); MAP_FIXED replaces exactly that range with bytes `old..new` of the file,
        // which is at least `new` bytes long; `old` is page aligned as mmap requires.
        let p = unsafe {
            libc::mmap(
                self.base.add(old).cast(),
                new - old,
                libc::PROT_READ | libc::PROT_WRITE,
                self.flags | libc::MAP_FIXED,
                file.as_raw_fd(),
                old as libc::off_t,
            )
        };
        if p == libc::MAP_FAILED {
            // A failed MAP_FIXED may already have unmapped the range (see `map_file`): give it
            // up rather than unmap, at drop, a range another thread may have been given since.
            self.lost_until.store(new, Ordering::Relaxed);
            return Err(PoolError::Io {
                path: path.to_path_buf(),
                op: "mmap (growth)",
                source: std::io::Error::last_os_error(),
            });
        }
        self.len.store(new, Ordering::Release);
        Ok(())
    }

    /// Miri cannot map files.
    #[cfg(miri)]
    pub(crate) fn extend(&self, _: &File, path: &Path, _: u64) -> PoolResult<()> {
        Err(PoolError::Io {
            path: path.to_path_buf(),
            op: "mmap",
            source: std::io::Error::new(std::io::ErrorKind::Unsupported, "no mmap under Miri"),
        })
    }

    /// Maps `len` bytes of `file` private and copy-on-write: stores change this process's copy of
    /// a page and never the file (`file` may be open read-only). For `pmtx check`.
    #[cfg(not(miri))]
    pub(crate) fn map_file_private(file: &File, path: &Path, len: u64) -> PoolResult<Mapping> {
        use std::os::fd::AsRawFd;
        let len = usize::try_from(len).map_err(|_| {
            PoolError::InvalidArgument(format!("pool size {len} does not fit in memory"))
        })?;
        // SAFETY: a fresh private mapping at an address of the kernel's choosing of `len` bytes,
        // the file's size; MAP_PRIVATE needs only read access to `file`.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE,
                file.as_raw_fd(),
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(PoolError::Io {
                path: path.to_path_buf(),
                op: "mmap",
                source: std::io::Error::last_os_error(),
            });
        }
        Ok(Mapping {
            base: p.cast(),
            len: AtomicUsize::new(len),
            reserved: len,
            lost_until: AtomicUsize::new(0),
            flags: libc::MAP_PRIVATE,
            kind: MappingKind::Private,
        })
    }

    /// Miri cannot map files.
    #[cfg(miri)]
    pub(crate) fn map_file_private(file: &File, path: &Path, len: u64) -> PoolResult<Mapping> {
        Self::map_file(file, path, len, false, len)
    }

    /// Miri cannot map files: refuse clearly so file-backed tests are skipped there.
    #[cfg(miri)]
    pub(crate) fn map_file(_: &File, path: &Path, _: u64, _: bool, _: u64) -> PoolResult<Mapping> {
        Err(PoolError::Io {
            path: path.to_path_buf(),
            op: "mmap",
            source: std::io::Error::new(std::io::ErrorKind::Unsupported, "no mmap under Miri"),
        })
    }

    /// Allocates `len` zeroed bytes on the heap, page aligned.
    pub(crate) fn heap(len: u64) -> PoolResult<Mapping> {
        Self::heap_filled(len, None)
    }

    /// Allocates a heap mapping holding a copy of `bytes` (a crash image): one pass over the
    /// bytes, not a zeroing pass and then a copy, since the crash suite opens thousands of images.
    pub(crate) fn heap_copy(bytes: &[u8]) -> PoolResult<Mapping> {
        Self::heap_filled(bytes.len() as u64, Some(bytes))
    }

    fn heap_filled(len: u64, contents: Option<&[u8]>) -> PoolResult<Mapping> {
        let len = usize::try_from(len).map_err(|_| {
            PoolError::InvalidArgument(format!("pool size {len} does not fit in memory"))
        })?;
        let layout = std::alloc::Layout::from_size_align(len.max(1), HEAP_ALIGN)
            .map_err(|e| PoolError::InvalidArgument(format!("pool size {len}: {e}")))?;
        let base = match contents {
            // SAFETY: the layout has a non-zero size.
            None => unsafe { std::alloc::alloc_zeroed(layout) },
            Some(bytes) => {
                // SAFETY: the layout has a non-zero size.
                let base = unsafe { std::alloc::alloc(layout) };
                if !base.is_null() {
                    // SAFETY: `base` is a fresh allocation of at least `len` = `bytes.len()`
                    // bytes, which cannot overlap `bytes`; after the copy every byte is
                    // initialised.
                    unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), base, len) };
                }
                base
            }
        };
        if base.is_null() {
            return Err(PoolError::InvalidArgument(format!(
                "cannot allocate {len} bytes of DRAM for an in-memory pool"
            )));
        }
        Ok(Mapping {
            base,
            len: AtomicUsize::new(len),
            reserved: len,
            lost_until: AtomicUsize::new(0),
            flags: 0,
            kind: MappingKind::Heap,
        })
    }

    /// Unmaps the address space a file mapping owns: `[0, len)` (the file mapping and its
    /// extensions) and the reservation not grown into, less any range a failed extension gave
    /// up (`lost_until`), which may belong to someone else by now.
    #[cfg(not(miri))]
    fn unmap_owned_ranges(&mut self) {
        let len = *self.len.get_mut();
        let unused_from = len.max(*self.lost_until.get_mut());
        // SAFETY: both ranges are address space this mapping owns, made by `mmap` and not yet
        // unmapped (see above); no reference into them outlives `self` (the pool's API hands
        // out copies and atomics borrowed from the pool).
        unsafe {
            libc::munmap(self.base.cast(), len);
            if unused_from < self.reserved {
                libc::munmap(
                    self.base.add(unused_from).cast(),
                    self.reserved - unused_from,
                );
            }
        }
    }

    pub(crate) fn kind(&self) -> MappingKind {
        self.kind
    }

    /// Bytes mapped. Relaxed: a thread learns of a growth through the page manager (a lock or
    /// an Acquire of the page count), which orders this load after the Release in `extend`.
    #[inline(always)]
    pub(crate) fn len(&self) -> u64 {
        self.len.load(Ordering::Relaxed) as u64
    }

    /// The address of byte `off`. The caller has bounds-checked `off`.
    #[inline(always)]
    pub(crate) fn ptr(&self, off: u64) -> *mut u8 {
        debug_assert!(off <= self.reserved as u64);
        // SAFETY: `off` is within the mapping (checked by every caller), so the result stays in
        // the same allocation.
        unsafe { self.base.add(off as usize) }
    }

    /// The 8-byte word at `off` as an atomic. The caller has checked bounds and 8-byte alignment.
    #[inline(always)]
    pub(crate) fn word(&self, off: u64) -> &std::sync::atomic::AtomicU64 {
        debug_assert!(off % 8 == 0 && off + 8 <= self.len());
        // SAFETY: the word is inside the mapping, 8-byte aligned (the base is page aligned), and
        // lives as long as `self`; all concurrent access to PM words goes through atomics.
        unsafe { std::sync::atomic::AtomicU64::from_ptr(self.ptr(off).cast()) }
    }

    /// Copies `src` to byte `off`. The caller has checked bounds.
    #[inline(always)]
    pub(crate) fn store(&self, off: u64, src: &[u8]) {
        // SAFETY: the destination range is inside the mapping (checked by the caller) and cannot
        // overlap `src`, which is a DRAM slice borrowed by the caller. Concurrent writers of the
        // same range are excluded by the concurrency-control layer above.
        unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), self.ptr(off), src.len()) }
    }

    /// Copies `dst.len()` bytes from byte `off` into `dst`. The caller has checked bounds.
    #[inline(always)]
    pub(crate) fn load(&self, off: u64, dst: &mut [u8]) {
        // SAFETY: the source range is inside the mapping and does not overlap `dst` (DRAM).
        // A concurrent writer can make the copy inconsistent; optimistic readers validate after
        // reading, as a seqlock does.
        unsafe { std::ptr::copy_nonoverlapping(self.ptr(off), dst.as_mut_ptr(), dst.len()) }
    }

    /// Copies `len` bytes within the mapping (ranges may overlap). The caller has checked bounds.
    #[inline(always)]
    pub(crate) fn copy_within(&self, src: u64, dst: u64, len: u64) {
        // SAFETY: both ranges are inside the mapping (checked by the caller); `copy` allows overlap.
        unsafe { std::ptr::copy(self.ptr(src), self.ptr(dst), len as usize) }
    }

    /// Sets `len` bytes at `off` to `byte`. The caller has checked bounds.
    #[inline(always)]
    pub(crate) fn fill(&self, off: u64, byte: u8, len: u64) {
        // SAFETY: the range is inside the mapping (checked by the caller).
        unsafe { std::ptr::write_bytes(self.ptr(off), byte, len as usize) }
    }

    /// A copy of the whole mapping (for crash images under eADR and for tests).
    pub(crate) fn to_vec(&self) -> Vec<u8> {
        let mut v = vec![0u8; self.len() as usize];
        self.load(0, &mut v);
        v
    }

    /// `msync(MS_SYNC)` of the pages covering `[off, off + len)`.
    pub(crate) fn msync(&self, off: u64, len: u64) -> std::io::Result<()> {
        if matches!(self.kind, MappingKind::Heap | MappingKind::Private) || len == 0 {
            return Ok(());
        }
        let page = 4096u64;
        let start = off & !(page - 1);
        let end = (off + len).min(self.len());
        #[cfg(not(miri))]
        {
            // SAFETY: `[start, end)` lies inside this live file mapping and `start` is page aligned.
            let rc = unsafe {
                libc::msync(
                    self.ptr(start).cast(),
                    (end - start) as usize,
                    libc::MS_SYNC,
                )
            };
            if rc != 0 {
                return Err(std::io::Error::last_os_error());
            }
        }
        #[cfg(miri)]
        let _ = (start, end);
        Ok(())
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        match self.kind {
            MappingKind::Heap => {
                let layout = std::alloc::Layout::from_size_align(self.reserved.max(1), HEAP_ALIGN)
                    .expect("layout was valid at allocation");
                // SAFETY: `base` was returned by `alloc_zeroed` with this same layout.
                unsafe { std::alloc::dealloc(self.base, layout) }
            }
            #[cfg(not(miri))]
            _ => self.unmap_owned_ranges(),
            #[cfg(miri)]
            _ => {}
        }
    }
}

/// Reserves `len` bytes of address space (`PROT_NONE`, no memory committed) at an address of the
/// kernel's choosing; `None` when the kernel refuses (errno says why).
#[cfg(not(miri))]
fn reserve_address_space(len: usize) -> Option<*mut libc::c_void> {
    // SAFETY: a fresh anonymous PROT_NONE mapping at an address of the kernel's choosing, which
    // nothing references; nothing can access it until the caller maps over parts of it.
    let r = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_NONE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
            -1,
            0,
        )
    };
    (r != libc::MAP_FAILED).then_some(r)
}

/// Whether the file accepts a `MAP_SYNC` mapping (a DAX file system): tried on its first page at
/// an address of the kernel's choosing, never over a range the caller owns (see
/// [`Mapping::map_file`]), and unmapped at once. Also `platform::storage_of`'s probe.
#[cfg(not(miri))]
pub(super) fn accepts_map_sync(fd: std::os::fd::RawFd, prot: i32) -> bool {
    const PROBE_BYTES: usize = 4096;
    // SAFETY: a fresh shared mapping of one page at an address of the kernel's choosing; nothing
    // reads or writes through it, and it is unmapped below. A file shorter than a page would
    // only make an access fault, and there is none.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            PROBE_BYTES,
            prot,
            libc::MAP_SHARED_VALIDATE | libc::MAP_SYNC,
            fd,
            0,
        )
    };
    if p == libc::MAP_FAILED {
        return false;
    }
    // SAFETY: `p` is the page mapped just above, referenced by nothing.
    unsafe { libc::munmap(p, PROBE_BYTES) };
    true
}

/// Asks the C allocator to keep freed large blocks for reuse instead of returning them to the
/// kernel at once. The crash harness allocates and frees one pool-sized image after another (the
/// simulator's durable copy, each image, each recovered pool); with glibc's defaults every one is
/// a fresh `mmap` whose pages fault in and are zeroed by the kernel, which made the harness spend
/// most of its time in the kernel. Process-wide and idempotent; a no-op off glibc.
pub fn retain_freed_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        static ONCE: std::sync::Once = std::sync::Once::new();
        ONCE.call_once(|| {
            // SAFETY: mallopt only changes allocator tunables; it is safe to call at any time and
            // from any thread, and these values are in the documented ranges.
            unsafe {
                libc::mallopt(libc::M_MMAP_THRESHOLD, 512 << 20);
                libc::mallopt(libc::M_TRIM_THRESHOLD, 1 << 30);
            }
        });
    }
}

#[cfg(all(test, not(miri)))]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicBool;

    /// A growable mapping's reservation is never free address space while the file is mapped
    /// over it, so memory another thread maps meanwhile (a malloc arena, a thread stack) is never
    /// placed inside it. A file system that refuses `MAP_SYNC` only after unmapping the target
    /// range (ext4, xfs without DAX) used to leave such a hole between a refused `MAP_FIXED` try
    /// and the retry, which then mapped the pool over the other thread's memory, and dropping
    /// that memory unmapped the pool's header (tests/pool_growth.rs died of SIGSEGV).
    #[test]
    fn no_other_mapping_lands_in_a_growable_mapping_while_it_is_set_up() {
        const FILE_BYTES: u64 = 1 << 20;
        const RESERVE: u64 = 16 << 20;
        const THEIRS: usize = 64 << 10;
        let path =
            std::env::temp_dir().join(format!("pmtx-mapping-race-{}.pool", std::process::id()));
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(&path)
            .unwrap();
        file.set_len(FILE_BYTES).unwrap();
        let (started, done) = (AtomicBool::new(false), AtomicBool::new(false));
        let (ours, theirs) = std::thread::scope(|s| {
            let other = s.spawn(|| {
                let mut theirs = Vec::new();
                while !done.load(Ordering::Relaxed) && theirs.len() < 200_000 {
                    let p = reserve_address_space(THEIRS).expect("mmap");
                    theirs.push(p as usize);
                    started.store(true, Ordering::Release);
                }
                theirs
            });
            while !started.load(Ordering::Acquire) {
                std::hint::spin_loop();
            }
            let ours: Vec<Mapping> = (0..1000)
                .map(|_| Mapping::map_file(&file, &path, FILE_BYTES, true, RESERVE).unwrap())
                .collect();
            done.store(true, Ordering::Relaxed);
            (ours, other.join().unwrap())
        });
        let overlaps = theirs
            .iter()
            .filter(|&&t| {
                ours.iter().any(|m| {
                    let base = m.base as usize;
                    t < base + m.reserved && base < t + THEIRS
                })
            })
            .count();
        for &t in &theirs {
            // SAFETY: `t` is one of the mappings made above, of THEIRS bytes, referenced by
            // nothing.
            unsafe { libc::munmap(t as *mut libc::c_void, THEIRS) };
        }
        drop(ours);
        drop(file);
        let _ = std::fs::remove_file(&path);
        assert_eq!(
            overlaps,
            0,
            "{overlaps} of {} other mappings were placed inside a pool's reserved range",
            theirs.len()
        );
    }
}
