//! `actionfs ctl`: drives a running daemon through its control socket
//! (`--control=PATH`, see [`crate::daemon::control`]). Prints for people by
//! default and the daemon's JSON answer with `--json`.

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::PathBuf;

use actionfs_protocol::{CreateSandbox, Decoded, Mapping, Request, RequestReader};
use serde_json::{json, Value};

/// What `ctl` was asked to do.
#[derive(Debug)]
pub struct CtlArgs {
    pub control: PathBuf,
    pub json: bool,
    pub verb: Verb,
}

#[derive(Debug)]
pub enum Verb {
    Create {
        id: String,
        /// `(writable, path in the sandbox, underlying path)`.
        maps: Vec<(bool, String, String)>,
        spec: Option<PathBuf>,
    },
    Destroy(String),
    List,
    Stats,
    Accessed(String),
}

/// A failure of `ctl` itself or an error the daemon answered.
#[derive(Debug)]
pub struct CtlError(String);

impl std::fmt::Display for CtlError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

pub fn run(args: &CtlArgs) -> Result<(), CtlError> {
    let request = request_for(&args.verb)?;
    let answer = call(&args.control, &request)?;
    if args.json {
        println!("{answer}");
    } else {
        print_human(&args.verb, &answer);
    }
    match answer.get("error") {
        Some(Value::String(message)) => Err(CtlError(message.clone())),
        _ => Ok(()),
    }
}

fn request_for(verb: &Verb) -> Result<Value, CtlError> {
    Ok(match verb {
        Verb::Create { id, maps, spec } => {
            let mut create = match spec {
                Some(path) => read_spec(path)?,
                None => CreateSandbox::default(),
            };
            create.id = id.clone();
            create
                .mappings
                .extend(maps.iter().map(|(writable, path, underlying)| Mapping {
                    path: path.clone(),
                    underlying_path: underlying.clone(),
                    writable: *writable,
                    ..Mapping::default()
                }));
            serde_json::to_value(Request::Create(create)).expect("a request serializes")
        }
        Verb::Destroy(id) => {
            serde_json::to_value(Request::Destroy(id.clone())).expect("a request serializes")
        }
        Verb::List => json!({ "List": null }),
        Verb::Stats => json!({ "Stats": null }),
        Verb::Accessed(id) => json!({ "Accessed": id }),
    })
}

/// One CreateSandbox request as on the wire.
fn read_spec(path: &PathBuf) -> Result<CreateSandbox, CtlError> {
    let bytes = std::fs::read(path).map_err(|e| CtlError(format!("spec {path:?}: {e}")))?;
    match RequestReader::new(bytes.as_slice()).next() {
        Some(Ok(Decoded::Request(Request::Create(create)))) => Ok(create),
        Some(Ok(Decoded::Invalid { message, .. })) => {
            Err(CtlError(format!("spec {path:?}: {message}")))
        }
        Some(Err(err)) => Err(CtlError(format!("spec {path:?}: {}", err.message))),
        _ => Err(CtlError(format!(
            "spec {path:?}: expected one CreateSandbox request"
        ))),
    }
}

fn call(control: &PathBuf, request: &Value) -> Result<Value, CtlError> {
    let fail = |what: &str, err: std::io::Error| CtlError(format!("{control:?}: {what}: {err}"));
    let mut stream = UnixStream::connect(control).map_err(|e| fail("connect", e))?;
    // A daemon that refuses us answers and closes before reading our request,
    // so a failed send may still leave its answer to read: read it first.
    let sent = stream
        .write_all(request.to_string().as_bytes())
        .and_then(|()| stream.shutdown(std::net::Shutdown::Write));
    let mut line = String::new();
    let received = BufReader::new(stream).read_line(&mut line);
    if line.is_empty() {
        sent.map_err(|e| fail("send", e))?;
        received.map_err(|e| fail("receive", e))?;
    }
    serde_json::from_str(&line).map_err(|e| {
        CtlError(format!(
            "{control:?}: the answer is not JSON ({e}): {line:?}"
        ))
    })
}

fn print_human(verb: &Verb, answer: &Value) {
    if answer.get("error").is_some_and(|e| !e.is_null()) {
        return; // main prints the error
    }
    match verb {
        Verb::Create { id, .. } => println!("created {id}"),
        Verb::Destroy(id) => println!("destroyed {id}"),
        Verb::List => print!("{}", list_table(answer)),
        Verb::Stats => print!("{}", stats_table(&answer["stats"])),
        Verb::Accessed(_) => {
            let inputs = answer["inputs"].as_array().cloned().unwrap_or_default();
            let count = |access: &str| inputs.iter().filter(|i| i["access"] == access).count();
            for input in &inputs {
                println!(
                    "{:<7} {}  ({})",
                    input["access"].as_str().unwrap_or("?"),
                    input["path"].as_str().unwrap_or("?"),
                    input["underlying"].as_str().unwrap_or("?")
                );
            }
            println!(
                "{} inputs: {} read, {} looked up only, {} untouched",
                inputs.len(),
                count("read"),
                count("lookup"),
                count("none")
            );
        }
    }
}

