#!/usr/bin/env python3
"""Unit tests of tests/lib/checkdocs.py's logic (make check-docs runs them
first): GitHub's heading slugs and duplicate anchors, which links are found
and how they resolve, references outside the repository, --help's groups and
defaults against configuration.md's tables, and the metrics table. No kwc, no
network: each case builds a small tree in a temporary directory."""
import os
import shutil
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import checkdocs as cd  # noqa: E402


class Slug(unittest.TestCase):
    def test_github_slugs(self):
        # each pair as GitHub renders the heading's anchor
        for heading, slug in [
            ("Limits of the front end", "limits-of-the-front-end"),
            ("Budgets: descriptors and memory under a flood", "budgets-descriptors-and-memory-under-a-flood"),
            ("HTTP/2", "http2"),
            ("Upgrading a single instance: `--takeover`", "upgrading-a-single-instance---takeover"),
            ("Protobuf (`application/vnd.kubernetes.protobuf`)", "protobuf-applicationvndkubernetesprotobuf"),
            ("kwc's own identity", "kwcs-own-identity"),
            ("The `kwc_cache_state` gauge", "the-kwc_cache_state-gauge"),
            ("**Bold** and *em* and [a link](x.md)", "bold-and-em-and-a-link"),
            ("Authentication, impersonation, authorization (`--policy`)",
             "authentication-impersonation-authorization---policy"),
            ("Über café 2", "über-café-2"),
            ("a  b", "a--b"),
        ]:
            self.assertEqual(cd.github_slug(cd.rendered_text(heading)), slug, heading)

    def test_duplicates_and_html_anchors(self):
        text = "# Notes\n## Notes\n## Notes\n## Notes-1\n<a name=\"here\"></a>\n"
        self.assertEqual(cd.anchors(text), {"notes", "notes-1", "notes-2", "notes-1-1", "here"})

    def test_headings_in_code_blocks_are_not_headings(self):
        text = "# Real\n```sh\n# a comment\n```\n~~~\n## not either\n~~~\n"
        self.assertEqual(cd.anchors(text), {"real"})


class Links(unittest.TestCase):
    def setUp(self):
        self.root = tempfile.mkdtemp(prefix="checkdocs-test-")
        os.makedirs(os.path.join(self.root, "docs"))
        os.makedirs(os.path.join(self.root, "bench", "results"))
        self.write("README.md", "# kwc\n## Serving TLS\n")
        self.write("docs/a.md", "# A\n## HTTP/2\n")
        self.write("bench/results/x.png", "")

    def tearDown(self):
        shutil.rmtree(self.root)

    def write(self, rel, text):
        with open(os.path.join(self.root, rel), "w", encoding="utf-8") as f:
            f.write(text)

    def check(self, doc, target):
        return cd.check_link(doc, target, self.root, {})

    def test_found_outside_code_only(self):
        text = ("see [a](docs/a.md) and ![img](x.png) `[not](a link)`\n"
                "```\n[nor](this.md)\n```\n[ref]: docs/b.md \"title\"\n"
                "<a href=\"c.md#x\">c</a> [text with [brackets]](d.md) [x](<e f.md>)\n")
        self.assertEqual([t for _, t in cd.links(text)],
                         ["docs/a.md", "x.png", "docs/b.md", "c.md#x", "d.md", "e f.md"])

    def test_resolution(self):
        self.assertIsNone(self.check("README.md", "docs/a.md"))
        self.assertIsNone(self.check("README.md", "docs/a.md#http2"))
        self.assertIsNone(self.check("docs/a.md", "../README.md#serving-tls"))
        self.assertIsNone(self.check("docs/a.md", "#a"))
        self.assertIsNone(self.check("docs/a.md", "../bench/results/x.png"))
        self.assertIsNone(self.check("docs/a.md", "https://kubernetes.io/docs/#x"))
        self.assertIn("no such file: docs/bench/results/x.png", self.check("docs/a.md", "bench/results/x.png"))
        self.assertIn("no heading #security", self.check("docs/a.md", "../README.md#security"))
        self.assertIn("no heading #http-2", self.check("docs/a.md", "#http-2"))
        self.assertIn("leaves the repository", self.check("docs/a.md", "../../shared/DESIGN.md"))
        self.assertIn("absolute path", self.check("docs/a.md", "/docs/a.md"))
        self.assertIn("file://", self.check("docs/a.md", "file:///etc/passwd"))

    def test_outside_references(self):
        text = ("the design (`../shared/DESIGN.md`)\nbuilt in /work/wt-x/build and /tmp/kwc-old\n"
                "see DESIGN.md and README.md\n/etc/kwc/kwc.yaml and /var/lib/kwc are fine\n")
        got = cd.outside_refs(text, {"README.md"})
        self.assertEqual([n for n, _ in got], [1, 2, 2, 3])
        self.assertIn("names DESIGN.md", got[3][1])

    def test_path_code_spans(self):
        os.makedirs(os.path.join(self.root, "bench", "src"))
        self.write("bench/ingest.c", "")
        text = ("`bench/results/x.png` `bench/ingest` `bench/results/gone.md` `docs/a.md#http2`\n"
                "`bench/NN_*.py` `bench/NAME_fuzz.c` `tests/x` `not/a/top/dir`\n")
        self.assertEqual(cd.path_refs(text, self.root), [(1, "bench/results/gone.md")])


