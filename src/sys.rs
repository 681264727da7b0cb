//! The platform-specific mechanisms behind one interface: the Linux forms
//! are the crate in `linux/`, the macOS forms the crate in `macos/`, with
//! the same names. Everything else uses calls both platforms share.

#[cfg(target_os = "linux")]
pub use actionfs_linux::*;
#[cfg(target_os = "macos")]
pub use actionfs_macos::*;
