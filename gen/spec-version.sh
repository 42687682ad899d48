#!/usr/bin/env bash
# Which spec a build for NCCL <version> exports, the one place that decides it (the Makefile and
# the shim's build script both ask): the release's own spec; for a patch release without one,
# the newest spec of its minor release, whose ABI it shares; every spec for `all`. Prints that
# release (or `all`); otherwise one line on stderr and exit 2.
#   gen/spec-version.sh 2.27.5             ->   2.27.7
#   gen/spec-version.sh --release 2.33.1   ->   2.33.1 (only checks that it names a release)
set -euo pipefail
release_only=
if [ "${1:-}" = --release ]; then
  release_only=1
  shift
fi
version=${1?usage: spec-version.sh [--release] <X.Y.Z|all>}

if [ "$version" = all ] && [ -z "$release_only" ]; then
  echo all
  exit 0
fi
if ! [[ $version =~ ^[0-9]+\.[0-9]+\.[0-9]+$ ]]; then
  echo "NCCL_VERSION=$version is not an NCCL release ($([ -n "$release_only" ] && echo X.Y.Z || echo X.Y.Z or all))" >&2
  exit 2
fi
if [ -n "$release_only" ]; then
  echo "$version"
  exit 0
fi

spec_dir=$(dirname "$0")/../spec
# The release's own spec first.
if [ -f "$spec_dir/nccl-$version.rs" ]; then
  echo "$version"
  exit 0
fi
specs=$(ls "$spec_dir" | sed -n 's/^nccl-\(.*\)\.rs$/\1/p' | sort -V)
chosen=
for spec in $specs; do
  # Sorted oldest first: the last of the minor release is its newest.
  [ "${spec%.*}" = "${version%.*}" ] && chosen=$spec
done
if [ -n "$chosen" ]; then
  echo "$chosen"
  exit 0
fi
# The specs just before and just after the release.
nearest=$(printf '%s\n' $specs "$version" | sort -V | grep -x -F -B1 -A1 "$version" | grep -v -x -F "$version" |
  paste -sd, - | sed 's/,/ and /')
echo "NCCL $version has no spec, nor has any ${version%.*} release (nearest: $nearest); make one from its headers: make spec NCCL_VERSION=$version" >&2
exit 2
