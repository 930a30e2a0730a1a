"""A bounded concurrent load on a real Triton server: mixed valid and invalid requests.

`ServedModel(name, workdir, runtime=)` exports a zoo entry for Triton in either layout
(`linnet.serving.triton.RUNTIMES`; the onnxruntime one needs the backend `triton_ort` builds), starts
a real `tritonserver` on loopback (`linnet.testing.triton_server`) and loads the same entry
on the ONNX backend as the reference. `run_load(served, requests=, concurrency=)` then sends
`requests` requests with at most `concurrency` in flight (worker threads, each with its own
HTTP or gRPC client): valid ones drawn from a pool of payloads whose outputs the ONNX
backend computed beforehand, invalid ones (ids out of range, a too long sequence, shapes
that disagree, a wrong datatype or rank, a batch over max_batch_size) with the input each
error must name. Every request must come back; a valid one with the reference's outputs
(max |diff| <= 1e-5), an invalid one with an error naming its input; and the server must be
live, ready and answering afterwards.

    python -m linnet.testing.triton_load --requests 2000 --concurrency 16 [--runtime python] [--seed N] [--json out.json]

Outside the tests the MiniLM checkpoint is taken from the Hugging Face cache; in a source
checkout without it, `--install-fixture` puts the packaged copy the tests use into a
private offline cache first.
"""
from __future__ import annotations

import argparse
import atexit
import json
import os
import random
import shutil
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

OUTPUTS = ("hidden", "pooled", "embedding")


class ServedModel:
    """A zoo entry served by a real Triton server, with its ONNX-backend reference."""

    def __init__(self, name: str, workdir: Path, *, max_batch_size: int = 8, runtime: str = "onnxruntime"):
        self.name, self.workdir, self.max_batch_size = name, Path(workdir), max_batch_size
        self.runtime = runtime
        self.server = None
        self._local = threading.local()
        self._clients: list = []
        self._lock = threading.Lock()

    def __enter__(self) -> "ServedModel":
        from ..nest import load, prepare
        from ..serving.triton import export_passes, export_triton
        from .triton_ort import provision_for
        from .triton_server import TritonServer

        tools = provision_for(self.runtime)
        ctx, _ = prepare(self.name, optimize=export_passes())
        export_triton(ctx, self.workdir / "repo", runtime=self.runtime, max_batch_size=self.max_batch_size)
        # The export above is `linnet export-triton`'s (the ONNX backend's passes, packing among
        # them), so the reference is the ONNX backend's default load: both read 0 at padding.
        self.onnx = load(self.name, backend="onnx")
        from ..runtime import index_bounds

        program = self.onnx.program
        self.vocab = {n: b.rows for n, b in index_bounds(program, program.entries[ctx.manifest.source.entry]).items()}
        self.server = TritonServer(self.workdir / "repo", tools, log_path=self.workdir / "tritonserver.log")
        self.server.start()
        return self

    def __exit__(self, *exc) -> None:
        with self._lock:
            for client in self._clients:
                try:
                    client.close()
                except Exception:  # noqa: BLE001 - closing is best effort before the stop
                    pass
            self._clients.clear()
        if self.server is not None:
            self.server.stop()

    # ---------------------------------------------------------------- clients
    def client(self, protocol: str = "grpc"):
        """This thread's client for `protocol` (tritonclient's HTTP client is not thread-safe)."""
        clients = self._local.__dict__.setdefault("clients", {})
        if protocol not in clients:
            if protocol == "http":
                import tritonclient.http as module
                client = module.InferenceServerClient(self.server.http_url, connection_timeout=120,
                                                      network_timeout=120)
            else:
                import tritonclient.grpc as module
                client = module.InferenceServerClient(self.server.grpc_url)
            clients[protocol] = (module, client)
            with self._lock:
                self._clients.append(client)
        return clients[protocol]

    def _send(self, inputs: dict, outputs, protocol: str):
        from tritonclient.utils import np_to_triton_dtype

        module, client = self.client(protocol)
        tensors = []
        for name, array in inputs.items():
            array = np.asarray(array)
            tensor = module.InferInput(name, list(array.shape), np_to_triton_dtype(array.dtype))
            tensor.set_data_from_numpy(array)
            tensors.append(tensor)
        requested = [module.InferRequestedOutput(o) for o in outputs]
        return client.infer(self.name, tensors, outputs=requested)

    def infer(self, inputs: dict, outputs=OUTPUTS, protocol: str = "grpc") -> dict[str, np.ndarray]:
        result = self._send(inputs, outputs, protocol)
        return {o: result.as_numpy(o) for o in outputs}

    def request_error(self, inputs: dict, outputs=OUTPUTS, protocol: str = "grpc") -> str | None:
        """The server's error message for a request, or None when it answered."""
        from tritonclient.utils import InferenceServerException

        try:
            self._send(inputs, outputs, protocol)
        except InferenceServerException as exc:
            return exc.message() or str(exc)
        return None

    def healthy(self, protocol: str = "grpc") -> bool:
        _, client = self.client(protocol)
        return bool(client.is_server_live() and client.is_server_ready() and client.is_model_ready(self.name))

    def reference(self, tokens, token_types=None, attention_mask=None) -> dict[str, np.ndarray]:
        kwargs = {"token_types": token_types, "attention_mask": attention_mask}
        return {"hidden": self.onnx(tokens, **kwargs), "pooled": self.onnx.pool(tokens, **kwargs),
                "embedding": self.onnx.embed(tokens, **kwargs)}


