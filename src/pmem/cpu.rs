//! The cache-line flush and store-fence instructions, chosen once at start-up.
//!
//! Stable Rust has intrinsics for `clflush` and `sfence` but not for `clwb` or `clflushopt`, so those
//! two are issued with inline assembly. CPUID leaf 7 (sub-leaf 0) reports them in EBX: bit 24 is
//! CLWB and bit 23 CLFLUSHOPT; `is_x86_feature_detected!` does not know either. Under Miri, which
//! rejects inline assembly, every instruction here is a no-op.

use std::sync::OnceLock;

/// Bytes in a CPU cache line: the unit of flushing and of the crash simulator's bookkeeping.
pub const CACHE_LINE: u64 = 64;

/// The instruction used to write a cache line back to memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum FlushInstruction {
    /// Write back, keep the line cached (best: later reads still hit).
    Clwb,
    /// Write back and invalidate, weakly ordered.
    Clflushopt,
    /// Write back and invalidate, serialising (the slowest; every x86-64 has it).
    Clflush,
    /// No flush instruction: a non-x86 target or Miri. Only the volatile domain is honest there.
    None,
}

impl FlushInstruction {
    /// The instruction's mnemonic.
    pub fn name(self) -> &'static str {
        match self {
            FlushInstruction::Clwb => "clwb",
            FlushInstruction::Clflushopt => "clflushopt",
            FlushInstruction::Clflush => "clflush",
            FlushInstruction::None => "none",
        }
    }
}

/// The best flush instruction this CPU offers: `clwb`, else `clflushopt`, else `clflush`.
pub fn flush_instruction() -> FlushInstruction {
    static DETECTED: OnceLock<FlushInstruction> = OnceLock::new();
    *DETECTED.get_or_init(detect)
}

#[cfg(all(target_arch = "x86_64", not(miri)))]
fn detect() -> FlushInstruction {
    // CPUID is safe on every x86-64 CPU; leaf 7 is valid once the maximum basic leaf (EAX of
    // leaf 0) is at least 7, which is checked first.
    let max_leaf = std::arch::x86_64::__cpuid(0).eax;
    let ebx7 = if max_leaf >= 7 {
        std::arch::x86_64::__cpuid_count(7, 0).ebx
    } else {
        0
    };
    if ebx7 & (1 << 24) != 0 {
        FlushInstruction::Clwb
    } else if ebx7 & (1 << 23) != 0 {
        FlushInstruction::Clflushopt
    } else {
        FlushInstruction::Clflush
    }
}

#[cfg(not(all(target_arch = "x86_64", not(miri))))]
fn detect() -> FlushInstruction {
    FlushInstruction::None
}

/// Writes back the cache line holding `addr` with `instruction`.
///
/// # Safety
/// `addr` must point into a live mapping of this process (the instruction touches the line).
#[inline(always)]
pub(crate) unsafe fn flush_line(instruction: FlushInstruction, addr: *const u8) {
    #[cfg(all(target_arch = "x86_64", not(miri)))]
    // SAFETY: the caller guarantees `addr` is mapped; these instructions only write back (and
    // possibly invalidate) the line, they never change its contents.
    unsafe {
        match instruction {
            FlushInstruction::Clwb => {
                std::arch::asm!("clwb [{0}]", in(reg) addr, options(nostack, preserves_flags))
            }
            FlushInstruction::Clflushopt => {
                std::arch::asm!("clflushopt [{0}]", in(reg) addr, options(nostack, preserves_flags))
            }
            FlushInstruction::Clflush => std::arch::x86_64::_mm_clflush(addr),
            FlushInstruction::None => {}
        }
    }
    #[cfg(not(all(target_arch = "x86_64", not(miri))))]
    {
        let _ = (instruction, addr);
    }
}

/// Orders every earlier flush and store before every later store (`sfence`).
#[inline(always)]
pub(crate) fn store_fence() {
    #[cfg(all(target_arch = "x86_64", not(miri)))]
    // SAFETY: `sfence` has no memory operands and no preconditions.
    unsafe {
        std::arch::x86_64::_mm_sfence()
    }
    #[cfg(not(all(target_arch = "x86_64", not(miri))))]
    std::sync::atomic::fence(std::sync::atomic::Ordering::SeqCst);
}

