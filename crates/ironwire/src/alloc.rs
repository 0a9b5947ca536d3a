//! The daemon's global allocator: the system allocator, counting the
//! allocations each reactor thread makes, so that `ctl stats` can show (and
//! a test can assert) that the I/O path allocates nothing per command.
//!
//! Each reactor thread registers a counter of its own; only that thread
//! writes it (a plain load and store, no read-modify-write), and `ctl
//! stats` reads it from the control thread. Other threads are not counted.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

/// The system allocator with per-reactor-thread counts.
pub struct Counting;

thread_local! {
    static COUNTER: Cell<Option<&'static AtomicU64>> = const { Cell::new(None) };
}

static REGISTRY: Mutex<Vec<(String, &'static AtomicU64)>> = Mutex::new(Vec::new());

fn count() {
    // `try_with`: during thread teardown the slot may be gone.
    let _ = COUNTER.try_with(|c| {
        if let Some(n) = c.get() {
            n.store(n.load(Ordering::Relaxed) + 1, Ordering::Relaxed);
        }
    });
}

// SAFETY: every call is forwarded unchanged to the system allocator; the
// counting touches only a thread-local cell and the thread's own counter
// and never allocates.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        count();
        // SAFETY: forwarded with the caller's guarantees.
        unsafe { System.alloc(layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        count();
        // SAFETY: forwarded with the caller's guarantees.
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        count();
        // SAFETY: forwarded with the caller's guarantees.
        unsafe { System.realloc(ptr, layout, new_size) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: forwarded with the caller's guarantees.
        unsafe { System.dealloc(ptr, layout) }
    }
}

/// Starts counting the calling thread's allocations under `name`.
pub fn count_this_thread(name: String) {
    let counter: &'static AtomicU64 = Box::leak(Box::new(AtomicU64::new(0)));
    if let Ok(mut r) = REGISTRY.lock() {
        r.push((name, counter));
    }
    COUNTER.with(|c| c.set(Some(counter)));
}

/// Allocations (and reallocations) of each counted thread, by name.
pub fn counts() -> Vec<(String, u64)> {
    let mut out: Vec<(String, u64)> = match REGISTRY.lock() {
        Ok(r) => r.iter().map(|(n, c)| (n.clone(), c.load(Ordering::Relaxed))).collect(),
        Err(_) => Vec::new(),
    };
    out.sort();
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_registered_thread_counts_its_own_allocations_only() {
        let h = std::thread::spawn(|| {
            count_this_thread("alloc-test-a".into());
            let v: Vec<Box<u64>> = (0..10).map(Box::new).collect();
            drop(v);
        });
        h.join().expect("join");
        std::thread::spawn(|| drop(Box::new(5u8))).join().expect("join");
        let n = counts().into_iter().find(|(n, _)| n == "alloc-test-a").map(|(_, c)| c);
        // Ten boxes and the vector; thread start-up may add a few.
        assert!(n.is_some_and(|c| (11..40).contains(&c)), "{n:?}");
    }
}
