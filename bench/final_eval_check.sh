# The learner's final evaluation decodes like sampler 0's baseline (grpo.evaluate.eval_engine):
# a 6-step SmolLM2 run on one GPU (sampler beside the learner, DeepSpeed ZeRO-2, evaluations every
# 3 versions on 200 test problems at 256 tokens), then the final checkpoint scored by
# `python -m grpo.evaluate` with each decoder. One GPU, about two minutes:
#   OUT=bench/results/final_eval_decoder bash bench/final_eval_check.sh
# (on the GPU machine, source bench/device_setup.sh first and pass --dataset where the data is:
#  DATA=.data/gsm8k). Writes eval.jsonl, eval_fast.json, eval_hf.json, learner0.log and
# versions.json (device, torch, transformers, deepspeed) into $OUT.
set -e
OUT=${OUT:-bench/results/final_eval_decoder}; DATA=${DATA:-../shared/data/gsm8k}; RUN=runs/final_eval_check
mkdir -p "$OUT"; rm -rf "$RUN"
python3 run_distributed.py --sampling-gpus 0 --training-gpus 0 --share-gpus --dataset "$DATA" \
  --max-steps 6 --eval-every 3 --eval-size 200 --max-new-tokens 256 --generation-backend fast --learning-rate 5e-5 \
  --run-dir "$RUN" > "$RUN.out" 2>&1
CK=$(ls -d "$RUN"/checkpoints/step_*/hf | tail -1)
for b in fast hf; do
  python3 -m grpo.evaluate --model "$CK" --dataset "$DATA" --eval-size 200 --max-new-tokens 256 \
    --generation-backend $b --out "$OUT/eval_$b.json" 2>&1 | grep "pass@1"
done
cp "$RUN/eval.jsonl" "$RUN/learner0.log" "$OUT/"
python3 -c "
import json, sys, torch; sys.path.insert(0, 'bench')
from benchutil import versions
json.dump({'device': torch.cuda.get_device_name(0), 'versions': versions()}, open('$OUT/versions.json', 'w'), indent=2)"
cat "$OUT/eval.jsonl"
