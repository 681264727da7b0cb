//! The FUSE-over-io_uring transport (Linux 6.14+): one queue per possible
//! CPU, each served by threads pinned to that CPU, so that a request is
//! answered on the CPU of the process that made it. fuser keeps the
//! mount, INIT and the `/dev/fuse` loop, which still carries FORGET,
//! INTERRUPT and notifications.
//!
//! Once INIT granted the ring, the kernel holds every other request until
//! each queue has an entry registered: if the queues cannot all start, the
//! connection must be told to give the ring up (a REGISTER it refuses
//! does that), or the mount would hang.

use crate::sys::fuse_abi as abi;
mod decode;
mod encode;
mod queue;
mod serve;

use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd};
use std::sync::mpsc::channel;
use std::sync::Arc;

use io_uring::{cqueue, squeue, types, IoUring};

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

/// The queues could not all start.
#[derive(Debug)]
pub struct StartError {
    pub error: io::Error,
    /// Whether the kernel gave the ring up, so that requests flow on
    /// `/dev/fuse`; if not, the mount cannot serve.
    pub classic_works: bool,
}

/// Whether this process can make a ring of 128-byte SQEs (before
/// mounting: io_uring may be disabled or restricted).
pub fn probe() -> io::Result<()> {
    IoUring::<squeue::Entry128, cqueue::Entry>::builder()
        .build(2)
        .map(drop)
}

/// Sets up every queue on the mount's `/dev/fuse` descriptor and starts
/// serving them; returns the queue count once each queue has a thread
/// registered (the kernel then sends requests on the rings). `pin`: pin
/// each thread to its queue's CPU.
pub fn start(
    device: BorrowedFd,
    dispatch: Arc<Dispatcher>,
    acl: Acl,
    pin: bool,
) -> Result<usize, StartError> {
    let queues = queue_count();
    let Ok(qids) = u16::try_from(queues) else {
        return Err(give_up(device, io::Error::other("too many CPUs")));
    };
    let (ready, reports) = channel();
    let mut started = 0;
    let mut failure = None;
    'spawn: for qid in 0..qids {
        for thread in 0..THREADS_PER_QUEUE {
            let setup = queue::QueueSetup {
                qid,
                depth: DEPTH,
                payload_size: payload_size(),
                pin,
            };
            let (dispatch, ready) = (dispatch.clone(), ready.clone());
            let spawned = device.as_fd().try_clone_to_owned().and_then(|device| {
                std::thread::Builder::new()
                    .name(format!("fuse-ring-{qid}.{thread}"))
                    .spawn(move || queue::run(setup, device, dispatch, acl, ready))
            });
            match spawned {
                Ok(_) => started += 1,
                Err(err) => {
                    failure = Some(err);
                    break 'spawn;
                }
            }
        }
    }
    drop(ready);
    let mut registered = vec![false; queues];
    for _ in 0..started {
        match reports.recv() {
            Ok((qid, Ok(()))) => registered[usize::from(qid)] = true,
            Ok((qid, Err(err))) => {
                log::warn!("ring queue {qid}: a thread could not start: {err}");
                failure.get_or_insert(err);
            }
            Err(_) => {
                failure.get_or_insert(io::Error::other("a ring queue thread ended unready"));
            }
        }
    }
    match failure {
        None => Ok(queues),
        // Every queue has a thread: the ring serves, one thread short.
        Some(_) if registered.iter().all(|&r| r) => Ok(queues),
        Some(err) => Err(give_up(device, err)),
    }
}

/// Makes the kernel give the ring up for this connection: a REGISTER for
/// a queue that does not exist fails, and the kernel then sends requests
/// on `/dev/fuse` again.
fn give_up(device: BorrowedFd, error: io::Error) -> StartError {
    let refused = (|| {
        let mut ring = IoUring::<squeue::Entry128, cqueue::Entry>::builder().build(2)?;
        let sqe = queue::give_up_command(types::Fd(device.as_raw_fd()));
        // SAFETY: the command carries no buffer the kernel could keep.
        unsafe { ring.submission().push(&sqe) }
            .map_err(|_| io::Error::other("submission queue full"))?;
        ring.submit_and_wait(1)?;
        let cqe = ring
            .completion()
            .next()
            .ok_or_else(|| io::Error::other("no completion"))?;
        match -cqe.result() {
            libc::EINVAL => Ok(()),
            errno => Err(io::Error::from_raw_os_error(errno)),
        }
    })();
    match refused {
        Ok(()) => StartError {
            error,
            classic_works: true,
        },
        Err(err) => {
            log::error!("cannot make the kernel give the io_uring transport up: {err}");
            StartError {
                error,
                classic_works: false,
            }
        }
    }
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
