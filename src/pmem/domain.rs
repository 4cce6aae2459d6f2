//! Persistence domains: what part of the memory hierarchy survives a power failure.
//!
//! Terms follow Falcon §3 and DUDETx §2.2. The domain decides what `flush`, `fence` and
//! `persist` do, and what the crash simulator may lose.

use std::fmt;
use std::str::FromStr;

/// What survives a crash, and so what the persistence primitives must do.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum PersistenceDomain {
    /// No durability at all: flushes and fences are skipped. The ceiling every design is measured
    /// against.
    Volatile,
    /// Asynchronous DRAM Refresh: only data that has left the CPU cache is durable, through an
    /// explicit flush ordered by a fence, or through a silent eviction at any moment.
    Adr,
    /// Extended ADR (persistent cache): every globally visible store is durable. Flushes are
    /// optional; an engine may still issue them as write-combining hints (Falcon §4.3).
    Eadr,
    /// A regular file on a disk (no DAX): durability comes only from `msync` of the touched pages,
    /// issued at each fence. Slow, but honest on any file system.
    Msync,
}

impl PersistenceDomain {
    /// Every domain, in the order the CLI lists them.
    pub const ALL: [PersistenceDomain; 4] = [
        PersistenceDomain::Volatile,
        PersistenceDomain::Adr,
        PersistenceDomain::Eadr,
        PersistenceDomain::Msync,
    ];

    /// The lower-case name used on the command line and in JSON.
    pub fn name(self) -> &'static str {
        match self {
            PersistenceDomain::Volatile => "volatile",
            PersistenceDomain::Adr => "adr",
            PersistenceDomain::Eadr => "eadr",
            PersistenceDomain::Msync => "msync",
        }
    }

    /// Whether a store must be flushed (and fenced) before it is durable.
    pub fn needs_flush(self) -> bool {
        matches!(self, PersistenceDomain::Adr | PersistenceDomain::Msync)
    }

    /// Whether anything survives a crash at all.
    pub fn is_durable(self) -> bool {
        !matches!(self, PersistenceDomain::Volatile)
    }
}

impl fmt::Display for PersistenceDomain {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The error of parsing an unknown domain name.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown persistence domain '{0}' (expected one of: volatile, adr, eadr, msync)")]
pub struct UnknownDomain(pub String);

impl FromStr for PersistenceDomain {
    type Err = UnknownDomain;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        PersistenceDomain::ALL
            .into_iter()
            .find(|d| d.name().eq_ignore_ascii_case(s))
            .ok_or_else(|| UnknownDomain(s.to_string()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_unknown_is_refused() {
        for d in PersistenceDomain::ALL {
            assert_eq!(d.name().parse::<PersistenceDomain>().unwrap(), d);
            assert_eq!(d.to_string(), d.name());
        }
        assert_eq!(
            "ADR".parse::<PersistenceDomain>().unwrap(),
            PersistenceDomain::Adr
        );
        let err = "nvdimm".parse::<PersistenceDomain>().unwrap_err();
        assert!(err.to_string().contains("nvdimm") && err.to_string().contains("eadr"));
    }
}
