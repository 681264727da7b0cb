//! Everything that speaks FUSE: the dispatcher that serves the kernel's
//! requests from the core, the shell that carries them over fuser's
//! `/dev/fuse` loop, the kernel cache notifications the core asks for, and
//! the passthrough bookkeeping for file data.

mod dispatch;
mod notify;
mod passthrough;
mod shell;

pub use dispatch::{Ctx, Dispatcher, Entry, Open};
pub use notify::NotifierInvalidator;
pub use shell::FuseShell;
