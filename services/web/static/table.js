// Sorting, filtering and refreshing tables; no library. A header with data-sort sorts its column
// (data-value on a cell, else its text; empty values last). Inputs with data-filter-for filter the
// table's rows. The state lives in the URL's hash so that the periodic refresh keeps it.
(function () {
  "use strict";

  function cellValue(row, index, kind) {
    const cell = row.cells[index];
    const raw = cell.hasAttribute("data-value") ? cell.getAttribute("data-value") : cell.textContent.trim();
    if (raw === "" || raw === "—") return null;
    if (kind === "num") { const n = parseFloat(raw); return isNaN(n) ? null : n; }
    return raw.toLowerCase();
  }

  function sortTable(table, index, direction) {
    const header = table.tHead.rows[0].cells[index];
    const kind = header.getAttribute("data-sort");
    const body = table.tBodies[0];
    const rows = Array.from(body.rows);
    const sign = direction === "descending" ? -1 : 1;
    rows.sort(function (a, b) {
      const x = cellValue(a, index, kind), y = cellValue(b, index, kind);
      if (x === null || y === null) return (x === null) - (y === null);  // missing last, both ways
      return x < y ? -sign : x > y ? sign : 0;
    });
    rows.forEach(function (row) { body.appendChild(row); });
    Array.from(table.tHead.rows[0].cells).forEach(function (th) { th.removeAttribute("aria-sort"); });
    header.setAttribute("aria-sort", direction);
  }

  function readState() {
    const state = {};
    new URLSearchParams(location.hash.slice(1)).forEach(function (v, k) { state[k] = v; });
    return state;
  }

  function writeState(state) {
    const params = new URLSearchParams();
    Object.keys(state).forEach(function (k) { if (state[k]) params.set(k, state[k]); });
    const hash = params.toString();
    history.replaceState(null, "", hash ? "#" + hash : location.pathname + location.search);
  }

  function applyFilters(table) {
    const text = document.querySelector('input[data-filter-for="' + table.id + '"]');
    const op = document.querySelector('select[data-filter-for="' + table.id + '"]');
    const query = text ? text.value.trim().toLowerCase() : "";
    const opValue = op ? op.value : "";
    let shown = 0;
    Array.from(table.tBodies[0].rows).forEach(function (row) {
      const visible = (!query || row.textContent.toLowerCase().indexOf(query) >= 0) &&
        (!opValue || row.getAttribute("data-op") === opValue);
      row.hidden = !visible;
      if (visible) shown += 1;
    });
    const count = document.getElementById("shown-count");
    if (count) count.textContent = shown + " of " + table.tBodies[0].rows.length + " problems";
  }

  function setup(table) {
    const state = readState();
    const key = table.id || "table";
    Array.from(table.tHead.rows[0].cells).forEach(function (th, index) {
      if (!th.hasAttribute("data-sort")) return;
      th.tabIndex = 0;
      function toggle() {
        const direction = th.getAttribute("aria-sort") === "descending" ? "ascending" :
          th.getAttribute("aria-sort") === "ascending" ? "descending" :
          th.getAttribute("data-sort") === "num" ? "descending" : "ascending";
        sortTable(table, index, direction);
        const s = readState(); s[key + ".sort"] = index + ":" + direction; writeState(s);
      }
      th.addEventListener("click", toggle);
      th.addEventListener("keydown", function (e) { if (e.key === "Enter") toggle(); });
    });
    const saved = state[key + ".sort"];
    if (saved) {
      const parts = saved.split(":");
      const index = parseInt(parts[0], 10);
      if (table.tHead.rows[0].cells[index]) sortTable(table, index, parts[1] === "ascending" ? "ascending" : "descending");
    }
    document.querySelectorAll('[data-filter-for="' + table.id + '"]').forEach(function (input) {
      const name = input.id;
      if (state[name]) input.value = state[name];
      function filter() {
        applyFilters(table);
        const s = readState(); s[name] = input.value; writeState(s);
      }
      input.addEventListener("input", filter);
      input.addEventListener("change", filter);
    });
    applyFilters(table);
  }

  // Reload every data-refresh-s seconds, but only once the reader has left the page alone that
  // long (no click, key, scroll or pointer move) and is not typing in a field.
  function scheduleRefresh() {
    const seconds = parseInt(document.body.getAttribute("data-refresh-s") || "0", 10);
    if (!seconds) return;
    let last = Date.now();
    ["click", "keydown", "input", "scroll", "mousemove", "change"].forEach(function (kind) {
      window.addEventListener(kind, function () { last = Date.now(); }, true);
    });
    setInterval(function () {
      const active = document.activeElement;
      const typing = active && (active.tagName === "INPUT" || active.tagName === "SELECT" || active.tagName === "TEXTAREA");
      if (!document.hidden && !typing && Date.now() - last >= seconds * 1000) location.reload();
    }, 1000);
  }

  document.querySelectorAll("table.sortable").forEach(setup);
  scheduleRefresh();
})();
