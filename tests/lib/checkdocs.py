#!/usr/bin/env python3
"""make check-docs: the docs stay true to the code (issue 33, part 6).

Fails, one line per problem naming the file, the line and what to fix, when:

  flags    a flag `kwc --help` prints is not in docs/configuration.md's table
           for its --help group (a "### <Group> flags" section: `| --flag |
           default | ... |` rows), or a row there names a flag --help does not
           print, or a row's default is not the one --help prints.
  metrics  a metric family kwc exports is not in a table row of
           docs/operations.md, or a row names a kwc_ family kwc does not export.
  links    a relative link (inline, reference, image, <a href>/<img src>) in
           any *.md of the repository (node_modules, build and .git left out)
           does not resolve to a file inside the repository, or its #anchor to
           a heading of the target (GitHub's slugs: github_slug below) or an
           explicit <a name/id>.
  outside  a doc refers to files outside the repository: ../shared, /work,
           /home, /root, /tmp, file://, a link that climbs out of the tree, or a
           *.md named in prose that no file of the repository has (the
           developers' DESIGN.md, STYLE.md, TRAPS.md live outside it).
  alerts   a Prometheus rules file under conf/prometheus/ fails `promtool
           check rules` (when promtool is installed: make deps-test installs
           it), or an expression reads a kwc_ series kwc does not export.
  paths    a `code span` naming a path under one of the repository's top-level
           directories (bench/, conf/, docs/, tests/, proxy/, ...) that does
           not exist (nor a source it is built from: bench/ingest <- .c).

Which metric families kwc exports, decided: both a scrape and the source.
  - The scrape: apisim and kwc (--resources auto, plaintext, --auth none) on
    ephemeral loopback ports (tests/lib/cluster.py), a cached list and a
    discovery request made, then /metrics' `# TYPE` lines. That is what kwc
    really writes, names built at run time included, but only for that
    configuration: the authentication and authorization families are written
    only under --auth delegated (which needs TLS, certificates and a policy:
    seconds more for no more certainty).
  - The source: every "kwc_..." / "process_..." string literal under proxy/
    and cache/. Today every family is registered by a literal name (the
    scrape's 83 families + the 11 --auth delegated ones = the 94 literals),
    so the source covers the configurations the scrape does not; the scrape
    covers a family whose name is ever built at run time.
  The union is checked. A literal that is not a family would show up as a
  false "missing" and should be renamed or documented.
  No hidden kwc option (--print-metric-names) is added: that would be C for
  a test's sake, and would list what kwc registers, not what it writes.

--no-scrape skips the scrape (source literals only); --kwc names the binary
(default build/kwc). Exit status 1 on any problem, 2 on a usage error.
Stdlib only; run with Debian's /usr/bin/python3. Its unit test:
tests/lib/checkdocs_test.py (the slug, anchor, link and --help parsing).
"""
import argparse
import os
import re
import shutil
import subprocess
import sys
import unicodedata

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
SKIP_DIRS = {"node_modules", "build", ".git"}
CONFIG_DOC = "docs/configuration.md"
OPS_DOC = "docs/operations.md"


# ---------------------------------------------------------------- markdown

_FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,})")


def prose_lines(text):
    """(line number, line) of the lines outside fenced code blocks."""
    out, fence = [], None
    for n, line in enumerate(text.split("\n"), 1):
        m = _FENCE.match(line)
        if fence is None:
            if m:
                fence = m.group(1)[0] * len(m.group(1))
                continue
            out.append((n, line))
        elif m and m.group(1).startswith(fence) and line.strip() == m.group(1):
            fence = None
    return out


_CODE_SPAN = re.compile(r"(`+)(.+?)\1")


def strip_code_spans(line):
    return _CODE_SPAN.sub(lambda m: " " * len(m.group(0)), line)