/// `ctl list` for people: one row per sandbox, in columns.
fn list_table(answer: &Value) -> String {
    let mut out = format!("{:<24} {:<7} {:>9}\n", "ID", "KIND", "MAPPINGS");
    for s in answer["sandboxes"].as_array().into_iter().flatten() {
        // A JSON number ignores width: format it as text.
        let mappings = s["mappings"]
            .as_u64()
            .map_or_else(|| "?".to_owned(), |n| n.to_string());
        out.push_str(&format!(
            "{:<24} {:<7} {mappings:>9}\n",
            s["id"].as_str().unwrap_or("?"),
            s["kind"].as_str().unwrap_or("?"),
        ));
    }
    out
}

/// `ctl stats` for people: sandboxes and memory, create and destroy
/// latencies, and the FUSE requests per opcode that were sent (an opcode
/// never sent gets no row) with the daemon's service time percentiles.
fn stats_table(stats: &Value) -> String {
    use std::fmt::Write as _;
    let live = &stats["live"];
    let number = |v: &Value| v.as_u64().map_or_else(|| "?".to_owned(), |n| n.to_string());
    let mut out = String::new();
    let built: Vec<String> = stats["built"]
        .as_object()
        .into_iter()
        .flatten()
        .filter(|(_, n)| n.as_u64().is_some_and(|n| n > 0))
        .map(|(how, n)| format!("{how} {n}"))
        .collect();
    let _ = writeln!(
        out,
        "sandboxes  {} now{}",
        number(&live["sandboxes"]),
        if built.is_empty() {
            String::new()
        } else {
            format!(" (built so far: {})", built.join(", "))
        }
    );
    let rss = live["rss_kib"].as_u64().map_or_else(
        || "?".to_owned(),
        |kib| format!("{:.1} MiB", kib as f64 / 1024.0),
    );
    let _ = writeln!(
        out,
        "memory     RSS {rss}, {} open descriptors, CPU {} ms user + {} ms system",
        number(&live["open_fds"]),
        number(&live["cpu_user_ms"]),
        number(&live["cpu_system_ms"])
    );
    let _ = writeln!(
        out,
        "\n{:<10} {:>8} {:>7} {:>10} {:>10} {:>10} {:>10}",
        "request", "count", "failed", "p50 ms", "p90 ms", "p99 ms", "max ms"
    );
    for kind in ["create", "destroy", "collect"] {
        let r = &stats["requests"][kind];
        if kind == "collect" && r["count"].as_u64().unwrap_or(0) == 0 {
            continue; // `serve`'s only
        }
        let ms = |key: &str| {
            r[key]
                .as_u64()
                .map_or_else(|| "-".to_owned(), |us| format!("{:.3}", us as f64 / 1000.0))
        };
        let _ = writeln!(
            out,
            "{kind:<10} {:>8} {:>7} {:>10} {:>10} {:>10} {:>10}",
            number(&r["count"]),
            number(&r["failed"]),
            ms("p50_us"),
            ms("p90_us"),
            ms("p99_us"),
            ms("max_us")
        );
    }
    let mut sent: Vec<(&String, u64)> = stats["fuse"]
        .as_object()
        .into_iter()
        .flatten()
        .filter_map(|(op, n)| n.as_u64().filter(|&n| n > 0).map(|n| (op, n)))
        .collect();
    sent.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(b.0)));
    let _ = writeln!(
        out,
        "\nFUSE requests: {} in all",
        number(&stats["fuse_requests"])
    );
    // A daemon older than the service times has none: its table stays as
    // it was.
    let Some(latencies) = stats.get("fuse_latency_us") else {
        for (op, n) in sent {
            let _ = writeln!(out, "  {op:<12} {n:>10}");
        }
        return out;
    };
    let _ = writeln!(
        out,
        "{:<14} {:>10} {:>9} {:>9} {:>9} {:>9} {:>9}   (the daemon's service time, not the round trip)",
        "opcode", "count", "mean us", "p50 us", "p90 us", "p99 us", "max us"
    );
    for (op, n) in sent {
        // No entry: counted but not yet answered when the daemon was asked.
        let latency = &latencies[op.as_str()];
        let us = |key: &str| latency[key].as_f64().map_or_else(|| "-".to_owned(), micros);
        let _ = writeln!(
            out,
            "  {op:<12} {n:>10} {:>9} {:>9} {:>9} {:>9} {:>9}",
            us("mean"),
            us("p50"),
            us("p90"),
            us("p99"),
            us("max")
        );
    }
    out
}