# --------------------------------------------------------------------------- requests


@dataclass
class Request:
    index: int
    inputs: dict
    outputs: tuple[str, ...]
    protocol: str
    expected: dict | None = None       # reference outputs of a valid request
    must_name: str | None = None       # the input an invalid request's error must name
    kind: str = "valid"


def _valid_pool(served: ServedModel, size: int, rng: np.random.Generator) -> list[tuple[dict, dict]]:
    pool = []
    vocab, types = served.vocab.get("tokens", 30522), served.vocab.get("token_types", 2)
    for _ in range(size):
        b, s = int(rng.integers(1, served.max_batch_size + 1)), int(rng.integers(1, 48))
        inputs = {"tokens": rng.integers(0, vocab, (b, s)).astype(np.int32)}
        if rng.random() < 0.5:
            inputs["token_types"] = rng.integers(0, types, (b, s)).astype(np.int32)
        if rng.random() < 0.5:
            lengths = rng.integers(1, s + 1, b)
            inputs["attention_mask"] = (np.arange(s)[None, :] < lengths[:, None]).astype(np.int32)
        pool.append((inputs, served.reference(**inputs)))
    return pool


def _invalid(kind: str, rng: np.random.Generator, served: ServedModel) -> tuple[dict, str]:
    vocab = served.vocab.get("tokens", 30522)
    tokens = rng.integers(0, vocab, (2, 6)).astype(np.int32)
    if kind == "negative id":
        tokens[1, 2] = -5
        return {"tokens": tokens}, "tokens"
    if kind == "id past vocab":
        tokens[0, 0] = vocab + int(rng.integers(0, 1000))
        return {"tokens": tokens}, "tokens"
    if kind == "type past vocab":
        return {"tokens": tokens, "token_types": np.full_like(tokens, 7)}, "token_types"
    if kind == "too long":
        return {"tokens": np.ones((1, 600), np.int32)}, "S"
    if kind == "shapes disagree":
        return {"tokens": tokens, "attention_mask": np.ones((2, 5), np.int32)}, "attention_mask"
    if kind == "float tokens":
        return {"tokens": tokens.astype(np.float32)}, "tokens"
    if kind == "rank":
        return {"tokens": tokens[0]}, "tokens"
    if kind == "batch too big":
        return {"tokens": np.ones((served.max_batch_size + 1, 3), np.int32)}, "batch"
    raise ValueError(kind)


INVALID_KINDS = ("negative id", "id past vocab", "type past vocab", "too long", "shapes disagree", "float tokens",
                 "rank", "batch too big")


def make_requests(served: ServedModel, requests: int, seed: int = 0, invalid_fraction: float = 0.3,
                  pool_size: int = 48) -> list[Request]:
    rng = np.random.default_rng(seed)
    pick = random.Random(seed)
    pool = _valid_pool(served, pool_size, rng)
    out = []
    for i in range(requests):
        protocol = "grpc" if pick.random() < 0.5 else "http"
        outputs = tuple(o for o in OUTPUTS if pick.random() < 0.6) or ("pooled",)
        if pick.random() < invalid_fraction:
            kind = pick.choice(INVALID_KINDS)
            inputs, name = _invalid(kind, rng, served)
            out.append(Request(i, inputs, outputs, protocol, must_name=name, kind=kind))
        else:
            inputs, expected = pick.choice(pool)
            out.append(Request(i, inputs, outputs, protocol, expected={o: expected[o] for o in outputs}))
    return out


@dataclass
class LoadReport:
    requests: int
    concurrency: int
    answered: int = 0
    valid_ok: int = 0
    invalid_refused: int = 0
    max_abs_diff: float = 0.0
    seconds: float = 0.0
    max_in_flight: int = 0
    healthy_after: bool = False
    problems: list[str] = field(default_factory=list)
    by_kind: dict[str, int] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return not self.problems and self.answered == self.requests and self.healthy_after

    def to_json(self) -> dict:
        data = dict(self.__dict__)
        data["problems"] = self.problems[:20]
        data["problem_count"] = len(self.problems)
        data["ok"] = self.ok
        data["requests_per_second"] = round(self.requests / self.seconds, 1) if self.seconds else None
        return data


