//! The kernel caches of destroyed sandboxes: kept for a while
//! ([`retention`]), taken over by the next sandbox over the same inputs
//! ([`adoption`]), or let go with the kernel told to forget them
//! ([`departure`]), off the request path ([`reaper`]).

pub mod adoption;
pub mod departure;
pub mod reaper;
pub mod retention;
