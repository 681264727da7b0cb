//! `calibrate` and `replay` show their progress on stderr when it is a
//! terminal (a pseudo-terminal from script(1) here) and write none when it
//! is not (a pipe, as in CI or a log).

use std::path::Path;
use std::process::{Command, Output};

use actionfs_testkit::tier::{require, skip, Need};
use actionfs_testkit::*;

/// Runs `args` with stderr on a pseudo-terminal; returns what the
/// terminal showed (stdout and stderr together).
fn on_a_terminal(args: &[String]) -> Option<String> {
    let quoted: Vec<String> = args
        .iter()
        .map(|a| format!("'{}'", a.replace('\'', r"'\''")))
        .collect();
    let out = Command::new("script")
        .args(["-q", "-e", "-c", &quoted.join(" "), "/dev/null"])
        .stdin(std::process::Stdio::null())
        .output();
    match out {
        Ok(out) if out.status.success() => Some(String::from_utf8_lossy(&out.stdout).into_owned()),
        Ok(out) => panic!("{args:?} on a terminal: {out:?}"),
        Err(err) => {
            skip(&format!("script(1) cannot run: {err}"));
            None
        }
    }
}

fn piped(args: &[String]) -> Output {
    let out = Command::new(&args[0]).args(&args[1..]).output().unwrap();
    assert!(out.status.success(), "{args:?}: {out:?}");
    out
}

fn assert_quiet(out: &Output, label: &str) {
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !stderr.contains('\r') && !stderr.contains(&format!("{label}: ")),
        "progress written to a pipe: {stderr:?}"
    );
}

#[test]
fn replay_shows_progress_on_a_terminal_only() {
    if !require(&[Need::Mount]) {
        return;
    }
    let fx = Fixture::new();
    let input = fx.write("src/a", "a");
    let mut stream = String::new();
    for i in 0..5 {
        stream.push_str(&format!(
            "{{\"C\":{{\"i\":\"s{i}\",\"m\":[{{\"p\":\"/a\",\"u\":{:?}}}]}}}}\n{{\"D\":\"s{i}\"}}\n",
            input.display().to_string()
        ));
    }
    let file = fx.path("stream.json");
    std::fs::write(&file, stream).unwrap();
    let args = |mnt: &str| -> Vec<String> {
        let mnt = fx.path(mnt);
        std::fs::create_dir_all(&mnt).unwrap();
        vec![
            bin().to_owned(),
            "replay".to_owned(),
            file.display().to_string(),
            mnt.display().to_string(),
            "--".to_owned(),
            "--native_below=0".to_owned(),
        ]
    };

    let out = piped(&args("mnt-piped"));
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("replayed 10 requests"),
        "{out:?}"
    );
    assert_quiet(&out, "replay");

    let Some(shown) = on_a_terminal(&args("mnt-tty")) else {
        return;
    };
    assert!(shown.contains("replay: 10/10 (100%)"), "{shown:?}");
    assert!(shown.contains("replayed 10 requests"), "{shown:?}");
}

#[test]
fn calibrate_shows_progress_on_a_terminal_only() {
    if !require(&[Need::Mount]) {
        return;
    }
    let fx = Fixture::new();
    let args = |dir: &Path| -> Vec<String> {
        vec![
            bin().to_owned(),
            "calibrate".to_owned(),
            "--quick".to_owned(),
            "--sizes=10".to_owned(),
            format!("--dir={}", dir.display()),
        ]
    };
    let out = piped(&args(&fx.path("scratch")));
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("recommended: --native_below="),
        "{out:?}"
    );
    assert_quiet(&out, "calibrate");
    assert!(out.stderr.is_empty(), "{out:?}");

    let Some(shown) = on_a_terminal(&args(&fx.path("scratch"))) else {
        return;
    };
    // 1 size x 2 read fractions x (3 runs + a warm-up) x 2 modes.
    assert!(shown.contains("calibrate: 16/16 (100%)"), "{shown:?}");
    assert!(shown.contains("calibrating in "), "{shown:?}");
    assert!(shown.contains("recommended: --native_below="), "{shown:?}");
}
