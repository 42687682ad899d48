# ncclshim: `make build` (the library), `make test` (the whole CPU suite).
#   make build [NCCL_VERSION=2.27.7|X.Y.Z|all] [REAL_NCCL_LIB=/abs/path/libnccl.so.2] [BUILD=build]
#   make test
#   make spec NCCL_H=path/to/nccl.h | make spec NCCL_VERSION=2.29.7 | make specs
#   make spec-diff FROM=2.27.7 TO=2.28.9
#   make install [PREFIX=/usr/local]
#   make microbench
#   make help

SHELL := /bin/bash
NCCL_VERSION ?= 2.27.7
REAL_NCCL_LIB ?=
CARGO ?= cargo
BUILD ?= $(CURDIR)/build
TARGET_DIR ?= $(or $(CARGO_TARGET_DIR),$(CURDIR)/target)
# The cargo command `make build` compiles with, and the folder it leaves the release build in
# (the wheel's: cargo-zigbuild, for an old glibc).
CARGO_COMMAND := build
CARGO_OUT = $(TARGET_DIR)/release
FETCH := $(CURDIR)/gen/fetch-nccl.sh
# The NVRTC the build compiles the core's kernels with, ahead of time (fetched once from PyPI).
FETCH_NVRTC := $(CURDIR)/gen/fetch-nvrtc.sh
# The GPU architectures the library carries kernels for (empty: shim/src/core/program.rs's).
KERNEL_ARCHS ?=
# Runs a cargo command whose build script takes the kernels from shim/kernels/ (committed, this
# source's) and fetches NVRTC only to compile those it lacks: `$(WITH_KERNELS) cargo ...`.
WITH_KERNELS = NCCLSHIM_FETCH_NVRTC=$(FETCH_NVRTC) \
  $(if $(KERNEL_ARCHS),NCCLSHIM_KERNEL_ARCHS="$(KERNEL_ARCHS)")
# The same with NVRTC fetched first (for the tests that compile at run time too).
WITH_NVRTC = nvrtc=$$($(FETCH_NVRTC)) && NCCLSHIM_BUILD_NVRTC=$$nvrtc $(WITH_KERNELS)
# Every release with a spec, oldest first. NCCL_VERSION=all exports the union of their APIs and
# installs the newest one's headers.
SPEC_VERSIONS := $(shell ls spec | sed -n 's/^nccl-\(.*\)\.rs$$/\1/p' | sort -V)
NEWEST_SPEC := $(lastword $(SPEC_VERSIONS))
# The real NCCL releases the CPU tests run against (and the newest, whose headers the build for
# all versions installs).
TEST_NCCL_VERSIONS := 2.27.7 2.26.5 2.28.9 $(NEWEST_SPEC)
# The release whose spec a build exports, as gen/spec-version.sh decides (for the build script
# too): NCCL_VERSION's own, its minor release's newest (said once: everything after names that
# one), or all. Worked out when first used, by the targets that build, so that a stray
# NCCL_VERSION (nvidia/cuda images export one) stops nothing else.
SPEC_OF := $(CURDIR)/gen/spec-version.sh
SPEC_VERSION = $(eval SPEC_VERSION := $(call checked,$(SPEC_OF) '$(NCCL_VERSION)'))$(if \
  $(filter-out $(NCCL_VERSION),$(SPEC_VERSION)),$(info NCCL $(NCCL_VERSION) has no spec; building \
  $(SPEC_VERSION)'s ABI (the nearest: its minor release's)))$(SPEC_VERSION)
# NCCL_VERSION where it must name a release (make spec).
RELEASE = $(eval RELEASE := $(call checked,$(SPEC_OF) --release '$(NCCL_VERSION)'))$(RELEASE)
# $(call checked,COMMAND): what COMMAND prints; where it fails, make stops with its one line.
checked = $(call stop_on_failure,$(shell $(1) 2>&1))
stop_on_failure = $(if $(filter 0,$(.SHELLSTATUS)),$(1),$(error $(1)$(if \
  $(filter environment,$(origin NCCL_VERSION)), (NCCL_VERSION comes from the environment: pass \
  NCCL_VERSION=X.Y.Z to make, or unset it))))
