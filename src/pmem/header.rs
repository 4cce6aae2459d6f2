//! The pool header: the first bytes of every pool, which say what the file is.
//!
//! Layout (little-endian), in the first two cache lines of the pool:
//!
//! | offset | bytes | field |
//! | --- | --- | --- |
//! | 0 | 8 | magic `PMTXPOOL` (written last at creation, so a half-made pool is "not a pool") |
//! | 8 | 4 | format version |
//! | 12 | 4 | header length in bytes (128) |
//! | 16 | 16 | pool UUID |
//! | 32 | 8 | pool size in bytes at creation |
//! | 40 | 8 | creation time, nanoseconds since the Unix epoch |
//! | 48 | 32 | layout (engine) name, UTF-8, NUL-padded |
//! | 80 | 1 | persistence domain the pool was created for (1 volatile, 2 adr, 3 eadr, 4 msync) |
//! | 81 | 7 | reserved, zero |
//! | 88 | 8 | maximum size the pool may grow to (0: a fixed-size pool) |
//! | 96 | 24 | reserved, zero |
//! | 120 | 8 | CRC-32 of bytes 0..120 |
//!
//! Version history: 1 had no domain byte, an unchecked page table and unchecked engine meta
//! pages; 2 (this build) records the domain and checksums the page-table descriptors and the
//! engine meta page (docs/ARCHITECTURE.md, "Integrity"). Version 1 pools are refused with
//! [`PoolError::UnsupportedVersion`]: recreate them.
//!
//! The header is immutable after creation. The two mutable fields live in cache lines of their own
//! and are each written with a single 8-byte atomic store, which can never be torn: the root
//! offset at [`ROOT_OFFSET_WORD`], and the pool's current size at [`SIZE_WORD`] (0 until the pool
//! first grows; then the size it has grown to, made durable only after the file extension is, so
//! a crash during growth leaves either the old size or the new one, and the file at least that
//! long: bytes of the file beyond the recorded size are left over from an interrupted growth and
//! are ignored). A maximum of 0 at offset 88 is what every pool made before growth existed has, so
//! those open as the fixed-size pools they are.

use super::domain::PersistenceDomain;
use super::error::{PoolError, PoolResult};
use std::path::Path;

/// The first eight bytes of every pool.
pub const MAGIC: [u8; 8] = *b"PMTXPOOL";
/// The format version this build writes and reads.
pub const FORMAT_VERSION: u32 = 2;
/// Bytes covered by the header and its checksum.
pub const HEADER_LEN: usize = 128;
/// Longest layout name, in bytes.
pub const MAX_LAYOUT_LEN: usize = 32;
/// Offset of the pool's root word: where recovery starts (0 = no root yet).
pub const ROOT_OFFSET_WORD: u64 = 192;
/// Offset of the pool's size word: the size a growable pool has grown to (0 = the size at offset 32).
pub const SIZE_WORD: u64 = 256;
/// Bytes reserved at the start of the pool for the header and root word; the rest is the caller's.
pub const RESERVED_BYTES: u64 = 4096;

const CHECKSUM_AT: usize = 120;
const DOMAIN_AT: usize = 80;
const MAX_SIZE_AT: usize = 88;

fn domain_code(d: PersistenceDomain) -> u8 {
    match d {
        PersistenceDomain::Volatile => 1,
        PersistenceDomain::Adr => 2,
        PersistenceDomain::Eadr => 3,
        PersistenceDomain::Msync => 4,
    }
}

fn domain_of(code: u8) -> Option<PersistenceDomain> {
    PersistenceDomain::ALL
        .into_iter()
        .find(|&d| domain_code(d) == code)
}

/// The decoded pool header.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct Header {
    /// Format version of the pool.
    pub version: u32,
    /// The pool's unique id, fixed at creation.
    pub uuid: uuid::Uuid,
    /// Pool size in bytes: the size at creation, or the size a growable pool has grown to (see
    /// [`SIZE_WORD`]) when the header was read.
    pub size: u64,
    /// Pool size in bytes at creation (the checksummed size at offset 32).
    pub initial_size: u64,
    /// The size the pool may grow to; `None` for a fixed-size pool.
    pub max_size: Option<u64>,
    /// Creation time, nanoseconds since the Unix epoch.
    pub created_unix_ns: u64,
    /// The layout (engine) the pool was created for.
    pub layout: String,
    /// The persistence domain the pool was created for; opening with another one is refused
    /// unless the caller overrides it (see [`PoolOptions::allowing_domain_change`](super::PoolOptions::allowing_domain_change)).
    pub domain: PersistenceDomain,
}

