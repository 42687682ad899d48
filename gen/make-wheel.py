#!/usr/bin/env python3
"""Packs a build of ncclshim into a Python wheel (standard library only):
  make-wheel.py --lib LIB --bin BIN --version V --glibc X.Y --abi TEXT --out DIR
LIB (the shim's library, a build for every NCCL version) goes to ncclshim/lib/libnccl.so.2 in
site-packages, BIN (the ncclshim command) to the environment's bin/. NVIDIA's NCCL comes as an
extra (ncclshim[cu12] or ncclshim[cu13]), in the same environment, where the shim finds it.
The wheel is tagged manylinux_X_Y_ARCH (glibc X.Y or newer, the processor LIB and BIN are for:
x86_64 or aarch64), which LIB and BIN were built for: a file that needs a newer GLIBC_ symbol
version, or files for two processors, stop it. Prints the wheel's path."""
import argparse
import base64
import hashlib
import os
import re
import stat
import struct
import sys
import zipfile

# PEP 600's tags that older pips know by their first names (PEP 513, 571, 599).
LEGACY_NAMES = {(2, 5): "manylinux1", (2, 12): "manylinux2010", (2, 17): "manylinux2014"}
SHT_GNU_VERNEED = 0x6FFFFFFE
# ELF's e_machine: the processors a wheel may be for, by their names in platform tags.
MACHINES = {62: "x86_64", 183: "aarch64"}

INIT = '''"""ncclshim: a drop-in libnccl.so.2 in front of NVIDIA's NCCL ({abi}).

Run a program with it: `ncclshim run -- torchrun ...`; check a machine: `ncclshim doctor`."""
import os

__version__ = "{version}"


def library_path():
    """The shim's libnccl.so.2, for LD_PRELOAD."""
    return os.path.join(os.path.dirname(__file__), "lib", "libnccl.so.2")
'''

METADATA = """Metadata-Version: 2.1
Name: ncclshim
Version: {version}
Summary: A drop-in libnccl.so.2: faster intra-node collectives over NVLink, NVIDIA's NCCL for the rest ({abi})
License: Apache-2.0
Requires-Python: >=3.8
Provides-Extra: cu12
Requires-Dist: nvidia-nccl-cu12; extra == "cu12"
Provides-Extra: cu13
Requires-Dist: nvidia-nccl-cu13; extra == "cu13"

Run a program with the shim in front: `ncclshim run -- CMD ...`. Check a machine:
`ncclshim doctor`. The real NCCL is found in the same Python environment (the cu12 or cu13
extra installs NVIDIA's), or named by NCCLSHIM_REAL_NCCL.
"""

WHEEL = """Wheel-Version: 1.0
Generator: ncclshim make-wheel.py
Root-Is-Purelib: false
"""


def platform_tags(glibc, arch="x86_64"):
    """The wheel's platform tags for glibc (major, minor) on processor arch: PEP 600's, then its
    legacy name."""
    tags = [f"manylinux_{glibc[0]}_{glibc[1]}_{arch}"]
    if glibc in LEGACY_NAMES:
        tags.append(f"{LEGACY_NAMES[glibc]}_{arch}")
    return tags


def elf_machine(path):
    """The processor an ELF file is for, as platform tags name it; stops on any other."""
    with open(path, "rb") as f:
        header = f.read(20)
    if header[:4] != b"\x7fELF":
        sys.exit(f"make-wheel: {path} is not an ELF file")
    (machine,) = struct.unpack_from("<H", header, 0x12)
    if machine not in MACHINES:
        sys.exit(f"make-wheel: {path} is for ELF machine {machine}, not {' or '.join(MACHINES.values())}")
    return MACHINES[machine]


def glibc_versions_needed(elf):
    """The GLIBC_X.Y[.Z] symbol versions a 64-bit little-endian ELF file needs (its
    .gnu.version_r section), as tuples of numbers."""
    assert elf[:6] == b"\x7fELF\x02\x01", "not a 64-bit little-endian ELF file"
    (shoff,) = struct.unpack_from("<Q", elf, 0x28)
    shentsize, shnum = struct.unpack_from("<HH", elf, 0x3A)
    # Each: (type, offset, link, info) of sh_name, sh_type, flags, addr, offset, size, link, info.
    sections = [
        struct.unpack_from("<4xI16xQ8xII", elf, shoff + i * shentsize) for i in range(shnum)
    ]
    versions = set()
    for kind, offset, link, count in sections:
        if kind != SHT_GNU_VERNEED:
            continue
        strings = sections[link][1]
        for _ in range(count):
            _, aux_count, _, aux, following = struct.unpack_from("<HHIII", elf, offset)
            at = offset + aux
            for _ in range(aux_count):
                _, _, _, name, next_aux = struct.unpack_from("<IHHII", elf, at)
                text = elf[strings + name : elf.index(b"\0", strings + name)].decode()
                if re.fullmatch(r"GLIBC_[0-9.]+", text):
                    versions.add(tuple(int(n) for n in text[len("GLIBC_") :].split(".")))
                at += next_aux
            offset += following
    return versions


def check_glibc(path, glibc):
    """Stops where the ELF file at path needs a GLIBC_ symbol version newer than glibc."""
    newer = sorted(v for v in glibc_versions_needed(open(path, "rb").read()) if v > glibc)
    if newer:
        names = ", ".join("GLIBC_" + ".".join(map(str, v)) for v in newer)
        sys.exit(f"make-wheel: {path} needs {names}, newer than glibc {'.'.join(map(str, glibc))}")


def record_line(name, data):
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{name},sha256={digest},{len(data)}"


def main():
    parser = argparse.ArgumentParser()
    for arg in ("--lib", "--bin", "--version", "--glibc", "--abi", "--out"):
        parser.add_argument(arg, required=True)
    args = parser.parse_args()
    glibc = tuple(int(n) for n in args.glibc.split("."))
    for path in (args.lib, args.bin):
        check_glibc(path, glibc)
    arch = elf_machine(args.lib)
    if elf_machine(args.bin) != arch:
        sys.exit(f"make-wheel: {args.lib} is for {arch}, {args.bin} for {elf_machine(args.bin)}")
    tags = platform_tags(glibc, arch)
    wheel_file = WHEEL + "".join(f"Tag: py3-none-{tag}\n" for tag in tags)
    dist = f"ncclshim-{args.version}"
    files = [
        ("ncclshim/__init__.py", INIT.format(abi=args.abi, version=args.version).encode(), 0o644),
        ("ncclshim/lib/libnccl.so.2", open(args.lib, "rb").read(), 0o755),
        (f"{dist}.data/scripts/ncclshim", open(args.bin, "rb").read(), 0o755),
        (f"{dist}.dist-info/METADATA", METADATA.format(version=args.version, abi=args.abi).encode(), 0o644),
        (f"{dist}.dist-info/WHEEL", wheel_file.encode(), 0o644),
        (f"{dist}.dist-info/top_level.txt", b"ncclshim\n", 0o644),
    ]
    record = f"{dist}.dist-info/RECORD"
    lines = [record_line(name, data) for name, data, _ in files] + [f"{record},,"]
    files.append((record, ("\n".join(lines) + "\n").encode(), 0o644))
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, f"{dist}-py3-none-{'.'.join(tags)}.whl")
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as wheel:
        for name, data, mode in files:
            info = zipfile.ZipInfo(name, date_time=(2026, 1, 1, 0, 0, 0))
            info.external_attr = (stat.S_IFREG | mode) << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            wheel.writestr(info, data)
    print(path)


if __name__ == "__main__":
    sys.exit(main())
