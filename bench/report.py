"""Writing a bench result: the JSON file, a bar chart beside it, and a markdown table.

`python -m bench.report` prints the table of every `nest/*/bench*.json`;
`python -m bench.report --readme` also rewrites the generated part of README.md's
`## Benchmarks` section (between the `bench:table` markers) with those tables.
"""
from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

from .weights import REPO_ROOT

START, END = "<!-- bench:table:start -->", "<!-- bench:table:end -->"


def write(result: dict, out: Path, *, chart: bool = True) -> None:
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(result, indent=1, default=_jsonable) + "\n", encoding="utf-8")
    tmp.replace(out)
    if chart:
        try:
            render_chart(result, chart_path(out))
        except ImportError as exc:
            print(f"no chart: {exc} (pip install matplotlib)", file=sys.stderr)


def _jsonable(value):
    try:
        return float(value)
    except (TypeError, ValueError):
        return str(value)


def chart_path(json_path: Path) -> Path:
    """bench.json -> bench.png, bench.cuda.json -> bench.cuda.png."""
    return json_path.with_name(json_path.name[: -len(".json")] + ".png")


def _reference(result: dict) -> dict | None:
    return next((m for m in result["methods"] if m["key"] == result["reference"]), None)


def ratios(result: dict) -> dict[str, tuple[float | None, float | None]]:
    """key -> (latency / reference latency, throughput / reference throughput)."""
    ref = _reference(result)
    ref_lat = ref and ref["metrics"].get("latency_ms")
    ref_thr = ref and ref["metrics"].get("throughput_per_s")
    out = {}
    for m in result["methods"]:
        lat, thr = m["metrics"].get("latency_ms"), m["metrics"].get("throughput_per_s")
        out[m["key"]] = (lat / ref_lat if lat and ref_lat else None, thr / ref_thr if thr and ref_thr else None)
    return out


def _ratio_to(result: dict, metric: str, anchor_key: str | None) -> dict[str, float | None]:
    """key -> metric / the anchor method's metric (None where either is missing)."""
    anchor = next((m for m in result["methods"] if m["key"] == anchor_key), None)
    base = anchor and anchor["metrics"].get(metric)
    return {m["key"]: (m["metrics"].get(metric) / base if m["metrics"].get(metric) and base else None)
            for m in result["methods"]}


def has_metric(result: dict, metric: str) -> bool:
    return any(m["metrics"].get(metric) is not None for m in result["methods"])


def _panels(result: dict) -> list[tuple[dict, str]]:
    """(key -> ratio, title) per chart panel: the fixed workload's two, then the variable-length
    batch and the corpus where the result has them (older results do not)."""
    r = ratios(result)
    panels = [({k: v[0] for k, v in r.items()}, "latency / reference  (B=1; lower is faster)"),
              ({k: v[1] for k, v in r.items()}, "throughput / reference  (B=8; higher is better)")]
    wl = result["workload"]
    if has_metric(result, "varlen_ms"):
        panels.append((_ratio_to(result, "varlen_ms", result["reference"]),
                       f"{wl.get('varlen_batch', 32)} sentences, padded: time / reference  (lower is faster)"))
    if has_metric(result, "corpus_per_s"):
        panels.append((_ratio_to(result, "corpus_per_s", result.get("corpus_reference")),
                       f"corpus encode: texts/s / {result.get('corpus_reference')}  (higher is better)"))
    return panels