HEADERS_VERSION = $(if $(filter all,$(SPEC_VERSION)),$(NEWEST_SPEC),$(SPEC_VERSION))
BUILT_ABI = $(if $(filter all,$(SPEC_VERSION)),the ABI of every NCCL from $(firstword \
  $(SPEC_VERSIONS)) to $(NEWEST_SPEC),NCCL $(SPEC_VERSION)'s ABI)

.PHONY: help build install wheel wheel-aarch64 test lint unit-tests integration-tests spec specs spec-diff microbench \
  deps-test clean readme kernels
PREFIX ?= /usr/local

help:
	@echo "make build [NCCL_VERSION=2.27.7|X.Y.Z|all]  the library in build/lib, headers in build/include, the ncclshim command in build/bin"
	@echo "make install [PREFIX=/usr/local]           build/ into PREFIX/lib, PREFIX/include and PREFIX/bin, as NCCL's packages lay them out"
	@echo "make wheel [WHEEL_ARCH=x86_64|aarch64]     dist/ncclshim-*.whl: pip install it (extras cu12, cu13: NVIDIA's NCCL)"
	@echo "make test                                  the whole CPU suite (installs what it needs: apt, PyPI; needs root)"
	@echo "make spec NCCL_VERSION=X.Y.Z | NCCL_H=...  a spec from a release's headers; make specs: every one again"
	@echo "make spec-diff FROM=2.27.7 TO=2.28.9       what changed between two releases' APIs"
	@echo "make microbench                            the cost of a forwarded call"
	@echo "make kernels                               shim/kernels/ compiled again, after a change to the kernels' source (commit them)"
	@echo "make readme                                the README's tables of variables, from shim/src/variables.rs"
	@echo "make gpu-bundle [NCCL_TESTS_GIT=...]       the GPU suite, to run on a GPU machine (tests/gpu/README.md)"
	@echo "make clean"

build:
	@command -v $(CARGO) >/dev/null || { echo "make build needs Rust (cargo): https://rustup.rs"; exit 1; }
	@echo "building the shim, with its CUDA kernels from shim/kernels/ (where the kernels' source changed, they are compiled: about 25 minutes on two cores, cached under $${NCCLSHIM_CACHE:-~/.cache/ncclshim})"
	$(WITH_KERNELS) NCCL_VERSION=$(SPEC_VERSION) REAL_NCCL_LIB=$(REAL_NCCL_LIB) \
	  $(CARGO) $(CARGO_COMMAND) --release --locked -p ncclshim -p ncclshim-cli
	@header_dir=$$($(FETCH) $(HEADERS_VERSION) headers)/include && \
	  rm -rf $(BUILD)/lib $(BUILD)/include $(BUILD)/bin && mkdir -p $(BUILD)/lib $(BUILD)/include $(BUILD)/bin && \
	  cp $(CARGO_OUT)/ncclshim $(BUILD)/bin/ncclshim && \
	  cp $(CARGO_OUT)/libnccl.so $(BUILD)/lib/libnccl.so.$(SPEC_VERSION) && \
	  ln -s libnccl.so.$(SPEC_VERSION) $(BUILD)/lib/libnccl.so.2 && \
	  ln -s libnccl.so.2 $(BUILD)/lib/libnccl.so && \
	  cp -r $$header_dir/. $(BUILD)/include/ && rm -f $(BUILD)/include/__init__.py
	@echo "built $(BUILD)/lib/libnccl.so.$(SPEC_VERSION) ($(BUILT_ABI), headers of $(HEADERS_VERSION))"

# The built library, headers and command under PREFIX: lib/libnccl.so.<version> with the links
# libnccl.so.2 and libnccl.so, include/nccl.h (and nccl_device/ from 2.28 on).
install:
	@[ -e $(BUILD)/lib/libnccl.so.2 ] || { echo "nothing built in $(BUILD): make build first"; exit 1; }
	install -d $(PREFIX)/lib $(PREFIX)/include $(PREFIX)/bin
	cp -P $(BUILD)/lib/libnccl.so* $(PREFIX)/lib/
	cp $(BUILD)/bin/ncclshim $(PREFIX)/bin/
	cp -r $(BUILD)/include/. $(PREFIX)/include/
	@echo "installed $$(readlink -f $(PREFIX)/lib/libnccl.so.2), its headers and bin/ncclshim under $(PREFIX)"

# A Python wheel: the build for every NCCL version (its own target and build folders) and the
# ncclshim command; `pip install --find-links dist ncclshim` (or `ncclshim[cu12]`, `ncclshim[cu13]`
# for NVIDIA's NCCL as well). Both are linked against WHEEL_GLIBC's symbols by cargo-zigbuild
# (gen/fetch-wheel-tools.sh), so that the wheel installs where NVIDIA's NCCL wheels do
# (manylinux2014); gen/make-wheel.py refuses files that need a newer glibc. WHEEL_ARCH: the
# processor, x86_64 or aarch64 (Grace Hopper, Grace Blackwell), this machine's by default; the
# other is built across, with Rust's standard library for it (rustup installs it where missing).
WHEEL_GLIBC := 2.17
# Not from the environment (`make wheel WHEEL_ARCH=...` sets it): `make test` builds this machine's.
WHEEL_ARCH = $(shell uname -m)
WHEEL_TRIPLE = $(WHEEL_ARCH)-unknown-linux-gnu
WHEEL_BUILD = $(CURDIR)/target/wheel-build-$(WHEEL_ARCH)
WHEEL_TARGET := $(CURDIR)/target/wheel
wheel:
	@case "$(WHEEL_ARCH)" in x86_64|aarch64) ;; *) echo "WHEEL_ARCH is x86_64 or aarch64"; exit 1;; esac
	@[ "$(WHEEL_ARCH)" = "$$(uname -m)" ] || $(call HAS_RUST_TARGET,$(WHEEL_TRIPLE)) || timeout 300 rustup target add $(WHEEL_TRIPLE) || \
	  { echo "make wheel WHEEL_ARCH=$(WHEEL_ARCH) needs Rust's standard library for $(WHEEL_TRIPLE): rustup target add $(WHEEL_TRIPLE)"; exit 1; }
	@# Without debug information: the wheel's files carry none.
	tools=$$(gen/fetch-wheel-tools.sh) && PATH=$$tools:$$PATH CARGO_TARGET_DIR=$(WHEEL_TARGET) \
	  CARGO_PROFILE_RELEASE_DEBUG=false CARGO_PROFILE_RELEASE_STRIP=debuginfo \
	  $(MAKE) --no-print-directory build NCCL_VERSION=all BUILD=$(WHEEL_BUILD) \
	  CARGO_COMMAND="zigbuild --target $(WHEEL_TRIPLE).$(WHEEL_GLIBC)" \
	  CARGO_OUT=$(WHEEL_TARGET)/$(WHEEL_TRIPLE)/release
	@python3 gen/make-wheel.py --lib $(WHEEL_BUILD)/lib/libnccl.so.all --bin $(WHEEL_BUILD)/bin/ncclshim \
	  --version $$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml) --glibc $(WHEEL_GLIBC) \
	  --abi "the API of every NCCL from $(firstword $(SPEC_VERSIONS)) to $(NEWEST_SPEC)" --out $(CURDIR)/dist

