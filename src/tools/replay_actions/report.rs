//! Checking what each run made against the log, and the summary: per mode
//! the actions that succeeded, the outputs compared, every mismatch and
//! failure by name, the wall times with their ratio to `unsandboxed`, and
//! each step's mean time per action.

use std::collections::HashSet;
use std::fmt::Write as _;
use std::fs;
use std::path::Path;
use std::time::Duration;

use super::plan::{hash_file, Action, Plan};
use super::pool::Outcome;
use super::steps::Step;
use super::Mode;

/// Lines of mismatches or failures printed per mode; the rest are counted.
const SHOWN: usize = 40;

/// An output whose digest differs from the log's.
#[derive(Debug, Clone)]
pub struct Mismatch {
    pub run: usize,
    pub action: String,
    pub path: String,
    pub expected: String,
    pub actual: String,
}

#[derive(Debug, Default)]
pub struct ModeReport {
    pub times: Vec<Duration>,
    /// Per run, each step's time summed over its actions.
    pub steps: Vec<[Duration; 4]>,
    pub runs: usize,
    pub actions_ok: usize,
    pub actions: usize,
    pub compared: usize,
    pub mismatches: Vec<Mismatch>,
    /// Failed actions and runs, each told in full.
    pub failures: Vec<String>,
}

/// How long a run took: its wall time, and each step's time summed over
/// its actions ([`Step::ALL`] order).
#[derive(Debug, Clone, Copy)]
pub struct RunTime {
    pub wall: Duration,
    pub steps: [Duration; 4],
}

#[derive(Debug)]
pub struct Report {
    pub modes: Vec<(Mode, ModeReport)>,
}

/// Compares the action's logged outputs with those under `results` (a
/// mode's exec root): each file the log has, and no extra file in a tree
/// artifact. Returns how many were compared and what differs, as (path,
/// expected, actual).
pub fn compare(results: &Path, action: &Action) -> (usize, Vec<(String, String, String)>) {
    let mut differ = Vec::new();
    let shown = |hash: &str, size: i64| format!("{hash} ({size} bytes)");
    for expected in &action.expected {
        let want = shown(&expected.hash, expected.size);
        match hash_file(&results.join(&expected.path)) {
            Ok(got) if got.hash == expected.hash => {}
            Ok(got) => differ.push((
                expected.path.clone(),
                want,
                shown(&got.hash, got.size_bytes),
            )),
            Err(_) => differ.push((expected.path.clone(), want, "no such file".to_owned())),
        }
    }
    let logged: HashSet<&str> = action.expected.iter().map(|e| e.path.as_str()).collect();
    for output in action.outputs.iter().filter(|o| o.dir) {
        let dir = results.join(&output.path);
        if !dir.is_dir() {
            differ.push((
                output.path.clone(),
                "a directory".to_owned(),
                "no such directory".to_owned(),
            ));
            continue;
        }
        let mut found = Vec::new();
        files_below(&dir, &output.path, &mut found);
        for path in found {
            if !logged.contains(path.as_str()) {
                let got = hash_file(&results.join(&path))
                    .map_or_else(|err| err.to_string(), |d| shown(&d.hash, d.size_bytes));
                differ.push((path, "no file (not in the log)".to_owned(), got));
            }
        }
    }
    (action.expected.len(), differ)
}

/// Exec paths of the files below `dir` (exec path `path`).
fn files_below(dir: &Path, path: &str, found: &mut Vec<String>) {
    let Ok(entries) = fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let child = format!("{path}/{}", entry.file_name().to_string_lossy());
        if entry.file_type().is_ok_and(|t| t.is_dir()) {
            files_below(&entry.path(), &child, found);
        } else {
            found.push(child);
        }
    }
}

impl Report {
    pub fn new(modes: &[Mode]) -> Report {
        Report {
            modes: modes.iter().map(|m| (*m, ModeReport::default())).collect(),
        }
    }

    fn of(&mut self, mode: Mode) -> &mut ModeReport {
        &mut self
            .modes
            .iter_mut()
            .find(|(m, _)| *m == mode)
            .expect("a mode of the report")
            .1
    }

