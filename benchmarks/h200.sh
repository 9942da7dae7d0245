#!/usr/bin/env bash
# Every GPU figure and check of hotwire, as run on the lent H200 (vLLM 0.25.1 offline bundle,
# ../shared/device/README.md). Four stages, each sized for one 10-minute device call, or all of
# them in one go on a GPU box of your own:
#
#   bash benchmarks/h200.sh checks OUTDIR   # op kernel, GPU suite (both runners), e2e operator flow,
#                                           # determinism control
#   bash benchmarks/h200.sh matrix OUTDIR   # verified-architectures matrix
#   bash benchmarks/h200.sh perf   OUTDIR [SHAPE...]  # kernel time per decode step / prefill: plugin-free,
#                                           # armed on all layers (graphs without the op for idle steps,
#                                           # and without them: HOTWIRE_IDLE_GRAPHS=0; the op's kernels
#                                           # switched per step: HOTWIRE_GRAPH_SWITCH=1), armed on two,
#                                           # each mode (0.6B: + eager)
#   bash benchmarks/h200.sh serve  OUTDIR [C...]  # host work per step; a py-spy profile of both engine cores, under load at once
#                                           # at the largest C (needs py-spy on PATH); served tokens/s at
#                                           # C in flight (default 256; one C per call gives the most
#                                           # windows), every server under load at once (--simultaneous):
#                                           # plugin-free vs all armed, half steered, hotwire sent the same
#                                           # requests unsteered, and the original hotwire-vllm 0.1.2
#                                           # when its wheel travelled in .device/original (serve_throughput.py
#                                           # says how to fetch it); TTFT and tokens/s with the control API
#                                           # pushing every second
#   bash benchmarks/h200.sh split  OUTDIR A|B|C|U|S|L|R|F|G|D  # where steering's served cost goes, under MPS at 256 in
#                                           # flight, each engine core's step timed phase by phase
#                                           # (one run per call, ~7.5 min): A = plugin-free, host only
#                                           # (the op kept off the GPU), graphs only (no launch from Python),
#                                           # hotwire; B = plugin-free, host only, armed on the two steered
#                                           # layers, hotwire; C = plugin-free, every op call
#                                           # through torch's dispatcher, graphs only, hotwire; U = plugin-free,
#                                           # hotwire sent no spec (two graph sets, then one), hotwire loaded
#                                           # with no layer armed; S = plugin-free, hotwire sent no spec armed
#                                           # on 2, 14 and all 28 layers; L = plugin-free, host only uploading
#                                           # nothing, hotwire uploading by copy-engine copies (before
#                                           # session 29), hotwire (the upload kernel); R = plugin-free,
#                                           # specs refused at admission, copies, hotwire; F = plugin-free,
#                                           # hotwire sent no spec, the specs under a key it never reads,
#                                           # the specs refused (what a spec's arrival costs, and where);
#                                           # G = plugin-free, the specs under a key hotwire never reads,
#                                           # refused without hotwire's API-server middleware, refused;
#                                           # D = plugin-free, specs refused, hotwire whose op Triton
#                                           # launches (before session 32), hotwire (the driver launches it)
#   bash benchmarks/h200.sh forward OUTDIR [ROUND...]  # one engine alone at a time (forward_cost.py, ~70 s
#                                           # each, HOTWIRE_JOB_LIMIT=120 fits): what armed layers cost
#                                           # the forward, unsteered, Qwen3 0.6B shape. Round 1 = plugin-free
#                                           # and all armed (both also under cProfile), the op out of the
#                                           # graph, a bare op in its place, the mailbox off; 2 = plugin-free,
#                                           # all armed; 3 = plugin-free, all armed, the mailbox off, bare
#                                           # op, out of the graph (no cProfile; the likeliest first);
#                                           # 4 = plugin-free, out of the graph, bare op, all armed;
#                                           # 5 = plugin-free, the op doing nothing, all armed; 6 =
#                                           # plugin-free, the op never launching, all armed; 7 =
#                                           # plugin-free, all armed, all armed, plugin-free (how far
#                                           # two engines of one kind differ, in one call);
#                                           # each compared with its round's latest plugin-free
#                                           # engine; files fc-KIND-ROUND-N.json, N its place in the round
#   bash benchmarks/h200.sh steered OUTDIR [SHAPE [C [KIND]]]  # what steering half the requests costs served
#                                           # (default 0.6B, 256 in flight), two servers only (plugin-free,
#                                           # hotwire; at qwen3-8b also hotwire with HOTWIRE_GRAPH_SWITCH=1,
#                                           # the op's kernels switched to the steered layers): under MPS,
#                                           # then taking turns on the GPU by time slices (~8.5 min;
#                                           # session 38, 0.6B at 256: 0.966 under MPS, 0.953 by time
#                                           # slices, both resolved; session 33's 8B at 64, 0.956, shared
#                                           # by time slices: its MPS never reached the daemon); KIND: a
#                                           # hotwire kind in hotwire's place (e.g. hotwire_2: armed on the
#                                           # steered layers only)
#   bash benchmarks/h200.sh alone  OUTDIR [SHAPE [C [FIRST]]]  # served tokens/s, one GPU, each server
#                                           # alone on it in turn (sequential A B B A: plugin-free and
#                                           # hotwire, half the requests steered; default 8B, 64 in flight;
#                                           # ~8.5 min at 8B, 13 rounds). FIRST = the server on the first
#                                           # pinned cores (default plugin_free); pool a run of each
#                                           # order with pair_ratio.py (session 37)
#   bash benchmarks/h200.sh apart  OUTDIR [SHAPE [C]]  # two GPUs: the same two servers under load at
#                                           # once, one GPU each (--gpu-each), twice with GPUs and cores
#                                           # swapped, then both runs pooled (~9 min at 8B: 240 s each)
#   bash benchmarks/h200.sh halves OUTDIR [SHAPE [C]]  # one GPU split in two: the same two servers under load at
#                                           # once under MPS, each limited to half the SMs (--mps-split),
#                                           # twice with cores swapped, then pooled (~9 min at 8B: 240 s
#                                           # each); the one-GPU stand-in for apart (memory bandwidth shared)
#   bash benchmarks/h200.sh bar    OUTDIR [SHAPE [C]]  # the bar "<= 1 % when every request is steered",
#                                           # by the GPU time of the engine's steps (CUDA events, not
#                                           # kernel sums): one engine alone at a time (forward_cost.py),
#                                           # plugin-free, hotwire idle, every request steered, and every
#                                           # request steered with HOTWIRE_GRAPH_SWITCH=1, each compared
#                                           # with plugin-free (default 0.6B, 256 in flight; ~4 min, 8B ~7)
#   bash benchmarks/h200.sh pair   OUTDIR   # two GPUs: TP=2 and PP=2 servers with runtime registration
#                                           # (tests/test_e2e_parallel.py as deployed: bf16, graphs on)
#   bash benchmarks/h200.sh all    OUTDIR   # the four stages one after another (0.6B, 4B, 8B; 64, 256 in
#                                           # flight), then the tables and OUTDIR/step-time.png (~35 min)
#
# On a two-GPU box two stages run at once, one per GPU, e.g.
#   CUDA_VISIBLE_DEVICES=0 bash benchmarks/h200.sh checks OUT & CUDA_VISIBLE_DEVICES=1 bash benchmarks/h200.sh matrix OUT
# Checks run side by side (engines share the GPU with fixed KV budgets); timed runs run alone on their GPU.
# Every job has a time limit (HOTWIRE_JOB_LIMIT s, per shape in perf), writes its log to
# OUTDIR/logs and its results to OUTDIR; what finished survives a stage cut short.
set -u
stage=${1:-} out=${2:-}
case $stage in
  checks|matrix|perf|serve|steered|alone|apart|halves|bar|split|forward|pair|all) [ -n "$out" ] ;;
  *) false ;;
