# hymoe: the one entry point. `make help` lists the targets and knobs.
# Objects are built out of tree in build/<config>/ (config = cpu|cuda, plus -asan), with -MMD deps;
# build/hymoe links to the binary of the last config built.

CUDA      ?= 0
SAN       ?=
CONFIG    := $(if $(filter 1,$(CUDA)),cuda,cpu)$(if $(SAN),-$(SAN))
OUT       := build/$(CONFIG)

# ccache, when installed (make deps installs it), answers recompiles of unchanged sources, also in a
# fresh clone on the same machine (the clone's folder is left out of its hash); `make CCACHE=` skips it
CCACHE    ?= $(shell command -v ccache)
export CCACHE_BASEDIR := $(CURDIR)
export CCACHE_NOHASHDIR := 1
CXX       := $(strip $(CCACHE) mpicxx)
PKGS      := hdf5-openmpi openblas yaml-cpp nlohmann_json libpng libpcre2-8
# '=' (not ':='): pkg-config runs when a recipe needs it, after `make deps` has installed the packages
PKG_CFLAGS = $(shell pkg-config --cflags $(PKGS))
PKG_LIBS   = $(shell pkg-config --libs $(PKGS))
WARN      := -Wall -Wextra -Wpedantic -Wshadow -Wnon-virtual-dtor -Wdouble-promotion \
             -Wimplicit-fallthrough -Werror
OPT       ?= -O2 -g
CPPFLAGS   = -Iinclude -DOMPI_SKIP_MPICXX=1 $(PKG_CFLAGS) \
             $(if $(filter 1,$(CUDA)),-DHYMOE_CUDA=1 -isystem $(CUDA_HOME)/include)
CXXFLAGS   = -std=c++20 $(OPT) $(WARN) -MMD -MP $(SAN_FLAGS)
LDLIBS     = $(PKG_LIBS) -ljpeg -fopenmp $(if $(filter 1,$(CUDA)),$(CUDA_LIBS))

ifeq ($(SAN),asan)
# g++ 12 gives false maybe-uninitialized warnings on instrumented code (std::regex's std::function)
SAN_FLAGS := -fsanitize=address,undefined -fno-omit-frame-pointer -Wno-maybe-uninitialized
OPT       := -O1 -g
endif

CUDA_HOME ?= /usr/local/cuda
NVCC      := $(CUDA_HOME)/bin/nvcc
CUDA_ARCH ?= -gencode arch=compute_90,code=sm_90 -gencode arch=compute_90,code=compute_90
MPI_INC    = $(addprefix -I,$(shell mpicxx --showme:incdirs))
NVCCFLAGS  = -std=c++20 -O2 $(CUDA_ARCH) -ccbin g++ -Werror all-warnings \
             -Xcompiler -Wall,-Wextra,-Werror -MMD -MP
CUDA_LIBS := -L$(CUDA_HOME)/lib64 -Wl,-rpath,$(CUDA_HOME)/lib64 -lcublas -lnccl -lcudart

TEST_LIBS := -lboost_unit_test_framework

# ---- sources -------------------------------------------------------------------------------------
# Found once, when make starts: a file created while a make runs joins at the next make.
# C++ under a cuda/ folder (the GPU's decode graphs and host KV tier, src/model/cuda/) calls the
# CUDA backend: CUDA builds only
CUDA_CPP  := $(shell find src -path '*/cuda/*' -name '*.cpp' | sort)
LIB_SRC   := $(filter-out src/main.cpp $(if $(filter 1,$(CUDA)),,$(CUDA_CPP)), \
               $(shell find src -name '*.cpp' | sort))
CU_SRC    := $(if $(filter 1,$(CUDA)),$(shell find src -name '*.cu' | sort))
LIB_OBJ   := $(LIB_SRC:%.cpp=$(OUT)/%.o) $(CU_SRC:%.cu=$(OUT)/%.cu.o) $(OUT)/gen/build_info.o
UNIT_SRC  := $(shell find tests/unit -name '*.cpp' | sort)
MPI_SRC   := $(shell find tests/mpi -name '*.cpp' | sort)
E2E_SRC   := $(shell find tests/e2e -name '*.cpp' | sort)
CUDA_TEST_SRC := $(if $(filter 1,$(CUDA)),$(shell find tests/cuda -name '*.cpp' | sort))
# bench_cuda*.cpp need the CUDA backend: CUDA builds only
BENCH_SRC := $(filter-out $(if $(filter 1,$(CUDA)),,tests/bench/bench_cuda%), \
               $(shell find tests/bench -name '*.cpp' | sort))
