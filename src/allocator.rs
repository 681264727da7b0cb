//! The daemon's allocator: mimalloc, except that large zeroed blocks are
//! fresh anonymous mappings.
//!
//! fuser gives each FUSE thread (and its handshake) a zeroed 16 MiB read
//! buffer, of which a request touches a few pages. mimalloc hands out
//! memory it freed and purged before as not known to be zero, so it
//! `memset`s all 16 MiB: every page faulted in and cleared, tens of
//! milliseconds of CPU at each start and 16 MiB of RSS per buffer. The
//! kernel's zero pages cost nothing until touched.

use std::alloc::{GlobalAlloc, Layout};
use std::ptr;
use std::sync::atomic::{AtomicUsize, Ordering};

/// Zeroed blocks at least this large are mapped, not taken from mimalloc.
const MAPPED_FROM: usize = 4 << 20;

/// Where the mapped blocks are (0: a free slot). A block that finds no
/// free slot comes from mimalloc, so the count only bounds what is saved.
const SLOTS: usize = 64;

pub struct Allocator {
    mapped: [AtomicUsize; SLOTS],
}

impl Allocator {
    pub const fn new() -> Allocator {
        Allocator {
            mapped: [const { AtomicUsize::new(0) }; SLOTS],
        }
    }

    fn remember(&self, block: *mut u8) -> bool {
        self.mapped.iter().any(|slot| {
            slot.compare_exchange(0, block as usize, Ordering::AcqRel, Ordering::Relaxed)
                .is_ok()
        })
    }

    /// Forgets `block` if it was mapped; whether it was.
    fn forget(&self, block: *mut u8) -> bool {
        self.mapped.iter().any(|slot| {
            slot.compare_exchange(block as usize, 0, Ordering::AcqRel, Ordering::Relaxed)
                .is_ok()
        })
    }
}

impl Default for Allocator {
    fn default() -> Allocator {
        Allocator::new()
    }
}

fn page_size() -> usize {
    // SAFETY: sysconf reads a constant of the system.
    let size = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    usize::try_from(size).unwrap_or(4096)
}

// SAFETY: every block is either mimalloc's, handled by mimalloc, or a
// mapping of at least its layout's size, page aligned (which satisfies any
// alignment up to a page), remembered in a slot until it is unmapped.
unsafe impl GlobalAlloc for Allocator {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        mimalloc::MiMalloc.alloc(layout)
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        if layout.size() >= MAPPED_FROM && layout.align() <= page_size() {
            // SAFETY: a private anonymous mapping; no memory is passed in.
            let block = libc::mmap(
                ptr::null_mut(),
                layout.size(),
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            );
            if block != libc::MAP_FAILED {
                let block = block.cast::<u8>();
                if self.remember(block) {
                    return block;
                }
                libc::munmap(block.cast(), layout.size());
            }
        }
        mimalloc::MiMalloc.alloc_zeroed(layout)
    }

    unsafe fn dealloc(&self, block: *mut u8, layout: Layout) {
        if layout.size() >= MAPPED_FROM && self.forget(block) {
            libc::munmap(block.cast(), layout.size());
            return;
        }
        mimalloc::MiMalloc.dealloc(block, layout)
    }

    unsafe fn realloc(&self, block: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        if layout.size() < MAPPED_FROM
            || !self
                .mapped
                .iter()
                .any(|s| s.load(Ordering::Acquire) == block as usize)
        {
            return mimalloc::MiMalloc.realloc(block, layout, new_size);
        }
        // A mapped block grows or shrinks into mimalloc's memory: rare.
        let new_layout = Layout::from_size_align_unchecked(new_size, layout.align());
        let moved = mimalloc::MiMalloc.alloc(new_layout);
        if !moved.is_null() {
            ptr::copy_nonoverlapping(block, moved, layout.size().min(new_size));
            self.dealloc(block, layout);
        }
        moved
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn large_zeroed_blocks_are_mapped_zero_and_given_back() {
        let allocator = Allocator::new();
        let layout = Layout::from_size_align(MAPPED_FROM + 4096, 8).unwrap();
        // SAFETY: the layout has a non-zero size; the block is used within
        // it and freed with it.
        unsafe {
            let block = allocator.alloc_zeroed(layout);
            assert!(!block.is_null());
            assert!(allocator
                .mapped
                .iter()
                .any(|s| s.load(Ordering::Relaxed) == block as usize));
            let bytes = std::slice::from_raw_parts_mut(block, layout.size());
            assert!(bytes.iter().all(|&b| b == 0));
            bytes[layout.size() - 1] = 7;
            // Grown, it moves to mimalloc with its bytes.
            let grown = allocator.realloc(block, layout, layout.size() * 2);
            assert_eq!(*grown.add(layout.size() - 1), 7);
            assert!(allocator
                .mapped
                .iter()
                .all(|s| s.load(Ordering::Relaxed) == 0));
            allocator.dealloc(
                grown,
                Layout::from_size_align(layout.size() * 2, 8).unwrap(),
            );
        }
    }

    #[test]
    fn small_or_unzeroed_blocks_stay_with_mimalloc() {
        let allocator = Allocator::new();
        let small = Layout::from_size_align(4096, 8).unwrap();
        let large = Layout::from_size_align(MAPPED_FROM, 8).unwrap();
        // SAFETY: non-zero sizes; each block freed with its layout.
        unsafe {
            let a = allocator.alloc_zeroed(small);
            let b = allocator.alloc(large);
            assert!(allocator
                .mapped
                .iter()
                .all(|s| s.load(Ordering::Relaxed) == 0));
            allocator.dealloc(a, small);
            allocator.dealloc(b, large);
        }
    }
}
