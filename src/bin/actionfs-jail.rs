//! `actionfs-jail [--write PATH]... [--hide PATH]... [--dev] [--network]
//! -- ACTION...`: confines itself (Landlock, seccomp) and execs ACTION.
//! `actionfs serve` names it in the wrapper it answers Create with; a
//! binary of its own because it runs before every action, and a small
//! one execs faster than `actionfs __jail` (docs/BENCHMARKS.md).

use std::process::ExitCode;

fn main() -> ExitCode {
    ExitCode::from(actionfs::jail::main(std::env::args_os().skip(1)) as u8)
}