/// Copies `src` to `dst` with non-temporal (streaming) stores where the destination is 8-byte
/// aligned: `movnti` for 8-byte words, `movntdq` for 16-byte aligned pairs. A streaming store
/// bypasses the cache: it writes the line without first reading it (no read-for-ownership of a
/// cold destination) and reaches memory, i.e. the persistence domain under ADR, once the write
/// combining buffer drains, which the next `sfence` forces. Until that fence streaming stores are
/// not ordered with other stores. Returns `(head, tail)`: how many leading and trailing bytes were
/// copied with ordinary stores instead (the parts of `dst` not covered by whole aligned words),
/// which the caller must flush like any store. Off x86-64 and under Miri everything is copied
/// with ordinary stores (`(src.len(), 0)`).
///
/// # Safety
/// `dst..dst + src.len()` must lie in a live, writable mapping of this process that no Rust
/// reference covers, and must not overlap `src`.
#[inline]
pub(crate) unsafe fn stream_copy(dst: *mut u8, src: &[u8]) -> (usize, usize) {
    #[cfg(all(target_arch = "x86_64", not(miri)))]
    // SAFETY: the caller guarantees the destination range is mapped, writable and disjoint from
    // `src`; every access below stays within `dst..dst + len` and `src`. `movnti` and `movntdq`
    // are in the x86-64 baseline (SSE2); `movntdq` needs a 16-byte aligned destination, which
    // the loop ensures, and its source is read unaligned (`loadu`).
    unsafe {
        use std::arch::x86_64::{__m128i, _mm_loadu_si128, _mm_stream_si128, _mm_stream_si64};
        let len = src.len();
        let s = src.as_ptr();
        let head = ((8 - (dst as usize & 7)) & 7).min(len);
        std::ptr::copy_nonoverlapping(s, dst, head);
        let mut i = head;
        if len - i >= 8 && (dst as usize + i) & 15 != 0 {
            _mm_stream_si64(
                dst.add(i).cast::<i64>(),
                s.add(i).cast::<i64>().read_unaligned(),
            );
            i += 8;
        }
        while len - i >= 16 {
            let v = _mm_loadu_si128(s.add(i).cast::<__m128i>());
            _mm_stream_si128(dst.add(i).cast::<__m128i>(), v);
            i += 16;
        }
        if len - i >= 8 {
            _mm_stream_si64(
                dst.add(i).cast::<i64>(),
                s.add(i).cast::<i64>().read_unaligned(),
            );
            i += 8;
        }
        std::ptr::copy_nonoverlapping(s.add(i), dst.add(i), len - i);
        (head, len - i)
    }
    #[cfg(not(all(target_arch = "x86_64", not(miri))))]
    // SAFETY: as above: the caller guarantees the destination is mapped, writable and disjoint.
    unsafe {
        std::ptr::copy_nonoverlapping(src.as_ptr(), dst, src.len());
        (src.len(), 0)
    }
}

/// Hints the CPU to start loading the cache line holding `addr` into its caches. It has no
/// architectural effect (never faults, changes no data), so it is safe for any address; it is a
/// no-op off x86-64 and under Miri. Layers above `pmem` may not use `unsafe`; this lets them
/// overlap the misses of DRAM structures (e.g. Zen's Met-Cache rows) with other work.
#[inline]
pub fn prefetch<T>(addr: *const T) {
    #[cfg(all(target_arch = "x86_64", not(miri)))]
    // SAFETY: `prefetcht0` only hints the cache hierarchy: it never faults, whatever the address,
    // and reads or writes no program-visible state. SSE is in the x86-64 baseline.
    unsafe {
        std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(addr.cast::<i8>())
    }
    #[cfg(not(all(target_arch = "x86_64", not(miri))))]
    let _ = addr;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn detection_is_stable_and_flushing_a_local_line_is_harmless() {
        let first = flush_instruction();
        assert_eq!(first, flush_instruction());
        let data = [7u8; 128];
        // SAFETY: `data` is a live local array.
        unsafe { flush_line(first, data.as_ptr()) };
        store_fence();
        assert_eq!(data[0], 7);
    }

    #[test]
    fn stream_copy_copies_every_byte_at_any_alignment() {
        let src: Vec<u8> = (0..200u32).map(|i| (i * 7 + 3) as u8).collect();
        for start in 0..17 {
            for len in [0, 1, 7, 8, 9, 15, 16, 17, 31, 64, 100, 183] {
                let mut buf = vec![0u8; 256];
                // SAFETY: `start + len` is at most 200 < 256: the range lies in `buf`, which no
                // other reference covers while the copy runs.
                let (head, tail) = unsafe { stream_copy(buf.as_mut_ptr().add(start), &src[..len]) };
                store_fence();
                assert!(head + tail <= len);
                assert_eq!(
                    &buf[start..start + len],
                    &src[..len],
                    "start {start} len {len}"
                );
                assert!(buf[..start].iter().all(|&b| b == 0));
                assert!(buf[start + len..].iter().all(|&b| b == 0));
            }
        }
    }
}
