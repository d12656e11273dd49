"""The page `stepsim serve` serves: the HTML report's shell (outputs/html_report.py) with a form
in it, and the script that makes it live.

The form picks or pastes machines, a model and the knobs. As the user types, the memory bars
and the command line follow (``/api/memory``, a few milliseconds); Compare and Advise run
the command shown (``/api/compare``, ``/api/advise``) with a progress bar, and the answer's
section of the report is inserted under the form. An error is the line the command printed,
next to the field it names.
"""

from __future__ import annotations

from html import escape

from simulator.api import STRATEGIES
from simulator.commands import presets
from simulator.inputs import choices
from simulator.inputs.schema import CHECKPOINTING_MODES
from simulator.outputs.html_report import page as report_page

FORM_STYLE = """
<style>
#form label { display: inline-block; margin: 2px 10px 2px 0; }
#machines label.m { display: block; margin: 3px 0; }
#machines input.gpus { width: 5em; margin-left: 6px; }
textarea { width: 100%; min-height: 7em; font: 12px ui-monospace, Menlo, Consolas, monospace; }
.knobs label { margin-right: 14px; } .knobs input { width: 7em; }
.knobs input[type=checkbox] { width: auto; }
.error:empty { display: none; } .error { margin: 4px 0; }
#run { margin: 12px 0; } progress { width: 14em; vertical-align: middle; }
button.primary { background: #2b59c3; color: white; border-color: #2b59c3; }
</style>
"""


def _error(name: str) -> str:
    return f'<div class="error" id="err-{name}" data-field="{name}"></div>'


def _options(values: list[str], selected: str = "") -> str:
    return "".join(f'<option value="{escape(v)}"{" selected" if v == selected else ""}>'
                   f"{escape(v) or '(the workload&#39;s)'}</option>" for v in values)


def form() -> str:
    listing = presets.listing()
    machines = "".join(
        f'<label class="m"><input type="checkbox" name="machine" value="{escape(t["name"])}"> '
        f'{escape(t["name"])} <span class="muted">{escape(t["gpus"])}</span> '
        '<input class="gpus" type="number" min="1" placeholder="all" '
        f'aria-label="GPUs of {escape(t["name"])}"></label>'
        for t in listing["topologies"])
    workloads = _options([w["name"] for w in listing["workloads"]], "llama2-7b-lora")
    cards = _options(list(choices.GPU_NAMES), "rtx4090")
    return f"""{FORM_STYLE}<section id="form">
<h2>Machines</h2><div id="machines">{machines}</div>{_error("machines")}
<details><summary>Paste <code>nvidia-smi topo -m</code></summary>
<textarea id="topo-text" placeholder="the matrix as nvidia-smi topo -m prints it"></textarea>
<label>GPU <select id="topo-gpu">{cards}</select></label>
<label>name <input id="topo-name" value="mybox"></label>
<button id="topo-import">Import</button>{_error("topo")}<pre id="topo-yaml" hidden></pre>
</details>
<details><summary>Paste an nccl-tests log to calibrate a machine</summary>
<textarea id="nccl-text" placeholder="all_reduce_perf output"></textarea>
<label>machine <select id="nccl-machine">{_options([t["name"] for t in listing["topologies"]])}
</select></label> <button id="nccl-calibrate">Calibrate</button>{_error("nccl")}</details>
<h2>Model</h2><label>preset <select id="workload">{workloads}</select></label>
<details><summary>Paste <code>config.json</code> and <code>adapter_config.json</code></summary>
<label>config.json (Hugging Face; replaces the preset)</label>
<textarea id="config-json"></textarea>
<label>adapter_config.json (PEFT)</label><textarea id="adapter-json"></textarea></details>
{_error("workload")}
<h2>Knobs</h2><div class="knobs">
<label>strategy <select id="strategy">{_options(list(STRATEGIES), "ddp")}</select></label>
<label>micro-batch <input id="micro_batch" placeholder="workload's | max"></label>
<label>sequence length <input id="seq_len" placeholder="workload's"></label>
<label>checkpointing <select id="checkpointing">{_options(["", *CHECKPOINTING_MODES])}
</select></label>
<label>LoRA rank <input id="lora_rank" placeholder="none"></label>
<label title="a tokenizer's padding, DataCollatorWithPadding: sdpa runs its memory-efficient
kernel"><input type="checkbox" id="padded"> padded batches</label></div>
{_error("strategy")}{_error("micro_batch")}{_error("seq_len")}{_error("checkpointing")}
{_error("lora_rank")}
<h2>Memory per GPU, as you type</h2><div id="memory-live"><p class="muted">Pick a machine.</p>
</div>
<p class="muted">The command: <code id="live-command"></code></p>
<div id="run"><button id="run-compare" class="primary">Compare</button>
<button id="run-advise">Advise</button> <progress id="progress" value="0" max="1" hidden>
</progress> <span id="progress-text"></span></div>{_error("general")}
</section><div id="result"></div>"""


