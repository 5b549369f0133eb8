#!/usr/bin/env bash
# Two training steps of a tiny random model for every strategy x engine x (full, LoRA) on this
# machine's GPUs, each the command a user runs (`lit-rag fit`, every default callback), then a
# table: what ran, whether it finished both steps, wrote its checkpoint and printed its header
# once, how long, the weight-sync time and the largest engine/trainer log-prob difference of the
# last step. For whoever has GPUs: NCCL, vLLM's sleep
# mode, FSDP's CPU offload and the CUDA paths cannot run on the CPU machine CI uses.
#
#   bash scripts/gpu_smoke.sh checks               # first: the checks, one GPU, a few minutes
#   bash scripts/gpu_smoke.sh                      # the checks, then every strategy x engine
#   DEVICES=2 STRATEGIES="ddp fsdp" ENGINES=vllm bash scripts/gpu_smoke.sh
#   TP=2 DEVICES=4 ENGINES=vllm bash scripts/gpu_smoke.sh     # vLLM tensor parallel over rank pairs
#
# Needs lit-rag with the gpu extra (pip install 'lit-rag[gpu]', deepspeed for its strategies).
# Logs go to ${OUT:-runs/gpu_smoke}/<strategy>-<engine>-<policy>.log.
set -uo pipefail
cd "$(dirname "$0")/.."
if ! command -v nvidia-smi >/dev/null || ! nvidia-smi -L >/dev/null 2>&1; then
  echo "gpu_smoke: error: no NVIDIA GPU here (nvidia-smi -L failed); the CPU paths run in the tests" >&2
  exit 2
fi
# The checks of the paths no CPU takes, one line each (PASS / FAIL / SKIP with its figure):
# fp32 master weights and their step at lr 1e-6, FSDP CPU offload accumulating as without it,
# the dense index's GPU placement, a rollout worker killed mid-push over NCCL, the sharded
# log-prob pass's peak at a 151,936-token vocabulary, vLLM's top-p log-probs like with like,
# the fused log-prob head under bf16 autocast and the step clock's CUDA events.
case "${1:-}" in
  checks) exec python scripts/gpu_checks.py ;;
  "") python scripts/gpu_checks.py || echo "gpu_smoke: a check failed (above); the runs follow" ;;
  *) echo "gpu_smoke: error: unknown argument '$1'; allowed: checks, or none" >&2; exit 2 ;;
esac
DEVICES=${DEVICES:-$(nvidia-smi -L | wc -l)}
STRATEGIES=${STRATEGIES:-"ddp fsdp fsdp_offload deepspeed_stage_2 deepspeed_stage_3"}
ENGINES=${ENGINES:-"hf vllm"}
POLICIES=${POLICIES:-"full lora"}
TP=${TP:-1}
OUT=${OUT:-runs/gpu_smoke}
mkdir -p "$OUT"
MODEL="$OUT/tiny-model"
if [ ! -f "$MODEL/config.json" ]; then  # 4 heads of 64: every attention kernel has that size
  python - "$MODEL" <<'EOF'
import sys
from lit_rag.models.loading import ModelConfig, TinyConfig, load_model, load_tokenizer
config = ModelConfig(tiny=TinyConfig(hidden_size=256, num_layers=2, num_heads=4))
load_model(config).save_pretrained(sys.argv[1])
load_tokenizer(config).save_pretrained(sys.argv[1])
EOF
fi

rows=()
for strategy in $STRATEGIES; do
  for engine in $ENGINES; do
    for policy in $POLICIES; do
      name="$strategy-$engine-$policy"
      args=(fit --config recipes/tiny.yaml --model.policy.tiny=null "--model.policy.path=$MODEL"
            --trainer.accelerator=gpu "--trainer.devices=$DEVICES" --trainer.precision=bf16-mixed
            --trainer.max_steps=2 --trainer.limit_val_batches=0 --trainer.enable_checkpointing=true
            "--trainer.logger.init_args.save_dir=$OUT"
            "--trainer.logger.init_args.name=$name" "--model.engine=$engine")
      case $strategy in
        fsdp_offload) args+=(--trainer.strategy=FSDPStrategy --trainer.strategy.cpu_offload=true) ;;
        *) args+=("--trainer.strategy=$strategy") ;;
      esac
      [ "$policy" = lora ] && args+=('--model.policy.lora={"r": 8, "alpha": 16, "dropout": 0.0}')
      [ "$engine" = vllm ] && args+=(--model.engine.init_args.gpu_memory_utilization=0.2
                                     "--model.engine.init_args.tensor_parallel_size=$TP")
      start=$(date +%s)
      lit-rag "${args[@]}" >"$OUT/$name.log" 2>&1
      rc=$?
      seconds=$(( $(date +%s) - start ))
      metrics=$(ls -t "$OUT/$name"/version_*/metrics.csv 2>/dev/null | head -1)
      summary=$(python - "$metrics" <<'EOF'
import csv, sys
rows = [r for r in csv.DictReader(open(sys.argv[1]))] if sys.argv[1] else []
steps = [r for r in rows if r.get("reward/total")]
last = steps[-1] if steps else {}
print(len(steps), last.get("time/weight_sync_s") or "-", last.get("rollout/logprob_diff_max") or "-",
      last.get("mem/peak_gpu_gib") or "-")
EOF
)
      read -r steps sync diff gpu <<<"$summary"
      headers=$(grep -c "^lit-rag fit: " "$OUT/$name.log")
      run=$(dirname "$metrics" 2>/dev/null)
      checkpoint=$(ls -d "$run"/checkpoints/*step=2.ckpt 2>/dev/null | head -1)
      result="ok"
      if [ "$rc" -ne 0 ]; then
        result="FAILED (exit $rc): $(grep -v '^\s*$' "$OUT/$name.log" | tail -1 | cut -c1-120)"
      elif [ "$steps" != 2 ] || [ "$headers" != 1 ] || [ -z "$checkpoint" ]; then
        result="FAILED: $steps steps, header printed $headers times, checkpoint ${checkpoint:-missing}"
      fi
      rows+=("| $strategy | $engine | $policy | $DEVICES | $result | $steps | ${seconds} s | $sync | $diff | $gpu |")
    done
  done
done
echo "| strategy | engine | policy | GPUs | result | steps | wall | weight sync s | logprob diff max | peak GPU GiB |"
echo "|---|---|---|---|---|---|---|---|---|---|"
printf '%s\n' "${rows[@]}"
echo "command: DEVICES=$DEVICES STRATEGIES=\"$STRATEGIES\" ENGINES=\"$ENGINES\" POLICIES=\"$POLICIES\" TP=$TP bash scripts/gpu_smoke.sh"
