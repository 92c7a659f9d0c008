() => {
  // Every visible element holding text of its own: its font size, and its contrast against the
  // background it is painted on (translucent layers and opacity composited up the tree).
  const parse = (c) => { const m = c.match(/rgba?\(([^)]+)\)/); if (!m) return null;
    const p = m[1].split(/[ ,\/]+/).filter(Boolean).map(Number); return [p[0], p[1], p[2], p.length > 3 ? p[3] : 1]; };
  const over = (top, bottom) => [0, 1, 2].map(i => top[i] * top[3] + bottom[i] * (1 - top[3])).concat([1]);
  const lum = (c) => { const f = (v) => { v /= 255; return v <= 0.03928 ? v / 12.92 : ((v + 0.055) / 1.055) ** 2.4; };
    return 0.2126 * f(c[0]) + 0.7152 * f(c[1]) + 0.0722 * f(c[2]); };
  const background = (el) => { const layers = [];
    for (let e = el; e && e.nodeType === 1; e = e.parentElement) {
      const c = parse(getComputedStyle(e).backgroundColor); if (c && c[3] > 0) layers.push(c);
      if (c && c[3] >= 1) break; }
    let bg = [255, 255, 255, 1]; for (const c of layers.reverse()) bg = over(c, bg); return bg; };
  const opacity = (el) => { let o = 1; for (let e = el; e && e.nodeType === 1; e = e.parentElement) o *= +getComputedStyle(e).opacity; return o; };
  const out = [];
  for (const el of document.body.querySelectorAll('*')) {
    if (['SCRIPT', 'STYLE', 'NOSCRIPT', 'OPTION'].includes(el.tagName)) continue;
    const own = [...el.childNodes].filter(n => n.nodeType === 3).map(n => n.textContent).join('').trim();
    if (!own) continue;
    const s = getComputedStyle(el), r = el.getBoundingClientRect();
    if (!r.width || !r.height || s.visibility === 'hidden' || el.closest('[aria-hidden=true]')) continue;
    const op = opacity(el); if (op === 0) continue;
    const svg = el instanceof SVGElement;
    const fg = parse(svg ? s.fill : s.color); if (!fg) continue;
    const bg = background(svg ? el.closest('.js-plotly-plot') || el : el);
    const shown = over([fg[0], fg[1], fg[2], fg[3] * op], bg);
    const [a, b] = [lum(shown), lum(bg)].sort((x, y) => y - x);
    const size = parseFloat(s.fontSize), bold = +s.fontWeight >= 700;
    out.push({text: own.slice(0, 50), tag: el.tagName, id: (el.closest('[id]') || {}).id || '', cls: String(el.className.baseVal ?? el.className).slice(0, 60),
              size, contrast: Math.round((a + 0.05) / (b + 0.05) * 100) / 100, large: size >= 24 || (bold && size >= 18.66),
              top: Math.round(r.top + window.scrollY)});
  }
  return out;
}
