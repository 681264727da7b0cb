//! `actionfs-jail [--write PATH]... [--hide PATH]... [--dev] [--network]
//! -- ACTION...`: confines itself (Landlock, seccomp) and execs ACTION.
//! `actionfs serve` names it in the wrapper it answers Create with; a
//! binary of its own because it runs before every action, and a small
//! one execs faster than `actionfs __jail` (docs/BENCHMARKS.md).
//!
//! `no_main`: std's runtime setup before `main` (the main thread's stack
//! guard reads /proc/self/maps) cost about as much as the rest of the
//! jail; std still has the arguments (glibc hands them to `.init_array`).

// A test build keeps std's main for the harness (this file has no tests;
// the library's jail module has them).
#![cfg_attr(not(test), no_main)]

#[cfg(not(test))]
#[no_mangle]
pub extern "C" fn main(_argc: libc::c_int, _argv: *const *const libc::c_char) -> libc::c_int {
    actionfs::jail::main(std::env::args_os().skip(1))
}
