"""`stepsim serve`: the HTML report made live, on this machine only.

A page (serve_page.py) to pick or paste machines (presets, a pasted `nvidia-smi topo -m`, a
pasted nccl-tests log to calibrate one), a model (a preset, a pasted `config.json` and
`adapter_config.json`) and the knobs (strategy, micro-batch, sequence length, checkpointing,
LoRA rank, padded batches). The server binds 127.0.0.1 on a free port (or ``--port``) and
prints its address; it is the standard library's ``http.server``.

No answer differs from the CLI's, by construction: the page's fields become a `stepsim`
command line (shown on the page), and
- compare, advise, topo import and calibrate run as that very command, in a `stepsim` process
  of their own (``--json`` and ``--html``; progress read from its stderr,
  ``STEPSIM_PROGRESS=lines``); the answer shown is the section of its HTML report, and an
  error is the one line it printed;
- the memory bar, which follows every keystroke, runs `stepsim memory`'s own parser and
  functions in this process (a verdict costs milliseconds).
Answers are cached by command line. Pasted files are kept in a temporary folder named by
their content, and written on the page and in errors by their own names (``config.json``), as
the command would name them in the folder that holds them.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import importlib
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlparse

from simulator.commands.parsing import Parser, whole
from simulator.errors import InputError

MAX_BODY = 4 << 20  # a pasted log or config is far smaller
FIELD_FLAGS = {  # a field of the page -> the words of an error line that point at it
    "micro_batch": ("--micro-batch",), "seq_len": ("--seq-len",),
    "checkpointing": ("--checkpointing",), "strategy": ("strategy", "-s "),
    "lora_rank": ("adapter_config.json", "--peft", "lora"),
    "workload": ("workload", "config.json", "hf:"),
    "machines": ("topology", "-t ", "--gpus", ".yaml"),
}


def add_parser(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "serve", help="a local page to compare boxes, live (127.0.0.1)",
        description="Serve a page on 127.0.0.1 to pick or paste machines and a model, see the "
        "memory verdict as you type, and run compare and advise with a progress bar; every "
        "answer is the `stepsim` command's own (the page shows the command).")
    parser.add_argument("--port", type=whole(0, 65535), default=0,
                        help="the port to listen on (default: a free one, printed)")
    parser.set_defaults(handler=run)


def parse(command: str, argv: list[str]) -> argparse.Namespace:
    """``argv`` read by ``command``'s own parser, as the CLI reads it."""
    parser = Parser(prog="stepsim")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=Parser)
    importlib.import_module(f"simulator.commands.{command}").add_parser(sub)
    args = parser.parse_args([command, *argv])
    args.argv = [command, *argv]
    return args


def error_line(command: str, exc: InputError) -> str:
    """The line the CLI prints for ``exc`` (cli.py: ``prog: error: message``)."""
    prog = getattr(exc, "prog", None) or f"stepsim {command}"
    return f"{prog}: error: {exc}"


def field_of(line: str) -> str:
    """The page's field an error line is about ("general" when none is named)."""
    message = line.split(": error: ", 1)[-1]
    for name, words in FIELD_FLAGS.items():
        if any(w in message for w in words):
            return name
    return "general"


@dataclass
class Job:
    """One command run for the page: its progress, then its answer or its error line."""

    argv: list[str]
    done: int = 0
    total: int = 0
    finished: bool = False
    answer: dict[str, Any] = field(default_factory=dict)


