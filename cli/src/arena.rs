//! The CLI's allocator: a bump arena in front of the system allocator.
//!
//! A `palisade run` lives a few milliseconds and allocates a few hundred
//! kilobytes, most of it freed again at once (argument parsing, the
//! request's encoding). musl's allocator gives freed groups back to the
//! kernel at once, so such a run made about forty `mmap` and `munmap` calls,
//! a quarter of the process's CPU time. Here the first [`ARENA_BYTES`] come
//! from a static arena: bumped, never returned (a free only rewinds when it
//! was the last allocation), gone with the process. Beyond it, and for
//! anything that outlives it (an embedded broker's long runs, `--json`
//! output gathered in memory), the system allocator serves as before.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::UnsafeCell;
use std::sync::atomic::{AtomicUsize, Ordering};

/// The arena's size: more than a short run allocates in all (a few hundred KiB).
const ARENA_BYTES: usize = 1 << 20;
/// Every block is aligned at least as malloc's are (`max_align_t`): code
/// that keeps C structures in byte buffers relies on it (nix's control
/// messages for `sendmsg`, for one).
const MIN_ALIGN: usize = 16;

#[repr(C, align(4096))]
struct Space(UnsafeCell<[u8; ARENA_BYTES]>);

// SAFETY: every byte of the space is handed out at most once (a compare-and-swap
// on `next` claims it), so no two threads ever reach the same byte through it.
unsafe impl Sync for Space {}

pub struct Arena {
    space: Space,
    /// Offset of the first free byte.
    next: AtomicUsize,
}

impl Default for Arena {
    fn default() -> Arena {
        Arena::new()
    }
}

impl Arena {
    pub const fn new() -> Arena {
        Arena { space: Space(UnsafeCell::new([0; ARENA_BYTES])), next: AtomicUsize::new(0) }
    }

    fn base(&self) -> usize {
        self.space.0.get() as usize
    }

    /// The offset of `ptr` in the arena, if it is one of the arena's.
    fn offset(&self, ptr: *mut u8) -> Option<usize> {
        (ptr as usize).checked_sub(self.base()).filter(|&o| o < ARENA_BYTES)
    }

    /// Claims `layout` from the arena; null when it does not fit.
    fn bump(&self, layout: Layout) -> *mut u8 {
        let base = self.base();
        let mut current = self.next.load(Ordering::Relaxed);
        loop {
            let start = (base + current).next_multiple_of(layout.align().max(MIN_ALIGN)) - base;
            let Some(end) = start.checked_add(layout.size()).filter(|&e| e <= ARENA_BYTES) else {
                return std::ptr::null_mut();
            };
            // Acquire: bytes given back by another thread (a rewind, Release)
            // are reused only after that thread's last writes to them.
            match self.next.compare_exchange_weak(current, end, Ordering::Acquire, Ordering::Relaxed) {
                Ok(_) => return (base + start) as *mut u8,
                Err(now) => current = now,
            }
        }
    }
}

// SAFETY: `bump` hands out disjoint, suitably aligned ranges of the arena,
// which lives as long as the process; everything else goes to `System` with
// the same layouts it was allocated with there.
unsafe impl GlobalAlloc for Arena {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let p = self.bump(layout);
        // SAFETY: the caller's layout is valid and of non-zero size.
        if p.is_null() { unsafe { System.alloc(layout) } } else { p }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // The arena's bytes are zero until handed out, but a rewound range
        // may have been used: zero it either way.
        let p = self.bump(layout);
        if p.is_null() {
            // SAFETY: as in `alloc`.
            return unsafe { System.alloc_zeroed(layout) };
        }
        // SAFETY: `p` starts `layout.size()` bytes of the arena claimed just now.
        unsafe { p.write_bytes(0, layout.size()) };
        p
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        match self.offset(ptr) {
            // The last allocation is given back; any other stays claimed.
            Some(o) => {
                // Release: the next thread to claim these bytes sees our writes done.
                let _ =
                    self.next.compare_exchange(o + layout.size(), o, Ordering::Release, Ordering::Relaxed);
            }
            // SAFETY: not the arena's, so `System` allocated it with this layout.
            None => unsafe { System.dealloc(ptr, layout) },
        }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let Some(o) = self.offset(ptr) else {
            // SAFETY: not the arena's, so `System` allocated it with this layout.
            return unsafe { System.realloc(ptr, layout, new_size) };
        };
        // The last allocation grows or shrinks in place when the arena has room.
        let (end, new_end) = (o + layout.size(), o + new_size);
        if new_end <= ARENA_BYTES
            && self.next.compare_exchange(end, new_end, Ordering::AcqRel, Ordering::Relaxed).is_ok()
        {
            return ptr;
        }
        if new_size <= layout.size() {
            return ptr;
        }
        // SAFETY: the new layout has the old one's valid alignment and a non-zero size.
        let moved = unsafe { self.alloc(Layout::from_size_align_unchecked(new_size, layout.align())) };
        if !moved.is_null() {
            // SAFETY: both ranges are at least `layout.size()` long and distinct allocations.
            unsafe { std::ptr::copy_nonoverlapping(ptr, moved, layout.size()) };
            // SAFETY: `ptr` was allocated by us with `layout`.
            unsafe { self.dealloc(ptr, layout) };
        }
        moved
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn inside(a: &Arena, p: *mut u8) -> bool {
        a.offset(p).is_some()
    }