HELP = """kwc is a watch-cache reverse proxy.

Usage:
  kwc [flags]

Serving flags:

      --listen string          address to serve on (default "127.0.0.1:8001")
      --idle-timeout duration  how long a keep-alive connection may wait
                               (0: none) (default 1m30s)
      --max-connections int    open client connections at most (0: what the
                               limit leaves; default: a quarter)

Cache flags:

      --resources-exclude strings   resources never cached (default
                                    [v1/events,events.k8s.io/v1/events,
                                    coordination.k8s.io/v1/leases])
  -h, --help                        help for kwc
"""

CONFIG = """# configuration
### Serving flags
| flag | default | what, and why |
|---|---|---|
| `--listen string` | `127.0.0.1:8001` | loopback |
| `--idle-timeout duration` | `1m30s` | Go's |
| `--max-connections int` | what the open-file limit leaves | |
### Cache flags
| flag | default | what |
|---|---|---|
| `--resources-exclude strings` | `[v1/events,events.k8s.io/v1/events,coordination.k8s.io/v1/leases]` | |
| `-h, --help` | | |
"""


class Flags(unittest.TestCase):
    def test_help_parsing(self):
        self.assertEqual(cd.help_flags(HELP), [
            ("Serving", "--listen", '"127.0.0.1:8001"'),
            ("Serving", "--idle-timeout", "1m30s"),
            ("Serving", "--max-connections", None),
            ("Cache", "--resources-exclude",
             "[v1/events,events.k8s.io/v1/events, coordination.k8s.io/v1/leases]"),
            ("Cache", "--help", None),
        ])

    def test_config_matches(self):
        self.assertEqual(cd.check_flags(HELP, CONFIG), [])

    def test_missing_flag_wrong_group_stale_row_wrong_default(self):
        config = CONFIG.replace("| `--idle-timeout duration` | `1m30s` | Go's |\n", "")
        self.assertIn("--idle-timeout (--help, Serving flags) is missing", "\n".join(cd.check_flags(HELP, config)))
        moved = CONFIG.replace("| `--listen string` | `127.0.0.1:8001` | loopback |\n", "").replace(
            "| `-h, --help` | | |", "| `-h, --help` | | |\n| `--listen` | `127.0.0.1:8001` | |")
        self.assertIn("--listen is under \"Cache flags\"; --help puts it under \"Serving flags\"",
                      "\n".join(cd.check_flags(HELP, moved)))
        stale = CONFIG + "| `--gone` | | |\n"
        self.assertIn("--gone is not a flag kwc --help prints", "\n".join(cd.check_flags(HELP, stale)))
        wrong = CONFIG.replace("| `1m30s` |", "| `90s` |")
        self.assertIn("--idle-timeout's default cell '`90s`' does not say --help's default 1m30s",
                      "\n".join(cd.check_flags(HELP, wrong)))
        nosection = CONFIG.replace("### Cache flags", "### Caching")
        self.assertIn('no section "### Cache flags"', "\n".join(cd.check_flags(HELP, nosection)))


class Metrics(unittest.TestCase):
    OPS = ("| metric | type |\n|---|---|\n| `kwc_a_total`, `kwc_b` | counter |\n"
           "| `process_open_fds` | |\nprose naming `kwc_c` is not a row\n")

    def test_table(self):
        self.assertEqual(cd.check_metrics({"kwc_a_total", "kwc_b", "process_open_fds"}, self.OPS), [])
        got = "\n".join(cd.check_metrics({"kwc_a_total", "kwc_c", "process_open_fds"}, self.OPS))
        self.assertIn("metric kwc_c (exported by kwc) is not in the metrics table", got)
        self.assertIn("metric kwc_b is in the table but kwc does not export it", got)


class Rules(unittest.TestCase):
    def test_series_in_expressions(self):
        text = ("groups:\n  - rules:\n      - alert: A\n        expr: kwc_a_total > 0 and kwc_h_bucket\n"
                "        annotations:\n          summary: kwc_not_an_expr\n")
        self.assertEqual(cd.rule_series(text), {(4, "kwc_a_total"), (4, "kwc_h")})


if __name__ == "__main__":
    unittest.main()
