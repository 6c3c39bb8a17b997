# SPDX-License-Identifier: Apache-2.0
"""Remote mode: each row runs as one kcoral program on a kcoral GPU server (``--server URL``).

kcoral (PyPI ``kcoral``) executes instruction sequences (upload / get_function / run / return) in a
fresh worker process per request that holds an exclusive lease on its GPU. A row is one program: it
uploads the small module ``ENTRY_SOURCE``, whose ``bench_row`` imports the server's installed
tirx-kernels and calls the same ``run.measure_spec`` the local mode calls, and returns the row as a
JSON string. The server's kernel-source fingerprint must equal this checkout's, else the row fails:
a remote row measures exactly the source the run records.
"""

from __future__ import annotations

import json

# Uploaded to the server as a kcoral "module": no state survives between programs, so each function
# imports what it needs from the worker's environment.
ENTRY_SOURCE = '''
def bench_row(spec_json):
    import json
    from tirx_kernels.bench_suite.run import measure_spec
    return json.dumps(measure_spec(json.loads(spec_json)), default=str)


def environment(root):
    import json
    from tirx_kernels.bench_suite import provenance
    return json.dumps(provenance.environment(root or None), default=str)
'''

DEFAULT_TIMEOUT_S = 900.0  # first FlashInfer JIT builds take ~50 s; kcoral clamps to its --max-timeout-seconds


class RemoteError(RuntimeError):
    """The kcoral server cannot be reached or a program failed on it."""


def _kcoral():
    try:
        import kcoral
    except ImportError as e:
        raise RemoteError("--server needs the kcoral client: pip install kcoral==0.1.1 (tirx-core[bench])") from e
    return kcoral


def build_program(function: str, argument: str):
    """A kcoral Program calling ``function(argument)`` of ``ENTRY_SOURCE`` and returning it as ``out``."""
    kcoral = _kcoral()
    p = kcoral.Program()
    module = p.upload(id="entry", kind="module", source=ENTRY_SOURCE)
    fn = p.get_function(id="fn", module=module, name=function)
    out = p.run(id="call", fn=fn, args=[argument])
    p.return_(key="out", value=out)
    return p


class KcoralExecutor:
    """``measure(spec)`` / ``environment(root)`` through a kcoral server at ``url``."""

    mode = "remote"

    def __init__(self, url: str, timeout_s: float = DEFAULT_TIMEOUT_S, client=None, require_gpu: bool = True):
        self.server = url
        self.timeout_s = timeout_s
        self._client = client if client is not None else _kcoral().Client(url)
        try:
            self.health = self._client.health()
        except Exception as e:
            raise RemoteError(f"kcoral server {url} is not answering: {type(e).__name__}: {e}") from e
        if require_gpu and not self.health.get("gpu_count"):
            raise RemoteError(f"kcoral server {url} has no GPU workers (started with --device cpu?): "
                              f"health={json.dumps(self.health)[:300]}")

    def _call(self, function: str, argument: str) -> tuple[str, dict]:
        res = self._client.execute(build_program(function, argument), timeout_seconds=self.timeout_s)
        meta = {"request_id": res.request_id, "queue_ms": res.queue_ms, "elapsed_ms": res.elapsed_ms,
                "lease_wait_ms": res.lease_wait_ms, "lease_held_ms": res.lease_held_ms,
                "gpu_ids": list(res.gpu_ids)}
        if not res.completed:
            err = res.error or {}
            raise RemoteError(f"kcoral request {res.request_id} failed: {err.get('kind', '?')}: "
                              f"{err.get('message', '')} {res.stderr[-1500:]}".strip())
        return res.results["out"], meta

    def environment(self, root: str) -> dict:
        text, meta = self._call("environment", root)
        env = json.loads(text)
        env["kcoral"] = {"url": self.server, "health": self.health, "request": meta}
        return env

    def measure(self, spec: dict) -> dict:
        from tirx_kernels import registry
        from tirx_kernels.core import artifacts

        text, meta = self._call("bench_row", json.dumps(spec))
        row = json.loads(text)
        row["kcoral"] = meta
        entry = registry.scan().get(spec["kernel"])
        if entry is not None and row.get("fingerprint"):
            here = artifacts.fingerprint(entry.path)
            if row["fingerprint"] != here:
                row["status"] = "failed"
                row.setdefault("errors", []).append({
                    "where": "ours", "reason": f"the server measured kernel source {row['fingerprint']}, this "
                                               f"checkout has {here}: install this tree on the server"})
        return row

    def close(self) -> None:
        self._client.close()
