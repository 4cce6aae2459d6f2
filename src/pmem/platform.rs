//! What the platform says about where a pool lives, for choosing a persistence domain that is
//! honest there (issue 19, item 8): eADR only where the kernel reports the CPU cache persistent,
//! ADR on a DAX mapping, `msync` on an ordinary file system (flush + fence stop at the page
//! cache there, which a power loss empties). A memory file system (tmpfs, `/dev/shm`) keeps
//! every store through a process crash, but nothing through power loss or a reboot, whatever the
//! domain.

use super::domain::PersistenceDomain;
use std::path::{Path, PathBuf};

/// What kind of storage holds a pool file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Storage {
    /// No file: a heap buffer, or a scratch pool removed when the database is dropped.
    Scratch,
    /// A memory file system (tmpfs, ramfs): survives process crashes, not power loss.
    Memory,
    /// A DAX file system: `mmap(MAP_SYNC)` works, stores reach persistent memory without the
    /// page cache.
    Dax,
    /// Any other file system: the page cache sits between the CPU and the media.
    PageCache,
}

/// The domain chosen for a pool, and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DomainDetection {
    /// The domain.
    pub domain: PersistenceDomain,
    /// Where the pool lives.
    pub storage: Storage,
    /// Why, in a sentence.
    pub reason: String,
}

/// The persistence domain `auto` picks for a pool at `path` (`None`: a scratch pool): eADR where
/// every NVDIMM region reports `cpu_cache` persistence, ADR on other DAX storage, `msync` on a
/// page-cache file system, and eADR for memory-backed storage (every store survives a process
/// crash there, and no domain survives power loss).
pub fn detect_domain(path: Option<&Path>) -> DomainDetection {
    let storage = path.map_or(Storage::Scratch, storage_of);
    let (domain, reason) = match storage {
        Storage::Scratch => (
            PersistenceDomain::Eadr,
            "a scratch pool, removed when the database is dropped: nothing is meant to outlive \
             the process"
                .to_string(),
        ),
        Storage::Memory => (
            PersistenceDomain::Eadr,
            "a memory file system (tmpfs): every store survives a process crash, nothing \
             survives power loss or a reboot"
                .to_string(),
        ),
        Storage::Dax => match nvdimm_persistence_domains().as_deref() {
            Some(domains) if !domains.is_empty() && domains.iter().all(|d| d == "cpu_cache") => (
                PersistenceDomain::Eadr,
                "DAX, and every NVDIMM region reports a persistent CPU cache (cpu_cache)".into(),
            ),
            _ => (
                PersistenceDomain::Adr,
                "DAX without a reported persistent CPU cache: stores are durable once flushed"
                    .into(),
            ),
        },
        Storage::PageCache => (
            PersistenceDomain::Msync,
            "a file system without DAX: flushes stop at the page cache, so durability needs \
             msync"
                .into(),
        ),
    };
    DomainDetection {
        domain,
        storage,
        reason,
    }
}

/// Why `domain` is not honest for a pool at `path` (`None` when it is, or when the pool is a
/// scratch pool): ADR and eADR promise that a flushed (or any) store survives power loss, which
/// holds only on persistent memory.
pub fn durability_warning(domain: PersistenceDomain, path: Option<&Path>) -> Option<String> {
    if !matches!(domain, PersistenceDomain::Adr | PersistenceDomain::Eadr) {
        return None;
    }
    let path = path?;
    match storage_of(path) {
        Storage::Scratch | Storage::Dax => None,
        Storage::Memory => Some(format!(
            "pool {} is on a memory file system (tmpfs): it survives process crashes but not \
             power loss or a reboot, whatever the domain ({domain}); keep data you need on \
             persistent memory (DAX), or under the msync domain on a disk",
            path.display()
        )),
        Storage::PageCache => Some(format!(
            "pool {} is on a file system without DAX, where flush and fence reach only the page \
             cache: under {domain} a power loss can lose acknowledged commits; use the msync \
             domain (or auto) there",
            path.display()
        )),
    }
}

/// The storage kind of the file at `path`, or of the directory it would be created in.
pub fn storage_of(path: &Path) -> Storage {
    let dir = existing_dir(path);
    if is_memory_fs(&dir) {
        return Storage::Memory;
    }
    if supports_map_sync(&dir) {
        Storage::Dax
    } else {
        Storage::PageCache
    }
}

/// The nearest existing directory holding `path` (the file itself need not exist yet).
fn existing_dir(path: &Path) -> PathBuf {
    let mut dir = if path.is_dir() {
        path.to_path_buf()
    } else {
        path.parent()
            .filter(|p| !p.as_os_str().is_empty())
            .map_or_else(|| PathBuf::from("."), Path::to_path_buf)
    };
    while !dir.is_dir() {
        match dir.parent() {
            Some(p) if !p.as_os_str().is_empty() => dir = p.to_path_buf(),
            _ => return PathBuf::from("."),
        }
    }
    dir
}