esac || { echo "usage: $0 checks|matrix|perf|serve|steered|alone|apart|halves|bar|split|forward|pair|all OUTDIR [ARGS...]" >&2; exit 2; }
shift 2
mkdir -p "$out/logs"
limit=${HOTWIRE_JOB_LIMIT:-540}
job() {  # job NAME CMD...: run in the background with the time limit, log + exit status to OUTDIR/logs
  local name=$1; shift
  ( timeout -s INT -k 20 "$limit" "$@" >"$out/logs/$name.log" 2>&1; echo "exit status $?" >>"$out/logs/$name.log" ) &
}
export PYTHONUNBUFFERED=1

checks() {
  job op python3 -m pytest -m gpu tests/test_steering_op.py tests/test_routing.py tests/test_upload_kernel.py \
    --basetemp /tmp/pt-op -p no:cacheprovider -rA
  job gpu-v2 python3 -m pytest -m gpu tests/test_gpu.py -k v2 --basetemp /tmp/pt-gpu-v2 -p no:cacheprovider -rA
  job gpu-v1 python3 -m pytest -m gpu tests/test_gpu.py -k v1 --basetemp /tmp/pt-gpu-v1 -p no:cacheprovider -rA
  # batch-invariant kernels: the e2e tests compare a request in flight with the same request alone.
  # The control API's uploads need python-multipart, which the offline vLLM bundle lacks (carry it)
  python3 -c "import python_multipart" 2>/dev/null \
    || echo "no python-multipart here: the e2e uploads will fail (carry its wheel, docs/h200-runs.md)" >&2
  job e2e env HOTWIRE_E2E_GPU=1 VLLM_BATCH_INVARIANT=1 python3 -m pytest tests/test_e2e_serve.py tests/test_e2e_attacks.py \
    --basetemp /tmp/pt-e2e -p no:cacheprovider -rA
  # control: two plugin-free engines on the e2e model (hidden 128), each compiling cold
  python3 -c "from hotwire.tools.tiny_model import build_tiny; build_tiny('/tmp/hw-tiny')"
  local ea='{"dtype": "bfloat16", "attention_backend": "TRITON_ATTN", "gpu_memory_utilization": 0.05,
            "kv_cache_memory_bytes": 536870912}'
  job determinism python3 benchmarks/determinism.py --model /tmp/hw-tiny --out "$out/determinism-tiny.json" \
    --engine-args "$ea"
  # the same with reduction configs chosen by rule, as the GPU tests run their engines
  job determinism-filtered env TORCHINDUCTOR_FORCE_FILTER_REDUCTION_CONFIGS=1 python3 benchmarks/determinism.py \
    --model /tmp/hw-tiny --out "$out/determinism-tiny-filtered.json" --engine-args "$ea"
  wait
}

