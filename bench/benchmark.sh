#!/usr/bin/env bash
# The device recipe for bench/benchmark.py: rows one after another, each scored and summarised before
# the next starts, its run files (without weights) copied to $OUT_DIR after each, so a plan cut short
# keeps what it finished. ROWS defaults to the standard rows this host's GPUs hold (`python3
# bench/benchmark.py rows --host-gpus N`: one-GPU rows N side by side, rows needing more than N left out).
# OURS_FLAGS: flags appended to ours' command in every row; SAVE_SCHEDULE: benchmark.py's --save-schedule;
# GPUS: the GPUs that score (default: all of the host's); LABEL: the rows' label in the result file
# (kept beside unlabelled runs of the same rows); FIRST_GPU: the GPU each group's first row starts
# at (default 0), so that two of these scripts share a host, each with its own CODE, WORK and GPUS. An
# item is ROW, ROW@SECONDS (that row's own length) or ROW+ROW+... (side by side, each on GPUs of its
# own). Runs from a copy of the checkout in $CODE, /tmp/code by default (the device tool re-sends
# the tree with each call; a row started later must not see it change under it).
# On the GPU machine, from the repo root, once the model's chunks are received (bench/fetch_models.py)
# and GSM8K is in /tmp/data/gsm8k:
#   bash bench/device_bg.sh start 'ROWS="0.5b:seed:ours:42 0.5b:1gpu:ours:42+0.5b:1gpu:trl:42" SECS=600 COMMIT=<sha> \
#       OUT_DIR=/tmp/bg/out bash bench/benchmark.sh'
#   bash bench/device_bg.sh wait 560      # again, back to back, until the plan has ended
set -uo pipefail
: "${COMMIT:?COMMIT: the commit of the checkout}"
SECS=${SECS:-600}; OUT_DIR=${OUT_DIR:-/tmp/bg/out}; WORK=${WORK:-/tmp/rw}; DATA=${DATA:-/tmp/data/gsm8k}
CODE=${CODE:-/tmp/code}
rm -rf $CODE && mkdir -p $CODE $OUT_DIR/results $OUT_DIR/runs
tar -C . --exclude=./.whl --exclude=./.chunk --exclude=./.data --exclude=./.git -cf - . | tar -C $CODE -xf -
cd $CODE && { set +u; . bench/device_setup.sh; set -u; }
NGPU=$(python3 -c 'import torch; print(torch.cuda.device_count())')
ROWS=${ROWS:-$(python3 bench/benchmark.py rows --host-gpus "$NGPU")}
GPUS=${GPUS:-$(seq -s, 0 $((NGPU - 1)))}
export GRPO_GIT_COMMIT=$COMMIT
# The rows' GGUF files converted first, with vLLM's wheels off the path: some of them break the
# converter's imports (transformers' language_code asks for pycountry), which ended a plan at once.
all_rows=$(for group in $ROWS; do for item in ${group//+/ }; do echo "${item%@*}"; done; done)
PYTHONPATH=$(echo ":${PYTHONPATH:-}:" | sed 's#:/tmp/site_vllm:#:#; s#^:##; s#:$##') \
    python3 bench/benchmark.py prepare --rows "$(echo $all_rows)" || echo "benchmark.sh: converting the models failed"
for group in $ROWS; do
    first=${FIRST_GPU:-0}
    for item in ${group//+/ }; do
        row=${item%@*}; secs=$SECS; [ "$item" != "$row" ] && secs=${item#*@}
        echo "benchmark.sh: row $row ($secs s, GPUs from $first) at $(date +%T)"
        python3 bench/benchmark.py run --row "$row" --seconds "$secs" --dataset "$DATA" --work-dir $WORK \
            --git-commit "$COMMIT" --first-gpu $first ${OURS_FLAGS:+--ours-flags="$OURS_FLAGS"} \
            ${SAVE_SCHEDULE:+--save-schedule "$SAVE_SCHEDULE"} ${LABEL:+--label "$LABEL"} \
            > $WORK.$first.log 2>&1 || echo "benchmark.sh: row $row failed" &
        case $row in *:1gpu:*|*:1gpu-chosen:*) first=$((first + 1));; *:2gpu:*) first=$((first + 2));; *) first=$((first + 4));; esac
        sleep 2   # one conversion lock at a time, and launch times apart
    done
    wait
    cat $WORK.*.log; rm -f $WORK.*.log
    # The machine's disk is 64 GB: a 1.5B learner's checkpoint (optimizer state included) is about
    # 18 GB and its weight saves 3 GB each, and a plan that filled the disk lost the machine with
    # every file. Rows are scored from weights/ only, so checkpoints go now and weights once scored.
    rm -rf $WORK/*/checkpoints
    python3 bench/benchmark.py score --work-dir $WORK --dataset "$DATA" --gpus "$GPUS" \
        || echo "benchmark.sh: scoring failed"
    for item in ${group//+/ }; do
        row=${item%@*}; name=$(echo "$row" | awk -F: '{print $1"_"$2"_"$3"_s"$4}')
        last=$(ls -d $WORK/$name/weights/step_* 2>/dev/null | awk -F'step_' '{print $NF" "$0}' | sort -n | tail -1 | cut -d' ' -f2)
        if [ "${FINAL_CHECK:-1}" = 1 ] && [ -n "$last" ] && [ "${row##*:ours:*}" = "" ]; then
            # The learner's final evaluation against `python -m grpo.evaluate` on the last save (the same weights)
            CUDA_VISIBLE_DEVICES=0 python3 -m grpo.evaluate --model "$last" --dataset "$DATA" --eval-size 500 \
                --max-new-tokens 512 --out "$(dirname $(dirname $last))/eval_cli.json" 2>&1 | grep "pass@1"
        fi
    done
    python3 bench/benchmark.py summarise --work-dir $WORK --results-dir $OUT_DIR/results ${LABEL:+--label "$LABEL"} \
        || echo "benchmark.sh: summarise failed"
    for run in $WORK/*/; do
        dest=$OUT_DIR/runs/$(basename $run); mkdir -p $dest
        (cd $run && find . -path ./weights -prune -o -path ./checkpoints -prune -o -path ./trl_output -prune \
            -o -type f -print | tar -cf - -T - | tar -C $dest -xf -)
    done
    cp $WORK/device.json $WORK/base_*.json $OUT_DIR/runs/ 2>/dev/null
    rm -rf $WORK/*/weights $WORK/*/trl_output
done
echo "benchmark.sh: done at $(date +%T)"