BENCHES   := $(BENCH_SRC:tests/bench/%.cpp=$(OUT)/%)
BINS      := $(OUT)/hymoe $(OUT)/test_unit $(OUT)/test_mpi $(OUT)/test_e2e $(BENCHES) \
             $(if $(filter 1,$(CUDA)),$(OUT)/test_cuda)

# ---- MPI as root on a small machine (tests, run) --------------------------------------------------
export OMPI_ALLOW_RUN_AS_ROOT := 1
export OMPI_ALLOW_RUN_AS_ROOT_CONFIRM := 1
export OMPI_MCA_rmaps_base_oversubscribe := 1
export OMP_NUM_THREADS ?= 1
export BOOST_TEST_COLOR_OUTPUT := no

DEB_PKGS := make g++ ccache pkg-config bc openmpi-bin libopenmpi-dev libhdf5-openmpi-dev hdf5-tools \
            libboost-test-dev libopenblas-openmp-dev libyaml-cpp-dev nlohmann-json3-dev \
            slurm-wlm munge libpmix-dev python3-h5py python3-matplotlib libpng-dev libjpeg62-turbo-dev \
            libpcre2-dev clang-14 libclang-rt-14-dev
NPM_PKGS := tiktoken@1.0.22

MAKEFLAGS += --no-builtin-rules
.DEFAULT_GOAL := all
.PHONY: all run test test-asan test-cuda check bench report docs format format-check depcheck deps help clean FORCE

all: $(BINS) build/hymoe  ## build hymoe and the test binaries (CUDA=1 adds the CUDA backend, SAN=asan sanitizers)

build/hymoe: $(OUT)/hymoe FORCE
	@ln -sfn $(CONFIG)/hymoe $@

$(OUT)/libhymoe.a: $(LIB_OBJ)
	@rm -f $@.$$$$ && ar rcs $@.$$$$ $^ && mv $@.$$$$ $@

$(OUT)/hymoe: $(OUT)/src/main.o $(OUT)/libhymoe.a
	$(CXX) $(SAN_FLAGS) $^ $(LDLIBS) -o $@

$(OUT)/test_unit: $(OUT)/tests/main.o $(UNIT_SRC:%.cpp=$(OUT)/%.o) $(OUT)/libhymoe.a
	$(CXX) $(SAN_FLAGS) $^ $(TEST_LIBS) $(LDLIBS) -o $@

$(OUT)/test_mpi: $(OUT)/tests/main_mpi.o $(MPI_SRC:%.cpp=$(OUT)/%.o) $(OUT)/libhymoe.a
	$(CXX) $(SAN_FLAGS) $^ $(TEST_LIBS) $(LDLIBS) -o $@

$(OUT)/test_e2e: $(OUT)/tests/main.o $(E2E_SRC:%.cpp=$(OUT)/%.o) $(OUT)/libhymoe.a
	$(CXX) $(SAN_FLAGS) $^ $(TEST_LIBS) $(LDLIBS) -o $@

ifeq ($(CUDA),1)
# The CUDA parity tests (label `cuda`): every kernel and GEMM against the CPU op; each skips
# with one line where no GPU is present.
$(OUT)/test_cuda: $(OUT)/tests/main.o $(CUDA_TEST_SRC:%.cpp=$(OUT)/%.o) $(OUT)/libhymoe.a
	$(CXX) $(SAN_FLAGS) $^ $(TEST_LIBS) $(LDLIBS) -o $@
endif

# Rewritten only when its content changes, so a new commit relinks but does not rebuild the world.
$(OUT)/gen/build_info.cpp: FORCE
	@mkdir -p $(@D)
	@sha=$$(git rev-parse --short=12 HEAD 2>/dev/null || echo unknown); \
	git diff --quiet HEAD 2>/dev/null || sha="$$sha+dirty"; \
	printf '%s\n' '// generated by the Makefile' '#include "hymoe/core/build_info.h"' \
	  "const char* const hymoe::build::git_sha = \"$$sha\";" \
	  "const char* const hymoe::build::compiler = \"g++ $$(g++ -dumpfullversion)\";" \
	  "const char* const hymoe::build::flags = \"$(strip $(OPT) $(SAN_FLAGS))\";" \
	  "const char* const hymoe::build::backend = \"$(if $(filter 1,$(CUDA)),cpu+cuda,cpu)\";" \
	  > $@.tmp; cmp -s $@.tmp $@ && rm -f $@.tmp || mv $@.tmp $@

