//! The `actionfs` binary: parses the command line and runs the daemon or
//! a subcommand.

use std::process::ExitCode;

use actionfs::cli::{self, Command, BAZEL_VERSION_LINE};
use actionfs::daemon::{stop, Stopped};

#[cfg(target_os = "linux")]
#[global_allocator]
static ALLOCATOR: actionfs::allocator::Allocator = actionfs::allocator::Allocator::new();

fn main() -> ExitCode {
    // The jail, before anything else: it runs before every action.
    let mut args = std::env::args_os().skip(1);
    if args.next().as_deref() == Some(actionfs::jail::SUBCOMMAND.as_ref()) {
        return ExitCode::from(actionfs::jail::main(args) as u8);
    }
    let command = cli::parse(std::env::args_os().skip(1));
    // The daemon's start and stop lines are shown by default (in sandboxfs's
    // words, which scripts grep for); subcommands that run daemons of their
    // own (calibrate, replay) stay quiet.
    let default_filter = match &command {
        Ok(Command::Serve(_) | Command::Backend(_)) => "warn,fuser=error,actionfs::lifecycle=info",
        _ => "warn,fuser=error",
    };
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or(default_filter))
        .format_target(false)
        .init();
    match command {
        Err(err) => {
            eprintln!("{err}");
            ExitCode::from(2)
        }
        Ok(Command::Help(text)) => {
            print!("{text}");
            ExitCode::SUCCESS
        }
        Ok(Command::Version) => {
            println!("{BAZEL_VERSION_LINE}");
            println!(
                "actionfs {} (speaks the sandboxfs 0.2 protocol)",
                env!("CARGO_PKG_VERSION")
            );
            ExitCode::SUCCESS
        }
        Ok(Command::Serve(options)) => match actionfs::daemon::run(*options) {
            Ok(Stopped::Unmounted | Stopped::FrontEndDone) => ExitCode::SUCCESS,
            Ok(Stopped::BySignal(signal)) => stop::exit_by(signal),
            Err(err) => exit(Err(err)),
        },
        Ok(Command::Backend(args)) => match actionfs::serve::run(&args) {
            Ok(actionfs::serve::Served::Closed) => ExitCode::SUCCESS,
            Ok(actionfs::serve::Served::Signal(signal)) => stop::exit_by(signal),
            Err(why) => {
                eprintln!("actionfs serve: {why}");
                ExitCode::from(1)
            }
        },
        Ok(Command::Materialize(args)) => exit(actionfs::tools::oneshot::materialize(&args)),
        Ok(Command::Rmtree { dir, verbose }) => {
            exit(actionfs::tools::oneshot::rmtree(&dir, verbose))
        }
        Ok(Command::StageRoot(args)) => exit(actionfs::tools::stage_root::run(&args)),
        Ok(Command::Calibrate(args)) => exit(actionfs::tools::calibrate::run(&args)),
        Ok(Command::Ctl(args)) => exit(actionfs::tools::ctl::run(&args)),
        Ok(Command::Replay(args)) => exit(actionfs::tools::replay::run(&args)),
        Ok(Command::ReplayActions(args)) => exit(actionfs::tools::replay_actions::run(&args)),
        Ok(Command::Doctor(args)) => exit(actionfs::tools::doctor::run(&args)),
        Ok(Command::Man { dir }) => exit(actionfs::tools::man::run(dir.as_deref())),
        Ok(Command::Completions(shell)) => exit(actionfs::tools::man::completions(shell)),
    }
}

/// Status 0, or 1 with the error on one line.
fn exit(result: Result<(), impl std::fmt::Display>) -> ExitCode {
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("actionfs: {err}");
            ExitCode::from(1)
        }
    }
}
