"""The report's inline style sheet and script: table sorting, Gantt zoom, and a hook that writes
any script error into the page (where a headless browser's DOM dump can see it)."""

STYLE = """
body { font: 14px/1.4 system-ui, sans-serif; margin: 24px; color: #222; max-width: 1100px; }
h1 { font-size: 22px; } h2 { font-size: 18px; margin-top: 32px; border-bottom: 1px solid #ddd; }
table { border-collapse: collapse; margin: 8px 0; }
th, td { border: 1px solid #ddd; padding: 3px 8px; text-align: right; }
th { background: #f4f4f4; cursor: pointer; user-select: none; }
td.text, th.text { text-align: left; }
svg.chart { display: block; margin: 8px 0; font-size: 11px; }
svg.chart text { fill: #333; } svg.chart .grid { stroke: #e4e4e4; }
svg.gantt { cursor: grab; border: 1px solid #eee; }
.none { color: #777; font-style: italic; }
code, pre { background: #f6f6f6; padding: 2px 4px; }
#js-errors:empty { display: none; } #js-errors { color: #b00; }
"""

SCRIPT = r"""
(function () {
  var errors = document.getElementById('js-errors');
  window.addEventListener('error', function (e) {
    errors.textContent += 'error: ' + e.message + '\n';
  });
  function cellValue(row, i) {
    var cell = row.cells[i];
    var raw = cell.getAttribute('data-v');
    var text = raw !== null ? raw : cell.textContent;
    var number = parseFloat(text);
    return isNaN(number) ? text : number;
  }
  document.querySelectorAll('table.sortable th').forEach(function (th, i) {
    th.addEventListener('click', function () {
      var table = th.closest('table');
      var body = table.tBodies[0];
      var up = th.getAttribute('data-dir') !== 'asc';
      th.setAttribute('data-dir', up ? 'asc' : 'desc');
      var rows = Array.prototype.slice.call(body.rows);
      rows.sort(function (a, b) {
        var x = cellValue(a, i), y = cellValue(b, i);
        if (x === y) return 0;
        return (x < y ? -1 : 1) * (up ? 1 : -1);
      });
      rows.forEach(function (r) { body.appendChild(r); });
    });
  });
  document.querySelectorAll('svg.gantt').forEach(function (svg) {
    var plot = svg.querySelector('g.plot');
    var left = parseFloat(svg.getAttribute('data-left'));
    var zoom = 1, shift = 0, dragging = null;
    function apply() {
      plot.setAttribute('transform', 'translate(' + (left + shift) + ',0) scale(' + zoom +
                        ',1) translate(' + (-left) + ',0)');
    }
    svg.addEventListener('wheel', function (e) {
      e.preventDefault();
      var box = svg.getBoundingClientRect();
      var x = (e.clientX - box.left) * svg.viewBox.baseVal.width / box.width - left;
      var factor = e.deltaY < 0 ? 1.25 : 0.8;
      var next = Math.max(1, Math.min(zoom * factor, 1000));
      shift = x - (x - shift) * next / zoom;
      zoom = next;
      apply();
    }, {passive: false});
    svg.addEventListener('mousedown', function (e) { dragging = [e.clientX, shift]; });
    window.addEventListener('mouseup', function () { dragging = null; });
    svg.addEventListener('mousemove', function (e) {
      if (dragging) { shift = dragging[1] + e.clientX - dragging[0]; apply(); }
    });
    svg.addEventListener('dblclick', function () { zoom = 1; shift = 0; apply(); });
  });
  document.body.setAttribute('data-ready', 'yes');
})();
"""