$(OUT)/gen/build_info.o: $(OUT)/gen/build_info.cpp
	$(CXX) $(CPPFLAGS) $(CXXFLAGS) -c $< -o $@

$(BENCHES): $(OUT)/%: $(OUT)/tests/bench/%.o $(OUT)/libhymoe.a
	$(CXX) $(SAN_FLAGS) $^ $(LDLIBS) -o $@

# The AVX-512(-BF16) kernels: the files built for those instructions (called after a cpuid
# check); the GEMVs and GEMMs with OpenMP (threads split output rows or column panels; libgomp is
# OpenBLAS's own, linked by -fopenmp)
AVX512_OBJ := $(OUT)/src/backend/cpu/linear_bf16.o $(OUT)/src/backend/cpu/gemv_avx512.o \
              $(OUT)/src/backend/cpu/gemm_avx512.o $(OUT)/src/backend/cpu/indexer_f32.o
$(AVX512_OBJ): CXXFLAGS += -mavx512f -mavx512bw -mavx512vl -mavx512bf16 -fopenmp
$(OUT)/src/backend/cpu/indexer_bf16.o $(OUT)/src/backend/cpu/indexer_topk.o: CXXFLAGS += -mavx512f -mavx512bw -mavx512vl -mavx512bf16

$(OUT)/%.o: %.cpp
	@mkdir -p $(@D)
	$(CXX) $(CPPFLAGS) $(CXXFLAGS) -c $< -o $@

$(OUT)/tests/main_mpi.o: tests/main.cpp
	@mkdir -p $(@D)
	$(CXX) $(CPPFLAGS) -DTEST_WITH_MPI $(CXXFLAGS) -c $< -o $@

$(OUT)/%.cu.o: %.cu
	@mkdir -p $(@D)
	$(NVCC) $(NVCCFLAGS) -Iinclude -DOMPI_SKIP_MPICXX=1 -DHYMOE_CUDA=1 $(MPI_INC) -c $< -o $@

-include $(shell find $(OUT) -name '*.d' 2>/dev/null)

# ---- the two commands of the README -------------------------------------------------------------
NPROC := $(shell nproc 2>/dev/null || echo 2)

run: deps  ## install what is missing, build, run the quickstart job (tiny model, 320 requests)
	@$(MAKE) --no-print-directory -j$(NPROC) all
	@echo "running jobs/quickstart/deck.yaml (the whole log goes to jobs/quickstart/out/log)"
	@OMPI_MCA_btl=self,vader OMPI_MCA_pml=ob1 mpirun -np 1 build/hymoe jobs/quickstart/deck.yaml >/dev/null
	@sed -nE 's/^\[[^]]*\] (outputs|done|tokens|batching): /\1: /p' jobs/quickstart/out/log

test: deps  ## install what is missing, build (also the asan hymoe), run every test tier; last line "N passed, N failed"
	@$(MAKE) --no-print-directory -j$(NPROC) all fuzz-build
	@$(MAKE) --no-print-directory SAN=asan -j$(NPROC) $(ASAN_BINS)
	@$(MAKE) --no-print-directory check

test-cuda:  ## build with CUDA=1 and run the CUDA parity tests (each skips where no GPU is present)
	@$(MAKE) --no-print-directory CUDA=1 -j$(NPROC) build/cuda$(if $(SAN),-$(SAN))/test_cuda
	@build/cuda$(if $(SAN),-$(SAN))/test_cuda --run_test=@cuda