/// Whether `dir` is on tmpfs or ramfs.
#[cfg(all(target_os = "linux", not(miri)))]
fn is_memory_fs(dir: &Path) -> bool {
    use std::os::unix::ffi::OsStrExt;
    const TMPFS_MAGIC: i64 = 0x0102_1994;
    const RAMFS_MAGIC: i64 = 0x8584_58f6;
    let Ok(c_path) = std::ffi::CString::new(dir.as_os_str().as_bytes()) else {
        return false;
    };
    let mut stat = std::mem::MaybeUninit::<libc::statfs>::zeroed();
    // SAFETY: `c_path` is a NUL-terminated path and `stat` points at writable memory of the size
    // statfs fills; the result is read only when the call succeeded.
    let ok = unsafe { libc::statfs(c_path.as_ptr(), stat.as_mut_ptr()) } == 0;
    if !ok {
        return false;
    }
    // SAFETY: statfs returned 0, so it initialised the structure.
    let stat = unsafe { stat.assume_init() };
    // `f_type`'s integer type differs between libc targets.
    #[allow(clippy::unnecessary_cast)]
    let f_type = stat.f_type as i64;
    f_type == TMPFS_MAGIC || f_type == RAMFS_MAGIC
}

#[cfg(not(all(target_os = "linux", not(miri))))]
fn is_memory_fs(_dir: &Path) -> bool {
    false
}

/// Whether files in `dir` can be mapped with `MAP_SYNC` (a DAX file system): probed on a small
/// temporary file, removed afterwards. A directory that cannot be written counts as not DAX.
#[cfg(all(target_os = "linux", not(miri)))]
fn supports_map_sync(dir: &Path) -> bool {
    use std::os::fd::AsRawFd;
    const PROBE_BYTES: u64 = 4096;
    let probe = dir.join(format!(".pmtx-dax-probe-{}", std::process::id()));
    let Ok(file) = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(true)
        .open(&probe)
    else {
        return false;
    };
    let dax = file.set_len(PROBE_BYTES).is_ok()
        && super::mapping::accepts_map_sync(file.as_raw_fd(), libc::PROT_READ | libc::PROT_WRITE);
    drop(file);
    let _ = std::fs::remove_file(&probe);
    dax
}

#[cfg(not(all(target_os = "linux", not(miri))))]
fn supports_map_sync(_dir: &Path) -> bool {
    false
}

/// The `persistence_domain` of every NVDIMM region the kernel lists (`cpu_cache`,
/// `memory_controller`, ...); `None` when there is no such listing.
fn nvdimm_persistence_domains() -> Option<Vec<String>> {
    let regions = std::fs::read_dir("/sys/bus/nd/devices").ok()?;
    let domains: Vec<String> = regions
        .filter_map(Result::ok)
        .filter(|e| e.file_name().to_string_lossy().starts_with("region"))
        .filter_map(|e| std::fs::read_to_string(e.path().join("persistence_domain")).ok())
        .map(|s| s.trim().to_string())
        .collect();
    Some(domains)
}

/// CPU time (user + system) consumed so far by every thread of this process, or `None` where
/// the platform does not report it. The benchmark harness divides the difference over its
/// measured window by the committed transactions: on a shared or virtualised machine that cost
/// per transaction varies far less than wall-clock throughput, because time the process spent
/// waiting for a core does not count.
#[cfg(all(unix, not(miri)))]
pub fn process_cpu_time() -> Option<std::time::Duration> {
    let mut usage = std::mem::MaybeUninit::<libc::rusage>::zeroed();
    // SAFETY: `usage` points at writable memory of the size getrusage fills; the result is
    // read only when the call succeeded.
    let ok = unsafe { libc::getrusage(libc::RUSAGE_SELF, usage.as_mut_ptr()) } == 0;
    if !ok {
        return None;
    }
    // SAFETY: getrusage returned 0, so it initialised the structure.
    let usage = unsafe { usage.assume_init() };
    let micros = |t: libc::timeval| {
        u64::try_from(t.tv_sec).unwrap_or(0) * 1_000_000 + u64::try_from(t.tv_usec).unwrap_or(0)
    };
    Some(std::time::Duration::from_micros(
        micros(usage.ru_utime) + micros(usage.ru_stime),
    ))
}

/// CPU time of the process: not reported on this platform.
#[cfg(not(all(unix, not(miri))))]
pub fn process_cpu_time() -> Option<std::time::Duration> {
    None
}

/// The size of a transparent huge page on x86-64 Linux.
const HUGE_PAGE: usize = 2 << 20;