def rendered_text(inline):
    """The text GitHub renders for a heading's inline markdown: code spans keep
    their content, links and images their text, emphasis markers and HTML tags
    go."""
    spans = []

    def keep(m):
        spans.append(m.group(2).strip() if m.group(2).strip() else m.group(2))
        return "\x00%d\x00" % (len(spans) - 1)

    s = _CODE_SPAN.sub(keep, inline)
    s = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", s)       # [text](url), ![alt](src)
    s = re.sub(r"!?\[([^\]]*)\]\[[^\]]*\]", r"\1", s)      # [text][ref]
    s = re.sub(r"<[^>]+>", "", s)                          # HTML tags
    s = re.sub(r"\\([!-/:-@\[-`{-~])", r"\1", s)           # backslash escapes
    s = re.sub(r"(\*\*|__)(?=\S)(.+?)(?<=\S)\1", r"\2", s)
    s = re.sub(r"(?<![\w*])\*(?=\S)(.+?)(?<=\S)\*(?![\w*])", r"\1", s)
    s = re.sub(r"(?<![\w_])_(?=\S)(.+?)(?<=\S)_(?![\w_])", r"\1", s)
    s = re.sub(r"~~(.+?)~~", r"\1", s)
    return re.sub(r"\x00(\d+)\x00", lambda m: spans[int(m.group(1))], s)


def github_slug(text):
    """GitHub's anchor for a heading's rendered text (github-slugger): lower
    case; every character that is not a letter, a digit, a combining mark, a
    connector (`_`), a hyphen or a space removed; each space a hyphen. Runs of
    hyphens stay ("a: `--b`" -> "a---b")."""
    out = []
    for ch in text.lower():
        cat = unicodedata.category(ch)
        if ch == " ":
            out.append("-")
        elif ch == "-" or cat[0] in "LNM" or cat == "Pc":
            out.append(ch)
    return "".join(out)


_ATX = re.compile(r"^ {0,3}(#{1,6})(?:[ \t]+(.*?))?(?:[ \t]+#+)?[ \t]*$")
_HTML_ANCHOR = re.compile(r"""<a\s[^>]*?(?:name|id)\s*=\s*["']([^"']+)["']""", re.I)


def headings(text):
    """[(line, level, rendered text)] of the ATX headings outside code."""
    out = []
    for n, line in prose_lines(text):
        m = _ATX.match(line)
        if m:
            out.append((n, len(m.group(1)), rendered_text((m.group(2) or "").strip())))
    return out


def anchors(text):
    """Every #fragment that leads somewhere in the document: the headings'
    slugs (a repeated one gets -1, -2, ... as on GitHub) and <a name/id>."""
    seen, out = {}, set()
    for _, _, t in headings(text):
        base = github_slug(t)
        slug = base
        if base in seen:
            seen[base] += 1
            slug = "%s-%d" % (base, seen[base])
            while slug in seen:
                seen[base] += 1
                slug = "%s-%d" % (base, seen[base])
        seen.setdefault(slug, 0)
        out.add(slug)
    for _, line in prose_lines(text):
        out.update(m.group(1) for m in _HTML_ANCHOR.finditer(line))
    return out


_INLINE_LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*(?:<([^<>\n]*)>|([^\s)]+))(?:\s+\"[^\"]*\")?\s*\)")
_REF_DEF = re.compile(r"^ {0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s+.*)?$")
_HTML_LINK = re.compile(r"""<(?:a|img)\s[^>]*?(?:href|src)\s*=\s*["']([^"']+)["']""", re.I)


def links(text):
    """[(line, target)] of every link outside code blocks and code spans."""
    out = []
    for n, line in prose_lines(text):
        s = strip_code_spans(line)
        found = [(m.start(), m.group(1) if m.group(1) is not None else m.group(2))
                 for m in _INLINE_LINK.finditer(s)]
        found += [(m.start(), m.group(1)) for m in _HTML_LINK.finditer(s)]
        m = _REF_DEF.match(s)
        if m:
            found.append((m.start(), m.group(1)))
        out.extend((n, t) for _, t in sorted(found))
    return out


def is_external(target):
    return re.match(r"^[a-zA-Z][a-zA-Z0-9+.-]*:", target) is not None and not target.startswith("file:")