# The asan build (g++ -fsanitize=address,undefined, -O1): `make test` builds its hymoe (the whole
# library: about 2300 CPU-seconds, 2.3-3.8x the -O2 compile) and the asan tier of tests/run_tiers
# runs the e2e bad_decks_suite and faults suites through it (about 4 min on 2 cores); its
# test_unit (47 more objects) and the other e2e suites would take CI past 35 min: `make test-asan`.
# Leaks are not checked (OpenMPI's own).
ASAN_BINS := build/cpu-asan/hymoe
ASAN_RUN := ASAN_OPTIONS=detect_leaks=0:abort_on_error=1 UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1
test-asan:  ## SAN=asan build; the unit tier and the e2e bad_decks_suite and faults suites under it
	@$(MAKE) --no-print-directory SAN=asan -j$(NPROC) build/cpu-asan/test_unit build/cpu-asan/test_e2e \
	    build/cpu-asan/hymoe
	@$(ASAN_RUN) build/cpu-asan/test_unit
	@$(ASAN_RUN) HYMOE_BIN=build/cpu-asan/hymoe OMPI_MCA_btl=self,vader OMPI_MCA_pml=ob1 \
	    build/cpu-asan/test_e2e --run_test=bad_decks_suite,faults

check:  ## run the test tiers (unit, mpi, e2e, emulate, docs, slurm, depcheck, fuzz, asan) on what is built (no install, no build)
	@OUT=$(OUT) tests/run_tiers

bench: deps  ## speed as ratios measured in the same run
	@$(MAKE) --no-print-directory -j$(NPROC) all
	@for np in 2 4; do OMPI_MCA_btl=self,vader OMPI_MCA_pml=ob1 mpirun -q -np $$np $(OUT)/bench_comm; done
	@for np in 2 4; do OMPI_MCA_btl=self,vader OMPI_MCA_pml=ob1 mpirun -q -np $$np $(OUT)/bench_moe; done
	@OMP_NUM_THREADS=1 $(OUT)/bench_model 1 $(if $(filter 1,$(NPROC)),,2)
	@OMP_NUM_THREADS=1 $(OUT)/bench_train
	@OMPI_MCA_btl=self,vader OMPI_MCA_pml=ob1 mpirun -q -np 2 $(OUT)/bench_checkpoint
	@$(OUT)/bench_tokenizer
	@OMP_NUM_THREADS=1 $(OUT)/bench_offload
	@OMP_NUM_THREADS=1 $(OUT)/bench_prefix

docs: $(OUT)/hymoe  ## write docs/reference/deck.md from the deck schema (hymoe --describe-deck)
	@$(OUT)/hymoe --describe-deck > docs/reference/deck.md.tmp && mv docs/reference/deck.md.tmp docs/reference/deck.md
	@echo "wrote docs/reference/deck.md"

# ---- fuzzing (tests/fuzz/; clang's libFuzzer, ASan and UBSan) -------------------------------------
# Each tests/fuzz/fuzz_<t>.cpp is one target, built with clang++ (the mpicxx wrapper's flags) over
# the parser sources only, into build/fuzz/. `make fuzz` runs each FUZZ_SECONDS seconds from its
# committed corpus tests/fuzz/corpus/<t>/ (new inputs go to build/fuzz/corpus/<t>/); a crash, leak,
# hang (> 1 s) or sanitizer report fails it and leaves the input in build/fuzz/crashes/<t>/.
# `make fuzz-regress` replays every committed input once (the test tiers run it).
FUZZ_CXX     ?= $(strip $(CCACHE) clang++-14)
FUZZ_SECONDS ?= 60
FUZZ_OUT     := build/fuzz
FUZZ_SAN     := -fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer
FUZZ_FLAGS    = -std=c++20 -O1 -g $(FUZZ_SAN) -fsanitize=fuzzer-no-link -Iinclude -DOMPI_SKIP_MPICXX=1 \
                $(shell mpicxx --showme:compile) $(PKG_CFLAGS)
