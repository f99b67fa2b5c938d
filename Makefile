# The stable developer interface: setup, build, test, demo, bench.
BUILD_DIR ?= build
BALLAST_CUDA ?= AUTO
JOBS ?= $(shell nproc)
PYTHON ?= python3
# ctest runs JOBS tests at once, so each gets nproc / JOBS intra-op threads.
# Left at torch's default (every core), two tests side by side oversubscribe
# the CPU and their OpenMP threads spin at each other's barriers: a one-step
# 131k-token run took 72 s alone and over 900 s beside another test on CI's
# 2 cores. Tests that check thread counts set their own.
TEST_THREADS ?= $(shell echo $$(( $$(nproc) / $(JOBS) > 1 ? $$(nproc) / $(JOBS) : 1 )))

# ccache shares hits across clones (CCACHE_BASEDIR) and accepts the torch
# precompiled header (sloppiness below is what ccache's manual asks for PCH).
export CCACHE_BASEDIR := $(CURDIR)
export CCACHE_SLOPPINESS := pch_defines,time_macros,include_file_mtime,include_file_ctime
export CCACHE_MAXSIZE ?= 5G
# Builds with -g hash their build folder unless told not to, so a second
# checkout (a git worktree) missed every object of the first; the price is
# debug info that may name the other checkout's build folder.
export CCACHE_NOHASHDIR := 1

.PHONY: setup configure build test fuzz demo demo-binaries bench soak images demo-containers format format-check clean

setup:
	@bash scripts/setup

cmake_configure = cmake -S . -B $(BUILD_DIR) -G Ninja -DBALLAST_CUDA=$(BALLAST_CUDA) -DPython3_EXECUTABLE=$$(command -v $(PYTHON))

$(BUILD_DIR)/build.ninja:
	$(cmake_configure)

# A build folder that `make demo` made has CUDA kernels for the local GPU
# only (BALLAST_CUDA_LOCAL_ONLY); every other build, CI's included, compiles
# them for every architecture, so it is set back here.
configure: $(BUILD_DIR)/build.ninja
	@if grep -qx 'BALLAST_CUDA_LOCAL_ONLY:BOOL=ON' $(BUILD_DIR)/CMakeCache.txt; then \
	  $(cmake_configure) -DBALLAST_CUDA_LOCAL_ONLY=OFF; fi

build: configure
	cmake --build $(BUILD_DIR) -j $(JOBS)

test: setup
	@$(MAKE) --no-print-directory build
	cd $(BUILD_DIR) && OMP_NUM_THREADS=$(TEST_THREADS) ctest --output-on-failure -j $(JOBS)

# libFuzzer on the parsers of untrusted input (tests/fuzz, scripts/fuzz), in a
# clang build of its own; FUZZ_SECONDS per target (default 60).
fuzz: setup
	@JOBS=$(JOBS) bash scripts/fuzz

# scripts/demo installs what the demo needs (scripts/setup --demo), builds
# demo-binaries and runs the job, timing each stage.
demo:
	@BUILD_DIR=$(BUILD_DIR) bash scripts/demo

# The four binaries the demo runs and nothing else (no tests, benchmarks or
# fuzzers); a new build folder gets the CUDA kernels for the local GPU alone,
# or none without one. An existing one is built as it is configured.
DEMO_BINARIES := ballastd ballast-worker ballast ballast-train
demo-binaries:
	@[ -e $(BUILD_DIR)/build.ninja ] || $(cmake_configure) -DBALLAST_CUDA_LOCAL_ONLY=ON
	cmake --build $(BUILD_DIR) -j $(JOBS) --target $(DEMO_BINARIES)

# Container images from the binaries of `make build` (docs/deploy.md).
images: setup
	@$(MAKE) --no-print-directory build
	@bash scripts/images

# The demo job on deploy/compose: a containerised coordinator and two workers.
demo-containers: images
	@BALLAST_SKIP_IMAGES=1 bash scripts/demo-containers

bench: setup
	@$(MAKE) --no-print-directory build
	@bash bench/run

# ballastd's memory under 10 minutes of churn (SOAK_SECONDS to change).
soak: setup
	@$(MAKE) --no-print-directory build
	@$(PYTHON) bench/soak --bin $(BUILD_DIR)/bin

format:
	@git ls-files '*.cc' '*.h' '*.cu' '*.cuh' | xargs -r clang-format -i

format-check:
	@git ls-files '*.cc' '*.h' '*.cu' '*.cuh' | xargs -r clang-format --dry-run -Werror

clean:
	rm -rf $(BUILD_DIR) build-fuzz
