//! PM space: the pool is carved into 2 MiB pages, handed out by the [`PageManager`].
//!
//! The page table (one 8-byte descriptor per page) is the only persisted allocation metadata; slot
//! allocators inside pages keep their free lists in DRAM and rebuild them at recovery wherever the
//! design allows it (Zen §3.4, ArchTM §4.2).

mod pages;

pub use pages::{full_detail, mib, AllocError, PageManager, PageTag, SpaceUsage, PAGE_SIZE};
