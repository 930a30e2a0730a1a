"""The `linnet` command line.

Exit codes: 0 clean, 1 the input has errors (diagnostics printed), 2 usage error,
3 an internal compiler error (a bug in Linnet, reported as such).
"""
from __future__ import annotations

import argparse
import json
import sys
import time
import traceback

from ..diagnostics import InternalError, LinnetError

EXIT_OK, EXIT_ERRORS, EXIT_USAGE, EXIT_BUG = 0, 1, 2, 3


def _parse_set(items: list[str], parser: argparse.ArgumentParser) -> dict[str, int | str]:
    values: dict[str, int | str] = {}
    for item in items:
        name, sep, raw = item.partition("=")
        if not sep or not name.strip().isidentifier() or not raw.strip():
            parser.error(f"--set expects NAME=VALUE, found {item!r}")
        raw = raw.strip()
        values[name.strip()] = _set_value(raw)
    return values


def _set_value(raw: str) -> int | float | str:
    """An integer (a Dim), else a number (a Real such as a dropout rate), else a dtype name."""
    for number in (int, float):
        try:
            return number(raw)
        except ValueError:
            pass
    return raw  # a dtype such as f16


# --------------------------------------------------------------------------- check


def _entry_lines(compiled) -> list[str]:
    instance = compiled.instance
    lines = []
    for sig in instance.entries.values():
        lines.append(f"  entry {sig}")
        dims = {d: compiled.check_dims[d] for d in sig.dims if d in compiled.check_dims}
        if len(dims) == len(sig.dims):
            from ..types import substitute
            from ..dims import const

            env = {k: const(v) for k, v in dims.items()}
            params = ", ".join(f"{n}: {substitute(t, env)}" for n, t in sig.params)
            at = ", ".join(f"{k}={v}" for k, v in dims.items())
            lines.append(f"    at {at}: ({params}) -> {substitute(sig.result, env)}")
    params = instance.params
    lines.append(f"  params: {instance.param_count:,} in {len(params)} tensors")
    return lines


def _check_one(path: str, overrides) -> tuple[dict, list[str]]:
    from ..compiler import compile_target
    from .targets import locate

    started = time.perf_counter()
    target = locate(path)
    compiled = compile_target(target, overrides)
    elapsed = time.perf_counter() - started
    report = {"path": path, "ok": True, "kind": target.kind, "seconds": round(elapsed, 4), "diagnostics": []}
    if compiled.instance is None:
        n = len([f for f in compiled.checked.functions.values()])
        return report, [f"{path}: ok ({target.kind}, {n} function{'s' if n != 1 else ''} checked) in {elapsed:.3f} s"]
    instance = compiled.instance
    generics = ", ".join(f"{k}={v}" for k, v in compiled.generics.items())
    report.update({
        "root": instance.root.block.name,
        "generics": compiled.generics,
        "check_dims": compiled.check_dims,
        "entries": {n: {"signature": str(s), "preconditions": [str(p) for p in s.preconditions]}
                    for n, s in instance.entries.items()},
        "param_count": instance.param_count,
        "param_tensors": len(instance.params),
    })
    lines = [f"{path}: ok — {instance.root.block.name}<{generics}>", *_entry_lines(compiled),
             f"  checked in {elapsed:.3f} s"]
    return report, lines


def cmd_check(args, parser) -> int:
    overrides = _parse_set(args.set or [], parser)
    reports, status = [], EXIT_OK
    for path in args.paths:
        try:
            report, lines = _check_one(path, overrides)
            if args.format == "text":
                print("\n".join(lines))
        except LinnetError as exc:
            status = EXIT_ERRORS
            report = {"path": path, "ok": False, "diagnostics": [d.to_json() for d in exc.diagnostics]}
            if args.format == "text":
                print(exc.render(), file=sys.stderr)
                n = len(exc.diagnostics)
                print(f"{path}: {n} error{'s' if n != 1 else ''}", file=sys.stderr)
        reports.append(report)
    if args.format == "json":
        print(json.dumps(reports if len(reports) > 1 else reports[0], indent=2))
    return status


