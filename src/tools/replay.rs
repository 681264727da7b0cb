//! `actionfs replay FILE MOUNTPOINT`: re-drives a request stream against
//! a fresh daemon and prints per-request latency percentiles, so that any
//! recorded build becomes a benchmark.
//!
//! FILE is a recording made with `--record` (requests are sent at their
//! recorded times, answers compared with the recorded ones) or a raw
//! stream as Bazel writes it, such as the traces in `shared/traces` (sent
//! as fast as the daemon answers). Requests for one sandbox id are sent
//! one after another, each once the previous one was answered, as Bazel
//! does; requests for different ids overlap, at most `--window` at once.

use std::collections::hash_map::DefaultHasher;
use std::collections::{BTreeSet, HashMap, VecDeque};
use std::hash::{Hash, Hasher};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::mpsc::channel;
use std::sync::Arc;
use std::time::{Duration, Instant};

use actionfs_protocol::{Client, ClientError, Decoded, PrefixTable, Request, RequestReader};
use parking_lot::Mutex;
use serde_json::Value;

use crate::tools::progress::Progress;

#[derive(Debug)]
pub struct ReplayArgs {
    pub file: PathBuf,
    pub mount_point: PathBuf,
    pub flood: bool,
    pub window: usize,
    pub populate: Option<PathBuf>,
    pub daemon_flags: Vec<String>,
}

#[derive(Debug)]
pub struct ReplayError(String);

impl std::fmt::Display for ReplayError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// One request to send: when (from the start), and whether the recording
/// says it succeeded (`None`: not recorded).
struct Step {
    at: Option<Duration>,
    request: Request,
    recorded_ok: Option<bool>,
}

/// The probe every client sends first; the replaying client sends its own.
fn is_probe(request: &Request) -> bool {
    matches!(request, Request::Create(c) if c.id == "empty" && c.mappings.is_empty())
}

/// Points the placeholder roots of the traces in `shared/traces` into
/// `root`.
pub fn rewrite_placeholders(raw: &str, root: &Path) -> String {
    raw.replace(
        "/BAZEL_OUTPUT_BASE",
        &root.join("output_base").to_string_lossy(),
    )
    .replace(
        "/BAZEL_WORKSPACE",
        &root.join("workspace").to_string_lossy(),
    )
}

/// Creates every underlying path `requests` name: writable mappings are
/// scratch directories, the others files holding their own path. Returns
/// how many files were made.
pub fn populate(requests: &[Request]) -> std::io::Result<usize> {
    let mut prefixes = PrefixTable::new();
    let mut files = BTreeSet::new();
    for request in requests {
        let Request::Create(create) = request else {
            continue;
        };
        let invalid = |e: actionfs_protocol::ResolveError| {
            std::io::Error::new(std::io::ErrorKind::InvalidData, e.0)
        };
        prefixes.register(&create.prefixes).map_err(invalid)?;
        for mapping in &create.mappings {
            let resolved = prefixes.resolve(mapping).map_err(invalid)?;
            if resolved.writable {
                std::fs::create_dir_all(&resolved.underlying)?;
            } else if files.insert(resolved.underlying.clone()) {
                if let Some(parent) = resolved.underlying.parent() {
                    std::fs::create_dir_all(parent)?;
                }
                std::fs::write(
                    &resolved.underlying,
                    resolved.underlying.as_os_str().as_encoded_bytes(),
                )?;
            }
        }
    }
    Ok(files.len())
}

fn load(args: &ReplayArgs) -> Result<Vec<Step>, ReplayError> {
    let fail = |what: String| ReplayError(format!("{:?}: {what}", args.file));
    let mut raw = std::fs::read_to_string(&args.file).map_err(|e| fail(e.to_string()))?;
    if let Some(root) = &args.populate {
        raw = rewrite_placeholders(&raw, root);
    }
    let recorded = raw
        .lines()
        .next()
        .and_then(|line| serde_json::from_str::<Value>(line).ok())
        .is_some_and(|first| first.get("t_us").is_some());
    let steps = if recorded {
        load_recording(&raw).map_err(|err| fail(err.to_string()))?
    } else {
        RequestReader::new(raw.as_bytes())
            .map(|item| match item {
                Ok(Decoded::Request(request)) => Ok(Step {
                    at: None,
                    request,
                    recorded_ok: None,
                }),
                Ok(Decoded::Invalid { id, message }) => Err(fail(match id {
                    Some(id) => format!("request for {id:?}: {message}"),
                    None => message,
                })),
                Err(err) => Err(fail(err.message)),
            })
            .collect::<Result<_, _>>()?
    };
    if args.populate.is_some() {
        let requests: Vec<Request> = steps.iter().map(|s| s.request.clone()).collect();
        populate(&requests).map_err(|e| fail(format!("populate: {e}")))?;
    }
    let mut steps: Vec<Step> = steps
        .into_iter()
        .filter(|step| !is_probe(&step.request))
        .collect();
    carry_prefixes(&mut steps);
    Ok(steps)
}

/// Makes every create register the prefixes it uses: requests for
/// different ids may now reach the daemon in another order than the one
/// that registered them first. (Registering a prefix again with the same
/// path is allowed.)
fn carry_prefixes(steps: &mut [Step]) {
    let mut known = std::collections::BTreeMap::new();
    for step in steps {
        let Request::Create(create) = &mut step.request else {
            continue;
        };
        known.extend(create.prefixes.clone());
        for mapping in &create.mappings {
            for id in [mapping.path_prefix, mapping.underlying_path_prefix] {
                if let Some(path) = known.get(&id).filter(|_| id != 0) {
                    create.prefixes.insert(id, path.clone());
                }
            }
        }
    }
}

