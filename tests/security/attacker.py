#!/usr/bin/env python3
"""The attacks of tests/security.rs, run as an unprivileged user.

usage:
  attacker.py swap-dir  VIEW UNDER PROTECTED   writable mapping, a directory
                                              swapped for a symlink
  attacker.py swap-last VIEW UNDER PROTECTED   writable mapping, a file swapped
                                              for a symlink (last component)
  attacker.py swap-ro   VIEW UNDER PROTECTED   read-only mapping, a directory
                                              swapped for a symlink
  attacker.py race VIEW UNDER PROTECTED N      N attempts while another thread
                                              swaps the directory back and forth

VIEW is the mapping's directory in the mount, UNDER its underlying directory
(writable by this user), PROTECTED a root-only directory holding `secret`.
Prints one JSON object: each operation's outcome, "ok" (with what a read
returned) or the errno name. The test decides what is acceptable.
"""

import errno
import json
import os
import sys
import threading


def outcome(call):
    try:
        result = call()
    except OSError as err:
        return errno.errorcode.get(err.errno, str(err.errno))
    if isinstance(result, bytes):
        return "ok:" + result.decode(errors="replace")
    if isinstance(result, list):
        return "ok:" + ",".join(sorted(str(r) for r in result))
    if isinstance(result, os.stat_result):
        return "ok:size=%d" % result.st_size
    return "ok"


def read(path):
    with open(path, "rb") as f:
        return f.read()


def write(path, data, flags=os.O_WRONLY | os.O_CREAT):
    fd = os.open(path, flags, 0o644)
    try:
        os.write(fd, data)
    finally:
        os.close(fd)


def swap_for_symlink(under, name, target):
    """Replaces UNDER/name with a symlink to target, keeping the original."""
    os.rename(os.path.join(under, name), os.path.join(under, name + ".orig"))
    os.symlink(target, os.path.join(under, name))


def attacks_through(view_dir, view_root, results):
    """Every operation the issue names, on a path below view_dir."""
    secret = os.path.join(view_dir, "secret")
    ops = {
        "stat": lambda: os.stat(secret, follow_symlinks=False),
        "read": lambda: read(secret),
        "list": lambda: os.listdir(view_dir),
        "create": lambda: write(os.path.join(view_dir, "planted"), b"x"),
        "mkdir": lambda: os.mkdir(os.path.join(view_dir, "planted-dir")),
        "symlink": lambda: os.symlink("/", os.path.join(view_dir, "planted-link")),
        "mkfifo": lambda: os.mkfifo(os.path.join(view_dir, "planted-fifo")),
        "write": lambda: write(secret, b"overwritten", os.O_WRONLY),
        "truncate": lambda: os.truncate(secret, 0),
        "chmod": lambda: os.chmod(secret, 0o777),
        "utime": lambda: os.utime(secret, (0, 0)),
        "rename": lambda: os.rename(secret, os.path.join(view_dir, "moved")),
        "link-out": lambda: os.link(secret, os.path.join(view_root, "stolen")),
        "unlink": lambda: os.unlink(secret),
        "setxattr": lambda: os.setxattr(secret, "user.planted", b"x"),
        "getxattr": lambda: os.getxattr(secret, "user.mark"),
        "listxattr": lambda: os.listxattr(secret),
        "removexattr": lambda: os.removexattr(secret, "user.mark"),
    }
    for name, call in ops.items():
        results[name] = outcome(call)


def swap_dir(view, under, protected):
    results = {}
    # Through the mount: a directory the kernel now caches as a directory.
    os.mkdir(os.path.join(view, "d"))
    os.listdir(os.path.join(view, "d"))
    swap_for_symlink(under, "d", protected)
    attacks_through(os.path.join(view, "d"), view, results)
    return results


def swap_last(view, under, protected):
    results = {}
    secret = os.path.join(view, "secret")
    write(secret, b"mine")
    os.stat(secret)
    # The file itself becomes a symlink to the protected file.
    os.rename(os.path.join(under, "secret"), os.path.join(under, "secret.orig"))
    os.symlink(os.path.join(protected, "secret"), os.path.join(under, "secret"))
    ops = {
        "read": lambda: read(secret),
        "write": lambda: write(secret, b"overwritten", os.O_WRONLY),
        "truncate": lambda: os.truncate(secret, 0),
        "chmod": lambda: os.chmod(secret, 0o777),
        "utime": lambda: os.utime(secret, (0, 0)),
        "link-out": lambda: os.link(secret, os.path.join(view, "stolen")),
        "setxattr": lambda: os.setxattr(secret, "user.planted", b"x"),
        "getxattr": lambda: os.getxattr(secret, "user.mark"),
    }
    for name, call in ops.items():
        results[name] = outcome(call)
    return results


def swap_ro(view, under, protected):
    results = {}
    # UNDER/sub exists (made by this user); the mount shows it read-only.
    os.listdir(os.path.join(view, "sub"))
    swap_for_symlink(under, "sub", protected)
    sub = os.path.join(view, "sub")
    secret = os.path.join(sub, "secret")
    ops = {
        "stat": lambda: os.stat(secret, follow_symlinks=False),
        "read": lambda: read(secret),
        "list": lambda: os.listdir(sub),
        "getxattr": lambda: os.getxattr(secret, "user.mark"),
        "listxattr": lambda: os.listxattr(secret),
    }
    for name, call in ops.items():
        results[name] = outcome(call)
    return results


def race(view, under, protected, attempts):
    """One thread swaps UNDER/d between a real directory and a symlink to
    PROTECTED; this one reads, creates and renames through VIEW/d."""
    os.mkdir(os.path.join(view, "d"))
    write(os.path.join(view, "d", "secret"), b"mine")
    real, link = os.path.join(under, "d"), os.path.join(under, "d.link")
    parked = os.path.join(under, "d.real")
    os.symlink(protected, link)
    stop = threading.Event()
    swaps = [0]

    def swapper():
        while not stop.is_set():
            # d becomes the symlink, then the real directory again.
            os.rename(real, parked)
            os.rename(link, real)
            os.rename(real, link)
            os.rename(parked, real)
            swaps[0] += 1

    thread = threading.Thread(target=swapper)
    thread.start()
    counts = {"attempts": 0, "ok": 0, "leaked": []}
    d = os.path.join(view, "d")
    try:
        for n in range(attempts):
            counts["attempts"] += 1
            for op, call in (
                ("read", lambda: read(os.path.join(d, "secret"))),
                ("create", lambda: write(os.path.join(d, "new%d" % n), b"x")),
                ("rename", lambda: os.rename(os.path.join(d, "new%d" % n),
                                             os.path.join(d, "renamed%d" % n))),
                ("unlink", lambda: os.unlink(os.path.join(d, "renamed%d" % n))),
            ):
                result = outcome(call)
                if result.startswith("ok"):
                    counts["ok"] += 1
                if "TOP SECRET" in result:
                    counts["leaked"].append(op)
    finally:
        stop.set()
        thread.join()
    counts["swaps"] = swaps[0]
    return counts


def main():
    command, view, under, protected = sys.argv[1:5]
    if command == "swap-dir":
        results = swap_dir(view, under, protected)
    elif command == "swap-last":
        results = swap_last(view, under, protected)
    elif command == "swap-ro":
        results = swap_ro(view, under, protected)
    elif command == "race":
        results = race(view, under, protected, int(sys.argv[5]))
    else:
        sys.exit("unknown command " + command)
    print(json.dumps(results))


if __name__ == "__main__":
    main()