# make test's wheel for aarch64, built on x86_64 and run there under qemu (cli/tests/wheel.rs)
# where Rust's standard library for aarch64 is installed or can be; elsewhere dist/aarch64-skipped
# says why (and make, and the tests), and no older aarch64 wheel is left to be taken for it.
# A target's standard library is installed once its manifest is written (rustup does it last).
HAS_RUST_TARGET = [ -f "$$(rustc --print sysroot)/lib/rustlib/manifest-rust-std-$(1)" ]
wheel-aarch64:
	@mkdir -p $(CURDIR)/dist && rm -f $(CURDIR)/dist/aarch64-skipped
	@skip() { rm -f $(CURDIR)/dist/ncclshim-*_aarch64.whl; echo "$$1" > $(CURDIR)/dist/aarch64-skipped; echo "no aarch64 wheel: $$1"; }; \
	if [ "$$(uname -m)" != x86_64 ]; then skip "built and run on x86_64 hosts only"; \
	elif $(call HAS_RUST_TARGET,aarch64-unknown-linux-gnu) || timeout 300 rustup target add aarch64-unknown-linux-gnu; then \
	  $(MAKE) --no-print-directory wheel WHEEL_ARCH=aarch64; \
	else skip "Rust's standard library for aarch64 could not be installed (rustup target add aarch64-unknown-linux-gnu)"; fi