    /// A run that could not start (or whose end went wrong).
    pub fn run_failed(&mut self, mode: Mode, run: usize, why: &str) {
        self.of(mode).failures.push(format!("run {run}: {why}"));
    }

    /// Records one run of `mode` and compares the outputs of its
    /// successful actions under `results`; returns a line about it.
    pub fn record(
        &mut self,
        mode: Mode,
        run: usize,
        plan: &Plan,
        time: RunTime,
        outcomes: &[Outcome],
        results: &Path,
    ) -> String {
        let report = self.of(mode);
        report.runs += 1;
        report.times.push(time.wall);
        report.steps.push(time.steps);
        report.actions += outcomes.len();
        let mut ok = 0;
        let mut compared = 0;
        let mut mismatches = 0;
        for (action, outcome) in plan.actions.iter().zip(outcomes) {
            match outcome {
                Outcome::Ok => {
                    ok += 1;
                    let (n, differ) = compare(results, action);
                    compared += n;
                    mismatches += differ.len();
                    for (path, expected, actual) in differ {
                        report.mismatches.push(Mismatch {
                            run,
                            action: action.name(),
                            path,
                            expected,
                            actual,
                        });
                    }
                }
                Outcome::Failed(why) => report
                    .failures
                    .push(format!("run {run}: {} failed: {why}", action.name())),
                Outcome::Blocked(producer) => report.failures.push(format!(
                    "run {run}: {} not run: {}, which makes one of its inputs, failed",
                    action.name(),
                    plan.actions[*producer].name()
                )),
            }
        }
        report.actions_ok += ok;
        report.compared += compared;
        format!(
            "{} run {run}: {ok}/{} actions ok, {compared} outputs compared, {mismatches} mismatches, {:.3} s",
            mode.name(),
            outcomes.len(),
            time.wall.as_secs_f64()
        )
    }

    pub fn ok(&self) -> bool {
        self.modes
            .iter()
            .all(|(_, r)| r.mismatches.is_empty() && r.failures.is_empty())
    }

    /// Mismatches and failures in all, for the last line.
    pub fn problems(&self) -> (usize, usize) {
        self.modes.iter().fold((0, 0), |(m, f), (_, r)| {
            (m + r.mismatches.len(), f + r.failures.len())
        })
    }

    /// The summary, for stdout.
    pub fn render(&self, plan: &Plan) -> String {
        let mut out = String::new();
        let skipped: usize = plan.skipped.values().sum();
        let reasons: Vec<String> = plan
            .skipped
            .iter()
            .map(|(why, n)| format!("{n} {}", why.describe()))
            .collect();
        let _ = writeln!(
            out,
            "actions: {} replayed, {skipped} skipped{}",
            plan.actions.len(),
            if reasons.is_empty() {
                String::new()
            } else {
                format!(" ({})", reasons.join(", "))
            }
        );
        let baseline = self
            .modes
            .iter()
            .find(|(m, _)| *m == Mode::Unsandboxed)
            .and_then(|(_, r)| median(&r.times));
        let _ = writeln!(
            out,
            "{:<14} {:>4} {:>11} {:>8} {:>10} {:>8} {:>9} {:>9} {:>9} {:>13}",
            "mode",
            "runs",
            "actions ok",
            "outputs",
            "mismatches",
            "failures",
            "median s",
            "min s",
            "max s",
            "/unsandboxed"
        );
        for (mode, r) in &self.modes {
            let secs = |d: Option<Duration>| {
                d.map_or("-".to_owned(), |d| format!("{:.3}", d.as_secs_f64()))
            };
            let ratio = match (median(&r.times), baseline) {
                (Some(m), Some(b)) if !b.is_zero() => {
                    format!("{:.2}x", m.as_secs_f64() / b.as_secs_f64())
                }
                _ => "-".to_owned(),
            };
            let _ = writeln!(
                out,
                "{:<14} {:>4} {:>11} {:>8} {:>10} {:>8} {:>9} {:>9} {:>9} {:>13}",
                mode.name(),
                r.runs,
                format!("{}/{}", r.actions_ok, r.actions),
                r.compared,
                r.mismatches.len(),
                r.failures.len(),
                secs(median(&r.times)),
                secs(r.times.iter().min().copied()),
                secs(r.times.iter().max().copied()),
                ratio
            );
        }
        render_steps(&mut out, &self.modes, plan.actions.len());
        let _ = writeln!(out, "{}", inputs_per_action(plan));
        for (mode, r) in &self.modes {
            for m in r.mismatches.iter().take(SHOWN) {
                let _ = writeln!(
                    out,
                    "MISMATCH {} run {}: {} {}: expected {}, got {}",
                    mode.name(),
                    m.run,
                    m.action,
                    m.path,
                    m.expected,
                    m.actual
                );
            }
            if r.mismatches.len() > SHOWN {
                let _ = writeln!(
                    out,
                    "MISMATCH {}: and {} more",
                    mode.name(),
                    r.mismatches.len() - SHOWN
                );
            }
            for f in r.failures.iter().take(SHOWN) {
                let _ = writeln!(out, "FAILED {} {f}", mode.name());
            }
            if r.failures.len() > SHOWN {
                let _ = writeln!(
                    out,
                    "FAILED {}: and {} more",
                    mode.name(),
                    r.failures.len() - SHOWN
                );
            }
        }
        out
    }
}

