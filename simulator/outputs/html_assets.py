"""The HTML report's style and script, inline in every page (no file, font or script is
fetched: the report opens from disk with the network off, and attaches to a forum post).

The script sorts a table by the column clicked (numbers by their value, kept in ``data-v``)
and copies a block's text (the command, the JSON) to the clipboard, falling back to a
selection where the page may not use the clipboard (a file opened from disk). ``bind(root)``
wires both inside ``root``, so the local page (commands/serve_page.py) calls it again on each
answer it inserts.
"""

STYLE = """
:root { color-scheme: light; --ink: #1d1d1f; --muted: #5f6368; --line: #d9d9de;
        --bad: #b00020; --ok: #1e6b2f; --accent: #2b59c3; }
* { box-sizing: border-box; }
body { font: 15px/1.45 system-ui, -apple-system, "Segoe UI", Roboto, "Helvetica Neue", Arial,
       sans-serif; color: var(--ink); margin: 0 auto; padding: 12px 16px 40px; max-width: 1100px; }
h1 { font-size: 1.35em; margin: 0.4em 0 0.2em; }
h2 { font-size: 1.1em; margin: 1.4em 0 0.4em; border-bottom: 1px solid var(--line); }
p.note, .muted { color: var(--muted); font-size: 0.9em; }
.scroll { overflow-x: auto; -webkit-overflow-scrolling: touch; }
table { border-collapse: collapse; width: 100%; font-variant-numeric: tabular-nums; }
th, td { text-align: left; padding: 5px 8px; border-bottom: 1px solid var(--line);
         vertical-align: top; }
td.num { white-space: nowrap; }
th { cursor: pointer; user-select: none; white-space: nowrap; background: #f6f6f8; }
th[data-dir="asc"]::after { content: " \\25B2"; } th[data-dir="desc"]::after { content: " \\25BC"; }
.bad { color: var(--bad); font-weight: 600; } .ok { color: var(--ok); }
.grade-high { color: var(--ok); } .grade-medium { color: #8a6d00; }
.grade-low, .grade-none { color: var(--bad); font-weight: 600; }
ul.lines { padding-left: 1.1em; } ul.lines li { margin: 0.2em 0; }
pre { background: #f6f6f8; padding: 8px; overflow-x: auto; font-size: 12px; max-height: 24em;
      white-space: pre-wrap; word-break: break-word; }
button { font: inherit; padding: 3px 10px; border: 1px solid var(--line); border-radius: 6px;
         background: white; cursor: pointer; }
button.copy { float: right; }
details { margin: 0.6em 0; } summary { cursor: pointer; font-weight: 600; }
.error { color: var(--bad); font-family: ui-monospace, Menlo, Consolas, monospace;
         font-size: 0.9em; white-space: pre-wrap; }
svg text { fill: var(--ink); font-family: inherit; } svg text.bad { fill: var(--bad); }
@media (max-width: 640px) { body { font-size: 14px; padding: 8px; }
  th, td { padding: 4px 5px; } }
"""

SCRIPT = """
function stepsimBind(root) {
  root.querySelectorAll('table.sortable th').forEach(function (th, i) {
    th.addEventListener('click', function () {
      var body = th.closest('table').tBodies[0], rows = Array.prototype.slice.call(body.rows);
      var up = th.dataset.dir !== 'asc';
      th.closest('tr').querySelectorAll('th').forEach(function (o) { delete o.dataset.dir; });
      th.dataset.dir = up ? 'asc' : 'desc';
      rows.sort(function (a, b) {
        var x = a.cells[i].dataset.v, y = b.cells[i].dataset.v;
        var nx = parseFloat(x), ny = parseFloat(y);
        var c = (!isNaN(nx) && !isNaN(ny)) ? nx - ny : String(x).localeCompare(String(y));
        return up ? c : -c;
      });
      rows.forEach(function (r) { body.appendChild(r); });
    });
  });
  root.querySelectorAll('button.copy').forEach(function (b) {
    b.addEventListener('click', function () {
      var text = document.getElementById(b.dataset.target).textContent;
      function fallback() {
        var a = document.createElement('textarea'); a.value = text;
        document.body.appendChild(a); a.select();
        try { document.execCommand('copy'); } catch (e) {}
        a.remove(); b.textContent = 'copied';
      }
      if (navigator.clipboard) {
        navigator.clipboard.writeText(text).then(function () { b.textContent = 'copied'; },
                                                 fallback);
      } else { fallback(); }
    });
  });
}
document.addEventListener('DOMContentLoaded', function () { stepsimBind(document); });
"""