# What the tests need beyond Rust: gcc, libclang (bindgen; libclang-cpp, which comes with llvm,
# is not it: gen/has-libclang.sh), qemu and aarch64's glibc (on x86_64), NVIDIA's libraries from
# PyPI.
deps-test:
	@command -v gcc >/dev/null && gen/has-libclang.sh || { \
	  echo "installing gcc and libclang-dev"; apt-get update -qq >/dev/null && \
	  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq gcc libclang-dev >/dev/null; }
	@# The wheel's test installs it into a virtual environment (Debian keeps venv apart).
	@python3 -c 'import ensurepip, venv' 2>/dev/null || { \
	  echo "installing python3-venv"; apt-get update -qq >/dev/null && \
	  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-venv >/dev/null; }
	@# The aarch64 wheel's test runs its files under qemu, with Debian's aarch64 glibc.
	@[ "$$(uname -m)" != x86_64 ] || { command -v qemu-aarch64 >/dev/null && [ -e /usr/aarch64-linux-gnu/lib/libc.so.6 ]; } || { \
	  echo "installing qemu-user and libc6-arm64-cross"; apt-get update -qq >/dev/null && \
	  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq qemu-user libc6-arm64-cross >/dev/null; }
	@for v in $(TEST_NCCL_VERSIONS); do $(FETCH) $$v host >/dev/null; done

# lint and test keep no incremental state (about 0.5 GB in target/debug): it speeds the rebuild of
# a crate after a small edit, which cargo's own commands are for.
lint:
	$(CARGO) fmt --all -- --check
	CARGO_INCREMENTAL=0 $(WITH_KERNELS) $(CARGO) clippy --locked --workspace --all-targets -- -D warnings

test: build wheel wheel-aarch64 deps-test lint gpu-check
	$(WITH_NVRTC) NCCLSHIM_BUILD=$(BUILD) NCCLSHIM_CACHE=$${NCCLSHIM_CACHE:-$$HOME/.cache/ncclshim} \
	  NCCLSHIM_WHEEL_DIR=$(CURDIR)/dist CARGO_INCREMENTAL=0 \
	  $(CARGO) test --locked --workspace --all-targets

# A spec from a release's headers (nccl.h, and nccl_device.h beside it from 2.28 on): given, or
# fetched from NVIDIA's wheel on PyPI for NCCL_VERSION.
spec:
	@[ -n "$(NCCL_H)" ] || [ "$(origin NCCL_VERSION)" != file ] || { \
	  echo "usage: make spec NCCL_H=path/to/nccl.h | make spec NCCL_VERSION=X.Y.Z"; exit 1; }
	@header=$(or $(NCCL_H),$$($(FETCH) $(RELEASE) headers)/include/nccl.h) && \
	  $(CARGO) run --locked --release -q -p ncclshim-gen -- spec $$header spec/

# Every committed spec again, from its release's headers (after a change to the generator).
specs:
	@for v in $(SPEC_VERSIONS); do $(MAKE) --no-print-directory spec NCCL_VERSION=$$v || exit 1; done

# What changed between two releases' specs: functions, types with their layout, constants.
spec-diff:
	@[ -n "$(FROM)" ] && [ -n "$(TO)" ] || { echo "usage: make spec-diff FROM=2.27.7 TO=2.28.9"; exit 1; }
	@echo "comparing spec/nccl-$(FROM).rs and spec/nccl-$(TO).rs (building ncclshim-gen first: about a minute the first time)" >&2
	@$(CARGO) run --locked --release -q -p ncclshim-gen -- diff spec/nccl-$(FROM).rs spec/nccl-$(TO).rs

microbench: build deps-test
	$(WITH_NVRTC) NCCLSHIM_BUILD=$(BUILD) NCCLSHIM_CACHE=$${NCCLSHIM_CACHE:-$$HOME/.cache/ncclshim} \
	  $(CARGO) bench --locked -p ncclshim-tests --bench forwarding

# shim/kernels/: this source's kernels compiled for every built-in architecture (and the PTX),
# to be committed with a change to the kernels' source; the packs of other source go.
kernels:
	$(WITH_NVRTC) NCCLSHIM_KERNELS_UPDATE=1 $(CARGO) build --release --locked -p ncclshim
	@echo "shim/kernels/: $$(ls shim/kernels | tr '\n' ' ')"

# The README's tables of variables, written from shim/src/variables.rs (a test holds them equal).
readme:
	UPDATE_README=1 $(CARGO) test --locked -q -p ncclshim --lib variables::tests::the_readme_tables

clean:
	rm -rf $(BUILD) target