/// Each step's mean time per action, the median over runs, in ms. With
/// several jobs, steps of different actions overlap: these are not shares
/// of the wall time.
fn render_steps(out: &mut String, modes: &[(Mode, ModeReport)], actions: usize) {
    if actions == 0 || modes.iter().all(|(_, r)| r.steps.is_empty()) {
        return;
    }
    let _ = writeln!(
        out,
        "time per action by step, ms (mean over actions, median of runs):"
    );
    let _ = write!(out, "{:<14}", "mode");
    for step in Step::ALL {
        let _ = write!(out, " {:>9}", step.name());
    }
    out.push('\n');
    for (mode, r) in modes.iter().filter(|(_, r)| !r.steps.is_empty()) {
        let _ = write!(out, "{:<14}", mode.name());
        for step in Step::ALL {
            let per_run: Vec<Duration> = r.steps.iter().map(|s| s[step as usize]).collect();
            let per_action = median(&per_run).unwrap_or_default() / actions as u32;
            let _ = write!(out, " {:>9.3}", per_action.as_secs_f64() * 1e3);
        }
        out.push('\n');
    }
}

/// Inputs per replayed action: median and range (what the docs cite
/// beside each replay's figures).
fn inputs_per_action(plan: &Plan) -> String {
    let mut counts: Vec<usize> = plan.actions.iter().map(|a| a.inputs.len()).collect();
    counts.sort_unstable();
    match (counts.first(), counts.last()) {
        (Some(min), Some(max)) => format!(
            "inputs per action: median {}, min {min}, max {max}",
            counts[counts.len() / 2]
        ),
        _ => "inputs per action: no action".to_owned(),
    }
}