def check_link(doc, target, root, anchor_cache):
    """None when the link resolves, else what is wrong. doc: the linking
    file's path relative to root."""
    if is_external(target):
        return None
    if target.startswith("file:"):
        return "a file:// link leaves the repository"
    path, _, frag = target.partition("#")
    path = re.sub(r"%([0-9A-Fa-f]{2})", lambda m: chr(int(m.group(1), 16)), path.split("?")[0])
    if path.startswith("/"):
        return "an absolute path: link relative to %s instead" % doc
    if path:
        full = os.path.normpath(os.path.join(root, os.path.dirname(doc), path))
        if not (full + os.sep).startswith(root + os.sep):
            return "leaves the repository (%s)" % path
        if not os.path.exists(full):
            return "no such file: %s" % os.path.relpath(full, root)
    else:
        full = os.path.join(root, doc)
    if frag:
        if not full.endswith(".md") or os.path.isdir(full):
            return None  # GitHub's line anchors (#L10) and the like: not checked
        if full not in anchor_cache:
            with open(full, encoding="utf-8") as f:
                anchor_cache[full] = anchors(f.read())
        want = re.sub(r"%([0-9A-Fa-f]{2})", lambda m: chr(int(m.group(1), 16)), frag)
        if want not in anchor_cache[full]:
            return "no heading #%s in %s" % (frag, os.path.relpath(full, root))
    return None


# Outside the repository: the developers' shared notes and this machine.
_OUTSIDE = re.compile(r"\.\./shared\b|(?<![\w.])/(?:work|home|root|tmp)(?:/|\b)|file://")
_MD_NAME = re.compile(r"(?<![\w./-])([A-Za-z0-9_.-]+\.md)\b")


def outside_refs(text, md_basenames):
    """[(line, what)] of references to files outside the repository."""
    out = []
    for n, line in enumerate(text.split("\n"), 1):
        for m in _OUTSIDE.finditer(line):
            out.append((n, "refers outside the repository: %r" % line[max(0, m.start() - 20):m.end() + 30].strip()))
    for n, line in prose_lines(text):
        for m in _MD_NAME.finditer(line):
            if m.group(1) not in md_basenames:
                out.append((n, "names %s, which is not in the repository" % m.group(1)))
    return out


def path_refs(text, root):
    """[(line, path)] of code spans naming a missing path under a top-level
    directory of the repository."""
    tops = sorted(d for d in os.listdir(root)
                  if os.path.isdir(os.path.join(root, d)) and d not in SKIP_DIRS and not d.startswith("."))
    rx = re.compile(r"^(?:%s)/[\w./-]*$" % "|".join(re.escape(t) for t in tops))
    out = []
    for n, line in prose_lines(text):
        for m in _CODE_SPAN.finditer(line):
            p = m.group(2).strip().split("#")[0].rstrip(":,")
            if not rx.match(p) or "node_modules" in p or re.search(r"\.\.\.|(?<![A-Za-z])(?:NAME|NN|N|X)(?![A-Za-z])", p):
                continue
            full = os.path.join(root, p)
            if os.path.exists(full) or any(os.path.exists(full + ext) for ext in (".c", ".py")):
                continue
            out.append((n, p))
    return out


# ---------------------------------------------------------------- --help

_GROUP = re.compile(r"^(\S.*) flags:$")
_FLAG = re.compile(r"^\s+(?:-(\w), )?--([a-z0-9][a-z0-9-]*)(?: (\w+))?(?:\s{2,}(.*))?$")


def help_flags(help_text):
    """[(group, flag, default or None)] in --help's order; flag is "--name".
    The default is pflag's "(default X)" at the end of the description (kwc's
    own "(default: ...)" prose is not one)."""
    out, group, cur = [], None, None

    def close():
        if cur:
            desc = " ".join(cur[2])
            m = re.search(r"\(default ((?:[^()]|\([^()]*\))*)\)\s*$", desc)
            out.append((cur[0], cur[1], m.group(1).strip() if m else None))

    for line in help_text.split("\n"):
        g = _GROUP.match(line)
        if g:
            close()
            cur, group = None, g.group(1)
            continue
        f = _FLAG.match(line) if group else None
        if f:
            close()
            cur = (group, "--" + f.group(2), [f.group(4) or ""])
        elif cur and line.strip():
            cur[2].append(line.strip())
        elif cur and not line.strip():
            close()
            cur = None
    close()
    return out


def _norm_default(s):
    return re.sub(r"[\s`\"]", "", s)


