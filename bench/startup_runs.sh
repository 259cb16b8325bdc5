#!/usr/bin/env bash
# Start-up and time to 2x on one GPU, as the device machine runs them (issue 26, items 3 and 6):
#   1. a 3-step run on the machine as it comes (`fresh`): the GGUF conversion, the first CUDA
#      kernels and the first train step included; its stage files and summary are kept;
#   2. bench/time_to_accuracy.py `ours` for each seed on the now warm machine, then, with
#      TRL_SECONDS set, TRL on the same machine for that many seconds from its launch (rerun it
#      when the GPU kind differs from its committed runs), then `score` and `summarise` under
#      --label $LABEL. SAVE_SCHEDULE (time_to_accuracy.py's --save-schedule) applies to both.
# Everything kept goes to $OUT (the device tool's return folder) after each stage, so a run cut
# off at the call's limit still returns what it finished. Profile traces (--profile-steps, tens of
# MB) stay on the machine: copy the one you need to $OUT by name. Scoring took 0.5-2.7 s a save on
# an H100 (each scores.jsonl line's score_cost), the engine's graph captures once per process. A plan
# longer than one 10-minute device call runs under bench/device_bg.sh.
#
#   . bench/device_setup.sh && LABEL=warmup SEEDS="42 1" SECONDS_EACH=120 bash bench/startup_runs.sh
#
# GRPO_GIT_COMMIT (the checkout's commit; the device copy has no .git) is recorded in every file.
set -uo pipefail
TASK=${TASK:-rg:basic_arithmetic:min_terms=2,max_terms=2,max_digits=1}
LABEL=${LABEL:-warmup}
SEEDS=${SEEDS:-42 1}
SECONDS_EACH=${SECONDS_EACH:-120}
FLAGS=${FLAGS:-}
TRL_SECONDS=${TRL_SECONDS:-}
SAVE_SCHEDULE=${SAVE_SCHEDULE:-}
# One work dir per task and label: time_to_accuracy.py refuses a run folder that holds a run.
WORK=${WORK:-/tmp/tta_${LABEL}_$(printf %s "$TASK" | tr -c 'A-Za-z0-9_\n' _)}
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT" "$WORK"
keep() {   # the work dir's small files, as one archive: no saved weights, no checkpoint (GBs), no trace
    rm -rf "$WORK"/*/checkpoints
    (cd "$WORK" && find . \( -name weights -o -name checkpoints \) -prune -o -type f ! -name '*.json.gz' -print \
        | tar czf "$OUT/work_$LABEL.tgz" -T -)
}
if [ "${SKIP_FRESH:-0}" != 1 ]; then
    FRESH=/tmp/fresh_$LABEL
    rm -rf "$FRESH"
    t0=$(date +%s.%N)
    python run_distributed.py --sampling-gpu 0 --training-gpus 0 --share-gpus --generation-backend fast \
        --dataset "$TASK" --reward correctness --filter-zero-signal --num-generations 16 --train-batch-size 128 \
        --learning-rate 2e-5 --beta 0.0 --loss-type dapo --max-new-tokens 256 --max-steps 3 --eval-every 0 \
        --run-dir "$FRESH" $FLAGS > "$OUT/fresh_$LABEL.log" 2>&1
    echo "fresh run: exit $? after $(python -c "import time; print(round(time.time() - $t0, 1))") s" | tee -a "$OUT/fresh_$LABEL.log"
    tar czf "$OUT/fresh_$LABEL.tgz" -C /tmp "fresh_$LABEL/stages" "fresh_$LABEL/summary.json" \
        "fresh_$LABEL/learner0.log" "fresh_$LABEL/sampler0.log" 2>/dev/null
    rm -rf "$FRESH/checkpoints"
fi
for seed in $SEEDS; do
    python bench/time_to_accuracy.py ours --work-dir "$WORK" --task "$TASK" --seed "$seed" \
        --ours-seconds "$SECONDS_EACH" --label "$LABEL" --git-commit "${GRPO_GIT_COMMIT:-}" \
        ${FLAGS:+--ours-flags "$FLAGS"} ${SAVE_SCHEDULE:+--save-schedule "$SAVE_SCHEDULE"} 2>&1 | tail -5
    keep
done
if [ -n "$TRL_SECONDS" ]; then
    python bench/time_to_accuracy.py trl --work-dir "$WORK" --task "$TASK" --seeds ${SEEDS%% *} \
        --seconds "$TRL_SECONDS" --label "$LABEL" --git-commit "${GRPO_GIT_COMMIT:-}" \
        ${SAVE_SCHEDULE:+--save-schedule "$SAVE_SCHEDULE"} 2>&1 | tail -5
    keep
fi
python bench/time_to_accuracy.py score --work-dir "$WORK" --task "$TASK" --label "$LABEL" 2>&1 | tail -5
python bench/time_to_accuracy.py summarise --work-dir "$WORK" --task "$TASK" --label "$LABEL" 2>&1 | tail -8
cp bench/results/time_to_accuracy_*.json "$OUT"/ 2>/dev/null
cp bench/results/time_to_accuracy_*"_$LABEL.png" "$OUT"/ 2>/dev/null
keep
ls -la "$OUT"
