// The course site's HTML: each page's MyST AST (what `myst build --site` wrote into
// _build/site/content/*.json) rendered with myst-to-html's mdast-to-hast handlers, plus handlers
// of our own for what the course's pages hold (notebook cells and their outputs, <details>
// answers, math as MathML, links between lessons), inside the course's page template.
//
//   node site/render.mjs MANIFEST.json
//
// MANIFEST (written by course_tools/site.py): {title, project, content, public, out,
// sections: [{title, pages: [source]}]}.
// Paths of pages are the project's source paths (index.md, start/00_start_here.ipynb); a page's
// HTML goes to the same path with .html, so every link is relative and the site works under any
// base URL (GitHub Pages serves a project site under /REPO/).
//
// Nothing here runs or fetches anything: the outputs are the executed notebooks' (images with the
// alt text course_tools/site.py wrote into their metadata, HTML already cleaned by its sanitizer).

import fs from 'node:fs';
import path from 'node:path';
import { mystToHast } from 'myst-to-html';
import { all } from 'mdast-util-to-hast';
import { unified } from 'unified';
import rehypeStringify from 'rehype-stringify';

const posix = path.posix;
const manifest = JSON.parse(fs.readFileSync(process.argv[2], 'utf8'));
const problems = [];

// ------------------------------------------------------------------ pages and their content
const pages = [];                                   // in the course's order
for (const section of manifest.sections) {
  for (const source of section.pages) pages.push({ source, section: section.title });
}
const bySource = new Map(pages.map((p) => [p.source, p]));
for (const file of fs.readdirSync(manifest.content)) {
  if (!file.endsWith('.json')) continue;
  const data = JSON.parse(fs.readFileSync(path.join(manifest.content, file), 'utf8'));
  const page = bySource.get((data.location || '').replace(/^\//, ''));
  if (page) page.data = data;
}
for (const page of pages) {
  if (!page.data) throw new Error(`myst wrote no content for ${page.source} in ${manifest.content}`);
  page.out = page.source.replace(/\.(ipynb|md)$/, '.html');
  page.title = page.data.frontmatter?.title || page.source;
  page.ids = new Set();
  page.jupyterAnchors = new Map();                  // JupyterLab's heading anchors -> our ids
  walk(page.data.mdast, (node) => {
    if (node.type === 'heading') {
      const id = node.html_id || node.identifier;
      page.ids.add(id);
      page.jupyterAnchors.set(plain(node).trim().replace(/ /g, '-'), id);
    } else if (node.identifier && (node.type === 'link' || node.type === 'mystTarget')) {
      page.ids.add(node.identifier);
    }
  });
}

function walk(node, fn) {
  fn(node);
  for (const child of node.children || []) walk(child, fn);
}

function plain(node) {
  if (node.type === 'text' || node.type === 'inlineCode') return node.value;
  return (node.children || []).map(plain).join('');
}

// ------------------------------------------------------------------ links
function fragment(frag, page) {
  if (!frag || page.ids.has(frag)) return frag;
  return page.jupyterAnchors.get(decodeURIComponent(frag)) || frag;
}

function copyStatic(rel) {
  const from = path.join(manifest.project, rel);
  if (!fs.existsSync(from)) return false;
  const to = path.join(manifest.out, rel);
  fs.mkdirSync(path.dirname(to), { recursive: true });
  fs.copyFileSync(from, to);
  return true;
}

function href(url, page) {
  if (!url) return url;
  if (/^[a-z][a-z0-9+.-]*:/i.test(url)) return url;          // https:, mailto:
  if (url.startsWith('#')) return '#' + fragment(url.slice(1), page);
  const [file, frag] = url.split('#');
  const target = posix.normalize(posix.join(posix.dirname(page.source), file));
  const here = posix.dirname(page.out);
  const other = bySource.get(target);
  if (other) {
    const rel = posix.relative(here, other.out) || posix.basename(other.out);
    return rel + (frag ? '#' + fragment(frag, other) : '');
  }
  if (!copyStatic(target)) problems.push(`${page.source}: link to ${url}: no such page or file`);
  return posix.relative(here, target) + (frag ? '#' + frag : '');
}

// ------------------------------------------------------------------ hast helpers
const el = (tagName, properties = {}, children = []) => ({ type: 'element', tagName, properties, children });
const text = (value) => ({ type: 'text', value });
const raw = (value) => ({ type: 'raw', value });
const ANSI = /\u001b\[[0-9;]*[A-Za-z]/g;
const joined = (v) => (Array.isArray(v) ? v.join('') : v || '');

function mathml(node, display) {
  const m = /<math[\s\S]*<\/math>/.exec(node.html || '');
  if (!m) {
    problems.push(`math not rendered: ${node.value}`);
    return el('code', {}, [text(node.value)]);
  }
  return raw(display ? m[0].replace('<math ', '<math display="block" ') : m[0]);
}

// ------------------------------------------------------------------ notebook outputs
function publicFile(p, page) {
  // an output file myst wrote into _build/site/public: copied to the site's _static folder
  const name = posix.basename(p);
  const to = path.join(manifest.out, '_static', name);
  fs.mkdirSync(path.dirname(to), { recursive: true });
  fs.copyFileSync(path.join(manifest.public, name), to);
  return posix.relative(posix.dirname(page.out), `_static/${name}`);
}

function content(entry) {
  return entry && typeof entry === 'object' ? joined(entry.content) : joined(entry);
}

function renderOutput(out, page) {
  const kind = out.output_type;
  if (kind === 'stream') {
    return el('pre', { className: ['output', out.name === 'stderr' ? 'stderr' : 'stdout'] },
      [text(joined(out.text).replace(ANSI, ''))]);
  }
  if (kind === 'error') {
    return el('pre', { className: ['output', 'error'] },
      [text(joined(out.traceback).replace(ANSI, '') || `${out.ename}: ${out.evalue}`)]);
  }
  const data = out.data || {};
  for (const mime of ['image/svg+xml', 'image/png', 'image/jpeg', 'image/gif']) {
    if (!data[mime]) continue;
    const alt = (out.metadata || {}).alt;
    if (!alt) problems.push(`${page.source}: an ${mime} output has no alt text`);
    const entry = data[mime];
    const src = entry.path ? publicFile(entry.path, page)
      : `data:${mime};base64,${content(entry).replace(/\s/g, '')}`;
    return el('figure', { className: ['output', 'figure'] }, [el('img', { src, alt: alt || '' })]);
  }
  if (data['text/html']) {
    // cleaned by course_tools.sanitize.clean when the page was made (course_tools/site.py)
    return el('div', { className: ['output', 'html'] }, [raw(content(data['text/html']))]);
  }
  if (data['text/plain']) {
    return el('pre', { className: ['output', 'result'] }, [text(content(data['text/plain']).replace(ANSI, ''))]);
  }
  problems.push(`${page.source}: an output of types ${Object.keys(data).join(', ')} is not shown`);
  return null;
}

// ------------------------------------------------------------------ mdast -> hast handlers
function handlers(page) {
  let lastDepth = 1;
  let tables = 0;
  return {
    block(h, node) {
      if (node.kind === 'notebook-code') return h(node, 'div', { className: ['cell'] }, all(h, node));
      return h(node, 'div', { className: ['cell', 'text'] }, all(h, node));
    },
    code(h, node) {
      const label = node.executable ? ['code', 'input'] : ['code'];
      return h(node, 'pre', { className: label },
        [h(node, 'code', node.lang ? { className: [`language-${node.lang}`] } : {}, [text(node.value || '')])]);
    },
    outputs(h, node) {
      const shown = (node.children || []).map((o) => renderOutput(o.jupyter_data || {}, page)).filter(Boolean);
      return shown.length ? h(node, 'div', { className: ['outputs'] }, shown) : null;
    },
    output(h, node) {
      return renderOutput(node.jupyter_data || {}, page);
    },
    heading(h, node) {
      // headings in order: a heading is at most one level below the one before it (the page's
      // title is the h1); a lesson's "### " straight under its title is shown as an h2
      const depth = Math.min(node.depth, lastDepth + 1);
      lastDepth = depth;
      return h(node, `h${depth}`, { id: node.html_id || node.identifier || undefined }, all(h, node));
    },
    link(h, node) {
      const url = node.urlSource ?? node.url;
      if (!url && node.identifier) return h(node, 'span', { id: node.identifier }, all(h, node));
      return h(node, 'a', { href: href(url, page) }, all(h, node));
    },
    crossReference(h, node) {
      if (node.remote && node.urlSource) return h(node, 'a', { href: href(node.urlSource, page) }, all(h, node));
      const id = node.html_id || node.identifier;
      return h(node, 'a', { href: `#${id}` }, all(h, node));
    },
    details(h, node) {
      return h(node, 'details', node.open ? { open: true } : {}, all(h, node));
    },
    summary(h, node) {
      return h(node, 'summary', {}, all(h, node));
    },
    inlineMath(h, node) { return mathml(node, false); },
    math(h, node) { return h(node, 'div', { className: ['math'] }, [mathml(node, true)]); },
    html(h, node) { return raw(node.value); },
    table(h, node) {
      // a wide table scrolls inside its own focusable region, not the page (200% zoom)
      const rows = (node.children || []).map((row) => h(row, 'tr', {},
        (row.children || []).map((cell) => {
          const th = cell.header && plain(cell).trim();      // an empty header cell is a plain cell
          return h(cell, th ? 'th' : 'td', th ? { scope: 'col' } : {}, all(h, cell));
        })));
      const head = rows.length && node.children[0].children?.every((c) => c.header) ? [rows.shift()] : [];
      const table = h(node, 'table', {}, [
        ...(head.length ? [el('thead', {}, head)] : []), el('tbody', {}, rows)]);
      tables += 1;                       // each region's name is its own: "Table 2: depth, lessons"
      const heads = head.length ? `: ${node.children[0].children.map((c) => plain(c).trim()).filter(Boolean).join(', ')}` : '';
      return el('div', { className: ['table'], tabindex: 0, role: 'region', 'aria-label': `Table ${tables}${heads}` }, [table]);
    },
    mystRole(h, node) {
      problems.push(`${page.source}: MyST role {${node.name}} is not rendered`);
      return h(node, 'code', {}, [text(node.value || '')]);
    },
    mystDirective(h, node) {
      problems.push(`${page.source}: MyST directive {${node.name}} is not rendered`);
      return h(node, 'pre', {}, [text(node.value || '')]);
    },
    comment() { return null; },
  };
}

// ------------------------------------------------------------------ the page template
function navigation(current) {
  const sections = manifest.sections.map((section, i) => {
    const items = section.pages.map((source) => {
      const p = bySource.get(source);
      const link = el('a', { href: posix.relative(posix.dirname(current.out), p.out) || p.out,
        ...(p === current ? { 'aria-current': 'page' } : {}) }, [text(p.title)]);
      return el('li', {}, [link]);
    });
    const id = `nav-${i}`;
    return el('li', {}, [el('span', { className: ['nav-section'], id }, [text(section.title)]),
      el('ul', { 'aria-labelledby': id }, items)]);
  });
  return el('nav', { className: ['site-nav'], id: 'contents', 'aria-label': 'Course contents' },
    [el('ul', {}, sections)]);
}

function pager(page) {
  const i = pages.indexOf(page);
  const link = (p, rel, word) => el('a', { href: posix.relative(posix.dirname(page.out), p.out) || p.out, rel },
    [el('span', { className: ['pager-word'] }, [text(word)]), text(p.title)]);
  const items = [];
  if (i > 0) items.push(link(pages[i - 1], 'prev', 'Previous: '));
  if (i < pages.length - 1) items.push(link(pages[i + 1], 'next', 'Next: '));
  return el('nav', { className: ['pager'], 'aria-label': 'Previous and next page' }, items);
}

function render(page) {
  const hast = mystToHast({ handlers: handlers(page), allowDangerousHtml: true })(page.data.mdast);
  const body = unified().use(rehypeStringify, { allowDangerousHtml: true }).stringify(hast);
  // the page first, the course's contents after it (shown beside it on a wide screen, below it
  // at 200% zoom, where a long list before the lesson would push it off the screen)
  const shell = el('div', { className: ['shell'] }, [
    el('main', { id: 'main', tabindex: -1 }, [
      el('h1', {}, [text(page.title)]),
      raw(body),
      pager(page),
    ]),
    navigation(page),
  ]);
  const up = posix.relative(posix.dirname(page.out), '.') || '.';
  const home = posix.relative(posix.dirname(page.out), 'index.html') || 'index.html';
  const chrome = unified().use(rehypeStringify, { allowDangerousHtml: true }).stringify({
    type: 'root',
    children: [
      el('a', { className: ['skip'], href: '#main' }, [text('Skip to the page content')]),
      el('header', { className: ['site-header'] }, [
        el('a', { href: home, className: ['site-title'] }, [text(manifest.title)]),
        el('a', { href: '#contents', className: ['contents-link'] }, [text('Course contents')])]),
      shell,
      el('footer', { className: ['site-footer'] }, [el('p', {}, [text(
        'Every page is a notebook of the course run with its outputs. Open a lesson on the course\'s ' +
        'JupyterHub from its first line to run it yourself.')])]),
    ],
  });
  const title = page.source === 'index.md' ? manifest.title : `${page.title} · ${manifest.title}`;
  return `<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>${escape(title)}</title>
<link rel="stylesheet" href="${up}/_static/course.css">
</head>
<body>
${chrome}
</body>
</html>
`;
}

function escape(s) {
  return s.replace(/&/g, '&amp;').replace(/</g, '&lt;').replace(/>/g, '&gt;').replace(/"/g, '&quot;');
}

// ------------------------------------------------------------------ write the site
fs.mkdirSync(path.join(manifest.out, '_static'), { recursive: true });
fs.copyFileSync(new URL('./course.css', import.meta.url), path.join(manifest.out, '_static', 'course.css'));
for (const page of pages) {
  const html = render(page);
  const to = path.join(manifest.out, page.out);
  fs.mkdirSync(path.dirname(to), { recursive: true });
  fs.writeFileSync(to, html);
}
if (problems.length) {
  console.error(`the site has ${problems.length} problem(s):\n` + problems.map((p) => `  ${p}`).join('\n'));
  process.exit(1);
}
console.log(`${pages.length} pages in ${manifest.out}`);