impl Header {
    /// Checks a layout name: non-empty, at most [`MAX_LAYOUT_LEN`] bytes, no NUL.
    pub fn validate_layout(layout: &str) -> PoolResult<()> {
        if layout.is_empty() || layout.len() > MAX_LAYOUT_LEN || layout.contains('\0') {
            return Err(PoolError::InvalidArgument(format!(
                "layout name '{layout}' must be 1 to {MAX_LAYOUT_LEN} bytes with no NUL"
            )));
        }
        Ok(())
    }

    /// Encodes the header, checksum included.
    pub fn encode(&self) -> [u8; HEADER_LEN] {
        let mut b = [0u8; HEADER_LEN];
        b[0..8].copy_from_slice(&MAGIC);
        b[8..12].copy_from_slice(&self.version.to_le_bytes());
        b[12..16].copy_from_slice(&(HEADER_LEN as u32).to_le_bytes());
        b[16..32].copy_from_slice(self.uuid.as_bytes());
        b[32..40].copy_from_slice(&self.initial_size.to_le_bytes());
        b[40..48].copy_from_slice(&self.created_unix_ns.to_le_bytes());
        b[48..48 + self.layout.len()].copy_from_slice(self.layout.as_bytes());
        b[DOMAIN_AT] = domain_code(self.domain);
        b[MAX_SIZE_AT..MAX_SIZE_AT + 8].copy_from_slice(&self.max_size.unwrap_or(0).to_le_bytes());
        let crc = u64::from(crc32fast::hash(&b[..CHECKSUM_AT]));
        b[CHECKSUM_AT..].copy_from_slice(&crc.to_le_bytes());
        b
    }