# the model and backend come whole: config.json's parameter count walks the model's tensor list
FUZZ_LIBSRC  := $(wildcard src/core/*.cpp src/deck/*.cpp src/io/*.cpp src/text/*.cpp src/tensor/*.cpp \
                  src/parallel/*.cpp src/model/*.cpp src/backend/*.cpp src/backend/cpu/*.cpp) \
                  src/runtime/results.cpp src/runtime/rerun.cpp tests/fuzz/engine_names.cpp
FUZZ_TARGETS := $(patsubst tests/fuzz/fuzz_%.cpp,%,$(wildcard tests/fuzz/fuzz_*.cpp))
FUZZ_BINS    := $(FUZZ_TARGETS:%=$(FUZZ_OUT)/fuzz_%)

$(FUZZ_OUT)/src/backend/cpu/linear_bf16.o $(FUZZ_OUT)/src/backend/cpu/gemv_avx512.o \
    $(FUZZ_OUT)/src/backend/cpu/gemm_avx512.o $(FUZZ_OUT)/src/backend/cpu/indexer_bf16.o \
    $(FUZZ_OUT)/src/backend/cpu/indexer_f32.o $(FUZZ_OUT)/src/backend/cpu/indexer_topk.o: FUZZ_FLAGS += -mavx512f -mavx512bw -mavx512vl -mavx512bf16
$(FUZZ_OUT)/%.o: %.cpp
	@mkdir -p $(@D)
	$(FUZZ_CXX) $(FUZZ_FLAGS) -MMD -MP -c $< -o $@

$(FUZZ_OUT)/libparsers.a: $(FUZZ_LIBSRC:%.cpp=$(FUZZ_OUT)/%.o) $(FUZZ_OUT)/gen/build_info.o
	@rm -f $@ && ar rcs $@ $^

$(FUZZ_OUT)/gen/build_info.o: $(OUT)/gen/build_info.cpp
	@mkdir -p $(@D)
	$(FUZZ_CXX) $(FUZZ_FLAGS) -c $< -o $@

$(FUZZ_OUT)/fuzz_%: $(FUZZ_OUT)/tests/fuzz/fuzz_%.o $(FUZZ_OUT)/libparsers.a
	$(FUZZ_CXX) $(FUZZ_SAN) -fsanitize=fuzzer $^ $(shell mpicxx --showme:link) $(PKG_LIBS) -ljpeg -o $@

.PHONY: fuzz fuzz-build fuzz-regress
fuzz-build: $(FUZZ_BINS)

fuzz: fuzz-build  ## run every fuzz target FUZZ_SECONDS seconds (default 60) from its corpus
	@tests/fuzz/run $(FUZZ_SECONDS) $(FUZZ_TARGETS)

fuzz-regress: fuzz-build  ## replay every committed fuzz corpus input once through its target
	@tests/fuzz/run 0 $(FUZZ_TARGETS)

-include $(shell find $(FUZZ_OUT) -name '*.d' 2>/dev/null)

PYTHON ?= /usr/bin/python3
report:  ## plots and an HTML page of a job's outputs: make report JOB=jobs/NAME (-> JOB/out/report/)
	@test -n "$(JOB)" || { echo "usage: make report JOB=jobs/NAME"; exit 2; }
	@$(PYTHON) analysis/report.py $(JOB)/out

deps:  ## install the missing Debian packages (DEB_PKGS) and the npm tiktoken peer
	@missing=""; for p in $(DEB_PKGS); do \
	    dpkg-query -W -f='$${Status}' $$p 2>/dev/null | grep -q "ok installed" || missing="$$missing $$p"; \
	done; \
	if [ -n "$$missing" ]; then \
	    echo "installing:$$missing"; \
	    SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	    $$SUDO apt-get update -q && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -q \
	        --no-install-recommends $$missing; \
	fi
	@# the tokenizer tests' peer: node + the npm package tiktoken in build/node (git-ignored);
	@# nodejs and npm from Debian only when no node is there (a NodeSource node carries its npm)
	@if ! command -v node >/dev/null || ! command -v npm >/dev/null; then \
	    SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	    $$SUDO apt-get update -q && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -q \
	        --no-install-recommends nodejs npm; \
	fi
	@[ -f build/node/node_modules/tiktoken/package.json ] || \
	    npm install --silent --no-audit --no-fund --prefix build/node $(NPM_PKGS)

FORMAT_SRC = $(shell find include src tests -name '*.h' -o -name '*.cpp' -o -name '*.cu' | sort)
format:  ## clang-format every C++ and CUDA file in place
	clang-format -i $(FORMAT_SRC)

depcheck:  ## fail on any #include that breaks the one-way module order (scripts/depcheck.py)
	@$(PYTHON) scripts/depcheck.py

format-check:  ## fail if clang-format would change a file
	clang-format --dry-run --Werror $(FORMAT_SRC)

clean:  ## remove build/ and the jobs' out/ folders
	rm -rf build jobs/*/out

help:  ## this list
	@echo "usage: make [target] [CUDA=1] [SAN=asan] [CCACHE=] (CCACHE= builds without ccache)"
	@grep -hE '^[a-z-]+:.*## ' $(firstword $(MAKEFILE_LIST)) | sed -E 's/^([a-z-]+):.*## /  \1\t/' | expand -t 16
