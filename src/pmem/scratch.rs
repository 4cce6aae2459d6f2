//! Scratch files of this process (pools created with `remove_on_drop`, real-kill directories):
//! registered while they exist, so that a process stopped by SIGINT or SIGTERM — which runs no
//! destructors — can still remove them (`pmtx` installs a handler that calls [`remove_all`]).
//! Scratch pools live in /dev/shm, i.e. in DRAM: one left behind holds up to its full size.

use parking_lot::Mutex;
use std::path::{Path, PathBuf};

static SCRATCH: Mutex<Vec<PathBuf>> = Mutex::new(Vec::new());

/// Registers `path` (a file or a directory) for removal by [`remove_all`].
pub fn register(path: &Path) {
    SCRATCH.lock().push(path.to_path_buf());
}

/// Forgets `path` (its owner removed it, or keeps it).
pub fn unregister(path: &Path) {
    let mut scratch = SCRATCH.lock();
    if let Some(i) = scratch.iter().rposition(|p| p == path) {
        scratch.swap_remove(i);
    }
}

/// The registered paths.
pub fn registered() -> Vec<PathBuf> {
    SCRATCH.lock().clone()
}

/// Removes every registered file and directory (errors ignored: this runs on the way out) and
/// returns how many were removed.
pub fn remove_all() -> usize {
    remove_paths(&std::mem::take(&mut *SCRATCH.lock()))
}

fn remove_paths(paths: &[PathBuf]) -> usize {
    paths
        .iter()
        .filter(|p| {
            if p.is_dir() {
                std::fs::remove_dir_all(p).is_ok()
            } else {
                std::fs::remove_file(p).is_ok()
            }
        })
        .count()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn registered_files_and_directories_are_removed() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("a.pool");
        std::fs::write(&file, b"x").unwrap();
        let sub = dir.path().join("kills");
        std::fs::create_dir(&sub).unwrap();
        std::fs::write(sub.join("b.pool"), b"y").unwrap();
        let kept = dir.path().join("kept.pool");
        std::fs::write(&kept, b"z").unwrap();
        register(&file);
        register(&sub);
        register(&kept);
        unregister(&kept);
        let mut mine: Vec<PathBuf> = registered()
            .into_iter()
            .filter(|p| p.starts_with(dir.path()))
            .collect();
        mine.sort();
        assert_eq!(mine, vec![file.clone(), sub.clone()]);
        // Not remove_all: other tests of this process have scratch pools registered.
        assert_eq!(remove_paths(&mine), 2);
        unregister(&file);
        unregister(&sub);
        assert!(!file.exists() && !sub.exists());
        assert!(kept.exists());
    }
}