class Session:
    """What the server holds: pasted files, imported machines, the jobs and their cache."""

    def __init__(self) -> None:
        self.folder = Path(tempfile.mkdtemp(prefix="stepsim-serve-"))
        self.machines: dict[str, str] = {}  # imported or calibrated machine -> its YAML
        self.jobs: dict[str, Job] = {}
        self.cache: dict[tuple[str, ...], str] = {}  # command line -> job id
        self.lock = threading.Lock()  # the memory verdicts run in this process, one at a time

    def close(self) -> None:
        shutil.rmtree(self.folder, ignore_errors=True)

    def keep(self, name: str, text: str) -> str:
        """A pasted file, kept under its own name in a folder named by its content."""
        digest = hashlib.sha256(text.encode()).hexdigest()[:12]
        folder = self.folder / digest
        folder.mkdir(exist_ok=True)
        path = folder / name
        if not path.exists():
            path.write_text(text, encoding="utf-8")
        return str(path)

    def shown(self, text: str) -> str:
        """Paths of kept files as the user names them: the file's own name."""
        return re.sub(re.escape(str(self.folder)) + r"/[0-9a-f]{12}/", "", text)

    # --- the page's fields as a command line -----------------------------------------------

    def workload_args(self, form: dict[str, Any]) -> list[str]:
        config = (form.get("config_json") or "").strip()
        words = ["-w", f"hf:{self.keep('config.json', config)}" if config
                 else str(form.get("workload") or "")]
        adapter = (form.get("adapter_json") or "").strip()
        rank = str(form.get("lora_rank") or "").strip()
        if rank:  # the page's LoRA rank: the pasted adapter_config.json with r set, or PEFT's
            try:  # defaults for every linear layer of a block
                doc = json.loads(adapter) if adapter else {
                    "peft_type": "LORA", "task_type": "CAUSAL_LM", "lora_alpha": 16,
                    "target_modules": ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj",
                                       "up_proj", "down_proj"]}
                doc["r"] = int(rank) if rank.isdigit() else rank
                adapter = json.dumps(doc, indent=2)
            except ValueError:
                pass  # the CLI reads the pasted text and names what is wrong in it
        if adapter:
            words += ["--peft", self.keep("adapter_config.json", adapter)]
        return words

    def machine(self, name: str) -> str:
        return self.machines.get(name, name)

    def knob_args(self, form: dict[str, Any], *, strategy: bool = True) -> list[str]:
        words: list[str] = []
        if strategy and form.get("strategy"):
            words += ["-s", str(form["strategy"])]
        for key, flag in (("micro_batch", "--micro-batch"), ("seq_len", "--seq-len"),
                          ("checkpointing", "--checkpointing")):
            value = str(form.get(key) or "").strip()
            if value:
                words += [flag, value]
        return words + self.padded_args(form)

    def padded_args(self, form: dict[str, Any]) -> list[str]:
        """The page's "padded batches" box: `--padded` (training.padded)."""
        return ["--padded"] if form.get("padded") is True else []

    def command(self, kind: str, form: dict[str, Any]) -> list[str]:
        """The `stepsim compare` or `stepsim advise` command line of the page's fields."""
        argv = [kind]
        for m in form.get("machines") or []:
            gpus = str(m.get("gpus") or "").strip()
            argv += ["-t", self.machine(str(m["name"])) + (f":{gpus}" if gpus else "")]
        argv += self.workload_args(form)
        return argv + (self.knob_args(form) if kind == "compare" else self.padded_args(form))

    # --- answers ----------------------------------------------------------------------------

    def memory(self, form: dict[str, Any]) -> dict[str, Any]:
        """Each picked machine's memory verdict, as `stepsim memory --json` gives it."""
        from simulator import api
        from simulator.commands import memory as memory_command
        from simulator.commands.run import largest
        from simulator.outputs import svg

        labels: list[str] = []
        reports: list[dict[str, Any]] = []
        errors: dict[str, str] = {}
        for m in form.get("machines") or []:
            argv = ["-t", self.machine(str(m["name"])), *self.workload_args(form),
                    *self.knob_args(form), "--json"]
            gpus = str(m.get("gpus") or "").strip()
            if gpus:
                argv += ["--gpus", gpus]
            try:
                with self.lock:
                    args = parse("memory", argv)
                    spec = memory_command.spec_of(args)
                    if args.micro_batch == "max":  # at the largest that fits, as compare runs
                        spec = largest(spec)
                    result = api.memory(spec)
            except InputError as exc:
                line = self.shown(error_line("memory", exc))
                errors.setdefault(field_of(line), line)
                continue
            labels.append(str(m["name"]) + (f":{gpus}" if gpus else "")
                          + (f" (micro-batch {spec.micro_batch})" if args.micro_batch == "max"
                             else ""))
            reports.append({"memory": result.summary})
        return {"html": svg.memory_bars(labels, reports), "errors": errors,
                "verdicts": [r["memory"]["fits"] for r in reports],
                "peaks": [r["memory"]["peak_bytes"] for r in reports]}

    def start(self, argv: list[str], html: bool) -> str:
        """Run ``stepsim ARGV`` for the page in a process of its own; the job's id (a cached
        one for a command line run before)."""
        key = tuple(argv)
        with self.lock:
            known = self.cache.get(key)
            if known is not None:
                return known
            ident = hashlib.sha256("\0".join(argv).encode()).hexdigest()[:16]
            job = self.jobs[ident] = Job(argv)
            self.cache[key] = ident
        threading.Thread(target=self._run, args=(ident, job, html), daemon=True).start()
        return ident

    def _run(self, ident: str, job: Job, html: bool) -> None:
        page = self.folder / f"answer-{ident}.html"
        extra = ["--json", "--html", str(page)] if html else []
        code, stdout, stderr = _stepsim([*job.argv, *extra], job)
        answer: dict[str, Any] = {"command": self.shown(
            "stepsim " + " ".join(shlex.quote(w) for w in job.argv))}
        if code not in (0, 3):  # 3: nothing fits, which the answer itself says
            line = self.shown(next((x for x in reversed(stderr) if ": error: " in x),
                                   stderr[-1] if stderr else "stepsim: failed"))
            answer["error"] = {"field": field_of(line), "line": line}
        else:
            answer["stdout"] = self.shown(stdout)
            if html and page.exists():
                text = page.read_text(encoding="utf-8")
                found = re.search(r'<section id="answer">.*</section>', text, re.S)
                answer["html"] = self.shown(found.group(0) if found else "")
        job.answer = answer
        job.finished = True

    def status(self, ident: str) -> dict[str, Any]:
        job = self.jobs.get(ident)
        if job is None:
            return {"error": {"field": "general", "line": f"no job {ident}"}}
        return {"finished": job.finished, "done": job.done, "total": job.total, **job.answer}

    def import_topo(self, form: dict[str, Any]) -> dict[str, Any]:
        """A pasted `nvidia-smi topo -m`, imported by `stepsim topo import` into a machine."""
        name = re.sub(r"[^A-Za-z0-9._-]", "-", str(form.get("name") or "mybox")) or "mybox"
        matrix = self.keep("topo.txt", str(form.get("text") or ""))
        out = str(Path(matrix).parent / f"{name}.yaml")
        argv = ["topo", "import", matrix, "--gpu", str(form.get("gpu") or ""), "--name", name,
                "-o", out]
        return self._machine_from(argv, name, out)

    def calibrate(self, form: dict[str, Any]) -> dict[str, Any]:
        """A pasted nccl-tests log fitted to a machine by `stepsim calibrate`."""
        machine = str(form.get("machine") or "")
        log = self.keep("nccl-tests.log", str(form.get("text") or ""))
        name = f"{Path(self.machine(machine)).stem}-cal"
        out = str(Path(log).parent / f"{name}.yaml")
        argv = ["calibrate", "-t", self.machine(machine), log, "-o", out]
        return self._machine_from(argv, name, out)

    def _machine_from(self, argv: list[str], name: str, out: str) -> dict[str, Any]:
        ident = self.start(argv, html=False)
        while not self.jobs[ident].finished:
            threading.Event().wait(0.05)
        answer = self.jobs[ident].answer
        if "error" in answer:
            return {"error": answer["error"], "command": answer["command"]}
        self.machines[name] = out
        return {"machine": name, "command": answer["command"],
                "yaml": self.shown(Path(out).read_text(encoding="utf-8"))}


