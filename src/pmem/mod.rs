//! The pmem layer: pool files, persistence primitives, persistence domains, PM traffic counters and
//! the crash simulator.
//!
//! Every mutation of persistent memory in pmtx goes through [`Pool`]: `write_u64`, `write_bytes`,
//! `fill`, `copy`, the atomic word operations, `flush`, `fence` and `persist`. That single seam is
//! what lets the same engine code run natively (real `clwb`/`clflushopt`/`clflush` + `sfence`),
//! count its PM traffic, or run under the [crash simulator](crashsim) that enumerates the states
//! a power failure could leave behind. See `docs/ARCHITECTURE.md` for the model.
//!
//! ```
//! use pmtx::pmem::{Pool, PoolOptions, PersistenceDomain};
//! let pool = Pool::create_in_memory(1 << 20, &PoolOptions::new("demo", PersistenceDomain::Adr)).unwrap();
//! let off = pool.first_usable();
//! pool.write_u64(off, 42);
//! pool.persist(off, 8);
//! assert_eq!(pool.read_u64(off), 42);
//! ```

pub mod cpu;
pub mod crashsim;
pub mod domain;
pub mod error;
pub mod header;
mod mapping;
pub mod media;
pub mod platform;
mod pool;
pub mod scratch;
pub mod stats;

pub use cpu::{prefetch, FlushInstruction, CACHE_LINE};
pub use crashsim::{CrashImage, CrashSim, CrashState, CrashTrigger, OnCrash, SimulatedCrash};
pub use domain::PersistenceDomain;
pub use error::{PoolError, PoolResult};
pub use mapping::{retain_freed_memory, MappingKind};
pub use media::{MediaModel, MediaOptions, NvmLatency};
pub use pool::{
    default_pool_path, scratch_dir, CrashSimOptions, Pool, PoolInfo, PoolOptions, MAX_POOL_SIZE,
    MIN_POOL_SIZE,
};
pub use stats::PmStats;