/// Asks the kernel to back the 2 MiB-aligned part of `[start, start + len)` with transparent huge
/// pages (`madvise(MADV_HUGEPAGE)`; Linux's default `enabled=madvise` gives them only to memory
/// that asks). Returns the bytes advised: 0 where the range holds no aligned 2 MiB or the kernel
/// refused. A hint for large DRAM structures read at random (index node arenas, hash tables):
/// with 4 KiB pages nearly every access to them misses the TLB and walks the page tables, which
/// a virtual machine's nested paging makes several times dearer (issue 13). Call it before the
/// memory is first touched: pages already faulted in stay small until `khugepaged` collapses them.
#[cfg(all(target_os = "linux", not(miri)))]
pub fn advise_huge_pages(start: *const u8, len: usize) -> usize {
    let first = (start as usize).next_multiple_of(HUGE_PAGE);
    let end = (start as usize).saturating_add(len) / HUGE_PAGE * HUGE_PAGE;
    if end <= first {
        return 0;
    }
    // SAFETY: MADV_HUGEPAGE changes no byte of memory and no mapping's protection or contents:
    // it only sets the policy of the pages backing the range. The range is page-aligned and
    // lies inside `[start, start + len)`, which the caller owns; a range with unmapped holes
    // fails with ENOMEM and changes nothing.
    let advised =
        unsafe { libc::madvise(first as *mut libc::c_void, end - first, libc::MADV_HUGEPAGE) };
    if advised == 0 {
        end - first
    } else {
        0
    }
}

/// Huge pages are not requested on this platform.
#[cfg(not(all(target_os = "linux", not(miri))))]
pub fn advise_huge_pages(_start: *const u8, _len: usize) -> usize {
    let _ = HUGE_PAGE;
    0
}

/// Tests: whether the mapping holding `addr` asked for transparent huge pages (the `hg` flag of
/// its `VmFlags` in `/proc/self/smaps`); `None` where that file does not say.
#[cfg(test)]
pub(crate) fn huge_pages_advised_at(addr: *const u8) -> Option<bool> {
    let smaps = std::fs::read_to_string("/proc/self/smaps").ok()?;
    let addr = addr as usize;
    let mut inside = false;
    for line in smaps.lines() {
        let range = line.split(' ').next().and_then(|r| r.split_once('-'));
        // A mapping's first line starts with its range, `start-end` in hex; its fields follow.
        if let Some((start, end)) = range {
            if let (Ok(start), Ok(end)) = (
                usize::from_str_radix(start, 16),
                usize::from_str_radix(end, 16),
            ) {
                inside = (start..end).contains(&addr);
                continue;
            }
        }
        if inside {
            if let Some(flags) = line.strip_prefix("VmFlags:") {
                return Some(flags.split_whitespace().any(|flag| flag == "hg"));
            }
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn huge_pages_are_asked_for_only_on_whole_aligned_huge_pages_inside_the_range() {
        let buffer = vec![7u8; 5 * HUGE_PAGE];
        let start = buffer.as_ptr();
        assert_eq!(
            advise_huge_pages(start, HUGE_PAGE - 1),
            0,
            "no whole huge page"
        );
        let advised = advise_huge_pages(start, buffer.len());
        // 5 huge pages from an arbitrary start hold 4 aligned ones, or 5 if it is aligned; a
        // kernel without transparent huge pages refuses them all.
        if cfg!(target_os = "linux") && advised != 0 {
            let aligned_start = start.align_offset(HUGE_PAGE) == 0;
            assert_eq!(advised, if aligned_start { 5 } else { 4 } * HUGE_PAGE);
            // The kernel recorded the advice on the aligned part, and only there.
            let first_aligned = start.wrapping_add(start.align_offset(HUGE_PAGE));
            assert_eq!(huge_pages_advised_at(first_aligned), Some(true));
            if !aligned_start {
                assert_eq!(huge_pages_advised_at(start), Some(false));
            }
        }
        assert!(buffer.iter().all(|&b| b == 7), "the advice changes no byte");
    }

    #[test]
    fn a_scratch_pool_is_eadr_and_never_warned_about() {
        let d = detect_domain(None);
        assert_eq!(
            (d.domain, d.storage),
            (PersistenceDomain::Eadr, Storage::Scratch)
        );
        assert_eq!(durability_warning(PersistenceDomain::Adr, None), None);
    }

    #[test]
    #[cfg(target_os = "linux")]
    fn tmpfs_and_disk_files_get_the_domain_that_is_honest_there() {
        let shm = Path::new("/dev/shm/pmtx-detect-test.pool");
        if is_memory_fs(Path::new("/dev/shm")) {
            let d = detect_domain(Some(shm));
            assert_eq!(
                (d.domain, d.storage),
                (PersistenceDomain::Eadr, Storage::Memory)
            );
            let w = durability_warning(PersistenceDomain::Eadr, Some(shm)).unwrap();
            assert!(w.contains("power loss"), "{w}");
        }
        // The build directory is on a disk file system here (no DAX, not tmpfs).
        let dir = tempfile::tempdir_in(env!("CARGO_MANIFEST_DIR")).unwrap();
        let disk = dir.path().join("sub/dir/x.pool");
        let storage = storage_of(&disk);
        if storage == Storage::PageCache {
            let d = detect_domain(Some(&disk));
            assert_eq!(d.domain, PersistenceDomain::Msync, "{}", d.reason);
            let w = durability_warning(PersistenceDomain::Adr, Some(&disk)).unwrap();
            assert!(w.contains("without DAX") && w.contains("msync"), "{w}");
            assert_eq!(
                durability_warning(PersistenceDomain::Msync, Some(&disk)),
                None
            );
        }
        // The probe leaves nothing behind.
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
    }
}