LIVE_SCRIPT = """
(function () {
  function $(id) { return document.getElementById(id); }
  function fields() {
    var machines = [];
    document.querySelectorAll('#machines label.m').forEach(function (l) {
      var box = l.querySelector('input[type=checkbox]');
      if (box.checked) { machines.push({name: box.value, gpus: l.querySelector('.gpus').value}); }
    });
    return {machines: machines, workload: $('workload').value,
            config_json: $('config-json').value, adapter_json: $('adapter-json').value,
            strategy: $('strategy').value, micro_batch: $('micro_batch').value,
            seq_len: $('seq_len').value, checkpointing: $('checkpointing').value,
            lora_rank: $('lora_rank').value, padded: $('padded').checked};
  }
  function post(path, body) {
    return fetch(path, {method: 'POST', headers: {'Content-Type': 'application/json'},
                        body: JSON.stringify(body)}).then(function (r) { return r.json(); });
  }
  function showErrors(errors) {
    document.querySelectorAll('#form .error').forEach(function (e) {
      if (e.id !== 'err-topo' && e.id !== 'err-nccl') { e.textContent = ''; }
    });
    Object.keys(errors || {}).forEach(function (k) {
      var box = $('err-' + k) || $('err-general'); box.textContent = errors[k];
    });
  }
  var timer = null, asked = 0;
  function refresh() {
    clearTimeout(timer);
    timer = setTimeout(function () {
      var mine = ++asked, f = fields();
      post('/api/memory', f).then(function (r) {
        if (mine !== asked) { return; }  // a newer keystroke's answer is on its way
        $('memory-live').innerHTML = r.html ||
          '<p class="muted">Pick a machine.</p>';
        $('live-command').textContent = r.command;
        showErrors(r.errors);
      });
    }, 120);
  }
  $('form').addEventListener('input', function (e) {
    if (e.target.tagName !== 'TEXTAREA' || e.target.id.indexOf('json') > 0) { refresh(); }
  });
  $('form').addEventListener('change', refresh);
  function addMachine(name) {
    var l = document.createElement('label'); l.className = 'm';
    l.innerHTML = '<input type="checkbox" name="machine" checked> <span></span> ' +
      '<span class="muted">pasted</span> <input class="gpus" type="number" min="1" ' +
      'placeholder="all">';
    l.querySelector('input').value = name; l.querySelector('span').textContent = name;
    $('machines').appendChild(l);
    var o = document.createElement('option'); o.value = name; o.textContent = name;
    $('nccl-machine').appendChild(o);
    refresh();
  }
  $('topo-import').addEventListener('click', function () {
    $('err-topo').textContent = '';
    post('/api/import-topo', {text: $('topo-text').value, gpu: $('topo-gpu').value,
                              name: $('topo-name').value}).then(function (r) {
      if (r.error) { $('err-topo').textContent = r.error.line; return; }
      $('topo-yaml').hidden = false; $('topo-yaml').textContent = r.yaml;
      addMachine(r.machine);
    });
  });
  $('nccl-calibrate').addEventListener('click', function () {
    $('err-nccl').textContent = '';
    post('/api/calibrate', {text: $('nccl-text').value, machine: $('nccl-machine').value})
      .then(function (r) {
        if (r.error) { $('err-nccl').textContent = r.error.line; return; }
        addMachine(r.machine);
      });
  });
  function block(id, title, text) {
    var d = document.createElement('div');
    d.innerHTML = '<h2></h2><button class="copy" data-target="' + id + '">copy</button>' +
      '<pre id="' + id + '"></pre>';
    d.querySelector('h2').textContent = title; d.querySelector('pre').textContent = text;
    return d;
  }
  function run(kind) {
    showErrors({});
    $('progress').hidden = false; $('progress').removeAttribute('value');
    $('progress-text').textContent = 'running stepsim ' + kind;
    post('/api/' + kind, fields()).then(function (r) {
      (function poll() {
        fetch('/api/job?id=' + r.job).then(function (x) { return x.json(); }).then(function (s) {
          if (s.total) { $('progress').max = s.total; $('progress').value = s.done;
                         $('progress-text').textContent = s.done + ' of ' + s.total; }
          if (!s.finished) { setTimeout(poll, 250); return; }
          $('progress').hidden = true; $('progress-text').textContent = '';
          if (s.error) { var e = {}; e[s.error.field] = s.error.line; showErrors(e); return; }
          var result = $('result'); result.innerHTML = s.html || '';
          result.appendChild(block('result-command', 'The command', s.command));
          result.appendChild(block('result-json', 'JSON', s.stdout));
          stepsimBind(result);
        });
      })();
    });
  }
  $('run-compare').addEventListener('click', function () { run('compare'); });
  $('run-advise').addEventListener('click', function () { run('advise'); });
  refresh();
})();
"""


def page() -> str:
    return report_page("stepsim: compare boxes", form(), script=LIVE_SCRIPT)
