//! Everything that speaks FUSE: the shell that serves the kernel's requests
//! from the core, the kernel cache notifications the core asks for, and
//! the passthrough bookkeeping for file data.

mod notify;
mod passthrough;
mod shell;

pub use notify::NotifierInvalidator;
pub use shell::FuseShell;
