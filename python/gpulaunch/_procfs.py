"""What live re-formation reads of this process in /proc: its TCP sockets
(a process group's connections, found by what appeared while it was made),
their shutdown(2), and a thread's run state. Linux only."""

from __future__ import annotations

import os
import socket
from typing import Optional


def sockets() -> dict[int, int]:
    """fd -> inode of this process's sockets."""
    out: dict[int, int] = {}
    try:
        names = os.listdir("/proc/self/fd")
    except OSError:
        return out
    for name in names:
        try:
            target = os.readlink(f"/proc/self/fd/{name}")
        except OSError:
            continue
        if target.startswith("socket:[") and target.endswith("]"):
            out[int(name)] = int(target[8:-1])
    return out


def tcp_ports(fd: int, inode: int) -> Optional[tuple[int, int]]:
    """(local port, peer port) when fd is still that socket, a connected TCP
    one (not a listening one); else None."""
    try:
        dup = os.dup(fd)
    except OSError:
        return None
    try:
        if os.fstat(dup).st_ino != inode:
            os.close(dup)
            return None
        s = socket.socket(fileno=dup)
    except OSError:
        os.close(dup)
        return None
    try:
        if (s.family not in (socket.AF_INET, socket.AF_INET6) or s.type != socket.SOCK_STREAM
                or s.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN)):
            return None
        return int(s.getsockname()[1]), int(s.getpeername()[1])
    except OSError:
        return None
    finally:
        s.close()


def new_tcp(before: dict[int, int], store_port: int) -> dict[int, int]:
    """The connected TCP sockets that are not in before (fd -> inode); with a
    store_port, only those to or from it (the store's)."""
    out: dict[int, int] = {}
    for fd, ino in sockets().items():
        if before.get(fd) == ino:
            continue
        ports = tcp_ports(fd, ino)
        if ports is not None and (not store_port or store_port in ports):
            out[fd] = ino
    return out


def shut(fd: int, inode: int) -> None:
    """shutdown(2) on the socket behind fd if it is still that one: whatever
    waits on it returns at once; the owner still closes it."""
    try:
        dup = os.dup(fd)
    except OSError:
        return
    try:
        if os.fstat(dup).st_ino == inode:
            s = socket.socket(fileno=dup)
            dup = -1
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass  # not connected any more
            finally:
                s.close()
    except OSError:
        pass
    finally:
        if dup >= 0:
            os.close(dup)


def thread_state(tid: int) -> str:
    """The state letter of this process's thread tid (R running, S sleeping,
    ...); "" when it cannot be read."""
    try:
        with open(f"/proc/self/task/{tid}/stat") as f:
            stat = f.read()
    except OSError:
        return ""
    rest = stat[stat.rfind(")") + 2:]
    return rest[:1]


def thread_wchan(tid: int) -> str:
    """Where in the kernel this process's thread tid waits ("" when not
    known)."""
    try:
        with open(f"/proc/self/task/{tid}/wchan") as f:
            w = f.read().strip()
    except OSError:
        return ""
    return "" if w == "0" else w
