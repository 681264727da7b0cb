//! The FUSE-over-io_uring transport (Linux 6.14+): one queue per possible
//! CPU, each served by a thread pinned to that CPU, so that a request is
//! answered on the CPU of the process that made it. fuser keeps the
//! mount, INIT and the `/dev/fuse` loop, which still carries FORGET,
//! INTERRUPT, notifications and whatever arrives before every queue is
//! registered.

mod abi;
mod decode;
mod encode;
mod queue;
mod serve;

use std::io;
use std::os::fd::{AsFd, BorrowedFd};
use std::sync::mpsc::channel;
use std::sync::Arc;

pub use serve::Acl;

use crate::fuse::Dispatcher;

/// The largest write the kernel may send when the ring is used: with
/// fuser's default (16 MiB) every entry's payload buffer would be as big.
/// 1 MiB is also the kernel's default page limit per request.
pub const MAX_WRITE: u32 = 1 << 20;

/// Threads per queue, all pinned to the queue's CPU, each with its own
/// ring and entries: a request that blocks (an fsync, a slow underlying
/// disk) leaves the CPU's other requests a thread. The kernel hands a
/// request to the entry freed last, so the thread that just answered takes
/// the next one and the other sleeps unless needed.
const THREADS_PER_QUEUE: usize = 2;

/// Entries per thread: while the thread serves one, the next requests wait
/// in the kernel's buffers instead of its request list.
const DEPTH: u32 = 2;

/// How many queues the kernel expects: one per possible CPU (its
/// num_possible_cpus()), whether online or not.
pub fn queue_count() -> usize {
    let possible = std::fs::read_to_string("/sys/devices/system/cpu/possible").ok();
    possible
        .as_deref()
        .and_then(parse_cpu_list)
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
}

/// The number of CPUs in a list such as "0-3" or "0,2-5": highest + 1.
fn parse_cpu_list(list: &str) -> Option<usize> {
    list.trim()
        .split(',')
        .map(|range| range.rsplit('-').next()?.trim().parse::<usize>().ok())
        .try_fold(0, |max, cpu| Some(max.max(cpu? + 1)))
}

/// The kernel's payload size for this connection: its max_write, or its
/// page limit per request, or its smallest request buffer, whichever is
/// largest.
fn payload_size() -> usize {
    let page = nix::unistd::sysconf(nix::unistd::SysconfVar::PAGE_SIZE)
        .ok()
        .flatten()
        .map_or(4096, |p| p as usize);
    (MAX_WRITE as usize)
        .max(256 * page)
        .max(abi::FUSE_MIN_READ_BUFFER)
}

/// Sets up every queue on the mount's `/dev/fuse` descriptor and starts
/// serving them; returns once each is registered (the kernel then sends
/// requests on the rings), or with the first queue's failure (then the
/// kernel keeps sending them on `/dev/fuse`). `pin`: pin each thread to
/// its queue's CPU.
pub fn start(
    device: BorrowedFd,
    dispatch: Arc<Dispatcher>,
    acl: Acl,
    pin: bool,
) -> io::Result<usize> {
    let queues = queue_count();
    let qids = u16::try_from(queues).map_err(|_| io::Error::other("too many CPUs"))?;
    let (ready, reports) = channel();
    for qid in 0..qids {
        for thread in 0..THREADS_PER_QUEUE {
            let setup = queue::QueueSetup {
                qid,
                depth: DEPTH,
                payload_size: payload_size(),
                pin,
            };
            let device = device.as_fd().try_clone_to_owned()?;
            let (dispatch, ready) = (dispatch.clone(), ready.clone());
            std::thread::Builder::new()
                .name(format!("fuse-ring-{qid}.{thread}"))
                .spawn(move || queue::run(setup, device, dispatch, acl, ready))?;
        }
    }
    drop(ready);
    for _ in 0..queues * THREADS_PER_QUEUE {
        match reports.recv() {
            Ok(Ok(())) => {}
            Ok(Err(err)) => {
                return Err(io::Error::new(
                    err.kind(),
                    format!("ring queue setup: {err}"),
                ))
            }
            Err(_) => return Err(io::Error::other("a ring queue thread ended unready")),
        }
    }
    Ok(queues)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_lists_count_up_to_the_highest_cpu() {
        assert_eq!(parse_cpu_list("0-1\n"), Some(2));
        assert_eq!(parse_cpu_list("0"), Some(1));
        assert_eq!(parse_cpu_list("0,2-5"), Some(6));
        assert_eq!(parse_cpu_list("junk"), None);
    }
}
