"""pi-icarus-hook's own test scenarios through castor's Pi extension, on a fake Pi host.

pi-icarus-hook's tests call its handlers with a fake Pi and read what they return: a command's
reply string, a hook's result. A real Pi never shows those (tests/e2e's other tests drive real
Pi), so here the extension is loaded by Node with a fake host (tests/e2e/fake_pi_host.mjs) and
talks to a real castor (``castor serve --stdio``) over the reference Icarus backend, whose call
log shows what Icarus received. The extension's TypeScript is transpiled with the repo's
``typescript`` (installed by .ci/install-pi.sh next to the extension's other dependencies);
Pi's own package is replaced by a stub that exports ``VERSION`` (the extension reads nothing
else of it at run time).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.icarus import REFERENCE_ICARUS

from .pi_rpc import REPO, PiInstall

pytestmark = [pytest.mark.pi, pytest.mark.timeout(120)]

EXT = REPO / "integrations" / "pi"
HOST = Path(__file__).with_name("fake_pi_host.mjs")

_BUILD = r"""
import ts from %(typescript)s;
import { mkdirSync, readdirSync, readFileSync, writeFileSync } from "node:fs";
import { join } from "node:path";
const [src, out] = process.argv.slice(2);
mkdirSync(out, { recursive: true });
for (const name of readdirSync(src)) {
  if (!name.endsWith(".ts")) continue;
  const js = ts.transpileModule(readFileSync(join(src, name), "utf8"), { compilerOptions: {
    module: ts.ModuleKind.ESNext, target: ts.ScriptTarget.ES2022, rewriteRelativeImportExtensions: true } }).outputText;
  writeFileSync(join(out, name.replace(/\.ts$/, ".js")), js);
}
"""


def _build(install: PiInstall, root: Path) -> Path:
    """The extension as plain ES modules in ``root/src`` with the modules it imports beside it."""
    typescript = EXT / "node_modules" / "typescript" / "lib" / "typescript.js"
    if not typescript.exists():
        pytest.fail(f"no typescript at {typescript}: run .ci/install-pi.sh")
    root.mkdir(parents=True)
    (root / "package.json").write_text('{"type": "module"}')
    modules = root / "node_modules"
    stub = modules / "@mariozechner" / "pi-coding-agent"
    stub.mkdir(parents=True)
    (stub / "package.json").write_text(json.dumps({"name": "@mariozechner/pi-coding-agent", "type": "module",
                                                   "main": "index.js"}))
    (stub / "index.js").write_text('export const VERSION = "1.6.0";\n')
    typebox = modules / "typebox"
    typebox.mkdir()
    (typebox / "package.json").write_text(json.dumps({"name": "typebox", "type": "module", "main": "index.js"}))
    (typebox / "index.js").write_text("export const Type = { Unsafe: (schema) => ({ ...schema }) };\n")
    (modules / "@msgpack").symlink_to(EXT / "node_modules" / "@msgpack")
    build = root / "build.mjs"
    build.write_text(_BUILD % {"typescript": json.dumps(str(typescript))})
    subprocess.run([str(install.node), str(build), str(EXT / "src"), str(root / "src")], check=True, timeout=60)
    return root / "src" / "index.js"


def test_pi_icarus_hooks_own_scenarios_hold_through_the_extension(pi_install: PiInstall, tmp_path: Path) -> None:
    index = _build(pi_install, tmp_path / "ext")
    project, agent = tmp_path / "project", tmp_path / "agent"
    project.mkdir()
    agent.mkdir()
    path = os.environ.get("PYTHONPATH", "")
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(tmp_path / "home"),
        "PYTHONPATH": f"{REPO}{os.pathsep}{path}" if path else str(REPO),
        "CASTOR_COMMAND": json.dumps([sys.executable, "-m", "castor", "serve", "--stdio"]),
        "CASTOR_TIMEOUT_MS": "20000",
        "PI_CODING_AGENT_DIR": str(agent),
        "FAKE_PI_PROJECT": str(project),
        "ICARUS_DIR": str(REFERENCE_ICARUS),
        "ICARUS_PYTHON": sys.executable,
        "FABRIC_DIR": str(tmp_path / "fabric"),
        "ICARUS_REF_CALL_LOG": str(tmp_path / "calls.jsonl"),
        "ICARUS_REF_STARTUP_CONTEXT": "startup memory",
    }
    run = subprocess.run([str(pi_install.node), str(HOST), str(index)], cwd=project, env=env,
                         capture_output=True, text=True, timeout=100)
    assert run.returncode == 0 and "FAKE PI HOST OK" in run.stdout, f"{run.stdout}\n{run.stderr[-4000:]}"
