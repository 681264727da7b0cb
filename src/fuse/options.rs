//! What the FUSE layer is told about a mount beside its transport: who
//! may use it, and whether opens reach the daemon. Front ends fill them in
//! from their flags.

/// Who may access the mount.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Allow {
    OwnerOnly,
    RootAndOwner,
    Everyone,
}

/// Whether opens reach the daemon.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ZeroMessageOpens {
    /// Opt-in: the kernel opens files without asking (no OPEN or RELEASE),
    /// which changes what open files show (docs/actionfs.1.md).
    On,
    /// Every open is a round trip (the default; needed for passthrough).
    Off,
}
