//! `actionfs-jail`, built from this crate alone (for musl, by
//! scripts/package); see `src/bin/actionfs-jail.rs` of the workspace for
//! what it does and why it is `no_main`.

#![cfg_attr(not(test), no_main)]

/// # Safety
/// Called by the C runtime only, with `main`'s arguments.
#[cfg(not(test))]
#[no_mangle]
pub unsafe extern "C" fn main(argc: libc::c_int, argv: *const *const libc::c_char) -> libc::c_int {
    actionfs_jail::main(actionfs_jail::args_from_main(argc, argv))
}
