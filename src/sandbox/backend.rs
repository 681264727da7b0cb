//! What a front end's request loop drives: a sandbox made from its
//! drafted layout, or removed, and why a request was refused. The core
//! implements it (`hybrid::Sandboxes`); the daemon's loop and `serve`
//! call it.

use crate::sandbox::layout::Draft;

/// Why a request was refused; its text is the answer's error.
pub type Refusal = Box<dyn std::error::Error + Send + Sync>;

/// What the request loop drives.
pub trait Backend: Send + Sync {
    /// Creates sandbox `id` from its drafted layout; on success says how
    /// it was made (for the log).
    fn create(&self, id: &str, draft: Draft) -> Result<&'static str, Refusal>;
    fn destroy(&self, id: &str) -> Result<(), Refusal>;
}