def _stepsim(argv: list[str], job: Job) -> tuple[int, str, list[str]]:
    """``stepsim ARGV`` in a process of its own: its exit status, stdout, and the lines of
    its stderr other than progress (which goes to ``job``) and the files it wrote."""
    env = {**os.environ, "STEPSIM_PROGRESS": "lines"}
    proc = subprocess.Popen([sys.executable, "-m", "simulator", *argv], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env)
    assert proc.stdout is not None and proc.stderr is not None
    out: list[str] = []
    stdout = proc.stdout
    reader = threading.Thread(target=lambda: out.append(stdout.read()), daemon=True)
    reader.start()
    lines = []
    for raw in proc.stderr:
        if raw.startswith("stepsim-progress "):
            _, done, total = raw.split()
            job.done, job.total = int(done), int(total)
        elif not raw.startswith("wrote "):
            lines.append(raw.rstrip("\n"))
    code = proc.wait()
    reader.join()
    return code, "".join(out), lines


class Handler(BaseHTTPRequestHandler):
    session: Session  # set on the class the server makes

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - http.server's name
        pass  # the page's requests are not news on the terminal

    def _send(self, status: int, body: bytes, kind: str) -> None:
        self.send_response(status)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "no-store")
        self.end_headers()
        self.wfile.write(body)

    def _json(self, doc: Any, status: int = 200) -> None:
        self._send(status, json.dumps(doc).encode(), "application/json")

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        url = urlparse(self.path)
        if url.path == "/":
            from simulator.commands import serve_page

            self._send(200, serve_page.page().encode(), "text/html; charset=utf-8")
        elif url.path == "/api/job":
            self._json(self.session.status(parse_qs(url.query).get("id", [""])[0]))
        else:
            self._send(404, b"not found", "text/plain")

    def do_POST(self) -> None:  # noqa: N802 - http.server's name
        length = int(self.headers.get("Content-Length") or 0)
        if length > MAX_BODY:
            self._json({"error": {"field": "general", "line": "too large a paste"}}, 413)
            return
        try:
            form = json.loads(self.rfile.read(length) or b"{}")
        except ValueError:
            self._json({"error": {"field": "general", "line": "not JSON"}}, 400)
            return
        s = self.session
        path = urlparse(self.path).path
        if path == "/api/memory":
            self._json({**s.memory(form),
                        "command": s.shown("stepsim " + " ".join(
                            shlex.quote(w) for w in s.command("compare", form)))})
        elif path in ("/api/compare", "/api/advise"):
            kind = path.rsplit("/", 1)[1]
            self._json({"job": s.start(s.command(kind, form), html=True)})
        elif path == "/api/import-topo":
            self._json(s.import_topo(form))
        elif path == "/api/calibrate":
            self._json(s.calibrate(form))
        else:
            self._send(404, b"not found", "text/plain")


def serve(port: int = 0) -> tuple[ThreadingHTTPServer, Session]:
    """A server bound to 127.0.0.1 (``port`` 0: a free one), not yet serving."""
    session = Session()
    handler = type("SessionHandler", (Handler,), {"session": session})
    return ThreadingHTTPServer(("127.0.0.1", port), handler), session


def run(args: argparse.Namespace) -> int:
    server, session = serve(args.port)
    port = server.server_address[1]
    print(f"stepsim serve: http://127.0.0.1:{port}/ (Ctrl-C stops it)", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
        with contextlib.suppress(OSError):
            session.close()
    return 0