def config_tables(text):
    """{group: {flag: (line, default cell)}} of the `| --flag | default | ...`
    rows under each "### <Group> flags" heading of configuration.md."""
    out, group = {}, None
    for n, line in prose_lines(text):
        h = _ATX.match(line)
        if h:
            t = rendered_text((h.group(2) or "").strip())
            m = re.match(r"^(.*) flags$", t) if len(h.group(1)) == 3 else None
            group = m.group(1) if m else (group if len(h.group(1)) > 3 else None)
            if group is not None:
                out.setdefault(group, {})
            continue
        if group is None or not line.lstrip().startswith("|"):
            continue
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        m = re.match(r"^`(?:-\w, )?(--[a-z0-9-]+)[^`]*`", cells[0])
        if m:
            out[group][m.group(1)] = (n, cells[1] if len(cells) > 1 else "")
    return out


def check_flags(help_text, config_text):
    problems = []
    flags = help_flags(help_text)
    if not flags:
        return ["%s: kwc --help printed no flag groups (the check cannot read it)" % CONFIG_DOC]
    tables = config_tables(config_text)
    where = {f: g for g, rows in tables.items() for f in rows}
    known, missing = set(), set()
    for group, flag, default in flags:
        known.add(flag)
        rows = tables.get(group)
        if rows is None:
            if group not in missing:
                missing.add(group)
                problems.append("%s: no section \"### %s flags\" (--help's group of %s)" % (
                    CONFIG_DOC, group, ", ".join(f for g, f, _ in flags if g == group)))
        elif flag not in rows:
            if flag in where:
                problems.append("%s:%d: %s is under \"%s flags\"; --help puts it under \"%s flags\"" % (
                    CONFIG_DOC, tables[where[flag]][flag][0], flag, where[flag], group))
            else:
                problems.append("%s: %s (--help, %s flags) is missing: add a row to \"### %s flags\"" % (
                    CONFIG_DOC, flag, group, group))
        elif default is not None and _norm_default(default) not in _norm_default(rows[flag][1]):
            problems.append("%s:%d: %s's default cell %r does not say --help's default %s" % (
                CONFIG_DOC, rows[flag][0], flag, rows[flag][1], default))
    for group, rows in tables.items():
        for flag, (n, _) in rows.items():
            if flag not in known:
                problems.append("%s:%d: %s is not a flag kwc --help prints (renamed or removed?)" % (
                    CONFIG_DOC, n, flag))
    return problems


# ---------------------------------------------------------------- metrics

_TYPE = re.compile(r"^# TYPE ([a-zA-Z_:][a-zA-Z0-9_:]*) ")
_LITERAL = re.compile(r'"((?:kwc|process)_[a-z0-9_]+)"')


def source_families(root):
    out = set()
    for top in ("proxy", "cache"):
        for d, dirs, files in os.walk(os.path.join(root, top)):
            for fn in files:
                if fn.endswith(".c"):
                    with open(os.path.join(d, fn), encoding="utf-8") as f:
                        out.update(_LITERAL.findall(f.read()))
    return out


def scraped_families(kwc):
    """The families a real kwc writes, against apisim (see the header)."""
    sys.path.insert(0, os.path.join(ROOT, "tests", "lib"))
    os.environ.setdefault("KWC_BIN", kwc)
    import cluster  # noqa: E402 (needs KWC_BIN before import)
    with cluster.Env(auto=True, kwc_bin=kwc) as env:
        port = env.kwc.port
        for path in ("/api/v1/namespaces?resourceVersion=0", "/api/v1/pods?limit=1", "/version"):
            st, _, _ = cluster.http_request(port, "GET", path, timeout=30)
            if st != 200:
                raise RuntimeError("GET %s through kwc: %d" % (path, st))
        st, _, body = cluster.http_request(port, "GET", "/metrics", timeout=30)
        if st != 200:
            raise RuntimeError("GET /metrics: %d" % st)
        env.close()
    return {m.group(1) for m in map(_TYPE.match, body.decode().split("\n")) if m}


def ops_table_metrics(text):
    """{name: line} of the families named in table rows' first cells."""
    out = {}
    for n, line in prose_lines(text):
        if line.lstrip().startswith("|"):
            first = line.strip().strip("|").split("|")[0]
            for name in re.findall(r"`((?:kwc|process)_[a-z0-9_]+)`", first):
                out.setdefault(name, n)
    return out


