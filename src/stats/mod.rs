//! What the daemon has done, counted while it runs: kernel requests (round
//! trips) per FUSE operation with the daemon's service time of each,
//! reconfiguration requests per kind with their latencies, and how
//! sandboxes were built. `actionfs ctl stats` shows them (with live
//! figures: sandboxes, nodes, descriptors, memory, CPU time), and SIGUSR1
//! writes them to the log.
//!
//! A FUSE request costs a relaxed atomic increment and a clock read when
//! it comes in (a batched FORGET counts and is timed once per inode it
//! forgets), and a clock read and two relaxed atomic adds to its
//! operation's [`Histogram`] when its answer is ready; reconfiguration
//! latencies are kept in a bounded sample per request kind.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use serde_json::{json, Value};

pub mod histogram;

use histogram::Histogram;

/// The FUSE operations, as counted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    Lookup,
    Forget,
    Getattr,
    Setattr,
    Readlink,
    Mknod,
    Mkdir,
    Unlink,
    Rmdir,
    Symlink,
    Rename,
    Link,
    Open,
    Read,
    Write,
    Flush,
    Release,
    Fsync,
    Opendir,
    Readdir,
    Readdirplus,
    Releasedir,
    Fsyncdir,
    Statfs,
    Setxattr,
    Getxattr,
    Listxattr,
    Removexattr,
    Access,
    Create,
    Fallocate,
    Lseek,
}

impl Op {
    pub const ALL: [Op; 32] = [
        Op::Lookup,
        Op::Forget,
        Op::Getattr,
        Op::Setattr,
        Op::Readlink,
        Op::Mknod,
        Op::Mkdir,
        Op::Unlink,
        Op::Rmdir,
        Op::Symlink,
        Op::Rename,
        Op::Link,
        Op::Open,
        Op::Read,
        Op::Write,
        Op::Flush,
        Op::Release,
        Op::Fsync,
        Op::Opendir,
        Op::Readdir,
        Op::Readdirplus,
        Op::Releasedir,
        Op::Fsyncdir,
        Op::Statfs,
        Op::Setxattr,
        Op::Getxattr,
        Op::Listxattr,
        Op::Removexattr,
        Op::Access,
        Op::Create,
        Op::Fallocate,
        Op::Lseek,
    ];

    /// The FUSE opcode's name, lower case (`lookup`, `getattr`...).
    pub fn name(self) -> &'static str {
        match self {
            Op::Lookup => "lookup",
            Op::Forget => "forget",
            Op::Getattr => "getattr",
            Op::Setattr => "setattr",
            Op::Readlink => "readlink",
            Op::Mknod => "mknod",
            Op::Mkdir => "mkdir",
            Op::Unlink => "unlink",
            Op::Rmdir => "rmdir",
            Op::Symlink => "symlink",
            Op::Rename => "rename",
            Op::Link => "link",
            Op::Open => "open",
            Op::Read => "read",
            Op::Write => "write",
            Op::Flush => "flush",
            Op::Release => "release",
            Op::Fsync => "fsync",
            Op::Opendir => "opendir",
            Op::Readdir => "readdir",
            Op::Readdirplus => "readdirplus",
            Op::Releasedir => "releasedir",
            Op::Fsyncdir => "fsyncdir",
            Op::Statfs => "statfs",
            Op::Setxattr => "setxattr",
            Op::Getxattr => "getxattr",
            Op::Listxattr => "listxattr",
            Op::Removexattr => "removexattr",
            Op::Access => "access",
            Op::Create => "create",
            Op::Fallocate => "fallocate",
            Op::Lseek => "lseek",
        }
    }
}

/// Reconfiguration requests, by kind (Collect: `serve`'s only).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RequestKind {
    Create,
    Destroy,
    Collect,
}

impl RequestKind {
    const ALL: [RequestKind; 3] = [
        RequestKind::Create,
        RequestKind::Destroy,
        RequestKind::Collect,
    ];

    fn index(self) -> usize {
        self as usize
    }

    fn name(self) -> &'static str {
        match self {
            RequestKind::Create => "create",
            RequestKind::Destroy => "destroy",
            RequestKind::Collect => "collect",
        }
    }
}

/// How a sandbox was built.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Built {
    Fuse,
    Native,
    /// Native from a stash of an earlier sandbox.
    Stash,
    /// Meant to be native; the materializer could not, so FUSE.
    FuseFallback,
}

impl Built {
    const ALL: [Built; 4] = [
        Built::Fuse,
        Built::Native,
        Built::Stash,
        Built::FuseFallback,
    ];

    fn name(self) -> &'static str {
        match self {
            Built::Fuse => "fuse",
            Built::Native => "native",
            Built::Stash => "stash",
            Built::FuseFallback => "fuse_fallback",
        }
    }
}

