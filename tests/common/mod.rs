//! Helpers shared by the integration tests (`mod common;` in each test file that uses them).

/// A scratch directory for pool files: under /dev/shm when it exists (DRAM standing in for PM,
/// as the project's default pools), else the system temp dir. Removed when dropped.
pub fn pool_dir() -> tempfile::TempDir {
    let shm = std::path::Path::new("/dev/shm");
    if shm.is_dir() {
        tempfile::tempdir_in(shm).unwrap()
    } else {
        tempfile::tempdir().unwrap()
    }
}
