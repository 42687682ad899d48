#!/usr/bin/env bash
# Whether libclang itself, the library bindgen loads, is installed: exits 0 if a
# libclang.so[.N] or libclang-N.so[.N] is in one of DIRs (default: where clang-sys looks on
# Debian: $LIBCLANG_PATH, /usr/lib/llvm-*/lib, the multiarch and plain library folders).
# libclang-cpp.so (the C++ library of package libclang-cpp*, installed with llvm) does not count:
# bindgen cannot use it.
#   gen/has-libclang.sh [DIR...]
set -uo pipefail
if [ $# -eq 0 ]; then
  set -- ${LIBCLANG_PATH:-} /usr/lib/llvm-*/lib /usr/lib/x86_64-linux-gnu /usr/lib64 /usr/lib \
    /usr/local/lib
fi
for dir in "$@"; do
  for lib in "$dir"/libclang.so* "$dir"/libclang-[0-9]*.so*; do
    [ -f "$lib" ] && exit 0
  done
done
exit 1