pair() {  # needs two GPUs: the servers' two ranks take one each
  job parallel env HOTWIRE_E2E_GPU=1 VLLM_BATCH_INVARIANT=1 python3 -m pytest tests/test_e2e_parallel.py \
    --basetemp /tmp/pt-parallel -p no:cacheprovider -rA
  wait
}

matrix() {
  job arch python3 benchmarks/arch_matrix.py --jobs 12 --timeout 500 --out "$out/arch-matrix"
  wait
}

perf() {  # perf [SHAPE...]: one engine at a time (a neighbour's start-up disturbs kernel times);
          # about 8 min per shape, so one shape per call
  local shape kinds
  for shape in "${@:-qwen3-0.6b}"; do
    kinds="plugin_free hotwire hotwire_switched hotwire_op_graphs hotwire_2 hotwire_modes"
    [ "$shape" = qwen3-0.6b ] && kinds="$kinds eager"
    job "kt-$shape" python3 benchmarks/kernel_time.py --shape "$shape" --processes $kinds --repeats 1 \
      --steps 32 --parallel 1 --out "$out/kernel-time-$shape.json"
    wait
  done
}

serve() {  # serve [CONCURRENCY...]: host work, the profile (~3 min), served tokens/s (plugin-free, hotwire,
           # hotwire sent the same requests unsteered, and the original when its wheel is here, all at
           # once, every server over every pinned core set; ~7.5 min: start-up ~2.5 min, then 5 s
           # windows to the 420 s budget), then TTFT under registration pushes (~5 min)
  local cs=("$@") servers=(plugin_free hotwire hotwire_unsteered) original=()
  local wheel=.device/original/hotwire_vllm-0.1.2-py3-none-any.whl site=/tmp/hotwire-vllm-0.1.2
  [ ${#cs[@]} -eq 0 ] && cs=(256)
  if [ -f "$wheel" ]; then  # in a folder of its own: it has our import package's name (original_plugin.py)
    python3 -m pip install -q --no-index --no-deps --upgrade --target "$site" "$wheel" \
      && servers+=(original) && original=(--original-site "$site")
  else
    echo "no $wheel: served tokens/s without the original hotwire-vllm" >&2
  fi
  job host python3 benchmarks/host_overhead.py --repeat 300 --out "$out/host-overhead.json"
  wait
  if command -v py-spy >/dev/null; then
    job profile python3 benchmarks/profile_serve.py --simultaneous --shape qwen3-0.6b --concurrency "${cs[-1]}" --seconds 15 --gil-seconds 15 \
      --servers plugin_free hotwire_unsteered hotwire --out "$out/profile-qwen3-0.6b-c${cs[-1]}.json"
    wait
  else
    echo "no py-spy on PATH: no profile" >&2
  fi
  job serve python3 benchmarks/serve_throughput.py --simultaneous --shape qwen3-0.6b --concurrency "${cs[@]}" \
    --budget-s 420 --servers "${servers[@]}" --rotate-cores "${#servers[@]}" "${original[@]}" --out "$out/serve-qwen3-0.6b-c$(IFS=-; echo "${cs[*]}").json"
  wait
  job registration python3 benchmarks/registration_load.py --shape qwen3-0.6b --concurrency 64 --budget-s 265 \
    --window-s 6 --out "$out/registration-qwen3-0.6b.json"
  wait
}

steered() {  # steered [SHAPE [C [KIND]]]: plugin-free and hotwire (half the requests steered) alone on the GPU, under
             # MPS and then sharing it by time slices; at 8B also hotwire with the op's kernels in its graphs
             # switched to the steered layers (HOTWIRE_GRAPH_SWITCH=1). KIND: another hotwire server in
             # hotwire's place (server_kinds.py), e.g. hotwire_2, armed on the steered layers only
  local mps shape=${1:-qwen3-0.6b} c=${2:-256} kind=${3:-hotwire}
  local servers=(plugin_free "$kind") name=steered
  [ "$kind" = hotwire ] || name+="-$kind"
  [ "$shape" = qwen3-8b ] && [ "$kind" = hotwire ] && servers=(plugin_free hotwire hotwire_switched)
  for mps in --mps ""; do
    job "$name${mps:+-mps}-$shape-c$c" python3 benchmarks/serve_throughput.py --simultaneous $mps --shape "$shape" \
      --concurrency "$c" --budget-s 240 --servers "${servers[@]}" --rotate-cores "${#servers[@]}" --step-phases \
      --out "$out/$name${mps:+-mps}-$shape-c$c.json"
    wait
  done
}

alone() {  # alone [SHAPE [C [FIRST]]]: see the header
  local shape=${1:-qwen3-8b} c=${2:-64} first=${3:-plugin_free} order=(plugin_free hotwire)
  [ "$first" = hotwire ] && order=(hotwire plugin_free)
  job "alone-$shape-c$c-$first-first" python3 benchmarks/serve_throughput.py --shape "$shape" --concurrency "$c" \
    --budget-s 480 --servers plugin_free hotwire --cores-order "${order[@]}" \
    --out "$out/alone-$shape-c$c-$first-first.json"
  wait
}

pair_runs() {  # pair_runs NAME SHAPE C ARGS...: plugin-free and hotwire under load at once (serve_throughput.py
               # --simultaneous ARGS), twice with their cores (and GPUs) swapped, then both runs pooled
  local name=$1 shape=$2 c=$3 first; shift 3
  for first in plugin_free hotwire; do
    job "$name-$shape-c$c-$first-first" python3 benchmarks/serve_throughput.py --simultaneous "$@" \
      --shape "$shape" --concurrency "$c" --budget-s 240 --servers plugin_free hotwire \
      --cores-order $first $([ $first = hotwire ] && echo plugin_free || echo hotwire) \
      --out "$out/$name-$shape-c$c-$first-first.json"
    wait
  done
  python3 benchmarks/pair_ratio.py "$out"/"$name"-"$shape"-c"$c"-*-first.json plugin_free hotwire \
    | tee "$out/$name-$shape-c$c-pooled.txt"
}

apart() { pair_runs apart "${1:-qwen3-8b}" "${2:-64}" --gpu-each; }  # apart [SHAPE [C]]: see the header

halves() { pair_runs halves "${1:-qwen3-8b}" "${2:-64}" --mps --mps-split; }  # halves [SHAPE [C]]: see the header

bar() {  # bar [SHAPE [C]]: see the header
  local shape=${1:-qwen3-0.6b} c=${2:-256} kind
  local model=/tmp/hw-$shape
  python3 -c "from hotwire.tools.tiny_model import write_config; write_config('$model', '$shape')"
  for kind in free idle steered switched; do
    local args=(--model "$model" --dummy --max-seqs "$c" --requests $((4 * c))) envs=()
    case $kind in
      idle) args+=(--plugin) ;;
      steered) args+=(--plugin --steered 1) ;;
      switched) args+=(--plugin --steered 1) envs=(HOTWIRE_GRAPH_SWITCH=1) ;;
    esac
    job "bar-$shape-$kind" env "${envs[@]}" python3 benchmarks/forward_cost.py "${args[@]}" --out "$out/bar-$shape-$kind.json"
    wait
    [ $kind = free ] || [ ! -f "$out/bar-$shape-$kind.json" ] || python3 benchmarks/forward_cost.py --compare \
      "$out/bar-$shape-free.json" "$out/bar-$shape-$kind.json" >"$out/compare-bar-$shape-$kind.json"
  done
}

