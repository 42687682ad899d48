# ncclshim: `make build` (the library), `make test` (the whole CPU suite).
#   make build [NCCL_VERSION=2.27.7] [REAL_NCCL_LIB=/abs/path/libnccl.so.2]
#   make test
#   make spec NCCL_H=path/to/nccl.h
#   make microbench

SHELL := /bin/bash
NCCL_VERSION ?= 2.27.7
REAL_NCCL_LIB ?=
CARGO ?= cargo
BUILD ?= $(CURDIR)/build
TARGET_DIR ?= $(or $(CARGO_TARGET_DIR),$(CURDIR)/target)
FETCH := $(CURDIR)/gen/fetch-nccl.sh
# The real NCCL releases the CPU tests run against.
TEST_NCCL_VERSIONS := 2.27.7 2.26.5

.PHONY: build test lint unit-tests integration-tests spec microbench deps-test clean

build:
	@command -v $(CARGO) >/dev/null || { echo "make build needs Rust (cargo): https://rustup.rs"; exit 1; }
	NCCL_VERSION=$(NCCL_VERSION) REAL_NCCL_LIB=$(REAL_NCCL_LIB) $(CARGO) build --release --locked -p ncclshim
	@header_dir=$$($(FETCH) $(NCCL_VERSION))/include && \
	  rm -rf $(BUILD)/lib $(BUILD)/include && mkdir -p $(BUILD)/lib $(BUILD)/include && \
	  cp $(TARGET_DIR)/release/libnccl.so $(BUILD)/lib/libnccl.so.$(NCCL_VERSION) && \
	  ln -s libnccl.so.$(NCCL_VERSION) $(BUILD)/lib/libnccl.so.2 && \
	  ln -s libnccl.so.2 $(BUILD)/lib/libnccl.so && \
	  cp -r $$header_dir/. $(BUILD)/include/
	@echo "built $(BUILD)/lib/libnccl.so.$(NCCL_VERSION) (NCCL $(NCCL_VERSION) ABI)"

# What the tests need beyond Rust: gcc, libclang (bindgen), NVIDIA's libraries from PyPI.
deps-test:
	@command -v gcc >/dev/null && [ -n "$$(ls /usr/lib/llvm-*/lib/libclang*.so* 2>/dev/null)" ] || { \
	  echo "installing gcc and libclang-dev"; apt-get update -qq >/dev/null && \
	  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq gcc libclang-dev >/dev/null; }
	@for v in $(TEST_NCCL_VERSIONS); do $(FETCH) $$v >/dev/null; done

lint:
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --locked --workspace --all-targets -- -D warnings

test: build deps-test lint
	NCCLSHIM_BUILD=$(BUILD) NCCLSHIM_CACHE=$${NCCLSHIM_CACHE:-$$HOME/.cache/ncclshim} \
	  $(CARGO) test --locked --workspace --all-targets

spec:
	@[ -n "$(NCCL_H)" ] || { echo "usage: make spec NCCL_H=path/to/nccl.h"; exit 1; }
	$(CARGO) run --locked --release -q -p ncclshim-gen -- spec $(NCCL_H) spec/

microbench: build deps-test
	NCCLSHIM_BUILD=$(BUILD) NCCLSHIM_CACHE=$${NCCLSHIM_CACHE:-$$HOME/.cache/ncclshim} \
	  $(CARGO) bench --locked -p ncclshim-tests --bench forwarding

clean:
	rm -rf $(BUILD) target