# The GPU suite (tests/gpu/, tests/gpu/README.md): one folder holding everything a GPU machine
# needs, no Rust there: the shim built for the NCCL that PyTorch ships, the C/CUDA sources, the
# scripts; with NCCL_TESTS_GIT (a git folder of NVIDIA/nccl-tests, never committed here), its
# source and a 2.27.7 build of the shim with its headers, for the nccltests suite.
# There: BUNDLE/run.sh OUTDIR [collectives] [torch] [bench] [nccltests] ...
#   make gpu-bundle [GPU_NCCL_VERSION=2.28.9] [BUNDLE=.bundle] [NCCL_TESTS_GIT=path/to/.git]
#   make bench      (the same bundle; run BUNDLE/run.sh OUTDIR bench there)
GPU_NCCL_VERSION ?= 2.28.9
BUNDLE ?= $(CURDIR)/.bundle
NCCL_TESTS_GIT ?=
GPU_FILES := $(wildcard tests/gpu/*.cu tests/gpu/*.h tests/gpu/*.c tests/gpu/*.py tests/gpu/*.sh) \
  tests/c/calls_client.c tests/c/fake_operations_nccl.c

.PHONY: gpu-bundle bench gpu-check

gpu-bundle:
	rm -rf $(BUNDLE)
	@# A target folder of its own: other builds of the shim (other versions) share target/.
	CARGO_TARGET_DIR=$(CURDIR)/target/gpu-bundle $(MAKE) --no-print-directory build \
	  NCCL_VERSION=$(GPU_NCCL_VERSION) BUILD=$(BUNDLE)/shim
	strip --strip-debug $$(readlink -f $(BUNDLE)/shim/lib/libnccl.so.2) $(BUNDLE)/shim/bin/ncclshim
	@# The core's own GPU tests (shim/src/core/**/gpu_test.rs, ignored in make test): run.sh zerocopy.
	$(WITH_NVRTC) NCCL_VERSION=$(GPU_NCCL_VERSION) CARGO_TARGET_DIR=$(CURDIR)/target/gpu-bundle \
	  $(CARGO) test --release --locked -p ncclshim --lib --no-run --message-format=json 2>/dev/null \
	  | python3 -c 'import json, sys; print(next(m["executable"] for m in map(json.loads, sys.stdin) if m.get("executable")))' \
	  | xargs -I{} cp {} $(BUNDLE)/shim/bin/core-tests
	strip --strip-debug $(BUNDLE)/shim/bin/core-tests
	@if [ -n "$(NCCL_TESTS_GIT)" ]; then \
	  git --git-dir="$(NCCL_TESTS_GIT)" archive --format=tar.gz --prefix=nccl-tests/ HEAD \
	    >$(BUNDLE)/nccl-tests.tar.gz && \
	  $(MAKE) --no-print-directory build NCCL_VERSION=2.27.7 BUILD=$(BUNDLE)/shim-2.27.7 && \
	  strip --strip-debug $(BUNDLE)/shim-2.27.7/lib/libnccl.so.2.27.7 $(BUNDLE)/shim-2.27.7/bin/ncclshim; \
	else echo "no NCCL_TESTS_GIT: the bundle has no nccl-tests (its suite will be skipped)"; fi
	cp $(GPU_FILES) $(BUNDLE)/
	git describe --always --dirty > $(BUNDLE)/VERSION
	@echo "bundle: $(BUNDLE) ($$(du -sh $(BUNDLE) | cut -f1)); on a GPU machine: $(BUNDLE)/run.sh OUTDIR"

bench: gpu-bundle
	@echo "the benchmark (tests/gpu/bench.cu) is in the bundle: $(BUNDLE)/run.sh OUTDIR bench"

