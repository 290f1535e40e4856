// The stylesheet's colour pairs meet WCAG AA for text (4.5:1) in every theme: each pair is
// a text colour on the background the stylesheet puts it on (badges on their tint, links
// and the current nav item on theirs, the primary button's label on the accent…). The
// colours are read from style/main.css itself, so a new shade is checked as it lands.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

const css = readFileSync(
  path.join(path.dirname(fileURLToPath(import.meta.url)), '..', '..', 'style', 'main.css'),
  'utf8',
);

// The custom properties set by the first rule whose selector is exactly `selector`.
function theme(selector) {
  const at = css.indexOf(`${selector} {`);
  assert.ok(at >= 0, `no rule for ${selector}`);
  const body = css.slice(at, css.indexOf('}', at));
  return Object.fromEntries([...body.matchAll(/--([\w-]+):\s*(#[0-9a-fA-F]{6})\s*;/g)].map((m) => [m[1], m[2]]));
}

const themes = {
  light: theme('.console'),
  'dark (system)': theme('.console[data-theme="system"]'),
  dark: theme('.console[data-theme="dark"]'),
};

function luminance(hex) {
  const [r, g, b] = [1, 3, 5].map((i) => {
    const c = parseInt(hex.slice(i, i + 2), 16) / 255;
    return c <= 0.04045 ? c / 12.92 : ((c + 0.055) / 1.055) ** 2.4;
  });
  return 0.2126 * r + 0.7152 * g + 0.0722 * b;
}

function contrast(a, b) {
  const [hi, lo] = [luminance(a), luminance(b)].sort((x, y) => y - x);
  return (hi + 0.05) / (lo + 0.05);
}

// [text, background]: where the stylesheet puts one on the other.
const pairs = [
  ['text', 'bg'], ['text', 'surface'], ['text', 'row-hover'],
  ['muted', 'bg'], ['muted', 'surface'], ['muted', 'idle-bg'], ['muted', 'row-hover'],
  ['accent', 'surface'], ['accent', 'bg'], ['accent', 'row-hover'], ['accent', 'run-bg'],
  ['run', 'run-bg'], ['run', 'surface'],
  ['ok', 'ok-bg'], ['ok', 'surface'],
  ['error', 'error-bg'], ['error', 'surface'],
  ['warn-text', 'warn-bg'], ['warn-text', 'surface'],
  ['on-accent', 'accent'],
];

test('the contrast computation matches WCAG', () => {
  assert.equal(contrast('#000000', '#ffffff').toFixed(1), '21.0');
  assert.equal(contrast('#777777', '#ffffff').toFixed(2), '4.48');
  // The light accent on its tint, as it was: the defect this test guards against.
  assert.equal(contrast('#0972d3', '#e8f2fc').toFixed(2), '4.25');
});

for (const [name, colours] of Object.entries(themes)) {
  test(`${name} theme: every text colour on its background reaches 4.5:1`, () => {
    const low = [];
    for (const [fg, bg] of pairs) {
      assert.ok(colours[fg] && colours[bg], `${name}: --${fg} or --${bg} is not set`);
      const ratio = contrast(colours[fg], colours[bg]);
      if (ratio < 4.5) low.push(`--${fg} ${colours[fg]} on --${bg} ${colours[bg]}: ${ratio.toFixed(2)}:1`);
    }
    assert.deepEqual(low, []);
  });
}
