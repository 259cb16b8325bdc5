#!/usr/bin/env bash
# Issue 7 on a GPU machine: a LoRA run (ZeRO-2 learner on GPU 1, sampler on GPU 0) with NVML
# GPU stats in the logs, TensorBoard events and a report; then the CUDA-only test.
#   bash bench/run_obs_lora_gpu.sh            (TRAIN_GPUS=0 to share one GPU; STEPS=N)
set -euo pipefail
PY=${PY:-python}
RUN=runs/lora_gpu_$(date +%Y%m%d-%H%M%S)
$PY run_distributed.py --sampling-gpu 0 --training-gpus "${TRAIN_GPUS:-1}" --lora-r 16 --lora-alpha 32 \
    --learning-rate 1e-5 --max-steps "${STEPS:-12}" --dataset "${DATASET:-../shared/data/gsm8k}" --run-dir "$RUN"
$PY -m grpo.obs.report "$RUN"
echo "--- GPU use per step (learner) and per round (sampler)"
grep -h "| gpu" "$RUN/learner0.log" | tail -n 3
grep -h "| gpu" "$RUN/sampler0.log" | tail -n 3
$PY -c "import json; s = json.load(open('$RUN/summary.json')); print('lora', s['lora']); print('groups', s['groups'])"
ls "$RUN"/events.out.tfevents.* "$RUN/report.png" "$RUN/lora_adapter/adapter_model.safetensors"
$PY -m pytest tests/obs/test_obs.py -k cuda -q