/// Latencies kept per request kind: enough for stable percentiles, bounded
/// however long the daemon runs (later samples replace random earlier
/// ones, so the sample stays uniform over the daemon's life).
const LATENCY_SAMPLE: usize = 16_384;

#[derive(Default)]
struct Latencies {
    /// Microseconds.
    sample: Vec<u32>,
    seen: u64,
    failed: u64,
}

impl Latencies {
    fn add(&mut self, took: Duration, ok: bool) {
        let micros = took.as_micros().min(u32::MAX as u128) as u32;
        self.seen += 1;
        if !ok {
            self.failed += 1;
        }
        if self.sample.len() < LATENCY_SAMPLE {
            self.sample.push(micros);
        } else {
            // Reservoir sampling, with a cheap hash of the count as the
            // random draw.
            let slot = (self.seen.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 11) % self.seen;
            if let Some(kept) = self.sample.get_mut(slot as usize) {
                *kept = micros;
            }
        }
    }

    fn summary(&self) -> Value {
        let mut sorted = self.sample.clone();
        sorted.sort_unstable();
        let at = |q: f64| -> Option<u32> {
            (!sorted.is_empty()).then(|| sorted[((sorted.len() - 1) as f64 * q).round() as usize])
        };
        json!({
            "count": self.seen,
            "failed": self.failed,
            "p50_us": at(0.5),
            "p90_us": at(0.9),
            "p99_us": at(0.99),
            "max_us": at(1.0),
        })
    }
}

/// The daemon's counters, shared by the FUSE shell, the request loop and
/// the backend.
pub struct Stats {
    ops: [AtomicU64; Op::ALL.len()],
    /// Service time per operation: see [`Stats::timed`].
    service: [Histogram; Op::ALL.len()],
    requests: [Mutex<Latencies>; RequestKind::ALL.len()],
    built: [AtomicU64; Built::ALL.len()],
    /// FUSE requests that arrived on an io_uring queue.
    on_ring: AtomicU64,
}

impl Default for Stats {
    fn default() -> Self {
        Stats {
            ops: std::array::from_fn(|_| AtomicU64::new(0)),
            service: std::array::from_fn(|_| Histogram::default()),
            requests: std::array::from_fn(|_| Mutex::default()),
            built: std::array::from_fn(|_| AtomicU64::new(0)),
            on_ring: AtomicU64::new(0),
        }
    }
}

/// One kernel request being served: counted when made, timed until
/// dropped.
#[must_use = "the request is timed until this is dropped"]
pub struct Timed<'a> {
    stats: &'a Stats,
    op: Op,
    start: Instant,
}

impl Drop for Timed<'_> {
    fn drop(&mut self) {
        self.stats.service[self.op as usize].add(self.start.elapsed());
    }
}

impl Stats {
    /// Counts one kernel request.
    pub fn op(&self, op: Op) {
        self.ops[op as usize].fetch_add(1, Ordering::Relaxed);
    }

    /// Counts one kernel request and times its service until the guard
    /// is dropped: the daemon's own time, from the dispatcher's entry to
    /// its answer being ready. The transport's time (reading the request,
    /// encoding and writing the answer) and the kernel's are not in it, so
    /// it is not the round trip a caller sees.
    pub fn timed(&self, op: Op) -> Timed<'_> {
        self.op(op);
        Timed {
            stats: self,
            op,
            start: Instant::now(),
        }
    }

    pub fn ops(&self, op: Op) -> u64 {
        self.ops[op as usize].load(Ordering::Relaxed)
    }

    /// Counts one kernel request that came on an io_uring queue (also
    /// counted by its operation).
    pub fn ring_request(&self) {
        self.on_ring.fetch_add(1, Ordering::Relaxed);
    }

    pub fn ring_requests(&self) -> u64 {
        self.on_ring.load(Ordering::Relaxed)
    }

    pub fn request(&self, kind: RequestKind, took: Duration, ok: bool) {
        self.requests[kind.index()].lock().add(took, ok);
    }

    pub fn built(&self, how: Built) {
        self.built[how as usize].fetch_add(1, Ordering::Relaxed);
    }

    /// Everything counted, as JSON; `live` adds figures read now.
    pub fn to_json(&self, live: Value) -> Value {
        let ops: serde_json::Map<String, Value> = Op::ALL
            .iter()
            .map(|&op| (op.name().to_owned(), json!(self.ops(op))))
            .collect();
        let total: u64 = Op::ALL.iter().map(|&op| self.ops(op)).sum();
        let latency: serde_json::Map<String, Value> = Op::ALL
            .iter()
            .filter_map(|&op| {
                let s = self.service[op as usize].summary()?;
                // Nanoseconds to microseconds, to the nanosecond.
                let us = |ns: f64| ns.round() / 1000.0;
                Some((
                    op.name().to_owned(),
                    json!({
                        "count": s.count,
                        "mean": us(s.mean),
                        "p50": us(s.p50),
                        "p90": us(s.p90),
                        "p99": us(s.p99),
                        "max": us(s.max),
                    }),
                ))
            })
            .collect();
        let requests: serde_json::Map<String, Value> = RequestKind::ALL
            .iter()
            .map(|&k| {
                (
                    k.name().to_owned(),
                    self.requests[k.index()].lock().summary(),
                )
            })
            .collect();
        let built: serde_json::Map<String, Value> = Built::ALL
            .iter()
            .map(|&b| {
                let n = self.built[b as usize].load(Ordering::Relaxed);
                (b.name().to_owned(), json!(n))
            })
            .collect();
        json!({
            "fuse_requests": total,
            "fuse_on_ring": self.ring_requests(),
            "fuse": ops,
            "fuse_latency_us": latency,
            "requests": requests,
            "built": built,
            "live": live,
        })
    }
}