def run_load(served: ServedModel, requests: int = 200, concurrency: int = 8, seed: int = 0,
             invalid_fraction: float = 0.3, pool_size: int = 48) -> LoadReport:
    """Send the requests with at most `concurrency` in flight and check every answer."""
    from tritonclient.utils import InferenceServerException

    batch = make_requests(served, requests, seed, invalid_fraction, pool_size)
    report = LoadReport(requests, concurrency)
    lock = threading.Lock()
    in_flight = [0]

    def one(req: Request) -> None:
        with lock:
            in_flight[0] += 1
            report.max_in_flight = max(report.max_in_flight, in_flight[0])
        try:
            try:
                result = served._send(req.inputs, req.outputs, req.protocol)
                got = {o: result.as_numpy(o) for o in req.outputs}
                error = None
            except InferenceServerException as exc:
                got, error = None, exc.message() or str(exc)
            except Exception as exc:  # noqa: BLE001 - a transport failure is a lost request
                with lock:
                    report.problems.append(f"request {req.index} ({req.kind}, {req.protocol}) lost: "
                                           f"{type(exc).__name__}: {exc}")
                return
            with lock:
                report.answered += 1
                report.by_kind[req.kind] = report.by_kind.get(req.kind, 0) + 1
                if req.expected is not None:
                    if error is not None:
                        report.problems.append(f"request {req.index} (valid, {req.protocol}) failed: {error}")
                        return
                    for name, want in req.expected.items():
                        have = got.get(name)
                        if have is None or have.shape != want.shape:
                            report.problems.append(f"request {req.index}: `{name}` has shape "
                                                   f"{None if have is None else have.shape}, expected {want.shape}")
                            return
                        diff = float(np.max(np.abs(have.astype(np.float64) - want))) if want.size else 0.0
                        report.max_abs_diff = max(report.max_abs_diff, diff)
                        if not diff <= 1e-5:
                            report.problems.append(f"request {req.index}: `{name}` differs by {diff:.3g}")
                            return
                    report.valid_ok += 1
                else:
                    if error is None:
                        report.problems.append(f"request {req.index} ({req.kind}) was answered, not refused")
                    elif req.must_name.lower() not in error.lower():
                        report.problems.append(f"request {req.index} ({req.kind}): error does not name "
                                               f"`{req.must_name}`: {error}")
                    else:
                        report.invalid_refused += 1
        finally:
            with lock:
                in_flight[0] -= 1

    started = time.perf_counter()
    with ThreadPoolExecutor(max_workers=concurrency) as pool:
        list(pool.map(one, batch))
    report.seconds = round(time.perf_counter() - started, 2)
    try:
        report.healthy_after = served.healthy("grpc") and served.healthy("http")
        check = served.infer({"tokens": np.array([[101, 2023, 102]], np.int32)}, ("pooled",))
        want = served.reference(np.array([[101, 2023, 102]], np.int32))["pooled"]
        if float(np.max(np.abs(check["pooled"] - want))) > 1e-5:
            report.problems.append("the request after the load gave a wrong result")
    except Exception as exc:  # noqa: BLE001
        report.healthy_after = False
        report.problems.append(f"server unhealthy after the load: {type(exc).__name__}: {exc}")
    return report


def _temporary_folder(prefix: str) -> str:
    """A fresh folder under the temp dir, removed at exit so load runs leave nothing behind."""
    folder = tempfile.mkdtemp(prefix=prefix)
    atexit.register(shutil.rmtree, folder, ignore_errors=True)
    return folder


def _install_fixture() -> None:
    """Point huggingface_hub at a private offline cache holding the packaged MiniLM copy."""
    home = _temporary_folder("linnet-load-hf-")
    os.environ["HF_HOME"] = home
    os.environ["HF_HUB_OFFLINE"] = "1"
    tests = Path(__file__).resolve().parents[2] / "tests"
    sys.path.insert(0, str(tests))
    from fixtures.checkpoints import install_minilm

    hub = Path(home) / "hub"
    hub.mkdir(parents=True, exist_ok=True)
    install_minilm(hub)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m linnet.testing.triton_load", description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="all-minilm-l6-v2")
    parser.add_argument("--runtime", choices=("onnxruntime", "python"), default="onnxruntime",
                        help="the export-triton layout to serve (default: onnxruntime)")
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--invalid-fraction", type=float, default=0.3)
    parser.add_argument("--install-fixture", action="store_true",
                        help="use the packaged MiniLM copy in a private offline HF cache (source checkout)")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    if args.install_fixture:
        _install_fixture()
    if "LINNET_CACHE" not in os.environ:
        os.environ["LINNET_CACHE"] = _temporary_folder("linnet-load-cache-")
    with tempfile.TemporaryDirectory(prefix="linnet-load-") as work:
        with ServedModel(args.model, Path(work), runtime=args.runtime) as served:
            print(f"{args.runtime} layout: server ready in {served.server.start_seconds:.1f} s; sending {args.requests} requests, "
                  f"{args.concurrency} in flight", file=sys.stderr)
            report = run_load(served, args.requests, args.concurrency, args.seed, args.invalid_fraction)
    text = json.dumps(report.to_json(), indent=2)
    print(text)
    if args.json:
        args.json.write_text(text + "\n", encoding="utf-8")
    return 0 if report.ok else 1


if __name__ == "__main__":
    sys.exit(main())
