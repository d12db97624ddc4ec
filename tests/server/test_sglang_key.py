"""SGLang's API key reaches the engine through an owner-only ``--config`` file, never its command
line, and the file is gone once start-up ended. The engine here is a stand-in run as SGLang's
``python -m sglang.launch_server``: it records what it found in the file, then serves /health and
/generate. (That SGLang itself reads ``api-key`` from such a file is shown with its own code in
test_engine_contract.py.)
"""

from __future__ import annotations

import json
import os
import stat
import sys
import textwrap

from harvest.config import ServerConfig
from harvest.server import Server
from tests.server.helpers import TEST_PREFLIGHT, free_port

STAND_IN = textwrap.dedent("""\
    import http.server, json, os, stat, sys, threading
    if sys.argv[1:3] != ["-m", "sglang.launch_server"]:
        sys.exit(1)  # e.g. harvest asking for the package version
    args = sys.argv[3:]
    port = int(args[args.index("--port") + 1])
    path = args[args.index("--config") + 1]
    seen = {"mode": stat.S_IMODE(os.stat(path).st_mode), "text": open(path).read(), "argv": args}
    with open(os.environ["STAND_IN_OUT"], "w") as fh:
        json.dump(seen, fh)
    class H(http.server.BaseHTTPRequestHandler):
        def _ok(self):
            self.send_response(200); self.send_header("Content-Length", "2"); self.end_headers()
            self.wfile.write(b"{}")
        do_GET = do_POST = _ok
        def log_message(self, *a): pass
    threading.Timer(120, os._exit, [0]).start()
    http.server.HTTPServer(("127.0.0.1", port), H).serve_forever()
""")


def test_the_sglang_key_goes_through_an_owner_only_file_removed_after_start_up(tmp_path, monkeypatch):
    script = tmp_path / "fake-python"
    script.write_text(f"#!{sys.executable}\n" + STAND_IN)
    script.chmod(0o755)
    out = tmp_path / "seen.json"
    monkeypatch.setenv("HARVEST_TEST_SGLANG_KEY", "sk-sglang-77")
    cfg = ServerConfig(engine="sglang", model="m", python=str(script), port=free_port(),
                       api_key_env="HARVEST_TEST_SGLANG_KEY", ready_timeout=60, stop_grace=2, stop_deadline=20,
                       env={"STAND_IN_OUT": str(out)})
    server = Server(cfg, run_dir=tmp_path / "run", preflight=TEST_PREFLIGHT)
    try:
        server.launch()
        seen = json.loads(out.read_text())
        assert seen["mode"] == 0o600 and seen["text"] == 'api-key: "sk-sglang-77"\n'
        assert "sk-sglang-77" not in " ".join(seen["argv"]) and "--api-key" not in seen["argv"]
        assert not os.path.exists(seen["argv"][seen["argv"].index("--config") + 1])  # removed once ready
        assert not any("sk-sglang-77" in p.read_text(errors="replace")
                       for p in (tmp_path / "run").rglob("*") if p.is_file() and stat.S_ISREG(p.stat().st_mode))
    finally:
        server.shutdown()
