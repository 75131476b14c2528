#!/bin/bash
# The fused CUDA kernels emulated on the CPU (no GPU needed; about 3 minutes): builds the plan
# printer (plans.cpp with src/backend/fused_plan.cpp) into build/emulate/, checks the fragment
# loaders, then runs each kernel's numpy emulation on small shapes that cover its edge cases
# (partial chunks, empty sequences, splits, compactions, head tiles, partial row tiles).
# Exit 0 iff every emulation matches its reference. Usage: tests/emulate/run.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
mkdir -p build/emulate
g++ -std=c++20 -O1 -Iinclude tests/emulate/plans.cpp src/backend/fused_plan.cpp -o build/emulate/plans
export HYMOE_PLANS=$PWD/build/emulate/plans
cd tests/emulate
py=/usr/bin/python3
$py fragments.py
$py kda_chunk.py 64 64 65,0,1,64
$py kda_chunk.py 48 96 130,63
$py dsa.py indexer 3 600 8 32 16 1 132 500
$py dsa.py indexer 2 900 16 32 32 0 132 700
$py dsa.py indexer 2 700 8 32 16 1 1 650 1
$py dsa.py mla 2 16 128 16 100 40
$py dsa.py mla 2 20 128 32 200 70
$py moe.py 4 2 150 128 64
$py moe.py 3 2 400 256 128
