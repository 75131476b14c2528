#!/bin/bash
# The fused CUDA kernels emulated on the CPU (no GPU needed; about 3 minutes): builds the plan
# printer (plans.cpp with src/backend/fused_plan.cpp) into build/emulate/, checks the fragment
# loaders, then runs each kernel's numpy emulation on small shapes that cover its edge cases
# (partial chunks, empty sequences, splits, compactions, head tiles, partial row tiles), and the
# GPU model's fused DSA step (decode rows and chunks of several sequences over paged rows, one
# sequence two queries a block, rows with no more keys than top-k) against the CPU model's DSA.
# Each emulation is one case; the closing line is "N passed, N failed, 0 skipped" (a test tier of
# tests/run_tiers). Exit 0 iff every emulation matches its reference. Usage: tests/emulate/run.sh
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 2
mkdir -p build/emulate
g++ -std=c++20 -O1 -Iinclude tests/emulate/plans.cpp src/backend/fused_plan.cpp \
    -o build/emulate/plans || exit 2
export HYMOE_PLANS=$PWD/build/emulate/plans
cd tests/emulate || exit 2
py=/usr/bin/python3
passed=0 failed=0
case_() {  # case_ SCRIPT ARGS...: one emulation, counted
    if $py "$@"; then
        passed=$((passed + 1))
    else
        failed=$((failed + 1))
        echo "FAILED: $*"
    fi
}
case_ fragments.py
case_ kda_chunk.py 64 64 65,0,1,64
case_ kda_chunk.py 48 96 130,63
case_ dsa.py indexer 3 600 8 32 16 1 132 500
case_ dsa.py indexer 2 900 16 32 32 0 132 700
case_ dsa.py indexer 2 700 8 32 16 1 1 650 1
case_ dsa.py mla 2 16 128 16 100 40
case_ dsa.py mla 2 20 128 32 200 70
case_ dsa.py step 16 16 8 4 128 16 13:1,16:13,0:9
case_ dsa.py step 8 16 8 4 128 16 20:12
case_ dsa.py step 16 16 64 20 128 16 0:5,300:1,700:1
case_ moe.py 4 2 150 128 64
case_ moe.py 3 2 400 256 128
echo "$passed passed, $failed failed, 0 skipped"
[ "$failed" -eq 0 ]
