// The report page's behaviour: open folded blocks, zoom and pan, link each created node
// to the nodes it replaced, search. The graphs are SVG laid out by dot; the data says
// which node is which (onnxfuse/report/page.py writes both).
(() => {
  'use strict';
  const data = JSON.parse(document.getElementById('onnxfuse-data').textContent);
  const other = (key) => (key === 'L' ? 'R' : 'L');
  const panes = {};

  for (const key of ['L', 'R']) {
    const el = document.getElementById('pane-' + key);
    const views = new Map();
    for (const view of el.querySelectorAll('.view')) {
      const svg = view.querySelector('svg');
      const box = svg.viewBox.baseVal;
      svg.setAttribute('width', box.width);
      svg.setAttribute('height', box.height);
      views.set(Number(view.dataset.view), { el: view, svg, t: null });
    }
    panes[key] = { key, el, stage: el.querySelector('.stage'), crumbs: el.querySelector('.crumbs'),
      views, current: -1, side: data.sides[key] };
  }

  // Zoom and pan: one transform per view, kept while other views are open.
  function apply(view) {
    view.svg.style.transform = `translate(${view.t.x}px, ${view.t.y}px) scale(${view.t.s})`;
  }
  function fit(pane) {
    const view = pane.views.get(pane.current);
    const w = pane.stage.clientWidth, h = pane.stage.clientHeight;
    const box = view.svg.viewBox.baseVal;
    const s = Math.min(w / box.width, h / box.height, 1.5);
    view.t = { s, x: (w - box.width * s) / 2, y: Math.max(0, (h - box.height * s) / 2) };
    if (box.height * s > h) view.t.y = 0;
    apply(view);
  }

  function open(pane, number, follow = true) {
    if (!pane.views.has(number)) number = -1;
    if (pane.current !== number) {
      pane.views.get(pane.current).el.hidden = true;
      pane.current = number;
      pane.views.get(number).el.hidden = false;
    }
    const view = pane.views.get(number);
    if (view.t === null) fit(pane);
    const name = number < 0 ? null : pane.side.blocks[number];
    pane.crumbs.innerHTML = '';
    const top = document.createElement('a');
    top.textContent = 'top level';
    top.onclick = () => open(pane, -1);
    pane.crumbs.append(top);
    if (name !== null) {
      pane.crumbs.append(' › ', name);
    }
    if (follow) {
      // The other side opens the same block, so the two show one region before and after.
      const peer = panes[other(pane.key)];
      open(peer, name === null ? -1 : peer.side.blocks.indexOf(name), false);
    }
  }

  function centre(pane, element) {
    const view = pane.views.get(pane.current);
    const stage = pane.stage.getBoundingClientRect();
    const box = element.getBoundingClientRect();
    view.t.x += stage.left + stage.width / 2 - (box.left + box.width / 2);
    view.t.y += stage.top + stage.height / 2 - (box.top + box.height / 2);
    apply(view);
  }

  // Show node ``index`` of a side: open its block, centre it, mark it for a moment.
  function reveal(key, index) {
    const pane = panes[key];
    open(pane, pane.side.block[index]);
    const element = document.getElementById(key + index);
    if (element === null) return;
    centre(pane, element);
    element.classList.add('found');
    setTimeout(() => element.classList.remove('found'), 1600);
    describe(key, index);
  }

  // Hover or click on a node: it, the nodes it is linked to on the other side, and the
  // boxes of the blocks they are in light up.
  let lit = [];
  function light(key, index) {
    for (const element of lit) element.classList.remove('hl');
    lit = [];
    if (key === null) return;
    const mark = (side, i) => {
      for (const id of [side + i, side + 'b' + data.sides[side].block[i]]) {
        const element = document.getElementById(id);
        if (element !== null) { element.classList.add('hl'); lit.push(element); }
      }
    };
    mark(key, index);
    for (const j of data.sides[key].links[index]) mark(other(key), j);
  }

  const info = document.getElementById('info');
  function describe(key, index) {
    const side = data.sides[key];
    const rule = side.rule[index];
    const links = side.links[index];
    const names = links.map((j) => data.sides[other(key)].names[j]);
    const what = key === 'R' ? 'replaced' : 'replaced by';
    info.innerHTML = '';
    const head = document.createElement('p');
    head.innerHTML = `<b></b> <code></code>`;
    head.children[0].textContent = side.ops[index];
    head.children[1].textContent = side.names[index];
    info.append(head);
    if (rule >= 0) {
      const line = document.createElement('p');
      line.innerHTML = `<span class="swatch"></span>rule <b></b>`;
      line.children[0].style.background = data.colours[rule];
      line.children[1].textContent = data.rules[rule];
      info.append(line);
    }
    if (names.length) {
      const line = document.createElement('p');
      line.textContent = `${what} ${names.length}: ${names.slice(0, 40).join(', ')}` +
        (names.length > 40 ? ` and ${names.length - 40} more` : '');
      info.append(line);
    }
  }

  function nodeOf(target) {
    const g = target.closest('g.node');
    if (g === null) return null;
    const match = /^([LR])(b|p|s)?(\d+)(_\d+)?$/.exec(g.id);
    return match && { g, key: match[1], kind: match[2] || 'n', index: Number(match[3]) };
  }

  let pinned = false;
  for (const pane of Object.values(panes)) {
    const stage = pane.stage;
    let drag = null;
    stage.addEventListener('wheel', (event) => {
      event.preventDefault();
      const view = pane.views.get(pane.current);
      const rect = stage.getBoundingClientRect();
      const cx = event.clientX - rect.left, cy = event.clientY - rect.top;
      const factor = Math.exp(-event.deltaY * 0.0015);
      const s = Math.min(8, Math.max(0.02, view.t.s * factor));
      view.t.x = cx - (cx - view.t.x) * (s / view.t.s);
      view.t.y = cy - (cy - view.t.y) * (s / view.t.s);
      view.t.s = s;
      apply(view);
    }, { passive: false });
    stage.addEventListener('pointerdown', (event) => {
      drag = { x: event.clientX, y: event.clientY, moved: false };
      stage.setPointerCapture(event.pointerId);
    });
    stage.addEventListener('pointermove', (event) => {
      if (drag === null) return;
      const dx = event.clientX - drag.x, dy = event.clientY - drag.y;
      if (!drag.moved && Math.abs(dx) + Math.abs(dy) < 4) return;
      drag.moved = true;
      const view = pane.views.get(pane.current);
      view.t.x += dx; view.t.y += dy;
      drag.x = event.clientX; drag.y = event.clientY;
      apply(view);
    });
    stage.addEventListener('pointerup', (event) => {
      const moved = drag !== null && drag.moved;
      drag = null;
      if (moved) return;
      const hit = nodeOf(document.elementFromPoint(event.clientX, event.clientY) || stage);
      if (hit === null) { pinned = false; light(null); return; }
      if (hit.kind === 'b') { open(pane, hit.index); return; }
      if (hit.kind === 'p' || hit.kind === 's') {
        const [block, node] = pane.side.ports[hit.g.id];
        if (node >= 0) reveal(pane.key, node); else open(pane, block);
        return;
      }
      pinned = true;
      light(hit.key, hit.index);
      describe(hit.key, hit.index);
      const links = pane.side.links[hit.index];
      if (links.length) {
        // The other side shows the block where most of the linked nodes are, this
        // block when some are in it (a fusion that also read the model's shared mask).
        const peer = panes[other(pane.key)];
        const here = pane.current < 0 ? -1 : peer.side.blocks.indexOf(pane.side.blocks[pane.current]);
        const count = new Map();
        for (const j of links) count.set(peer.side.block[j], (count.get(peer.side.block[j]) || 0) + 1);
        const best = count.has(here) ? here : [...count.entries()].sort((a, b) => b[1] - a[1])[0][0];
        open(peer, best, false);
      }
    });
    stage.addEventListener('mouseover', (event) => {
      if (pinned) return;
      const hit = nodeOf(event.target);
      if (hit !== null && hit.kind === 'n') { light(hit.key, hit.index); describe(hit.key, hit.index); }
    });
  }

  // Search: by node name or op, both sides; the first results listed, each a link.
  const search = document.getElementById('search');
  const results = document.getElementById('results');
  const found = document.getElementById('found');
  const SHOWN = 50;
  search.addEventListener('input', () => {
    const query = search.value.trim().toLowerCase();
    results.innerHTML = '';
    found.textContent = '';
    if (query.length < 2) return;
    let count = 0;
    for (const key of ['L', 'R']) {
      const side = data.sides[key];
      for (let i = 0; i < side.names.length; i++) {
        if (side.kinds[i] !== 'node') continue;
        if (!side.names[i].toLowerCase().includes(query) && !side.ops[i].toLowerCase().includes(query)) continue;
        count++;
        if (count > SHOWN) continue;
        const item = document.createElement('li');
        const link = document.createElement('a');
        link.textContent = `${key === 'L' ? 'original' : 'optimized'} · ${side.ops[i]} · ${side.names[i]}`;
        link.onclick = () => reveal(key, i);
        item.append(link);
        results.append(item);
      }
    }
    found.textContent = count > SHOWN ? `${count} found, first ${SHOWN} listed` : `${count} found`;
  });
  document.getElementById('fit').onclick = () => { fit(panes.L); fit(panes.R); };
  for (const link of document.querySelectorAll('a.goto')) {
    link.onclick = () => {
      const key = link.dataset.side || 'R';
      const index = data.sides[key].names.indexOf(link.dataset.name);
      if (index >= 0) { reveal(key, index); panes[key].el.scrollIntoView({ block: 'nearest' }); }
    };
  }
  for (const item of document.querySelectorAll('.legend li')) {
    item.onclick = () => {
      const rule = Number(item.dataset.rule);
      const index = data.sides.R.rule.indexOf(rule);
      if (index >= 0) reveal('R', index);
    };
  }

  open(panes.L, -1);
  // When the first frame is drawn: the time from navigation start, read by the tests.
  requestAnimationFrame(() => setTimeout(() => {
    document.body.dataset.readyMs = performance.now().toFixed(0);
  }, 0));
})();
