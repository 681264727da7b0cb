//! The subcommands other than the daemon itself.

pub mod calibrate;
pub mod command_line;
pub mod ctl;
pub mod doctor;
pub mod man;
pub mod oneshot;
pub mod progress;
pub mod replay;
pub mod replay_actions;
pub mod stage_root;