def check_metrics(families, ops_text):
    problems = []
    table = ops_table_metrics(ops_text)
    for name in sorted(families - set(table)):
        problems.append("%s: metric %s (exported by kwc) is not in the metrics table: add a row" % (OPS_DOC, name))
    for name, n in sorted(table.items()):
        if name.startswith("kwc_") and name not in families:
            problems.append("%s:%d: metric %s is in the table but kwc does not export it" % (OPS_DOC, n, name))
    return problems


RULES_DIR = "conf/prometheus"
_SERIES = re.compile(r"\b(kwc_[a-z0-9_]+)")


def rule_series(text):
    """{(line, family)} of the kwc_ series the expr: lines of a rules file read
    (a histogram's _bucket, _sum and _count are its family's)."""
    out = set()
    for n, line in enumerate(text.split("\n"), 1):
        if re.match(r"^\s*expr:", line):
            for name in _SERIES.findall(line):
                out.add((n, re.sub(r"_(bucket|sum|count)$", "", name)))
    return out


def check_rules(root, families, promtool):
    problems = []
    d = os.path.join(root, RULES_DIR)
    files = sorted(f for f in os.listdir(d) if f.endswith((".yaml", ".yml"))) if os.path.isdir(d) else []
    for f in files:
        rel = os.path.join(RULES_DIR, f)
        with open(os.path.join(root, rel), encoding="utf-8") as fh:
            text = fh.read()
        for n, name in sorted(rule_series(text)):
            if name not in families:
                problems.append("%s:%d: reads %s, which kwc does not export" % (rel, n, name))
        if promtool:
            r = subprocess.run([promtool, "check", "rules", os.path.join(root, rel)],
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=60)
            if r.returncode != 0:
                problems.append("%s: promtool check rules failed: %s" % (rel, r.stdout.decode().strip()))
    return problems


# ---------------------------------------------------------------- main

def markdown_files(root):
    out = []
    for d, dirs, files in os.walk(root):
        dirs[:] = sorted(x for x in dirs if x not in SKIP_DIRS)
        out.extend(os.path.relpath(os.path.join(d, f), root) for f in sorted(files) if f.endswith(".md"))
    return out


def check_docs(root):
    problems, cache = [], {}
    docs = markdown_files(root)
    basenames = {os.path.basename(p) for p in docs}
    for doc in docs:
        with open(os.path.join(root, doc), encoding="utf-8") as f:
            text = f.read()
        for n, target in links(text):
            why = check_link(doc, target, root, cache)
            if why:
                problems.append("%s:%d: link (%s): %s" % (doc, n, target, why))
        for n, what in outside_refs(text, basenames):
            problems.append("%s:%d: %s" % (doc, n, what))
        for n, p in path_refs(text, root):
            problems.append("%s:%d: `%s` does not exist in the repository" % (doc, n, p))
    return problems


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--kwc", default=os.path.join(ROOT, "build", "kwc"))
    ap.add_argument("--no-scrape", action="store_true", help="metric families from the source only")
    args = ap.parse_args(argv)

    problems = check_docs(ROOT)
    with open(os.path.join(ROOT, CONFIG_DOC), encoding="utf-8") as f:
        config_text = f.read()
    with open(os.path.join(ROOT, OPS_DOC), encoding="utf-8") as f:
        ops_text = f.read()
    if not os.access(args.kwc, os.X_OK):
        print("check-docs: %s is not built (make all)" % args.kwc, file=sys.stderr)
        return 2
    help_text = subprocess.run([args.kwc, "--help"], stdout=subprocess.PIPE, check=True,
                               timeout=30).stdout.decode()
    problems += check_flags(help_text, config_text)
    families = source_families(ROOT)
    if not args.no_scrape:
        families |= scraped_families(os.path.abspath(args.kwc))
    problems += check_metrics(families, ops_text)
    promtool = shutil.which("promtool")
    if not promtool:
        print("check-docs: no promtool (make deps-test installs prometheus): rules files not checked by it",
              file=sys.stderr)
    problems += check_rules(ROOT, families, promtool)

    for p in problems:
        print(p)
    if problems:
        print("check-docs: %d problem(s): fix the docs (tests/lib/checkdocs.py says what each check wants)"
              % len(problems), file=sys.stderr)
        return 1
    print("check-docs: %d markdown files, %d flags, %d metric families: ok" % (
        len(markdown_files(ROOT)), len(help_flags(help_text)), len(families)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