# --------------------------------------------------------------------------- build


def cmd_build(args, parser) -> int:
    from pathlib import Path

    from ..backends import integration
    from .targets import load_name, locate
    from ..nest import backend_passes, prepare

    target = locate(args.path)
    if target.kind != "entry":
        parser.error("build needs a zoo entry (a folder with nest.toml, or its name), an hf: repo or a saved model's folder")
    module = integration(args.backend)
    # --optimize: the passes `nest.load` runs for this backend (packing included where it can).
    passes = backend_passes(args.backend, module, packing=args.packing) if args.optimize else ()
    ctx, _ = prepare(load_name(args.path, target), dtype=args.dtype, weights=args.weights, revision=args.revision,
                     need_weights=getattr(module, "BUILD_NEEDS_WEIGHTS", False),
                     overrides=_parse_set(args.set or [], parser), optimize=passes)
    started = time.perf_counter()
    for path in module.build(ctx, Path(args.output)):
        print(f"wrote {path}")
    print(f"built {ctx.name} for {args.backend} in {time.perf_counter() - started:.1f} s")
    return EXIT_OK


def _names(text: str) -> list[str]:
    return [n.strip() for n in text.split(",") if n.strip()]


def _whole_numbers(text: str) -> list[int]:
    try:
        return [int(n) for n in _names(text)]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected whole numbers separated by commas, got {text!r}") from None


def cmd_export_triton(args, parser) -> int:
    from pathlib import Path

    from .targets import load_name, locate
    from ..nest import prepare
    from ..serving.triton import export_passes, export_triton

    target = locate(args.path)
    if target.kind != "entry":
        parser.error("export-triton needs a zoo entry (a folder with nest.toml, or its name), an hf: repo or a "
                     "saved model's folder")
    # The graph nest.load(..., backend="onnx") runs: packed by default, `--no-packing` padded.
    ctx, _ = prepare(load_name(args.path, target), dtype=args.dtype, weights=args.weights, need_weights=True,
                     optimize=export_passes(args.packing))
    started = time.perf_counter()
    folder = export_triton(ctx, Path(args.output), runtime=args.runtime, entries=args.entries,
                           max_batch_size=args.max_batch_size, preferred_batch_sizes=tuple(args.preferred_batch_sizes),
                           max_queue_delay_us=args.max_queue_delay_us, instances=args.instances,
                           threads=args.threads, ragged=args.ragged,
                           **({} if args.max_batch_tokens is None else {"max_batch_tokens": args.max_batch_tokens}))
    models = [folder, *(folder.parent / n for n in json.loads((folder / "linnet_export.json").read_text())["companions"])]
    files = sorted(p for model in models for p in model.rglob("*") if p.is_file())
    for path in files:
        print(f"wrote {path}")
    size = sum({p.stat().st_ino: p.stat().st_size for p in files}.values())  # a hard link counts once
    print(f"exported {ctx.name} for Triton ({args.runtime}) in {time.perf_counter() - started:.1f} s, "
          f"{size / 1e6:.1f} MB; serve with: tritonserver --model-repository {args.output}")
    return EXIT_OK


def cmd_quickstart(args, parser) -> int:
    from .quickstart import run

    return run()


def cmd_zoo(args, parser) -> int:
    """The zoo's entries as a table (or JSON); exit 1 when some entry does not load or compile."""
    from ..nest.zoo import format_table, list_zoo

    entries = list_zoo()
    if args.json:
        print(json.dumps([e.to_json() for e in entries], indent=2))
    else:
        print(format_table(entries))
    broken = [e for e in entries if e.problem]
    for entry in broken:
        print(f"{entry.name}: {entry.problem}", file=sys.stderr)
    return EXIT_ERRORS if broken else EXIT_OK


