"""Disk chores on a node's file system, run inside the mount namespace where its image is mounted
(``python3 diskutil.py <mount point> <command> [args]``; standalone: no imports from the suite).

fill            take every free block with a ballast file outside the data dir (ENOSPC for the node)
free            delete the ballast
free-bytes      print the bytes still free
sizes           print {relative path: size} of the data dir as JSON
hash REL        print the SHA-1 and size of a file of the data dir ("-" when it is missing)
snapshot DEST   copy the data dir to DEST (a backup taken while the node runs)
wipe            delete the data dir's content but the node's id (a replaced disk, same node)
restore SRC     replace the data dir by a copy of SRC (an operator restoring an old backup)
powerloss CLAIM...
                zero the byte ranges the fault shim recorded as lost by a failed fsync (the claims), on
                the file incarnation it failed on (inode and inode generation must match): what the disk
                holds after a power failure, whatever the page cache showed before
"""

from __future__ import annotations

import array
import fcntl
import hashlib
import json
import os
import shutil
import sys
from pathlib import Path

FS_IOC_GETVERSION = 0x80087601  # _IOR('v', 1, long)


def fill(mnt: Path) -> None:
    fd = os.open(mnt / "ballast", os.O_WRONLY | os.O_CREAT, 0o600)
    offset = os.fstat(fd).st_size
    chunk = 64 * 1024 * 1024
    while chunk >= 4096:  # big steps first, then smaller ones until not a block is left
        try:
            os.posix_fallocate(fd, offset, chunk)
            offset += chunk
        except OSError:
            chunk //= 2
    os.fsync(fd)
    os.close(fd)
    print(offset)


def free_bytes(mnt: Path) -> int:
    st = os.statvfs(mnt)
    return st.f_bavail * st.f_frsize


def sizes(data: Path) -> dict[str, int]:
    found = {}
    for root, _, files in os.walk(data):
        for name in files:
            path = Path(root, name)
            try:
                found[str(path.relative_to(data))] = path.stat().st_size
            except FileNotFoundError:
                continue
    return found


def _version(fd: int) -> int:
    buf = array.array("L", [0])
    try:
        fcntl.ioctl(fd, FS_IOC_GETVERSION, buf)
    except OSError:
        return -1
    return buf[0] & 0xFFFFFFFF


def powerloss(claims: list[str]) -> list[str]:
    applied = []
    for claim in claims:
        try:
            fields = Path(claim).read_text().split(" ", 5)
        except OSError:
            continue
        if len(fields) < 6 or fields[0] != "eio":
            continue  # healed, or a short write (which the node saw)
        ino, version, lo, hi, path = int(fields[1]), int(fields[2]), int(fields[3]), int(fields[4]), fields[5].strip()
        try:
            fd = os.open(path, os.O_RDWR)
        except OSError:
            applied.append(f"{path}: gone")  # deleted since: nothing of it is left to lose
            continue
        try:
            st = os.fstat(fd)
            if st.st_ino != ino or _version(fd) != version:
                applied.append(f"{path}: replaced")  # rewritten as a new file since
                continue
            end = min(hi, st.st_size)
            if end > lo:
                os.pwrite(fd, bytes(end - lo), lo)
                os.fsync(fd)
                applied.append(f"{path} [{lo}, {end})")
        finally:
            os.close(fd)
    return applied


def main(argv: list[str]) -> None:
    mnt, command, args = Path(argv[0]), argv[1], argv[2:]
    data = mnt / "data"
    if command == "fill":
        fill(mnt)
    elif command == "free":
        (mnt / "ballast").unlink(missing_ok=True)
    elif command == "free-bytes":
        print(free_bytes(mnt))
    elif command == "sizes":
        print(json.dumps(sizes(data)))
    elif command == "hash":
        try:
            content = (data / args[0]).read_bytes()
            print(hashlib.sha1(content).hexdigest(), len(content))
        except FileNotFoundError:
            print("- 0")
    elif command == "snapshot":
        try:
            shutil.copytree(data, args[0], symlinks=True, ignore_dangling_symlinks=True)
        except shutil.Error:
            pass  # files the node deleted while they were copied
    elif command == "wipe":
        for entry in data.iterdir():
            if entry.name == ".clustering_id":
                continue
            if entry.is_dir() and not entry.is_symlink():
                shutil.rmtree(entry)
            else:
                entry.unlink()
        os.sync()
    elif command == "restore":
        shutil.rmtree(data, ignore_errors=True)
        shutil.copytree(args[0], data, symlinks=True)
        os.sync()
    elif command == "powerloss":
        print(json.dumps(powerloss(args)))
    else:
        raise SystemExit(f"unknown command {command}")


if __name__ == "__main__":
    main(sys.argv[1:])