/// Microseconds to about three significant digits: service times are a
/// few microseconds, so 1.86 rather than 2.
fn micros(us: f64) -> String {
    if us < 10.0 {
        format!("{us:.2}")
    } else if us < 100.0 {
        format!("{us:.1}")
    } else {
        format!("{us:.0}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_list_keeps_its_columns() {
        let answer = json!({"sandboxes": [
            {"id": "a", "kind": "fuse", "mappings": 1},
            {"id": "bb", "kind": "native", "mappings": 12345},
        ]});
        let table = list_table(&answer);
        let widths: Vec<usize> = table.lines().map(str::len).collect();
        assert_eq!(widths, [42, 42, 42], "{table}");
        assert!(
            table.lines().nth(1).unwrap().ends_with("        1"),
            "{table}"
        );
    }

    #[test]
    fn the_stats_table_has_a_row_per_opcode_sent_only() {
        let stats = json!({
            "fuse_requests": 12,
            "fuse": {"lookup": 9, "getattr": 3, "write": 0, "mkdir": 0},
            "requests": {
                "create": {"count": 2, "failed": 0, "p50_us": 1500, "p90_us": 2500, "p99_us": 2500, "max_us": 2500},
                "destroy": {"count": 0, "failed": 0, "p50_us": null, "p90_us": null, "p99_us": null, "max_us": null},
            },
            "built": {"fuse": 2, "native": 0},
            "live": {"sandboxes": 2, "rss_kib": 20480, "open_fds": 11, "cpu_user_ms": 5, "cpu_system_ms": 7},
        });
        let table = stats_table(&stats);
        assert!(
            table.contains("sandboxes  2 now (built so far: fuse 2)"),
            "{table}"
        );
        assert!(table.contains("RSS 20.0 MiB"), "{table}");
        let rows: Vec<&str> = table.lines().filter(|l| l.starts_with("  ")).collect();
        assert_eq!(rows.len(), 2, "{table}");
        assert!(
            rows[0].contains("lookup") && rows[0].ends_with(" 9"),
            "{table}"
        );
        assert!(
            !table.contains("write") && !table.contains("mkdir"),
            "{table}"
        );
        let create = table.lines().find(|l| l.starts_with("create")).unwrap();
        assert!(
            create.contains("1.500") && create.contains("2.500"),
            "{create}"
        );
        // A daemon without service times: the rows stay as they were.
        assert!(!table.contains("mean us"), "{table}");
    }

    #[test]
    fn the_stats_table_gives_each_opcode_its_service_times_in_microseconds() {
        let stats = json!({
            "fuse_requests": 13,
            "fuse": {"lookup": 9, "getattr": 3, "open": 1, "write": 0},
            "fuse_latency_us": {
                "lookup": {"count": 9, "mean": 2.412, "p50": 1.856, "p90": 3.84, "p99": 15.36, "max": 16.384},
                "getattr": {"count": 3, "mean": 0.9, "p50": 0.84, "p90": 0.84, "p99": 1.088, "max": 1.152},
            },
            "requests": {"create": {}, "destroy": {}},
            "built": {},
            "live": {},
        });
        let table = stats_table(&stats);
        let header = table.lines().find(|l| l.starts_with("opcode")).unwrap();
        let rows: Vec<&str> = table.lines().filter(|l| l.starts_with("  ")).collect();
        assert_eq!(rows.len(), 3, "{table}");
        let cells =
            |row: &str| -> Vec<String> { row.split_whitespace().map(str::to_owned).collect() };
        assert_eq!(
            cells(rows[0]),
            ["lookup", "9", "2.41", "1.86", "3.84", "15.4", "16.4"],
            "{table}"
        );
        assert_eq!(
            cells(rows[1]),
            ["getattr", "3", "0.90", "0.84", "0.84", "1.09", "1.15"],
            "{table}"
        );
        // Counted, not yet answered: no figures.
        assert_eq!(
            cells(rows[2]),
            ["open", "1", "-", "-", "-", "-", "-"],
            "{table}"
        );
        // The columns line up under their headings.
        for row in &rows {
            assert_eq!(row.len(), 14 + 11 + 5 * 10, "{row:?} in\n{table}");
            for heading in ["count", "mean us", "p50 us", "p99 us", "max us"] {
                let end = header.find(heading).unwrap() + heading.len();
                assert_ne!(row.as_bytes()[end - 1], b' ', "{heading}: {row:?}");
            }
        }
        assert!(header.contains("not the round trip"), "{header}");
        assert_eq!(micros(123.4), "123");
        assert_eq!(micros(0.064), "0.06");
    }
}