def cmd_run(args, parser) -> int:
    """Tokenise the texts, run the model, print what its entry is for (see linnet/cli/run.py)."""
    from .run import Options, run

    if args.top < 1:
        parser.error("--top must be at least 1")
    if args.max_new_tokens < 0:
        parser.error("--max-new-tokens must be at least 0")
    options = Options(args.name, args.texts, backend=args.backend, task=args.task, top=args.top,
                      weights=args.weights, revision=args.revision, max_new_tokens=args.max_new_tokens)
    for line in run(options):
        print(line)
    return EXIT_OK


def cmd_embed(args, parser) -> int:
    """Embed a corpus file into resumable Parquet shards (see linnet/nest/bulk.py)."""
    from ..nest.bulk import embed_file

    for flag, value in (("--batch-size", args.batch_size), ("--shard-rows", args.shard_rows),
                        ("--concurrency", args.concurrency), ("--threads", args.threads or 1)):
        if value < 1:
            parser.error(f"{flag} must be at least 1")
    if not args.ray and args.concurrency != 1:
        parser.error("--concurrency needs --ray (locally the model runs in this process)")
    load_options = {k: v for k, v in (("weights", args.weights), ("revision", args.revision)) if v}
    report = embed_file(args.name, args.input, args.output, backend=args.backend, text_column=args.text_column,
                        shard_rows=args.shard_rows, batch_size=args.batch_size,
                        progress=False if args.no_progress else None, use_ray=args.ray,
                        concurrency=args.concurrency, threads=args.threads, load_options=load_options,
                        normalize_embeddings=args.normalize, prompt_name=args.prompt_name,
                        max_length=args.max_length)
    print(report)
    return EXIT_OK


def cmd_convert_tf(args, parser) -> int:
    """A google-research/bert TensorFlow checkpoint as model.safetensors + config.json."""
    from pathlib import Path

    from ..nest.tf_checkpoint import convert

    started = time.perf_counter()
    written = convert(Path(args.prefix), Path(args.output), Path(args.config) if args.config else None)
    for path in written:
        print(f"wrote {path}")
    print(f"converted {args.prefix} in {time.perf_counter() - started:.1f} s; load it with "
          f"nest.load(..., weights=\"{written[0]}\") or transformers' from_pretrained(\"{args.output}\")")
    return EXIT_OK


# ---------------------------------------------------------------------------- main


