# SPDX-License-Identifier: MIT
# Thin forwarding to the CMake presets and the project's scripts; no logic of its own.
#   make run    install what is missing, build, run the default deck under mpirun
#   make test   install what is missing, build, run every test with ctest
JOBS ?= 2
DECK ?= inputs/default.deck
NP ?= 8
ARGS ?=
MPIRUN_ENV := OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1

.PHONY: all deps data build test run cuda cuda-compile debug format tidy clean

all: build

deps:
	scripts/install-deps.sh

data: deps
	scripts/get-data.sh

build: deps
	cmake --preset cpu-release
	cmake --build --preset cpu-release -j $(JOBS)

test: build data
	ctest --preset cpu-release -j $(JOBS)

run: build data
	scripts/run.sh $(DECK) $(NP) $(ARGS)

cuda: deps
	cmake --preset cuda-release
	cmake --build --preset cuda-release -j $(JOBS)

cuda-compile: deps
	cmake --preset cuda-compile-only
	cmake --build --preset cuda-compile-only -j $(JOBS)

debug: deps data
	cmake --preset cpu-debug
	cmake --build --preset cpu-debug -j $(JOBS)
	ctest --preset cpu-debug -j $(JOBS)

format:
	find include src tests tools bench -name '*.hpp' -o -name '*.cpp' -o -name '*.cu' | xargs clang-format -i

tidy: build
	find src -name '*.cpp' -not -path 'src/device/cuda/*' | xargs clang-tidy -p build --quiet

clean:
	rm -rf build build-debug build-cuda build-cuda-ci