split() {  # split [A|B]: one simultaneous run under MPS, hotwire beside kinds that each leave one part out
  local servers
  case ${1:-A} in
    A) servers=(plugin_free hotwire_host_only hotwire_graphs_only hotwire) ;;
    B) servers=(plugin_free hotwire_host_only hotwire_2 hotwire) ;;
    C) servers=(plugin_free hotwire_dispatched hotwire_graphs_only hotwire) ;;
    U) servers=(plugin_free hotwire_unsteered hotwire_one_graph_unsteered hotwire_unarmed) ;;
    S) servers=(plugin_free hotwire_unsteered_2 hotwire_unsteered_14 hotwire_unsteered) ;;
    L) servers=(plugin_free hotwire_no_uploads hotwire_copy_uploads hotwire) ;;
    R) servers=(plugin_free hotwire_refused hotwire_copy_uploads hotwire) ;;
    F) servers=(plugin_free hotwire_unsteered hotwire_foreign_spec hotwire_refused) ;;
    G) servers=(plugin_free hotwire_foreign_spec hotwire_refused_no_frontend hotwire_refused) ;;
    D) servers=(plugin_free hotwire_refused hotwire_triton_launch hotwire) ;;
    *) echo "split A, B, C, U, S, L, R, F, G or D" >&2; return 2 ;;
  esac
  job "split-${1:-A}" python3 benchmarks/serve_throughput.py --simultaneous --mps --shape qwen3-0.6b \
    --concurrency 256 --budget-s 420 --servers "${servers[@]}" --rotate-cores 4 --step-phases \
    --out "$out/split-${1:-A}.json"
  wait
}