def build_parser() -> argparse.ArgumentParser:
    from ..backends import available
    from .run import DEFAULT_NEW_TOKENS, TASKS

    parser = argparse.ArgumentParser(prog="linnet", description="Linnet: typed neural-network blocks and the Nest zoo")
    sub = parser.add_subparsers(dest="command", required=True)
    check = sub.add_parser("check", help="prove a zoo entry's, package's or file's shapes")
    check.add_argument("paths", nargs="+", metavar="PATH", help="zoo entry (folder or name), package folder or .linnet file")
    check.add_argument("--set", action="append", metavar="NAME=VALUE",
                       help="override a generic or a [check] dim, e.g. --set S=600")
    check.add_argument("--format", choices=("text", "json"), default="text")
    check.set_defaults(handler=cmd_check)
    build = sub.add_parser("build", help="write the generated source of a zoo entry for people to read")
    build.add_argument("path", metavar="PATH", help="zoo entry (folder or name), hf:owner/name, or a saved model's folder")
    build.add_argument("--backend", choices=available(), default="torch")
    build.add_argument("-o", "--output", required=True, metavar="DIR")
    build.add_argument("--dtype", choices=("f32", "f16", "bf16"), help="the model's float dtype (default: the manifest's)")
    build.add_argument("--weights", metavar="FILE", help="a local .safetensors file or folder instead of the pinned checkpoint")
    build.add_argument("--revision", help="another revision of the weights repo")
    build.add_argument("--set", action="append", metavar="NAME=VALUE", help="override a generic")
    build.add_argument("--optimize", action="store_true",
                       help="run the optimisation passes nest.load runs for the backend (fused Q/K/V, packing)")
    build.add_argument("--packing", action=argparse.BooleanOptionalAction, default=None,
                       help="with --optimize: padding-free execution on or off (default: the backend's choice)")
    build.set_defaults(handler=cmd_build)
    triton = sub.add_parser("export-triton", help="write a Triton model repository for a zoo entry")
    triton.add_argument("path", metavar="PATH", help="zoo entry (folder or name), hf:owner/name, or a saved model's folder")
    triton.add_argument("-o", "--output", required=True, metavar="REPO", help="the model repository folder")
    triton.add_argument("--dtype", choices=("f32", "f16", "bf16"), help="the model's float dtype (default: the manifest's)")
    triton.add_argument("--max-batch-size", type=int, default=8, metavar="N",
                        help="Triton's max_batch_size (default 8; 0 turns batching off)")
    triton.add_argument("--runtime", choices=("onnxruntime", "python"), default="onnxruntime",
                        help="Triton's ONNX Runtime backend (default), or ONNX Runtime in its Python backend")
    triton.add_argument("--entries", type=_names, metavar="A,B",
                        help="the entries (or their output names) to serve, comma-separated (default: all)")
    triton.add_argument("--preferred-batch-sizes", type=_whole_numbers, default=[], metavar="N,M",
                        help="batch sizes Triton's dynamic batcher aims for, comma-separated")
    triton.add_argument("--max-queue-delay-us", type=int, default=0, metavar="US",
                        help="how long a request may wait to be batched with others (default 0: never)")
    triton.add_argument("--instances", type=int, default=1, metavar="N",
                        help="model instances per device, one GPU or the CPU (default 1; Triton's own CPU "
                             "default for ONNX Runtime, 2, oversubscribes the cores)")
    triton.add_argument("--threads", type=int, metavar="N",
                        help="ONNX Runtime intra-op threads per instance (default: ONNX Runtime's, one per core); "
                             "on CPU, instances x threads = cores serves most rows/s")
    triton.add_argument("--weights", metavar="FILE", help="a local .safetensors file or folder instead of the pinned checkpoint")
    triton.add_argument("--packing", action=argparse.BooleanOptionalAction, default=None,
                        help="padding-free execution inside the ONNX graph (default: on where proven exact, "
                             "as nest.load's onnx backend); the served inputs are the same either way")
    triton.add_argument("--ragged", action="store_true",
                        help="one unpadded sequence per request, batched by concatenation (outputs with a row per "
                             "request, such as embedding, or per token, such as hidden; see docs/triton.md)")
    triton.add_argument("--max-batch-tokens", type=int, metavar="N",
                        help="with --ragged: at most N tokens per batch (sets max_batch_size to N // the longest "
                             "request the model takes)")
    triton.set_defaults(handler=cmd_export_triton)
    quick = sub.add_parser("quickstart", help="check the zoo, then load and run all-minilm-l6-v2 offline")
    quick.set_defaults(handler=cmd_quickstart)
    run = sub.add_parser("run", help="tokenise texts, run a model and print what it is for "
                                     "(fill-mask, similarity, classification, pooled vectors, "
                                     "a decoder's continuation)")
    run.add_argument("name", metavar="NAME", help="zoo entry (name or folder), hf:org/repo, or a .gguf file")
    run.add_argument("texts", nargs="+", metavar="TEXT",
                     help="texts to run ([MASK] marks a token to fill; a decoder's prompts), "
                          "or image files for an image model")
    run.add_argument("--backend", choices=available(), default="torch")
    run.add_argument("--task", choices=TASKS, default="auto",
                     help="what to print (default: chosen from the model's entries and the texts)")
    run.add_argument("--top", type=int, default=5, metavar="K", help="candidates or labels shown (default 5)")
    run.add_argument("--max-new-tokens", type=int, default=DEFAULT_NEW_TOKENS, metavar="N",
                     help=f"tokens a decoder adds to each prompt, greedily (default {DEFAULT_NEW_TOKENS})")
    run.add_argument("--weights", metavar="FILE", help="a local .safetensors file, folder or .gguf file instead of the "
                                                       "pinned checkpoint")
    run.add_argument("--revision", help="another revision of the weights repo")
    run.set_defaults(handler=cmd_run)
    embed = sub.add_parser("embed", help="embed a corpus (.txt, .jsonl, .parquet) into resumable Parquet shards, "
                                         "here or on Ray Data (--ray)")
    embed.add_argument("name", metavar="NAME", help="zoo entry (name or folder) or hf:org/repo")
    embed.add_argument("input", metavar="INPUT", help="a .txt (one text per line), .jsonl or .parquet file")
    embed.add_argument("-o", "--output", required=True, metavar="FOLDER",
                       help="the shard folder; a rerun of the same job embeds only the shards not there")
    embed.add_argument("--backend", choices=available(), default="torch")
    embed.add_argument("--text-column", default="text", metavar="NAME", help="the field holding the text (default text)")
    embed.add_argument("--batch-size", type=int, default=32, metavar="N", help="texts per encode batch (default 32)")
    embed.add_argument("--shard-rows", type=int, default=10_000, metavar="N",
                       help="input rows per output shard, the unit a rerun redoes (default 10000)")
    embed.add_argument("--normalize", action="store_true", help="scale each vector to unit length")
    embed.add_argument("--prompt-name", metavar="NAME", help="a prompt of the model's put before each text")
    embed.add_argument("--max-length", type=int, metavar="N", help="tokens per text (default: the model's)")
    embed.add_argument("--ray", action="store_true",
                       help="run on Ray Data actors: the cluster RAY_ADDRESS names, else a local one")
    embed.add_argument("--concurrency", type=int, default=1, metavar="N", help="Ray actors (with --ray; default 1)")
    embed.add_argument("--threads", type=int, metavar="N", help="torch threads per actor (or in this process)")
    embed.add_argument("--weights", metavar="FILE", help="a local .safetensors file or folder instead of the pinned checkpoint")
    embed.add_argument("--revision", help="another revision of the weights repo")
    embed.add_argument("--no-progress", action="store_true", help="no progress bar")
    embed.set_defaults(handler=cmd_embed)
    tf = sub.add_parser("convert-tf", help="convert a google-research/bert TensorFlow checkpoint to safetensors "
                                           "in transformers' key layout")
    tf.add_argument("prefix", metavar="CKPT_PREFIX", help="the checkpoint's files without their suffix, "
                                                         "e.g. uncased_L-12_H-768_A-12/bert_model.ckpt")
    tf.add_argument("-o", "--output", required=True, metavar="FOLDER",
                    help="where model.safetensors and config.json are written")
    tf.add_argument("--config", metavar="FILE", help="bert_config.json (default: the one beside the checkpoint)")
    tf.set_defaults(handler=cmd_convert_tf)
    zoo = sub.add_parser("zoo", help="list the zoo's entries: title, size, license, tags, pinned weights")
    zoo.add_argument("--json", action="store_true", help="print the listing as JSON")
    zoo.set_defaults(handler=cmd_zoo)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return args.handler(args, parser)
    except LinnetError as exc:
        print(exc.render(), file=sys.stderr)
        return EXIT_ERRORS
    except KeyboardInterrupt:
        return 130
    except InternalError as exc:
        print(str(exc), file=sys.stderr)
        return EXIT_BUG
    except Exception:  # noqa: BLE001 - anything else is by definition our bug
        print("internal compiler error (this is a bug in Linnet, please report it with the trace below):",
              file=sys.stderr)
        traceback.print_exc()
        return EXIT_BUG


if __name__ == "__main__":
    sys.exit(main())
