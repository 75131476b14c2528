#!/bin/bash
# The GPU trainer against the CPU (a step of scripts/gpu-check.sh): tests/decks/lora/small.yaml
# (adapters on attention and the experts, dropout 0.1) for 20 steps, fp32 matrices,
# once with job.device: cpu and once with cuda; prints both loss curves (results.h5 /train/loss)
# and fails unless every step's losses agree to 1e-4 relative.
# Usage: scripts/gpu-lora-check.sh OUT_DIR   (needs build/cuda/hymoe and h5dump)
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2
out=$(realpath -m "$1")
mkdir -p "$out"
run() {  # run DEVICE
    rm -rf "$out/lora-$1"
    mpirun -np 1 build/cuda/hymoe tests/decks/lora/small.yaml --set job.device="$1" \
        --set job.output="$out/lora-$1" --set finetune.steps=20 \
        >"$out/lora-$1.log" 2>&1 || {
        echo "lora on $1: exit $? (log: $out/lora-$1.log)"
        tail -3 "$out/lora-$1.log"
        return 1
    }
}
losses() {  # losses DEVICE: one per line
    h5dump -d /train/loss -y -w 0 "$out/lora-$1/results.h5" |
        sed -n '/DATA {/,/}/p' | sed '1d;$d' | tr ',' '\n' | tr -d ' ' | grep -v '^$'
}
run cpu && run cuda || exit 1
paste <(losses cpu) <(losses cuda) | awk '
    { d = ($1 - $2) / $1; if (d < 0) d = -d; if (d > worst) worst = d; n++
      printf "step %2d: cpu %s cuda %s\n", n, $1, $2 }
    END { printf "lora cpu vs cuda: %d steps, worst relative difference %.2e\n", n, worst
          exit !(n == 20 && worst <= 1e-4) }'