/// Figures of this process read now: open descriptors and resident memory.
pub fn process_figures() -> Value {
    let fds = std::fs::read_dir("/proc/self/fd").map(|d| d.count()).ok();
    let rss_kib = std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|status| {
            status
                .lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|n| n.parse::<u64>().ok())
        });
    let usage = nix::sys::resource::getrusage(nix::sys::resource::UsageWho::RUSAGE_SELF).ok();
    let ms = |t: nix::sys::time::TimeVal| t.tv_sec() as u64 * 1000 + t.tv_usec() as u64 / 1000;
    json!({
        "open_fds": fds,
        "rss_kib": rss_kib,
        "cpu_user_ms": usage.map(|u| ms(u.user_time())),
        "cpu_system_ms": usage.map(|u| ms(u.system_time())),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_and_percentiles_come_out_as_json() {
        let stats = Stats::default();
        for _ in 0..3 {
            stats.op(Op::Lookup);
        }
        stats.op(Op::Open);
        for ms in 1..=100 {
            stats.request(RequestKind::Create, Duration::from_millis(ms), ms != 7);
        }
        stats.built(Built::Native);
        let json = stats.to_json(json!({"sandboxes": 2}));
        assert_eq!(json["fuse"]["lookup"], 3);
        assert_eq!(json["fuse"]["open"], 1);
        assert_eq!(json["fuse_requests"], 4);
        let create = &json["requests"]["create"];
        assert_eq!(create["count"], 100);
        assert_eq!(create["failed"], 1);
        assert_eq!(create["p50_us"], 51_000);
        assert_eq!(create["max_us"], 100_000);
        assert_eq!(json["requests"]["destroy"]["p50_us"], Value::Null);
        assert_eq!(json["requests"]["collect"]["p50_us"], Value::Null);
        assert_eq!(json["built"]["native"], 1);
        assert_eq!(json["live"]["sandboxes"], 2);
    }

    #[test]
    fn a_timed_request_counts_at_entry_and_times_until_its_answer() {
        let stats = Stats::default();
        for _ in 0..3 {
            let _timed = stats.timed(Op::Getattr);
        }
        let open = stats.timed(Op::Open);
        let json = stats.to_json(Value::Null);
        assert_eq!(json["fuse"]["open"], 1, "counted as it came in");
        assert!(
            json["fuse_latency_us"].get("open").is_none(),
            "not timed before its answer: {json}"
        );
        drop(open);
        let json = stats.to_json(Value::Null);
        assert_eq!(json["fuse"]["getattr"], 3);
        let latency = &json["fuse_latency_us"];
        assert_eq!(latency["getattr"]["count"], 3, "{json}");
        assert_eq!(latency["open"]["count"], 1, "{json}");
        let getattr = &latency["getattr"];
        let us = |key: &str| getattr[key].as_f64().unwrap();
        assert!(us("p50") <= us("p90") && us("p90") <= us("p99") && us("p99") <= us("max"));
        assert!(us("mean") <= us("max"), "{json}");
        assert!(
            latency.get("lookup").is_none(),
            "nothing sent, no entry: {json}"
        );
    }

    #[test]
    fn the_latency_sample_stays_bounded() {
        let mut latencies = Latencies::default();
        for n in 0..(LATENCY_SAMPLE as u64 * 3) {
            latencies.add(Duration::from_micros(n), true);
        }
        assert_eq!(latencies.sample.len(), LATENCY_SAMPLE);
        assert_eq!(latencies.seen, LATENCY_SAMPLE as u64 * 3);
        // Later samples made it in.
        assert!(latencies
            .sample
            .iter()
            .any(|&m| m as usize > LATENCY_SAMPLE * 2));
    }
}
