//! One ring queue: a thread (pinned to its CPU) with an io_uring of
//! 128-byte SQEs, `/dev/fuse` registered as its fixed file, and a few
//! entries, each a header buffer and a payload buffer registered with the
//! kernel. A request arrives as the completion of an entry's REGISTER or
//! COMMIT_AND_FETCH; its answer goes back with the next COMMIT_AND_FETCH,
//! which also waits for the entry's next request.
//!
//! The kernel ends every entry with an error completion (ENOTCONN) when
//! the mount goes away; the thread ends when it has no entries left.

use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::panic::AssertUnwindSafe;
use std::sync::mpsc::Sender;
use std::sync::Arc;

use io_uring::{cqueue, opcode, squeue, types, IoUring};

use super::abi::{self, *};
use super::serve::{self, Acl, Served};
use crate::fuse::Dispatcher;

/// What a queue needs to know to set itself up.
#[derive(Clone, Copy, Debug)]
pub struct QueueSetup {
    pub qid: u16,
    /// Entries registered with the kernel.
    pub depth: u32,
    /// Bytes of each payload buffer (at least the kernel's max payload).
    pub payload_size: usize,
    /// Pin the thread to CPU `qid`.
    pub pin: bool,
}

/// One entry's buffers, allocated once and handed to the kernel by
/// address: they are reached only through raw pointers, as the kernel
/// writes them between our system calls.
struct Slot {
    header: *mut fuse_uring_req_header,
    payload: *mut u8,
    payload_size: usize,
    /// iov[0]: header, iov[1]: payload, read by the kernel at REGISTER.
    iov: *mut [libc::iovec; 2],
}

impl Slot {
    fn new(payload_size: usize) -> Slot {
        let header = Box::into_raw(Box::<fuse_uring_req_header>::default());
        let payload = Box::into_raw(vec![0u8; payload_size].into_boxed_slice()).cast::<u8>();
        let iov = Box::into_raw(Box::new([
            libc::iovec {
                iov_base: header.cast(),
                iov_len: size_of::<fuse_uring_req_header>(),
            },
            libc::iovec {
                iov_base: payload.cast(),
                iov_len: payload_size,
            },
        ]));
        Slot {
            header,
            payload,
            payload_size,
            iov,
        }
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        // SAFETY: each pointer came from Box::into_raw in `new` with these
        // types and lengths, and the kernel no longer holds the entry (the
        // ring is gone before the slots: see `run`).
        unsafe {
            drop(Box::from_raw(self.header));
            drop(Box::from_raw(std::ptr::slice_from_raw_parts_mut(
                self.payload,
                self.payload_size,
            )));
            drop(Box::from_raw(self.iov));
        }
    }
}

/// The 128-byte SQE of a ring command for this queue.
fn command(qid: u16, cmd_op: u32, commit_id: u64, slot: &Slot, index: usize) -> squeue::Entry128 {
    let req = fuse_uring_cmd_req {
        flags: 0,
        commit_id,
        qid,
        padding: [0; 6],
    };
    let mut cmd = [0u8; 80];
    cmd[..size_of::<fuse_uring_cmd_req>()].copy_from_slice(abi::bytes_of(&req));
    let mut sqe = opcode::UringCmd80::new(types::Fixed(0), cmd_op)
        .cmd(cmd)
        .addr(Some(slot.iov as u64))
        .build()
        .user_data(index as u64);
    if cmd_op == FUSE_IO_URING_CMD_REGISTER {
        set_len(&mut sqe, 2);
    }
    sqe
}

/// A REGISTER for a queue that does not exist: the kernel refuses it and
/// gives the ring up for the connection (see `super::give_up`).
pub fn give_up_command(device: types::Fd) -> squeue::Entry128 {
    let req = fuse_uring_cmd_req {
        flags: 0,
        commit_id: 0,
        qid: u16::MAX,
        padding: [0; 6],
    };
    let mut cmd = [0u8; 80];
    cmd[..size_of::<fuse_uring_cmd_req>()].copy_from_slice(abi::bytes_of(&req));
    opcode::UringCmd80::new(device, FUSE_IO_URING_CMD_REGISTER)
        .cmd(cmd)
        .build()
}