forward() {  # forward [ROUND...]: engines one after another, alone on the GPU (a job each, not at once)
  python3 -c "from hotwire.tools.tiny_model import write_config; write_config('/tmp/hw-q06', 'qwen3-0.6b')"
  local round kinds kind name flag envs prof free n
  for round in "${@:-1}"; do
    case $round in
      1) kinds="free armed28 graph bare_op no_mailbox" ;;
      2) kinds="free armed28" ;;
      3) kinds="free armed28 no_mailbox bare_op graph" ;;
      4) kinds="free graph bare_op armed28" ;;
      5) kinds="free noop_impl armed28" ;;
      6) kinds="free no_launch armed28" ;;
      7) kinds="free armed28 armed28 free" ;;
      *) echo "forward rounds are 1 to 7" >&2; return 2 ;;
    esac
    free="" n=0
    for kind in $kinds; do
      n=$((n + 1))
      flag=--plugin envs=() prof=()
      case $kind in
        free) flag="" ;;
        graph|bare_op|noop_impl|no_launch) envs=(BENCH_OP_OFF=$kind) ;;
        no_mailbox) envs=(HOTWIRE_MAILBOX=off) ;;
      esac
      [ "$round" = 1 ] && { [ $kind = free ] || [ $kind = armed28 ]; } && prof=(--cprofile 128)
      name=fc-$kind-$round-$n
      job "$name" env "${envs[@]}" python3 benchmarks/forward_cost.py --model /tmp/hw-q06 --dummy --requests 512 \
        "${prof[@]}" $flag --out "$out/$name.json"
      wait
      grep "forward:NONE\|forward:PIECE\| schedule \|steps,\|exit status" "$out/logs/$name.log"
      if [ $kind = free ]; then
        [ -f "$out/$name.json" ] && free=$out/$name.json
      elif [ -n "$free" ] && [ -f "$out/$name.json" ]; then  # beside the round's latest plugin-free engine
        python3 benchmarks/forward_cost.py --compare "$free" "$out/$name.json" >"$out/compare-$name.json"
      fi
    done
  done
}

if [ "$stage" = all ]; then
  limit=${HOTWIRE_JOB_LIMIT:-1800}
  checks; matrix; perf qwen3-0.6b qwen3-4b qwen3-8b; serve 64 256
  shopt -s nullglob
  for f in "$out"/kernel-time-*.json; do python3 benchmarks/kernel_time.py --report --out "$f"; done \
    >"$out/kernel-time-tables.md"
  python3 benchmarks/plot.py "$out"/kernel-time-*.json --out "$out/step-time.png" \
    || echo "no plot: benchmarks/plot.py needs matplotlib" >&2
else
  "$stage" "$@"
fi