/// A `--record` line (1-based) that is not the JSON it should be.
#[derive(Debug, thiserror::Error)]
#[error("line {line}: {source}")]
struct BadLine {
    line: usize,
    source: serde_json::Error,
}

/// Reads `--record` lines; each answer is matched to the oldest
/// unanswered request of its id.
fn load_recording(raw: &str) -> Result<Vec<Step>, BadLine> {
    let mut steps = Vec::new();
    let mut waiting: HashMap<String, VecDeque<usize>> = HashMap::new();
    for (n, line) in raw
        .lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
    {
        let event: Value = serde_json::from_str(line).map_err(|source| BadLine {
            line: n + 1,
            source,
        })?;
        let at = Duration::from_micros(event["t_us"].as_u64().unwrap_or(0));
        if let Some(request) = event.get("request") {
            let request: Request =
                serde_json::from_value(request.clone()).map_err(|source| BadLine {
                    line: n + 1,
                    source,
                })?;
            waiting
                .entry(request.id().to_owned())
                .or_default()
                .push_back(steps.len());
            steps.push(Step {
                at: Some(at),
                request,
                recorded_ok: None,
            });
        } else if let Some(answer) = event.get("answer") {
            let id = answer["id"].as_str().unwrap_or_default();
            if let Some(index) = waiting.get_mut(id).and_then(VecDeque::pop_front) {
                steps[index].recorded_ok = Some(answer["error"].is_null());
            }
        }
    }
    Ok(steps)
}

/// What one request took.
struct Timed {
    create: bool,
    took: Duration,
    ok: bool,
    recorded_ok: Option<bool>,
}

pub fn run(args: &ReplayArgs) -> Result<(), ReplayError> {
    let steps = load(args)?;
    let exe = std::env::current_exe().map_err(|e| ReplayError(format!("current_exe: {e}")))?;
    let mut command = Command::new(exe);
    command
        .args(&args.daemon_flags)
        .arg(&args.mount_point)
        .stderr(Stdio::inherit());
    let client = Arc::new(
        Client::start(command).map_err(|e| ReplayError(format!("daemon did not start: {e}")))?,
    );
    let workers = args.window.max(1);
    let results: Arc<Mutex<Vec<Timed>>> = Arc::default();
    let progress = Arc::new(Mutex::new(Progress::new("replay", steps.len())));
    let mut queues = Vec::new();
    let mut handles = Vec::new();
    for _ in 0..workers {
        let (tx, rx) = channel::<Step>();
        queues.push(tx);
        let (client, results, progress) = (client.clone(), results.clone(), progress.clone());
        handles.push(std::thread::spawn(move || {
            for step in rx {
                let started = Instant::now();
                let outcome = client.call(&step.request);
                let took = started.elapsed();
                if let Err(ClientError::Io(err)) = &outcome {
                    eprintln!("replay: {err}");
                }
                results.lock().push(Timed {
                    create: matches!(step.request, Request::Create(_)),
                    took,
                    ok: outcome.is_ok(),
                    recorded_ok: step.recorded_ok,
                });
                progress.lock().step();
            }
        }));
    }
    let count = steps.len();
    let started = Instant::now();
    for step in steps {
        if let (Some(at), false) = (step.at, args.flood) {
            if let Some(wait) = at.checked_sub(started.elapsed()) {
                std::thread::sleep(wait);
            }
        }
        let mut hasher = DefaultHasher::new();
        step.request.id().hash(&mut hasher);
        let worker = (hasher.finish() % workers as u64) as usize;
        if queues[worker].send(step).is_err() {
            return Err(ReplayError("a replay worker died".into()));
        }
    }
    drop(queues);
    for handle in handles {
        let _ = handle.join();
    }
    let elapsed = started.elapsed();
    drop(progress);
    let client = Arc::try_unwrap(client)
        .map_err(|_| ReplayError("replay workers still hold the daemon".into()))?;
    let status = client
        .terminate()
        .map_err(|e| ReplayError(format!("stopping the daemon: {e}")))?;
    report(&results.lock(), count, elapsed, workers);
    let differing = results
        .lock()
        .iter()
        .filter(|t| t.recorded_ok.is_some_and(|ok| ok != t.ok))
        .count();
    if differing > 0 {
        return Err(ReplayError(format!(
            "{differing} answers differ from the recording"
        )));
    }
    if results
        .lock()
        .iter()
        .any(|t| t.recorded_ok.is_none() && !t.ok)
    {
        return Err(ReplayError("some requests failed".into()));
    }
    log::info!("daemon exited: {status}");
    Ok(())
}

/// Prints latency percentiles per request kind.
fn report(results: &[Timed], count: usize, elapsed: Duration, workers: usize) {
    println!(
        "replayed {count} requests in {:.3} s ({workers} at most in flight)",
        elapsed.as_secs_f64()
    );
    for (name, create) in [("create", true), ("destroy", false)] {
        let mut took: Vec<Duration> = results
            .iter()
            .filter(|t| t.create == create)
            .map(|t| t.took)
            .collect();
        if took.is_empty() {
            continue;
        }
        took.sort();
        let at = |q: f64| took[((took.len() - 1) as f64 * q).round() as usize];
        let ms = |d: Duration| d.as_secs_f64() * 1000.0;
        println!(
            "{name:<8} n={:<6} p50={:.3}ms p90={:.3}ms p99={:.3}ms max={:.3}ms",
            took.len(),
            ms(at(0.5)),
            ms(at(0.9)),
            ms(at(0.99)),
            ms(at(1.0))
        );
    }
    let failed = results.iter().filter(|t| !t.ok).count();
    let differing = results
        .iter()
        .filter(|t| t.recorded_ok.is_some_and(|ok| ok != t.ok))
        .count();
    println!("failed: {failed}, answers differing from the recording: {differing}");
}