def render_chart(result: dict, path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    methods = result["methods"]
    labels = [m["key"] for m in methods]
    panels = _panels(result)
    columns = 2 if len(panels) > 2 else len(panels)
    rows = (len(panels) + columns - 1) // columns
    fig, axes = plt.subplots(rows, columns, figsize=(12, rows * (0.45 * len(methods) + 1.4) + 0.4), squeeze=False)
    colors = ["#7f7f7f" if m["kind"] == "reference" else "#1f77b4" for m in methods]
    for ax in axes.flat[len(panels):]:
        ax.set_visible(False)
    for ax, (by_key, title) in zip(axes.flat, panels):
        values = [by_key[k] for k in labels]
        bars = ax.barh(range(len(labels)), [v or 0 for v in values], color=colors)
        ax.axvline(1.0, color="black", linewidth=0.8)
        top = max([v for v in values if v] or [1.0])
        for bar, v, m in zip(bars, values, methods):
            text = f"{v:.2f}x" if v else ("error" if m["error"] else "n/a")
            ax.text((v or 0) + 0.01 * top, bar.get_y() + bar.get_height() / 2, text, va="center", fontsize=8)
        ax.set_xlim(0, top * 1.18)
        ax.set_title(title, fontsize=10)
        ax.set_yticks(range(len(labels)), labels if ax in axes[:, 0] else [], fontsize=9)
        ax.invert_yaxis()
    wl = result["workload"]
    env = result["environment"]
    where = env.get("gpu") or f"{env.get('cpu')}, {env.get('cores')} cores"
    fig.suptitle(f"{result.get('model', '')} on {wl['device']} ({where}), S={wl['seq']}; "
                 f"reference {result['reference']} (grey)", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _fmt(value, digits: int = 2) -> str:
    if value is None:
        return "—"
    if isinstance(value, float) and (math.isnan(value) or math.isinf(value)):
        return "—"
    return f"{value:,.{digits}f}"


def markdown_table(result: dict) -> str:
    r = ratios(result)
    memory_key = "peak_vram_mib" if result["workload"]["device"] == "cuda" else "peak_rss_mib"
    memory_title = "peak VRAM MiB" if memory_key == "peak_vram_mib" else "peak RSS MiB"
    lines = [f"| method | key | latency ms (B=1) | × ref | seq/s (B=8) | × ref | load s | {memory_title} "
             "| max abs diff |",
             "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for m in result["methods"]:
        met = m["metrics"]
        lat_ratio, thr_ratio = r[m["key"]]
        diff = m["max_abs_diff"]
        row = [m["method"], f"`{m['key']}`", _fmt(met.get("latency_ms")), _fmt(lat_ratio), _fmt(met.get("throughput_per_s"), 1),
               _fmt(thr_ratio), _fmt(met.get("load_s")), _fmt(met.get(memory_key), 0),
               "—" if diff is None else f"{diff:.2g}"]
        if m["error"]:
            row[2] = "error: " + m["error"].splitlines()[0][:90].replace("|", "\\|")
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines)


def workloads_table(result: dict) -> str:
    """The variable-length batch and the corpus, one row per method that ran either; "" for a
    result without them (one written before these workloads existed)."""
    varlen, corpus = has_metric(result, "varlen_ms"), has_metric(result, "corpus_per_s")
    if not (varlen or corpus):
        return ""
    # The targets for this batch are ratios to HF -> ORT: a column when it ran.
    v_ort = _ratio_to(result, "varlen_ms", "onnx-reference")
    with_ort = any(v is not None for v in v_ort.values())
    wl = result["workload"]
    head, rule = ["method", "key"], ["---", "---"]
    if varlen:
        head += [f"{wl.get('varlen_batch', 32)} sentences ms", "× ref"] + (["× onnx-reference"] if with_ort else []) \
            + ["max abs diff (real tokens)"]
        rule += ["---:"] * (4 if with_ort else 3)
    if corpus:
        head += ["corpus texts/s", f"× {result.get('corpus_reference')}", "max abs diff (embeddings)"]
        rule += ["---:"] * 3
    v_ref = _ratio_to(result, "varlen_ms", result["reference"])
    c_ref = _ratio_to(result, "corpus_per_s", result.get("corpus_reference"))
    lines = ["| " + " | ".join(head) + " |", "| " + " | ".join(rule) + " |"]
    diff = lambda d: "—" if d is None else f"{d:.2g}"  # noqa: E731
    for m in result["methods"]:
        met, key = m["metrics"], m["key"]
        if met.get("varlen_ms") is None and met.get("corpus_per_s") is None:
            continue
        row = [m["method"], f"`{key}`"]
        if varlen:
            row += [_fmt(met.get("varlen_ms"), 1), _fmt(v_ref[key])] + ([_fmt(v_ort[key])] if with_ort else []) \
                + [diff(met.get("varlen_max_abs_diff"))]
        if corpus:
            row += [_fmt(met.get("corpus_per_s"), 1), _fmt(c_ref[key]), diff(met.get("corpus_max_abs_diff"))]
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines)


def results(root: Path = REPO_ROOT / "nest") -> list[tuple[Path, dict]]:
    return [(p, json.loads(p.read_text(encoding="utf-8"))) for p in sorted(root.glob("*/bench*.json"))]


def summary(path: Path, result: dict) -> str:
    env, wl = result["environment"], result["workload"]
    where = env.get("gpu") or f"{env.get('cpu')} ({env.get('cores')} cores, {env.get('torch_threads')} torch threads)"
    ref = _reference(result)
    parts = _top_level_parts(ref["notes"]) if ref else []
    origin = result.get("weights") or (parts[0] if parts else "")
    shared = next((p for p in parts if "shared with other work" in p), None)
    if shared:
        origin += f". Note: {shared}; the ratios are therefore rough"
    rel = path.relative_to(REPO_ROOT) if path.is_relative_to(REPO_ROOT) else path
    chart = chart_path(path)
    text = [f"### {result.get('model', path.parent.name)} ({wl['device']})", "",
            f"{result['date'][:10]}, {where}; torch {env.get('torch')}, jax {env.get('jax')}, "
            f"onnxruntime {env.get('onnxruntime')}, transformers {env.get('transformers')}. {origin}. "
            f"{wl['rounds']} interleaved rounds. Raw numbers: [`{rel}`]({rel}).", "",
            markdown_table(result)]
    extra = workloads_table(result)
    if extra:
        corpus = wl.get("corpus_texts") or {}
        text += ["", f"Variable-length batch: {wl.get('varlen_inputs', '')}. Corpus: {corpus.get('texts')} "
                 f"{corpus.get('source', 'texts')}, batch_size {wl.get('corpus_batch')}.", "", extra]
    if chart.exists():
        text += ["", f"![{result.get('model')} {wl['device']} ratios]({chart.relative_to(REPO_ROOT) if chart.is_relative_to(REPO_ROOT) else chart})"]
    return "\n".join(text)


def _top_level_parts(notes: str) -> list[str]:
    """Split notes on "; " outside parentheses."""
    parts, depth, current = [], 0, ""
    for i, ch in enumerate(notes):
        depth += (ch == "(") - (ch == ")")
        if depth == 0 and notes.startswith("; ", i):
            parts.append(current)
            current = ""
            continue
        if depth == 0 and ch == " " and current == "" and parts:
            continue
        current += ch
    return parts + [current]


def update_readme(readme: Path = REPO_ROOT / "README.md") -> bool:
    """Replace the text between the markers in README.md; False when the markers are missing."""
    text = readme.read_text(encoding="utf-8")
    if START not in text or END not in text:
        return False
    head, rest = text.split(START, 1)
    _, tail = rest.split(END, 1)
    body = "\n\n".join(summary(p, r) for p, r in results())
    readme.write_text(f"{head}{START}\n{body}\n{END}{tail}", encoding="utf-8")
    return True


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.report")
    parser.add_argument("--readme", action="store_true", help="rewrite README.md's generated benchmark tables")
    args = parser.parse_args(argv)
    for path, result in results():
        print(summary(path, result), end="\n\n")
    if args.readme and not update_readme():
        print(f"README.md has no {START} ... {END} markers", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
