//! The command line as a user meets it: the real binary's help, the man
//! page and completions it generates, and the manual in docs/ keeping up
//! with every flag of the definition.

use std::path::Path;
use std::process::{Command, Output};

use actionfs_testkit::bin;

const SUBCOMMANDS: [&str; 11] = [
    "materialize",
    "stage-root",
    "rmtree",
    "calibrate",
    "ctl",
    "replay",
    "replay-actions",
    "serve",
    "doctor",
    "man",
    "completions",
];

fn run(args: &[&str]) -> Output {
    Command::new(bin()).args(args).output().unwrap()
}

fn stdout(args: &[&str]) -> String {
    let out = run(args);
    assert!(out.status.success(), "{args:?}: {out:?}");
    String::from_utf8(out.stdout).unwrap()
}

/// The lines of the section of `help` that starts with `heading`.
fn section<'a>(help: &'a str, heading: &str) -> Vec<&'a str> {
    help.lines()
        .skip_while(|l| *l != heading)
        .skip(1)
        .take_while(|l| !l.is_empty())
        .collect()
}

#[test]
fn help_lists_each_subcommand_with_its_own_description_and_one_mountpoint() {
    let help = stdout(&["--help"]);
    let usage: Vec<&str> = help
        .lines()
        .skip_while(|l| !l.starts_with("Usage:"))
        .take(2)
        .collect();
    assert_eq!(
        usage,
        [
            "Usage: actionfs [OPTIONS] MOUNTPOINT",
            "       actionfs <COMMAND> [OPTIONS] ..."
        ],
        "{help}"
    );
    let commands = section(&help, "Commands:");
    let described: Vec<(&str, &str)> = commands
        .iter()
        .map(|line| {
            let line = line.trim_start();
            let (name, about) = line.split_once(' ').unwrap_or((line, ""));
            (name, about.trim())
        })
        .collect();
    let names: Vec<&str> = described.iter().map(|(name, _)| *name).collect();
    assert_eq!(names, SUBCOMMANDS, "{help}");
    for (name, about) in &described {
        assert!(!about.is_empty(), "{name} has no description: {help}");
        // Each subcommand's own words, none of another's.
        let own = match *name {
            "calibrate" => "recommend --native_below",
            "ctl" => "control socket",
            "replay" => "recorded with --record",
            "replay-actions" => "execution log",
            "doctor" => "this machine",
            "serve" => "sandbox backend protocol",
            "man" => "manual page",
            "completions" => "completions",
            "materialize" => "real files",
            "rmtree" => "rm -rf",
            "stage-root" => "REAPI input root",
            _ => unreachable!(),
        };
        assert!(about.contains(own), "{name}: {about:?}");
        for (other, other_about) in &described {
            if other != name {
                assert!(
                    !about.contains(*other_about),
                    "{name} carries {other}'s text"
                );
            }
        }
    }
    assert_eq!(
        section(&help, "Arguments:"),
        ["  <MOUNTPOINT>", "          Where to mount (a directory)"],
        "{help}"
    );
    assert!(!help.contains("MOUNTPOINT]..."), "{help}");
}

#[test]
fn every_subcommand_and_ctl_verb_takes_h_without_its_arguments() {
    for args in SUBCOMMANDS.iter().map(|sub| vec![*sub, "-h"]).chain(
        ["create", "destroy", "list", "stats", "accessed"]
            .iter()
            .map(|verb| vec!["ctl", verb, "--help"]),
    ) {
        let help = stdout(&args);
        let usage = format!("Usage: actionfs {}", args[..args.len() - 1].join(" "));
        assert!(help.contains(&usage), "{args:?}: {help}");
    }
    // Help still loses to an unknown flag, in a subcommand too.
    let out = run(&["ctl", "--help", "--bogus"]);
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    assert!(String::from_utf8_lossy(&out.stderr).contains("--bogus"));
}

/// Every long flag of the definition, with the subcommand path it is on.
fn flags(command: &clap::Command, path: &str, out: &mut Vec<(String, String)>) {
    for arg in command.get_arguments().filter(|a| !a.is_hide_set()) {
        if let Some(long) = arg.get_long() {
            out.push((path.to_owned(), format!("--{long}")));
        }
    }
    for sub in command.get_subcommands() {
        let inner = format!("{path} {}", sub.get_name());
        out.push((path.to_owned(), sub.get_name().to_owned()));
        flags(sub, inner.trim(), out);
    }
}

