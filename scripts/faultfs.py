#!/usr/bin/env python3
"""A read-only FUSE passthrough of a directory that injects storage faults (libple's reliability tests).

    faultfs.py SRC_DIR MOUNTPOINT CTL_FILE

CTL_FILE holds JSON, re-read whenever its modification time changes, applied to every read of every
file from then on:
    {"eio": [[first_byte, end_byte], ...],   # a read overlapping a range fails with EIO
     "short": false,                          # a read returns half the bytes asked (at least 1)
     "stall_ms": 0}                           # every read sleeps this long first (per read; the
                                              # file system is multithreaded, so stalls overlap)
An empty object (or a missing file) means no fault. The mount is foreground; unmount with
`fusermount3 -u MOUNTPOINT` (or kill the process). Kernel caching is off (no kernel_cache,
attr/entry timeouts 0), so a page the kernel evicted is read again through the faults.
Needs the PyPI package mfusepy (libfuse3) and fusermount3.
"""
import errno
import json
import os
import sys
import threading
import time

import mfusepy as fuse


class FaultFs(fuse.Operations):
    def __init__(self, src, ctl):
        self.src = os.path.realpath(src)
        self.ctl = ctl
        self._mu = threading.Lock()
        self.mtime = None
        self.spec = {}

    def _path(self, p):
        return os.path.join(self.src, p.lstrip("/"))

    def _faults(self):
        try:
            st = os.stat(self.ctl)
            m = (st.st_mtime_ns, st.st_ino, st.st_size)
        except FileNotFoundError:
            m = None
        with self._mu:
            if m != self.mtime:
                self.mtime = m
                try:
                    with open(self.ctl) as f:
                        self.spec = json.load(f) if m is not None else {}
                except (OSError, ValueError):
                    self.spec = {}
            return self.spec

    def getattr(self, path, fh=None):
        st = os.lstat(self._path(path))
        keys = ("st_mode", "st_size", "st_nlink", "st_uid", "st_gid", "st_atime", "st_mtime", "st_ctime")
        d = {k: getattr(st, k) for k in keys}
        d["st_mode"] &= ~0o222  # read only
        return d

    def readdir(self, path, fh):
        return [".", ".."] + os.listdir(self._path(path))

    def open(self, path, flags):
        if flags & (os.O_WRONLY | os.O_RDWR):
            raise fuse.FuseOSError(errno.EROFS)
        return os.open(self._path(path), os.O_RDONLY)

    def read(self, path, size, offset, fh):
        spec = self._faults()
        stall = spec.get("stall_ms", 0)
        if stall:
            time.sleep(stall / 1000.0)
        for lo, hi in spec.get("eio", []):
            if offset < hi and offset + size > lo:
                raise fuse.FuseOSError(errno.EIO)
        data = os.pread(fh, size, offset)
        if spec.get("short") and len(data) > 1:
            data = data[: len(data) // 2]
        return data

    def release(self, path, fh):
        os.close(fh)
        return 0

    def statfs(self, path):
        st = os.statvfs(self.src)
        keys = ("f_bavail", "f_bfree", "f_blocks", "f_bsize", "f_favail", "f_ffree", "f_files", "f_flag",
                "f_frsize", "f_namemax")
        return {k: getattr(st, k) for k in keys}


def main():
    if len(sys.argv) != 4:
        sys.exit(__doc__)
    src, mnt, ctl = sys.argv[1:]
    fuse.FUSE(FaultFs(src, ctl), mnt, foreground=True, nothreads=False, ro=True,
              attr_timeout=0, entry_timeout=0)


if __name__ == "__main__":
    main()
