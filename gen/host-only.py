#!/usr/bin/env python3
"""Leaves NVIDIA's GPU code out of a fetched libnccl.so, in place, for the CPU tests.

    gen/host-only.py LIBRARY

The library's device code (the ELF sections `.nv_fatbin` and `__nv_relfatbin`, 370 of its 400
MB) becomes holes in the file: it reads as zeros and takes no disk. The file keeps its size and
every other byte, so its host code loads and runs as NVIDIA built it; only its GPU kernels are
gone, which no test runs without a GPU. Where the file system cannot punch holes the file stays
whole. Prints the bytes the file takes on disk before and after.
"""

import ctypes
import os
import struct
import sys

DEVICE_CODE = {".nv_fatbin", "__nv_relfatbin"}
FALLOC_FL_KEEP_SIZE, FALLOC_FL_PUNCH_HOLE = 0x1, 0x2


def sections(path):
    """(name, offset, size) of each section of a 64-bit little-endian ELF file."""
    with open(path, "rb") as f:
        head = f.read(64)
        if head[:4] != b"\x7fELF" or head[4] != 2 or head[5] != 1:
            raise SystemExit(f"{path}: not a 64-bit little-endian ELF file")
        (shoff,) = struct.unpack_from("<Q", head, 0x28)
        shentsize, shnum, shstrndx = struct.unpack_from("<HHH", head, 0x3A)
        f.seek(shoff)
        table = f.read(shentsize * shnum)
        headers = [struct.unpack_from("<IIQQQQIIQQ", table, i * shentsize) for i in range(shnum)]
        f.seek(headers[shstrndx][4])
        names = f.read(headers[shstrndx][5])
    for h in headers:
        name = names[h[0] : names.index(b"\0", h[0])].decode()
        yield name, h[4], h[5]


def main():
    path = sys.argv[1]
    before = os.stat(path).st_blocks * 512
    libc = ctypes.CDLL(None, use_errno=True)
    libc.fallocate.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_long, ctypes.c_long]
    page = os.sysconf("SC_PAGE_SIZE")
    fd = os.open(path, os.O_RDWR)
    try:
        for name, offset, size in sections(path):
            if name not in DEVICE_CODE:
                continue
            # Whole pages inside the section only: its neighbours keep every byte.
            start = -(-offset // page) * page
            end = (offset + size) // page * page
            if end <= start:
                continue
            mode = FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE
            if libc.fallocate(fd, mode, start, end - start) != 0:
                error = os.strerror(ctypes.get_errno())
                print(f"{path}: {name} kept ({error})", file=sys.stderr)
    finally:
        os.close(fd)
    after = os.stat(path).st_blocks * 512
    print(f"{path}: {before} bytes on disk before, {after} after")


if __name__ == "__main__":
    main()