#[test]
fn every_flag_and_subcommand_of_the_definition_is_in_the_manual() {
    let manual =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/actionfs.1.md"))
            .unwrap();
    let mut all = Vec::new();
    flags(&actionfs::cli::command(), "", &mut all);
    assert!(all.len() > 40, "{all:?}");
    let missing: Vec<String> = all
        .iter()
        .filter(|(_, name)| {
            let documented = if name.starts_with("--") {
                // As `--flag`, `--flag=...` or `--flag VALUE`.
                [
                    format!("`{name}`"),
                    format!("`{name}="),
                    format!("`{name} "),
                ]
                .iter()
                .any(|form| manual.contains(form.as_str()))
            } else {
                [
                    format!("`{name}`"),
                    format!("`{name} "),
                    format!("actionfs {name}"),
                ]
                .iter()
                .any(|form| manual.contains(form.as_str()))
            };
            !documented
        })
        .map(|(path, name)| format!("{name} (actionfs {path})"))
        .collect();
    assert!(missing.is_empty(), "not in docs/actionfs.1.md: {missing:?}");
}

#[test]
fn the_man_page_and_completions_come_from_the_definition() {
    let page = stdout(&["man"]);
    assert!(page.contains(".TH actionfs 1"), "{page}");
    let definition = actionfs::cli::command();
    for arg in definition.get_arguments().filter(|a| !a.is_hide_set()) {
        if let Some(long) = arg.get_long() {
            let roff = format!("\\-\\-{}", long.replace('-', "\\-"));
            assert!(page.contains(&roff), "--{long} missing from the page");
        }
    }
    for sub in SUBCOMMANDS {
        assert!(
            page.contains(&format!("actionfs\\-{}(1)", sub.replace('-', "\\-"))),
            "{sub}: {page}"
        );
    }

    // One page per (sub)command, each a page man can format.
    let dir = tempfile::tempdir().unwrap();
    let out = run(&["man", "--dir", dir.path().to_str().unwrap()]);
    assert!(out.status.success(), "{out:?}");
    for name in [
        "actionfs.1",
        "actionfs-doctor.1",
        "actionfs-ctl.1",
        "actionfs-ctl-create.1",
    ] {
        let page = std::fs::read_to_string(dir.path().join(name)).unwrap();
        assert!(
            page.starts_with(".ie") && page.contains(".SH SYNOPSIS"),
            "{name}"
        );
    }
    let ctl = std::fs::read_to_string(dir.path().join("actionfs-ctl.1")).unwrap();
    assert!(
        ctl.contains("\\-\\-control") && ctl.contains("\\-\\-json"),
        "{ctl}"
    );
    if Path::new("/usr/bin/man").exists() {
        let formatted = Command::new("man")
            .arg("-l")
            .arg(dir.path().join("actionfs-doctor.1"))
            .env("MANPAGER", "cat")
            .env("MANWIDTH", "100")
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&formatted.stdout);
        assert!(text.contains("--sandbox-base"), "{formatted:?}");
    }

    let bash = stdout(&["completions", "bash"]);
    for word in [
        "_actionfs()",
        "doctor",
        "completions",
        "--native_below",
        "--sandbox-base",
    ] {
        assert!(
            bash.contains(word),
            "{word} missing from the bash completions"
        );
    }
    let script = dir.path().join("actionfs.bash");
    std::fs::write(&script, &bash).unwrap();
    let syntax = Command::new("bash")
        .arg("-n")
        .arg(&script)
        .output()
        .unwrap();
    assert!(syntax.status.success(), "{syntax:?}");
    assert!(stdout(&["completions", "zsh"]).starts_with("#compdef actionfs"));
    assert!(stdout(&["completions", "fish"]).contains("complete -c actionfs"));
    let out = run(&["completions", "tcsh"]);
    assert_eq!(out.status.code(), Some(2), "{out:?}");
}
