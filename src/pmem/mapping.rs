//! The memory behind a pool: a shared file mapping (`MAP_SYNC` when the file system offers DAX) or
//! an aligned heap buffer (in-memory pools, crash images, Miri). This file and `cpu.rs` hold the
//! pmem layer's raw-pointer `unsafe`; `Pool` builds a safe, bounds-checked API on top.

use super::error::{PoolError, PoolResult};
use std::fs::File;
use std::path::Path;

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
pub(crate) struct Mapping {
    base: *mut u8,
    len: usize,
    kind: MappingKind,
}

// SAFETY: the mapping is plain memory owned by this value; the pool's API synchronises access to it
// (atomic words, or exclusive ownership of ranges granted by the layers above).
unsafe impl Send for Mapping {}
// SAFETY: as above; shared references only read, or write through atomics / caller-owned ranges.
unsafe impl Sync for Mapping {}

const HEAP_ALIGN: usize = 4096;

impl Mapping {
    /// Maps `len` bytes of `file` shared, trying `MAP_SYNC` first.
    #[cfg(not(miri))]
    pub(crate) fn map_file(
        file: &File,
        path: &Path,
        len: u64,
        writable: bool,
    ) -> PoolResult<Mapping> {
        use std::os::fd::AsRawFd;
        let len = usize::try_from(len).map_err(|_| {
            PoolError::InvalidArgument(format!("pool size {len} does not fit in memory"))
        })?;
        let fd = file.as_raw_fd();
        let prot = if writable {
            libc::PROT_READ | libc::PROT_WRITE
        } else {
            libc::PROT_READ
        };
        if writable {
            // SAFETY: a fresh mapping at an address of the kernel's choosing; `fd` is open for
            // reading and writing and `len` is the file's size.
            let p = unsafe {
                libc::mmap(
                    std::ptr::null_mut(),
                    len,
                    prot,
                    libc::MAP_SHARED_VALIDATE | libc::MAP_SYNC,
                    fd,
                    0,
                )
            };
            if p != libc::MAP_FAILED {
                return Ok(Mapping {
                    base: p.cast(),
                    len,
                    kind: MappingKind::DaxSync,
                });
            }
        }
        // SAFETY: as above; plain MAP_SHARED works on every file system that supports mmap.
        let p = unsafe { libc::mmap(std::ptr::null_mut(), len, prot, libc::MAP_SHARED, fd, 0) };
        if p == libc::MAP_FAILED {
            return Err(PoolError::Io {
                path: path.to_path_buf(),
                op: "mmap",
                source: std::io::Error::last_os_error(),
            });
        }
        let kind = if writable {
            MappingKind::Shared
        } else {
            MappingKind::ReadOnly
        };
        Ok(Mapping {
            base: p.cast(),
            len,
            kind,
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
            len,
            kind: MappingKind::Private,
        })
    }

    /// Miri cannot map files.
    #[cfg(miri)]
    pub(crate) fn map_file_private(file: &File, path: &Path, len: u64) -> PoolResult<Mapping> {
        Self::map_file(file, path, len, false)
    }

    /// Miri cannot map files: refuse clearly so file-backed tests are skipped there.
    #[cfg(miri)]
    pub(crate) fn map_file(_: &File, path: &Path, _: u64, _: bool) -> PoolResult<Mapping> {
        Err(PoolError::Io {
            path: path.to_path_buf(),
            op: "mmap",
            source: std::io::Error::new(std::io::ErrorKind::Unsupported, "no mmap under Miri"),
        })
    }

    /// Allocates `len` zeroed bytes on the heap, page aligned.
    pub(crate) fn heap(len: u64) -> PoolResult<Mapping> {
        let len = usize::try_from(len).map_err(|_| {
            PoolError::InvalidArgument(format!("pool size {len} does not fit in memory"))
        })?;
        let layout = std::alloc::Layout::from_size_align(len.max(1), HEAP_ALIGN)
            .map_err(|e| PoolError::InvalidArgument(format!("pool size {len}: {e}")))?;
        // SAFETY: the layout has a non-zero size.
        let base = unsafe { std::alloc::alloc_zeroed(layout) };
        if base.is_null() {
            return Err(PoolError::InvalidArgument(format!(
                "cannot allocate {len} bytes of DRAM for an in-memory pool"
            )));
        }
        Ok(Mapping {
            base,
            len,
            kind: MappingKind::Heap,
        })
    }

    pub(crate) fn kind(&self) -> MappingKind {
        self.kind
    }

    pub(crate) fn len(&self) -> u64 {
        self.len as u64
    }

    /// The address of byte `off`. The caller has bounds-checked `off`.
    #[inline(always)]
    pub(crate) fn ptr(&self, off: u64) -> *mut u8 {
        debug_assert!(off <= self.len as u64);
        // SAFETY: `off` is within the mapping (checked by every caller), so the result stays in
        // the same allocation.
        unsafe { self.base.add(off as usize) }
    }

    /// The 8-byte word at `off` as an atomic. The caller has checked bounds and 8-byte alignment.
    #[inline(always)]
    pub(crate) fn word(&self, off: u64) -> &std::sync::atomic::AtomicU64 {
        debug_assert!(off % 8 == 0 && off + 8 <= self.len as u64);
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
        let mut v = vec![0u8; self.len];
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
        let end = (off + len).min(self.len as u64);
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
                let layout = std::alloc::Layout::from_size_align(self.len.max(1), HEAP_ALIGN)
                    .expect("layout was valid at allocation");
                // SAFETY: `base` was returned by `alloc_zeroed` with this same layout.
                unsafe { std::alloc::dealloc(self.base, layout) }
            }
            _ => {
                #[cfg(not(miri))]
                // SAFETY: `base`/`len` describe a mapping made by `mmap` and not yet unmapped; no
                // reference into it outlives `self` (the pool's API hands out copies and atomics
                // borrowed from the pool).
                unsafe {
                    libc::munmap(self.base.cast(), self.len);
                }
            }
        }
    }
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
