#!/usr/bin/env bash
# The scale table's rows at one commit, one after another on one GPU machine (run under
# bench/device_bg.sh, whose plan may outlive one device call):
#   OUT=/tmp/bg/out DATA=.data/gsm8k ROWS="0.5b 0.5b:expandable 1.5b 7b 3b:expandable 3b:shared" \
#       bash bench/scale_rows.sh
# A row is SIZE[:VARIANT]: "expandable" runs it under PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True,
# "shared" with --weight-sync shared, "tcp_beta0" with --weight-sync tcp --beta 0 (no publication slots
# on the learner's GPU, no reference model: what fits 7B LoRA on one 80 GB H100). Each row merges into bench/results/scale_<device>.json (label
# SIZE_VARIANT_SUFFIX, SUFFIX from $SUFFIX, default "now"), then its run folder (without the
# final checkpoint: a 3B one is tens of GB, more than the disk holds for six rows, nor weights) and
# the JSON are copied under $OUT.
set -uo pipefail
OUT=${OUT:?OUT=folder for what comes back}
DATA=${DATA:-../shared/data/gsm8k}
SECS=${SECS:-45}
SUFFIX=${SUFFIX:-now}
WORK=${WORK:-runs/scale}
mkdir -p "$OUT"
for row in ${ROWS:?ROWS=\"0.5b 1.5b ...\"}; do
    size=${row%%:*}; variant=""; [ "$row" != "$size" ] && variant=${row#*:}
    label="${size}${variant:+_$variant}_${SUFFIX}"
    env=(); extra=()
    case "$variant" in
        "") ;;
        expandable) env=(PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True) ;;
        shared) extra=(-- --weight-sync shared) ;;
        tcp_beta0) extra=(-- --weight-sync tcp --beta 0) ;;
        *) echo "scale_rows: unknown variant $variant" >&2; exit 2 ;;
    esac
    echo "== $label $(date +%T)"
    env "${env[@]}" python bench/scale.py --sizes "$size" --label "$label" --max-time-s "$SECS" \
        --dataset "$DATA" --work-dir "$WORK" "${extra[@]}"
    echo "== $label exit $? $(date +%T)"
    rm -rf "$WORK/scale_$label/checkpoints"
    # what comes back: logs and metrics (a LoRA run's adapter stays here)
    tar czf "$OUT/scale_$label.tgz" --exclude='*.safetensors' -C "$WORK" "scale_$label" "scale_$label.log"
    cp bench/results/scale_*.json "$OUT/" 2>/dev/null
    df -h . | tail -1
done