/// Sets the SQE's `len` (the iovec count REGISTER reads), which the
/// io-uring crate has no setter for on this opcode.
fn set_len(sqe: &mut squeue::Entry128, len: u32) {
    const _: () = assert!(size_of::<squeue::Entry128>() == 128);
    /// offsetof(struct io_uring_sqe, len).
    const LEN_AT: usize = 24;
    // SAFETY: Entry128 is a repr(C) 128-byte SQE (checked above); `len`
    // is the u32 at byte 24 of struct io_uring_sqe.
    unsafe {
        let bytes = (sqe as *mut squeue::Entry128).cast::<u8>();
        std::ptr::write_unaligned(bytes.add(LEN_AT).cast::<u32>(), len);
    }
}

fn pin_to(cpu: usize) -> io::Result<()> {
    // SAFETY: a zeroed cpu_set_t is empty; CPU_SET and sched_setaffinity
    // only touch the set, for the calling thread (pid 0).
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        if libc::sched_setaffinity(0, size_of::<libc::cpu_set_t>(), &set) != 0 {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(())
}

/// SCHED_BATCH: a request that does not block its sender (RELEASE after
/// close(2), FORGET) wakes this thread without preempting the sender on
/// the CPU they share, so it is served at the sender's next blocking
/// request (an OPEN) in the same switch instead of costing one of its own.
/// A blocking request frees the CPU at once either way. Measured: fewer
/// context switches per open and a faster open, pinned or not
/// (docs/BENCHMARKS.md).
fn never_preempt_on_wakeup() -> io::Result<()> {
    let param = libc::sched_param { sched_priority: 0 };
    // SAFETY: plain system call on the calling thread (pid 0) with a
    // valid parameter block.
    if unsafe { libc::sched_setscheduler(0, libc::SCHED_BATCH, &param) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

fn new_ring(depth: u32) -> io::Result<IoUring<squeue::Entry128, cqueue::Entry>> {
    // One thread submits and reaps, and the kernel's work for it (copying
    // a request into our buffers) runs when it waits: no interrupts.
    let deferred = IoUring::<squeue::Entry128, cqueue::Entry>::builder()
        .setup_single_issuer()
        .setup_defer_taskrun()
        .build(depth);
    match deferred {
        Ok(ring) => Ok(ring),
        Err(err) if err.raw_os_error() == Some(libc::EINVAL) => {
            IoUring::<squeue::Entry128, cqueue::Entry>::builder().build(depth)
        }
        Err(err) => Err(err),
    }
}

/// Errors of an entry's command that mean the connection is gone.
fn is_gone(errno: i32) -> bool {
    matches!(
        errno,
        libc::ENOTCONN | libc::ECONNABORTED | libc::ECANCELED | libc::ENODEV
    )
}

/// Sets the queue up and serves it until the mount goes away. Reports
/// once on `ready`: Ok when every entry is registered, or why not.
pub fn run(
    setup: QueueSetup,
    device: OwnedFd,
    dispatch: Arc<Dispatcher>,
    acl: Acl,
    ready: Sender<(u16, io::Result<()>)>,
) {
    let qid = setup.qid;
    let mut slots = Vec::new();
    let ring = (|| {
        if setup.pin {
            if let Err(err) = pin_to(qid.into()) {
                log::warn!("ring queue {qid}: cannot pin to CPU {qid}: {err}");
            }
        }
        if let Err(err) = never_preempt_on_wakeup() {
            log::debug!("ring queue {qid}: SCHED_BATCH refused: {err}");
        }
        let mut ring = new_ring(setup.depth * 2)?;
        ring.submitter()
            .register_files(&[device.as_raw_fd()])
            .map_err(|err| io::Error::new(err.kind(), format!("registering /dev/fuse: {err}")))?;
        slots = (0..setup.depth)
            .map(|_| Slot::new(setup.payload_size))
            .collect();
        for (index, slot) in slots.iter().enumerate() {
            let sqe = command(qid, FUSE_IO_URING_CMD_REGISTER, 0, slot, index);
            // SAFETY: the slot's buffers and iovecs outlive the ring.
            unsafe { ring.submission().push(&sqe) }
                .map_err(|_| io::Error::other("submission queue full"))?;
        }
        ring.submit()?;
        // A REGISTER that fails completes at once; one that works stays
        // pending until a request comes.
        if let Some(cqe) = ring.completion().next() {
            let errno = -cqe.result();
            return Err(io::Error::new(
                io::Error::from_raw_os_error(errno).kind(),
                format!(
                    "FUSE_IO_URING_CMD_REGISTER: {}",
                    io::Error::from_raw_os_error(errno)
                ),
            ));
        }
        Ok(ring)
    })();
    drop(device);
    let mut ring = match ring {
        Ok(ring) => {
            let _ = ready.send((qid, Ok(())));
            ring
        }
        Err(err) => {
            let _ = ready.send((qid, Err(err)));
            return;
        }
    };
    serve_queue(&mut ring, &slots, setup, &dispatch, &acl);
    // The ring (and with it every command naming the slots) goes first.
    drop(ring);
    drop(slots);
}

fn serve_queue(
    ring: &mut IoUring<squeue::Entry128, cqueue::Entry>,
    slots: &[Slot],
    setup: QueueSetup,
    dispatch: &Dispatcher,
    acl: &Acl,
) {
    let qid = setup.qid;
    let mut live = slots.len();
    let mut done: Vec<(usize, i32)> = Vec::with_capacity(slots.len());
    while live > 0 {
        if let Err(err) = ring.submit_and_wait(1) {
            match err.raw_os_error() {
                Some(libc::EINTR) | Some(libc::EAGAIN) | Some(libc::EBUSY) => {}
                _ => {
                    log::error!("ring queue {qid}: io_uring_enter failed: {err}; queue stops");
                    return;
                }
            }
        }
        done.clear();
        done.extend(
            ring.completion()
                .map(|cqe| (cqe.user_data() as usize, cqe.result())),
        );
        for &(index, result) in &done {
            let Some(slot) = slots.get(index) else {
                log::error!("ring queue {qid}: completion for unknown entry {index}");
                continue;
            };
            if result < 0 {
                live -= 1;
                if !is_gone(-result) {
                    log::error!(
                        "ring queue {qid}: entry {index} failed: {}; {live} entries left",
                        io::Error::from_raw_os_error(-result)
                    );
                }
                continue;
            }
            let commit_id = answer(slot, dispatch, acl, qid);
            let sqe = command(
                qid,
                FUSE_IO_URING_CMD_COMMIT_AND_FETCH,
                commit_id,
                slot,
                index,
            );
            // SAFETY: as at REGISTER; at most one command per slot is in
            // the ring, and the queue holds twice the slots.
            if unsafe { ring.submission().push(&sqe) }.is_err() {
                log::error!("ring queue {qid}: submission queue full; entry {index} lost");
                live -= 1;
            }
        }
    }
    log::debug!("ring queue {qid}: connection gone; thread ends");
}

/// Serves the request now in `slot` and writes its answer there; returns
/// the commit id to send it back with.
fn answer(slot: &Slot, dispatch: &Dispatcher, acl: &Acl, qid: u16) -> u64 {
    // SAFETY: the kernel finished writing the slot before completing its
    // command, and touches it again only after our next command.
    let header = unsafe { &mut *slot.header };
    // SAFETY: as above; the payload is `payload_size` bytes from `new`.
    let payload = unsafe { std::slice::from_raw_parts_mut(slot.payload, slot.payload_size) };
    let commit_id = header.ring_ent_in_out.commit_id;
    let payload_in = header.ring_ent_in_out.payload_sz as usize;
    let served = match serve::in_header(header) {
        Some(head) => {
            let op_in = header.op_in;
            // A bug in serving one request must not stop the queue: the
            // kernel would wait for its answer forever.
            std::panic::catch_unwind(AssertUnwindSafe(|| {
                serve::serve(dispatch, acl, &head, &op_in, payload, payload_in)
            }))
            .unwrap_or_else(|_| {
                log::error!(
                    "ring queue {qid}: serving request {} (opcode {}) panicked; answering EIO",
                    head.unique,
                    head.opcode
                );
                Served {
                    error: -libc::EIO,
                    payload_len: 0,
                }
            })
        }
        None => Served {
            error: -libc::EIO,
            payload_len: 0,
        },
    };
    let out = serve::out_header(commit_id, &served);
    header.in_out[..size_of::<fuse_out_header>()].copy_from_slice(abi::bytes_of(&out));
    header.ring_ent_in_out.payload_sz = served.payload_len as u32;
    commit_id
}
