//! `actionfs-jail [--write PATH]... [--hide PATH]... [--dev] [--network]
//! [--namespaces] -- ACTION...`: confines itself (Landlock, seccomp, with
//! `--namespaces` a read-only host) and runs ACTION, killing what it
//! leaves running; `actionfs-jail --probe-namespaces` says whether
//! `--namespaces` works here.
//! `actionfs serve` names it in the wrapper it answers Create with; a
//! binary of its own because it runs before every action, and a small
//! one execs faster than `actionfs __jail` (docs/BENCHMARKS.md).
//!
//! One source, two builds: the workspace's `actionfs-jail` (a `[[bin]]`
//! of the root package, beside `actionfs`) and the package's, built for
//! musl from this crate alone (`--features helper`, scripts/package),
//! whose start-up costs less again.
//!
//! `no_main`: std's runtime setup before `main` (the main thread's stack
//! guard reads /proc/self/maps) cost about as much as the rest of the
//! jail.

// A test build keeps std's main for the harness (this file has no tests;
// the library has them).
#![cfg_attr(not(test), no_main)]

/// # Safety
/// Called by the C runtime only, with `main`'s arguments.
#[cfg(not(test))]
#[no_mangle]
pub unsafe extern "C" fn main(argc: libc::c_int, argv: *const *const libc::c_char) -> libc::c_int {
    actionfs_jail::main(actionfs_jail::args_from_main(argc, argv))
}