/// A serve run as the backend counted it (its SIGUSR1 report at the end
/// of the run): how its sandboxes were built, Create and Destroy latency
/// percentiles, and FUSE requests per action. A field the report lacks
/// shows as "?", never as 0.
pub fn backend_summary(stats: &serde_json::Value, actions: usize) -> String {
    let count = |v: &serde_json::Value| v.as_u64().map_or("?".to_owned(), |n| n.to_string());
    let ms = |v: &serde_json::Value| {
        v.as_u64()
            .map_or("?".to_owned(), |us| format!("{:.2}", us as f64 / 1e3))
    };
    let built = &stats["built"];
    let latency = |kind: &str| {
        let r = &stats["requests"][kind];
        format!(
            "{kind} p50/p90/p99 {}/{}/{} ms",
            ms(&r["p50_us"]),
            ms(&r["p90_us"]),
            ms(&r["p99_us"])
        )
    };
    let per_action: Vec<String> = ["lookup", "getattr", "open", "read", "write"]
        .iter()
        .map(|op| match stats["fuse"][op].as_u64() {
            Some(n) if actions > 0 => format!("{op} {:.1}", n as f64 / actions as f64),
            _ => format!("{op} ?"),
        })
        .collect();
    // The backend's own CPU (its threads, background deletion included)
    // is what it costs the build beside the actions, whatever the load.
    let live = &stats["live"];
    let cpu = match (live["cpu_user_ms"].as_u64(), live["cpu_system_ms"].as_u64()) {
        (Some(user), Some(system)) if actions > 0 => {
            format!("{:.2}", (user + system) as f64 / actions as f64)
        }
        _ => "?".to_owned(),
    };
    let rss = live["rss_kib"]
        .as_u64()
        .map_or("?".to_owned(), |kib| format!("{:.1}", kib as f64 / 1024.0));
    format!(
        "backend: built {} native, {} from stashes, {} FUSE, {} FUSE fallback; {}; {}; {}; \
         FUSE requests per action: {}; CPU {cpu} ms an action; RSS {rss} MiB",
        count(&built["native"]),
        count(&built["stash"]),
        count(&built["fuse"]),
        count(&built["fuse_fallback"]),
        latency("create"),
        latency("destroy"),
        latency("collect"),
        per_action.join(", ")
    )
}

/// The median (the mean of the middle two for an even count).
pub fn median(times: &[Duration]) -> Option<Duration> {
    let mut sorted = times.to_vec();
    sorted.sort_unstable();
    match sorted.len() {
        0 => None,
        n if n % 2 == 1 => Some(sorted[n / 2]),
        n => Some((sorted[n / 2 - 1] + sorted[n / 2]) / 2),
    }
}

#[cfg(test)]
mod tests {
    use super::super::plan::{Expected, Output};
    use super::*;
    use actionfs_protocol::backend::digest::sha256_hex;

    #[test]
    fn medians() {
        let s = Duration::from_secs;
        assert_eq!(median(&[]), None);
        assert_eq!(median(&[s(3), s(1), s(2)]), Some(s(2)));
        assert_eq!(
            median(&[s(4), s(1), s(2), s(3)]),
            Some(Duration::from_millis(2500))
        );
    }

    #[test]
    fn compares_files_and_tree_artifacts() {
        let root = std::env::temp_dir().join(format!("replay-report-{}", std::process::id()));
        fs::create_dir_all(root.join("t/sub")).unwrap();
        fs::write(root.join("same"), "same").unwrap();
        fs::write(root.join("other"), "other").unwrap();
        fs::write(root.join("t/a"), "a").unwrap();
        fs::write(root.join("t/sub/extra"), "x").unwrap();
        let expect = |path: &str, bytes: &[u8]| Expected {
            path: path.to_owned(),
            hash: sha256_hex(bytes),
            size: bytes.len() as i64,
        };
        let action = Action {
            number: 7,
            mnemonic: "Gen".into(),
            argv: vec!["true".into()],
            env: vec![],
            inputs: vec![],
            empty_dirs: vec![],
            timeout_secs: 0,
            outputs: vec![
                Output {
                    path: "same".into(),
                    dir: false,
                },
                Output {
                    path: "other".into(),
                    dir: false,
                },
                Output {
                    path: "gone".into(),
                    dir: false,
                },
                Output {
                    path: "t".into(),
                    dir: true,
                },
            ],
            expected: vec![
                expect("same", b"same"),
                expect("other", b"expected"),
                expect("gone", b""),
                expect("t/a", b"a"),
            ],
            deps: vec![],
        };
        let (n, differ) = compare(&root, &action);
        fs::remove_dir_all(&root).unwrap();
        assert_eq!(n, 4);
        let paths: Vec<&str> = differ.iter().map(|d| d.0.as_str()).collect();
        assert_eq!(paths, ["other", "gone", "t/sub/extra"]);
        assert!(
            differ[0].1.contains(&sha256_hex(b"expected")) && differ[0].2.contains("(5 bytes)")
        );
        assert_eq!(differ[1].2, "no such file");
    }
}
