# SPDX-License-Identifier: MIT
# Thin forwarding to the CMake presets and the project's scripts; no logic of its own.
#   make run    install what is missing (Debian, apt), build, run the default deck under mpirun
#   make test   install what is missing (Debian, apt), build, run every test with ctest
#   make build  configure and build only: never installs anything; CMake names what is missing
#   make install PREFIX=/opt/atlas   build, then install bin/atlas and share/atlas under PREFIX
JOBS ?= 2
DECK ?= inputs/default.deck
NP ?= 8
ARGS ?=
PREFIX ?= /usr/local
# Where `make build` configures, and extra CMake arguments, e.g. on a cluster without Debian's
# packages: make build CMAKE_ARGS="-DHDF5_ROOT=/opt/hdf5-mpi -DBLAS_LIBRARIES=/opt/openblas/lib/libopenblas.so"
BUILD_DIR ?= build
CMAKE_ARGS ?=
MPIRUN_ENV := OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1

.PHONY: all deps data build install test run cuda cuda-compile debug format tidy clean

all: build

deps:
	scripts/install-deps.sh

data: deps
	scripts/get-data.sh

build:
	cmake --preset cpu-release -B $(BUILD_DIR) $(CMAKE_ARGS)
	cmake --build $(BUILD_DIR) -j $(JOBS)

install: build
	cmake --install $(BUILD_DIR) --prefix $(PREFIX)

# The test preset reads build/ (ctest ignores --test-dir beside a preset): another BUILD_DIR gets
# the preset's settings spelled out.
ifeq ($(BUILD_DIR),build)
CTEST := ctest --preset cpu-release
else
CTEST := ctest --test-dir $(BUILD_DIR) --label-exclude gpu --output-on-failure --no-tests=error --timeout 600
endif

# deps first, then the build (in this order also under make -j).
test: deps data
	$(MAKE) --no-print-directory build
	$(CTEST) -j $(JOBS)

run: deps data
	$(MAKE) --no-print-directory build
	ATLAS=$(abspath $(BUILD_DIR))/bin/atlas ATLAS_BIN=$(abspath $(BUILD_DIR))/bin scripts/run.sh $(DECK) $(NP) $(ARGS)

cuda:
	cmake --preset cuda-release
	cmake --build --preset cuda-release -j $(JOBS)

cuda-compile:
	cmake --preset cuda-compile-only
	cmake --build --preset cuda-compile-only -j $(JOBS)

debug: deps data
	cmake --preset cpu-debug
	cmake --build --preset cpu-debug -j $(JOBS)
	ctest --preset cpu-debug -j $(JOBS)

format:
	find include src tests tools bench -name '*.hpp' -o -name '*.cpp' -o -name '*.cu' | xargs clang-format -i

tidy: build
	find src -name '*.cpp' -not -path 'src/device/cuda/*' | xargs clang-tidy -p $(BUILD_DIR) --quiet

clean:
	rm -rf build build-debug build-cuda build-cuda-ci
