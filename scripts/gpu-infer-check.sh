#!/bin/bash
# The GPU inference job over two ranks on the one GPU against the CPU (a step of
# scripts/gpu-check.sh): tests/decks/score/deck.yaml (the tiny model, fp32 matrices, prompt
# log-probabilities and 8 greedy tokens per prompt) on one rank with job.device: cpu, then on two
# ranks with cuda at tp2 and at pp2 (the ranks split job.device_memory of the GPU; comm:: stages
# their collectives through host memory). Fails unless every run's output tokens equal the CPU's
# and its prompt and output log-probabilities are within 1e-4 of them. Exits at the first run that
# fails (the GPU runs exit 2 where no GPU is seen: job.device is cuda).
# Usage: scripts/gpu-infer-check.sh OUT_DIR   (needs build/cuda/hymoe and h5dump)
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2
out=$(realpath -m "$1")
mkdir -p "$out"
run() {  # run NAME NP DEVICE [--set ...]: OUT_DIR/infer-NAME/, .log, .err
    local name=$1 np=$2 device=$3
    shift 3
    rm -rf "$out/infer-$name"
    timeout 10 mpirun -np "$np" build/cuda/hymoe tests/decks/score/deck.yaml \
        --set job.device="$device" --set job.output="$out/infer-$name" \
        --set inference.max_new_tokens=8 "$@" >"$out/infer-$name.log" 2>"$out/infer-$name.err" || {
        echo "infer $name ($np ranks, $device): exit $? (log: $out/infer-$name.log), stderr:"
        head -1 "$out/infer-$name.err" | sed 's/^/infer   /'
        return 1
    }
}
values() {  # values NAME DATASET: one per line
    h5dump -d "$2" -y -w 0 "$out/infer-$1/results.h5" |
        sed -n '/DATA {/,/}/p' | sed '1d;$d' | tr ',' '\n' | tr -d ' ' | grep -v '^$'
}
compare() {  # compare NAME: against infer-cpu
    local set
    for set in /requests/output_tokens /requests/prompt_logprobs /requests/output_logprobs; do
        paste <(values cpu "$set") <(values "$1" "$set") | awk -v got="$1" -v set="$set" '
            { if ($1 !~ /^-?[0-9]/ || $2 !~ /^-?[0-9]/) bad++  # nan, inf: awk would read 0
              d = $1 - $2; if (d < 0) d = -d; if (d > worst) worst = d; n++ }
            END { printf "infer cpu vs %s %s: %d values, worst difference %.2e, %d not finite\n",
                         got, set, n, worst, bad
                  exit !(n > 0 && !bad && worst <= (set ~ /tokens/ ? 0 : 1e-4)) }' || return 1
    done
}
run cpu 1 cpu && run cuda-tp2 2 cuda --set parallel.tp=2 &&
    run cuda-pp2 2 cuda --set parallel.pp=2 || exit 1
ok=0
compare cuda-tp2 || ok=1
compare cuda-pp2 || ok=1
exit "$ok"