    /// Decodes and validates a header from the first bytes of a file of `file_len` bytes (the
    /// size word at [`SIZE_WORD`] is read when `bytes` reaches it).
    ///
    /// Checks, in order: magic, length, version, checksum, the growth fields, size against the
    /// file. The file may be longer than the recorded size only for a growable pool, up to its
    /// maximum (an interrupted growth). The layout is checked by the caller, who knows which one
    /// it wants.
    pub fn decode(path: &Path, bytes: &[u8], file_len: u64) -> PoolResult<Header> {
        let path_buf = || path.to_path_buf();
        if bytes.len() < MAGIC.len() || bytes[..8] != MAGIC {
            return Err(PoolError::NotAPool { path: path_buf() });
        }
        if bytes.len() < HEADER_LEN {
            return Err(PoolError::Truncated {
                path: path_buf(),
                expected: HEADER_LEN as u64,
                actual: file_len,
            });
        }
        let u32_at = |o: usize| u32::from_le_bytes(bytes[o..o + 4].try_into().unwrap());
        let u64_at = |o: usize| u64::from_le_bytes(bytes[o..o + 8].try_into().unwrap());
        let version = u32_at(8);
        if version != FORMAT_VERSION {
            return Err(PoolError::UnsupportedVersion {
                path: path_buf(),
                found: version,
                supported: FORMAT_VERSION,
            });
        }
        let stored = u64_at(CHECKSUM_AT);
        let computed = u64::from(crc32fast::hash(&bytes[..CHECKSUM_AT]));
        if stored != computed || u32_at(12) as usize != HEADER_LEN {
            return Err(PoolError::BadChecksum {
                path: path_buf(),
                stored,
                computed,
            });
        }
        let initial_size = u64_at(32);
        let max_size = match u64_at(MAX_SIZE_AT) {
            0 => None,
            m if m < initial_size || m % 4096 != 0 => {
                return Err(PoolError::BadChecksum {
                    path: path_buf(),
                    stored,
                    computed,
                })
            }
            m => Some(m),
        };
        let grown = if bytes.len() >= SIZE_WORD as usize + 8 {
            u64_at(SIZE_WORD as usize)
        } else {
            0
        };
        let size = match (grown, max_size) {
            (0, _) => initial_size,
            (g, Some(max)) if g >= initial_size && g <= max && g % 4096 == 0 => g,
            (g, _) => {
                return Err(PoolError::BadSizeWord {
                    path: path_buf(),
                    word: g,
                    initial: initial_size,
                    max: max_size.unwrap_or(0),
                })
            }
        };
        if file_len < size {
            return Err(PoolError::Truncated {
                path: path_buf(),
                expected: size,
                actual: file_len,
            });
        }
        let interrupted_growth = max_size.is_some_and(|max| file_len <= max);
        if file_len != size && !interrupted_growth {
            return Err(PoolError::SizeMismatch {
                path: path_buf(),
                header: size,
                file: file_len,
            });
        }
        let layout_bytes = &bytes[48..48 + MAX_LAYOUT_LEN];
        let layout_len = layout_bytes
            .iter()
            .position(|&b| b == 0)
            .unwrap_or(MAX_LAYOUT_LEN);
        let layout = std::str::from_utf8(&layout_bytes[..layout_len])
            .map_err(|_| PoolError::BadChecksum {
                path: path_buf(),
                stored,
                computed,
            })?
            .to_string();
        // Covered by the checksum, so an unknown code is a header this build did not write.
        let domain = domain_of(bytes[DOMAIN_AT]).ok_or_else(|| PoolError::BadChecksum {
            path: path_buf(),
            stored,
            computed,
        })?;
        Ok(Header {
            version,
            uuid: uuid::Uuid::from_bytes(bytes[16..32].try_into().unwrap()),
            size,
            initial_size,
            max_size,
            created_unix_ns: u64_at(40),
            layout,
            domain,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Header {
        Header {
            version: FORMAT_VERSION,
            uuid: uuid::Uuid::from_u128(0x1234),
            size: 1 << 20,
            initial_size: 1 << 20,
            max_size: None,
            created_unix_ns: 42,
            layout: "falcon".into(),
            domain: PersistenceDomain::Adr,
        }
    }

    #[test]
    fn encode_decode_round_trip() {
        let h = sample();
        let b = h.encode();
        assert_eq!(Header::decode(Path::new("p"), &b, 1 << 20).unwrap(), h);
    }

    #[test]
    fn every_corruption_is_refused_with_its_own_error() {
        let p = Path::new("p");
        let good = sample().encode();
        let mut bad_magic = good;
        bad_magic[0] ^= 1;
        assert!(matches!(
            Header::decode(p, &bad_magic, 1 << 20),
            Err(PoolError::NotAPool { .. })
        ));
        assert!(matches!(
            Header::decode(p, &good[..64], 64),
            Err(PoolError::Truncated { .. })
        ));
        let mut bad_version = good;
        bad_version[8] = 9;
        let mut version_1 = good;
        version_1[8] = 1;
        assert!(matches!(
            Header::decode(p, &version_1, 1 << 20),
            Err(PoolError::UnsupportedVersion {
                found: 1,
                supported: 2,
                ..
            })
        ));
        assert!(matches!(
            Header::decode(p, &bad_version, 1 << 20),
            Err(PoolError::UnsupportedVersion { found: 9, .. })
        ));
        for flip in [16usize, 33, 44, 50, 100] {
            let mut bad = good;
            bad[flip] ^= 0x40;
            assert!(
                matches!(
                    Header::decode(p, &bad, 1 << 20),
                    Err(PoolError::BadChecksum { .. })
                ),
                "flipping byte {flip} must break the checksum"
            );
        }
        assert!(matches!(
            Header::decode(p, &good, 1000),
            Err(PoolError::Truncated { .. })
        ));
        assert!(matches!(
            Header::decode(p, &good, 2 << 20),
            Err(PoolError::SizeMismatch { .. })
        ));
    }

    #[test]
    fn layout_names_are_validated() {
        assert!(Header::validate_layout("zen").is_ok());
        assert!(Header::validate_layout("").is_err());
        assert!(Header::validate_layout(&"x".repeat(33)).is_err());
        assert!(Header::validate_layout("a\0b").is_err());
    }
}