    #[test]
    fn allocations_are_aligned_and_disjoint_then_the_system_allocator_takes_over() {
        static A: Arena = Arena::new();
        let mut taken: Vec<(*mut u8, Layout)> = Vec::new();
        for (i, align) in [1usize, 8, 16, 64, 4096, 2].into_iter().enumerate() {
            let layout = Layout::from_size_align(100 + i, align).unwrap();
            // SAFETY: a valid layout of non-zero size.
            let p = unsafe { A.alloc(layout) };
            // Odd sizes before it: a byte buffer is still aligned as malloc's.
            assert!(inside(&A, p) && p as usize % align.max(MIN_ALIGN) == 0);
            // SAFETY: `p` holds `layout.size()` bytes.
            unsafe { p.write_bytes(i as u8 + 1, layout.size()) };
            taken.push((p, layout));
        }
        for (i, (p, layout)) in taken.iter().enumerate() {
            // SAFETY: each range was written above and is still allocated.
            let bytes = unsafe { std::slice::from_raw_parts(*p, layout.size()) };
            assert!(bytes.iter().all(|&b| b == i as u8 + 1), "allocation {i} was overwritten");
        }
        // More than the arena has left: the system allocator's.
        let big = Layout::from_size_align(ARENA_BYTES, 8).unwrap();
        // SAFETY: a valid layout of non-zero size.
        let p = unsafe { A.alloc_zeroed(big) };
        assert!(!p.is_null() && !inside(&A, p));
        // SAFETY: `p` holds `big.size()` zeroed bytes.
        assert!(unsafe { std::slice::from_raw_parts(p, big.size()) }.iter().all(|&b| b == 0));
        // SAFETY: allocated above with these layouts.
        unsafe {
            A.dealloc(p, big);
            for (p, layout) in taken {
                A.dealloc(p, layout);
            }
        }
    }

    #[test]
    fn the_last_allocation_grows_in_place_and_is_given_back() {
        static A: Arena = Arena::new();
        let small = Layout::from_size_align(16, 8).unwrap();
        // SAFETY: valid layouts of non-zero size, each freed with the layout it has.
        unsafe {
            let first = A.alloc(small);
            first.write_bytes(7, 16);
            let last = A.alloc(small);
            assert_eq!(A.realloc(last, small, 4000), last, "the last allocation grows in place");
            A.dealloc(last, Layout::from_size_align(4000, 8).unwrap());
            assert_eq!(A.alloc(small), last, "freeing the last allocation gives its bytes back");
            // Not the last one: it moves, with its bytes.
            let moved = A.realloc(first, small, 64);
            assert_ne!(moved, first);
            assert!(std::slice::from_raw_parts(moved, 16).iter().all(|&b| b == 7));
            // Beyond the arena: moved to the system allocator, bytes kept.
            let huge = A.realloc(moved, Layout::from_size_align(64, 8).unwrap(), 2 * ARENA_BYTES);
            assert!(!inside(&A, huge));
            assert!(std::slice::from_raw_parts(huge, 16).iter().all(|&b| b == 7));
            A.dealloc(huge, Layout::from_size_align(2 * ARENA_BYTES, 8).unwrap());
        }
    }

    #[test]
    fn threads_never_share_a_byte() {
        static A: Arena = Arena::new();
        let layout = Layout::from_size_align(40, 8).unwrap();
        let per_thread = ARENA_BYTES / 40 / 4 + 100;
        let blocks: Vec<Vec<usize>> = std::thread::scope(|s| {
            let threads: Vec<_> = (0..4u8)
                .map(|t| {
                    s.spawn(move || {
                        (0..per_thread)
                            .map(|_| {
                                // SAFETY: a valid layout of non-zero size.
                                let p = unsafe { A.alloc(layout) };
                                // SAFETY: the block holds 40 bytes and is this thread's alone.
                                unsafe { p.write_bytes(t, 40) };
                                p as usize
                            })
                            .collect::<Vec<_>>()
                    })
                })
                .collect();
            threads.into_iter().map(|t| t.join().unwrap()).collect()
        });
        // The arena ran out on the way: some blocks came from the system allocator.
        assert!(blocks.iter().flatten().any(|&p| !inside(&A, p as *mut u8)));
        for (t, list) in blocks.iter().enumerate() {
            for &p in list {
                // SAFETY: each block holds 40 bytes written by its thread only.
                let bytes = unsafe { std::slice::from_raw_parts(p as *const u8, 40) };
                assert!(bytes.iter().all(|&b| b == t as u8), "a block was written by two threads");
                // SAFETY: allocated above with this layout, freed once.
                unsafe { A.dealloc(p as *mut u8, layout) };
            }
        }
    }
}
