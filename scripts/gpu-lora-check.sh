#!/bin/bash
# The GPU trainer against the CPU (a step of scripts/gpu-check.sh), on tests/decks/lora/small.yaml
# (adapters on attention and the experts), fp32 matrices, loss by loss (results.h5 /train/loss):
#   - one rank: 20 steps with dropout 0.1, job.device cpu against cuda;
#   - two ranks on the one GPU (they split job.device_memory; comm:: stages their collectives
#     through host memory): 5 steps without dropout of 4 micro-batches of 1 row (the global batch
#     of tests/e2e/test_lora.cpp's layout test), tp2 and pp2 on cuda against one rank on the CPU.
# Prints every curve and fails unless every step's losses agree to 1e-4 relative. Exits at the
# first run that fails (the GPU runs exit 2 where no GPU is seen: job.device is cuda).
# Usage: scripts/gpu-lora-check.sh OUT_DIR   (needs build/cuda/hymoe and h5dump)
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2
out=$(realpath -m "$1")
mkdir -p "$out"
layouts="--set finetune.steps=5 --set finetune.lora.dropout=0 --set finetune.batch.micro_batch=1 \
--set finetune.batch.grad_accum=4 --set finetune.eval.every=5"
run() {  # run NAME NP DEVICE [--set ...]: OUT_DIR/lora-NAME/, .log, .err
    local name=$1 np=$2 device=$3
    shift 3
    rm -rf "$out/lora-$name"
    timeout 10 mpirun -np "$np" build/cuda/hymoe tests/decks/lora/small.yaml \
        --set job.device="$device" --set job.output="$out/lora-$name" "$@" \
        >"$out/lora-$name.log" 2>"$out/lora-$name.err" || {
        echo "lora $name ($np ranks, $device): exit $? (log: $out/lora-$name.log), stderr:"
        head -1 "$out/lora-$name.err" | sed 's/^/lora   /'
        return 1
    }
}
losses() {  # losses NAME: one per line
    h5dump -d /train/loss -y -w 0 "$out/lora-$1/results.h5" |
        sed -n '/DATA {/,/}/p' | sed '1d;$d' | tr ',' '\n' | tr -d ' ' | grep -v '^$'
}
compare() {  # compare REF NAME STEPS: prints both curves, fails unless they agree
    paste <(losses "$1") <(losses "$2") | awk -v ref="$1" -v got="$2" -v steps="$3" '
        { n++
          if ($1 !~ /^-?[0-9]/ || $2 !~ /^-?[0-9]/ || $1 == 0) bad++  # nan, inf, 0: no ratio
          else { d = ($1 - $2) / $1; if (d < 0) d = -d; if (d > worst) worst = d }
          printf "step %2d: %s %s %s %s\n", n, ref, $1, got, $2 }
        END { printf "lora %s vs %s: %d steps, worst relative difference %.2e, %d not comparable\n",
                     ref, got, n, worst, bad
              exit !(n == steps && !bad && worst <= 1e-4) }'
}
# shellcheck disable=SC2086  # $layouts: several --set arguments
run cpu 1 cpu --set finetune.steps=20 && run cuda 1 cuda --set finetune.steps=20 &&
    run cpu-ref 1 cpu $layouts && run cuda-tp2 2 cuda $layouts --set parallel.tp=2 &&
    run cuda-pp2 2 cuda $layouts --set parallel.pp=2 || exit 1
ok=0
compare cpu cuda 20 || ok=1
compare cpu-ref cuda-tp2 5 || ok=1
compare cpu-ref cuda-pp2 5 || ok=1
exit "$ok"
