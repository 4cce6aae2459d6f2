//! Errors of the pmem layer: every way creating or opening a pool can fail, each with a message
//! that tells the user what is wrong and with which file.

use std::path::PathBuf;

/// Why a pool could not be created, opened or mapped.
///
/// Every variant that concerns an existing pool is raised *before* a single byte of it is written:
/// a refused pool is left exactly as it was found.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum PoolError {
    /// The path does not exist.
    #[error("pool {path}: no such file")]
    NotFound {
        /// The path that was asked for.
        path: PathBuf,
    },
    /// Creating a pool would overwrite an existing file.
    #[error("pool {path}: a file already exists there (pmtx never overwrites a file; remove it or pick another path)")]
    AlreadyExists {
        /// The path that was asked for.
        path: PathBuf,
    },
    /// An operating-system call failed.
    #[error("pool {path}: {op} failed: {source}")]
    Io {
        /// The file concerned.
        path: PathBuf,
        /// The operation that failed (open, read, mmap, ...).
        op: &'static str,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
    /// The path names a directory, not a pool file.
    #[error("{path} is a directory, not a pool file")]
    IsADirectory {
        /// The path concerned.
        path: PathBuf,
    },
    /// The file does not start with the pool magic.
    #[error("{path} is not a pmtx pool (no pool magic in its first bytes)")]
    NotAPool {
        /// The file concerned.
        path: PathBuf,
    },
    /// The file is shorter than its header says, or shorter than a header.
    #[error("pool {path} is truncated: it should be {expected} bytes but the file has {actual}")]
    Truncated {
        /// The file concerned.
        path: PathBuf,
        /// Bytes the header (or the header itself) needs.
        expected: u64,
        /// Bytes the file has.
        actual: u64,
    },
    /// The header checksum does not match the header.
    #[error("pool {path}: header checksum mismatch (stored {stored:#010x}, computed {computed:#010x}): the header is corrupt")]
    BadChecksum {
        /// The file concerned.
        path: PathBuf,
        /// The checksum stored in the header.
        stored: u64,
        /// The checksum computed over the header.
        computed: u64,
    },
    /// The pool was written by a format version this build does not read.
    #[error("pool {path}: format version {found} is not supported (this build reads version {supported}; pmtx has no converter: recreate the pool with this build)")]
    UnsupportedVersion {
        /// The file concerned.
        path: PathBuf,
        /// The version in the header.
        found: u32,
        /// The version this build reads and writes.
        supported: u32,
    },
    /// The file's size disagrees with the size recorded in the header.
    #[error("pool {path}: the header records {header} bytes but the file has {file} bytes")]
    SizeMismatch {
        /// The file concerned.
        path: PathBuf,
        /// Size recorded in the header.
        header: u64,
        /// Size of the file.
        file: u64,
    },
    /// The size word of a growable pool holds a size the header does not allow.
    #[error("pool {path}: the size word records {word} bytes, outside what the header allows (from {initial} up to a maximum of {max} bytes, 4 KiB aligned; a maximum of 0 means a fixed-size pool): the pool is damaged")]
    BadSizeWord {
        /// The file concerned.
        path: PathBuf,
        /// The size word.
        word: u64,
        /// Size at creation.
        initial: u64,
        /// The maximum size (0: none).
        max: u64,
    },
    /// Growing the pool failed or is not possible; the pool is unchanged and still usable.
    #[error("pool {path}: cannot grow from {from} to {to} bytes: {reason}")]
    GrowFailed {
        /// The file concerned (`<in-memory>` for a pool without a file).
        path: PathBuf,
        /// Current size.
        from: u64,
        /// Size asked for.
        to: u64,
        /// Why.
        reason: String,
    },
    /// The pool was created for another engine (layout) than the one requested.
    #[error("pool {path} holds layout '{found}', but layout '{expected}' was requested (pick the engine the pool was created with)")]
    LayoutMismatch {
        /// The file concerned.
        path: PathBuf,
        /// The layout requested by the caller.
        expected: String,
        /// The layout recorded in the pool.
        found: String,
    },
    /// The pool was created for another persistence domain than the one requested.
    #[error("pool {path} was created for the {recorded} domain but is being opened with {requested}: a pool's durability guarantees hold only in its own domain (override explicitly if the hardware changed: `--allow-domain-change`, `DbConfig::allow_domain_change`)")]
    DomainMismatch {
        /// The file concerned.
        path: PathBuf,
        /// The domain recorded in the header.
        recorded: super::PersistenceDomain,
        /// The domain asked for.
        requested: super::PersistenceDomain,
    },
    /// Another process (or another handle in this one) has the pool open for writing.
    #[error("pool {path} is in use: another process holds its lock")]
    Locked {
        /// The file concerned.
        path: PathBuf,
    },
    /// The file system has no room for a pool of the requested size.
    #[error("pool {path}: no space for {size} bytes on its file system")]
    NoSpace {
        /// The file concerned.
        path: PathBuf,
        /// The requested size.
        size: u64,
    },
    /// A size, layout name or other argument is out of range.
    #[error("invalid pool argument: {0}")]
    InvalidArgument(String),
}

/// Shorthand for results of the pmem layer.
pub type PoolResult<T> = Result<T, PoolError>;