# What of the GPU suite can be checked without a GPU: the matrix's inputs and host references
# (every reduction order gives the same bits), the scripts' syntax, the nccl-tests report.
gpu-check:
	@mkdir -p $(TARGET_DIR)
	gcc -O2 -std=gnu11 -Wall -Wextra -Werror tests/gpu/check_values.c -lm -o $(TARGET_DIR)/check_values
	$(TARGET_DIR)/check_values
	python3 -c 'import ast, sys; [ast.parse(open(f).read(), f) for f in sys.argv[1:]]' tests/gpu/*.py
	bash -n tests/gpu/run.sh
	bash -n tests/gpu/nccl_tests.sh
	@# nccl_tests_report.py on made-up nccl-tests output: sound rows pass, wrong ones fail, a row
	@# without an op (hypercube's) is read, the cold start's timing is found.
	python3 tests/gpu/nccl_tests_report.py --check tests/gpu/testdata/nccl-tests-shim.log
	! python3 tests/gpu/nccl_tests_report.py --check tests/gpu/testdata/nccl-tests-wrong.log >/dev/null
	[ "$$(python3 tests/gpu/nccl_tests_report.py --largest-ratio tests/gpu/testdata nccl-tests)" = 1.000 ]
	@# The ratios' list of sizes where the shim is slower: the one made-up slower size, and none.
	python3 tests/gpu/nccl_tests_report.py --ratios tests/gpu/testdata nccl-tests ratios-slow | tail -n 1 | \
	  grep -qx "# 1 of 10 sizes above 1.02 x NCCL's time (worst 1.20: ratios-slow 1 KiB in place)"
	python3 tests/gpu/nccl_tests_report.py --ratios tests/gpu/testdata nccl-tests | tail -n 1 | \
	  grep -qx "# 0 of 6 sizes above 1.02 x NCCL's time"
	python3 tests/gpu/nccl_tests_report.py --first-call tests/gpu/testdata/nccl-tests-shim.log \
	  tests/gpu/testdata/nccl-tests-real.log
	@# The speed gate on made-up rounds (-N 2): an outlier in one shim round is passed over for
	@# the best round, a shim 1.3 x slower at 32 MiB fails.
	python3 tests/gpu/nccl_tests_report.py --gate 1.05 tests/gpu/testdata gate-ok >/dev/null
	! python3 tests/gpu/nccl_tests_report.py --gate 1.05 tests/gpu/testdata gate-slow >/dev/null
	@# Settings weighed on made-up rounds: the one faster than the shim as built at 2 KiB is
	@# named there, the slower one nowhere.
	python3 tests/gpu/nccl_tests_report.py --tune tests/gpu/testdata tune-e \
	  | grep -qx 'sentinel_block:8K: faster than as built (below 0.98 of its time) at tune-e 2 KiB'
	python3 tests/gpu/nccl_tests_report.py --tune tests/gpu/testdata tune-e \
	  | grep -qx 'sentinel_block:0: faster than as built (below 0.98 of its time) nowhere'
	@# Limits measured for three collectives on made-up rounds: reduce's, reduce-scatter's two
	@# spans (it loses at 2 MiB only), all-gather's, which loses to NCCL's symmetric windows from
	@# 8 MiB (-R 2) but not to its plain buffers (the second row's), "-" for the others.
	[ "$$(python3 tests/gpu/nccl_tests_report.py --limits GPU 2 tests/gpu/testdata limits-t-mpi-reduce \
	  limits-t-mpi-reduce-r2 limits-t-mpi-reduce-g limits-t-mpi-reduce_scatter limits-t-mpi-all_gather \
	  limits-t-mpi-all_gather-r2 | tail -n 2 | paste -sd '|')" \
	  = "$$(printf 'GPU\t2\tany\t131072\t131072,8388608-33554432\t-\t131072\t-\t-\t-|GPU\t2\tplain\t33554432\t131072,8388608-33554432\t-\t131072\t-\t-\t-')" ]
	@# The same runs per collective and mode: all-gather's 8 MiB with symmetric windows is the
	@# shim's time against NCCL's faster one (its windows, not its plain buffers).
	python3 tests/gpu/nccl_tests_report.py --modes tests/gpu/testdata limits-t-mpi-all_gather \
	  limits-t-mpi-all_gather-r2 | grep -qxF '| 8 MiB | 30.0 / 60.0: 0.50 (0.50) | 30.0 / 27.0: 1.11 (1.11) |'
	@# trace_check.py on made-up traces: a timed one passes (and fails untimed), a gap fails.
	python3 tests/gpu/trace_check.py --timed tests/gpu/testdata/trace-timed.jsonl
	! python3 tests/gpu/trace_check.py tests/gpu/testdata/trace-timed.jsonl >/dev/null
	! python3 tests/gpu/trace_check.py --timed tests/gpu/testdata/trace-gap.jsonl >/dev/null
	@# bad_input_compare.py on made-up runs: right sums where NCCL's were wrong are noted, wrong
	@# sums where NCCL's were right fail.
	python3 tests/gpu/bad_input_compare.py tests/gpu/testdata/badinput-nccl.log \
	  tests/gpu/testdata/badinput-shim.log | grep -qx "2 cases: 2 as NCCL, 0 differ (1 with notes)"
	! python3 tests/gpu/bad_input_compare.py tests/gpu/testdata/badinput-nccl.log \
	  tests/gpu/testdata/badinput-shim-wrong.log >/dev/null
