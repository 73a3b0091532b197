#!/usr/bin/env python3
"""Checks the layering of the core crate (src/), the actors crate (actors/src/) and the
command line (cli/src/), and that docs/ARCHITECTURE.md draws it as the code has it.

Each crate is meant to be layered: a module may use the modules below it, never one
that (directly or through others) uses it back. This script reads every path into
the crate that its **/*.rs files name, fails on any import cycle in the graphs they
make, computes each module's layer and "uses" list, and compares them with the
layer diagrams and the tables' "uses" columns of docs/ARCHITECTURE.md, and the
Crates table's dependencies with each crate's Cargo.toml.

What counts as a module, at every level: the files and directories of one
directory are the modules of that level (src/x.rs, or the directory src/x/ as a
whole; src/x/mod.rs and everything under src/x/ are module `x` at the top level,
and src/x/a.rs, src/x/b/ are the modules `x::a`, `x::b` one level down). A use
between two files counts as an edge between the siblings that hold them, in the
directory where their paths part: `crate::x::a` using `crate::y::..` is an edge
x -> y; `crate::x::a` using `crate::x::b::c` is an edge x::a -> x::b. A parent
module (mod.rs) and the files under it use each other by design (the parent
re-exports a child, the child uses the parent's types), so uses between a module
and its own parent or children make no edge; a child that names `super::Foo`, where
the parent only imports or re-exports Foo from a sibling, makes an edge to that
sibling.

What counts as a dependency of a file, read with comments and string literals
removed:
  * every path of a `use crate::...;` item (braces expanded), and of a
    `use super::...;` / `use self::...;`;
  * every `crate::a::b` and `super::a::b` path written inline in code;
  * a name a module imports or re-exports (`use crate::Tensor`, `super::Joined`)
    counts as the module it is imported from;
  * in the actors crate and the command line, every path into another crate of the
    workspace (`rollout::a::b`, `rollout_actors::a`; a use or inline) counts as a use
    of that crate's top-level module it names (`rollout::Weights`, re-exported by the
    core's lib.rs, as `policy`; `rollout_actors::Collected`, which the actors crate
    re-exports from the core, as the core's `machine`).
Test-only code is not counted: a `#[cfg(test)]` (or `#[cfg(all(test, ..))]`)
module, inline or in a file of its own, may use whatever it needs to build its
fixtures. Binaries under src/bin/ are not part of the crate and are not read; a
binary crate's main.rs (no lib.rs beside it) is its root, as lib.rs is a library's.

A module's layer, among the modules of its directory: 0 if it uses none of them,
else one more than the highest layer of those it uses. Its "uses": the modules it
(any file under it) uses, named at the level where their paths part (a sibling of
`remote/listener` as `timing`, a top-level module as `metrics`), then another
crate's top-level modules after its label (`core:`, `rollout-actors:`).

What docs/ARCHITECTURE.md must say, found by markers (HTML comments, not shown
when the page is rendered):
  * `<!-- check-imports: layers DIR -->` before a code block: one line per layer,
    highest first, `N   name   dir/   ...`: the modules of DIR (src, actors/src,
    actors/src/remote, ...) in their layers;
  * `<!-- check-imports: uses DIR -->` before a table with a `module` column (first)
    and a `uses` column: a row per module of DIR (`pool`, `tensor/`), or per module
    of one of its folders (`remote/listener`: then every module of that folder has
    a row); its uses cell names the modules, each name optionally followed by a
    note in parentheses (`policy (Weights)`, compared by the name only), `—` for
    none, another crate's after its label (`messages; core: machine, rollout`); a row
    named by the directory itself (`cli/src/`) stands for the whole crate;
  * `<!-- check-imports: dependencies -->` before the Crates table: its `path`
    column (`src/`, `actors/`) names the crate's directory and its `depends on`
    column the crate's direct dependencies (`[dependencies]` of its Cargo.toml),
    each optionally followed by a note in parentheses.

Exit status: 0 with a one-line summary per crate when there is no cycle and the
document agrees with the code; 1 naming every cycle, with the lines that make each
of its edges, and every difference between the document and the code; 2 when a
path cannot be resolved to a module (so that the check never passes by not seeing
an edge).

Usage: scripts/check-imports.py [--src DIR ...] [--verbose] [--print] [--write] [--self-test]
  --print       each module's layer and uses, per directory
  --write       rewrites the layer diagrams, the uses cells (keeping the notes of
                names that remain) and the dependencies cells of the document
                from the code; adds a row for a module that has none (its
                description left for a person to write, which the check asks
                for) and names rows that name no module (left for a person to
                delete); exits 1 while such work is left
  --self-test   checks this script on a small crate and document of its own
"""

import argparse
import os
import re
import shutil
import sys
import tempfile

try:
    import tomllib
except ImportError:  # Python before 3.11: the names of [dependencies] read line by line
    tomllib = None

IDENT = r"[A-Za-z_][A-Za-z0-9_]*"


def strip_code(text):
    """`text` with comments, string and char literals blanked (newlines kept)."""
    out = []
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
            i = j
        elif text.startswith("/*", i):
            depth, j = 1, i + 2
            while j < n and depth:
                if text.startswith("/*", j):
                    depth, j = depth + 1, j + 2
                elif text.startswith("*/", j):
                    depth, j = depth - 1, j + 2
                else:
                    j += 1
            out.append("\n" * text.count("\n", i, j))
            i = j
        elif c == "r" and re.match(r'r#*"', text[i:i + 258]) and not re.match(r"[A-Za-z0-9_]", text[i - 1:i] or " "):
            hashes = re.match(r'r(#*)"', text[i:]).group(1)
            end = text.find('"' + hashes, i + len(hashes) + 2)
            j = n if end < 0 else end + 1 + len(hashes)
            out.append(" \"\"" + "\n" * text.count("\n", i, j))
            i = j
        elif c == '"':
            j = i + 1
            while j < n and text[j] != '"':
                j += 2 if text[j] == "\\" else 1
            out.append('""' + "\n" * text.count("\n", i, j))
            i = j + 1
        elif c == "'":
            # A char literal ('x', '\n', '\u{..}'), not a lifetime ('a).
            m = re.match(r"'(\\(u\{[0-9a-fA-F]+\}|x[0-9a-fA-F]{2}|.)|[^\\'])'", text[i:i + 12])
            if m:
                out.append("' '")
                i += m.end()
            else:
                out.append(c)
                i += 1
        else:
            out.append(c)
            i += 1
    return "".join(out)


def matching_brace(code, open_at):
    """Index just past the brace that closes the one at `open_at`."""
    depth = 0
    for j in range(open_at, len(code)):
        if code[j] == "{":
            depth += 1
        elif code[j] == "}":
            depth -= 1
            if depth == 0:
                return j + 1
    return len(code)


CFG_TEST = re.compile(r"#\[cfg\((?:test|all\(\s*test\s*,[^\]]*?\))\)\]\s*(?:#\[[^\]]*\]\s*)*(?:pub(?:\([^)]*\))?\s+)?mod\s+(" + IDENT + r")\s*([;{])")


def drop_test_modules(code):
    """`code` without its inline `#[cfg(test)]` modules (lines kept), and the names of
    the test modules it declares in files of their own."""
    file_mods = []
    while True:
        m = CFG_TEST.search(code)
        if not m:
            return code, file_mods
        if m.group(2) == ";":
            file_mods.append(m.group(1))
            end = m.end()
        else:
            end = matching_brace(code, m.end() - 1)
        code = code[:m.start()] + "\n" * code.count("\n", m.start(), end) + code[end:]


def expand_use(tree):
    """The paths of a use tree: `a::{self, b, c::{d, e}}` -> [a, a::b, a::c::d, a::c::e]."""
    tree = re.sub(r"\s+", "", re.sub(r"\s+as\s+", "@", tree))
    paths = []

    def walk(prefix, s):
        # Split `s` at top-level commas.
        depth, start, parts = 0, 0, []
        for j, ch in enumerate(s):
            if ch == "{":
                depth += 1
            elif ch == "}":
                depth -= 1
            elif ch == "," and depth == 0:
                parts.append(s[start:j])
                start = j + 1
        parts.append(s[start:])
        for p in parts:
            if not p:
                continue
            brace = p.find("{")
            if brace >= 0 and p.endswith("}"):
                head = [seg for seg in p[:brace].split("::") if seg]
                walk(prefix + head, p[brace + 1:-1])
            else:
                p = p.split("@")[0]  # `x as y` names x
                if p == "self" and prefix:  # `a::{self, ..}` names a itself
                    paths.append(list(prefix))
                    continue
                paths.append(prefix + [seg for seg in p.split("::") if seg and seg != "*"])

    walk([], tree)
    return paths


def module_of_file(src, path):
    """The module path of a source file: src/a/b.rs -> (a, b), src/a/mod.rs -> (a,)."""
    rel = os.path.relpath(path, src)[:-3].split(os.sep)
    if rel[-1] == "mod":
        rel = rel[:-1]
    if rel == ["lib"] or (rel == ["main"] and not os.path.exists(os.path.join(src, "lib.rs"))):
        rel = []
    return tuple(rel)


def level_edge(a, b):
    """The edge a use from module `a` to module `b` makes: between the two siblings
    that hold them, in the directory where their paths part; None when one holds the
    other (a parent and its children use each other by design)."""
    k = 0
    while k < len(a) and k < len(b) and a[k] == b[k]:
        k += 1
    if k == len(a) or k == len(b):
        return None
    return a[: k + 1], b[: k + 1]




class Crate:
    """One crate's source tree as read: its modules and every dependency of each file."""

    def __init__(self, src, repo, externals=()):
        """Reads the crate at `src` (paths shown relative to `repo`). `externals`:
        (name, Crate, label) of each crate this one uses, whose paths (`name::a::b`)
        are resolved to that crate's top-level modules too, shown after `label:`."""
        self.src, self.repo = src, repo
        self.name = self.rel(src)
        self.files = {}
        for root, dirs, names in os.walk(src):
            if os.path.normpath(root) == src:
                dirs[:] = [d for d in dirs if d != "bin"]
            dirs.sort()
            for name in sorted(names):
                if name.endswith(".rs"):
                    path = os.path.join(root, name)
                    self.files[module_of_file(src, path)] = path
        self.modules = set(self.files)

        # Read every file once: code without comments, strings and test modules.
        self.code_of, test_files = {}, set()
        for mod, path in self.files.items():
            with open(path, encoding="utf-8") as f:
                code, test_mods = drop_test_modules(strip_code(f.read()))
            self.code_of[mod] = code
            test_files.update(mod + (t,) for t in test_mods)
        # A test file's own children are test code too.
        self.test_files = {m for m in self.modules if any(m[: len(t)] == t for t in test_files)}

        # Names each module imports or re-exports: `use a::b::{X, Y};` -> X, Y from a::b;
        # and those it imports from another crate (`pub use rollout::machine::Collected`).
        self.imports, self.ext_imports = {}, {}
        ext_crates = {name: crate for name, crate, _ in externals}
        for mod, code in self.code_of.items():
            if mod in self.test_files:
                continue
            for m in re.finditer(r"\buse\s+([^;]+);", code):
                for p in expand_use(m.group(1)):
                    full = self.absolute(mod, p)
                    if full:
                        self.imports.setdefault(mod, {})[full[-1]] = tuple(full)
                    elif p and p[0] in ext_crates and len(p) > 1:
                        self.ext_imports[(mod, p[-1])] = (ext_crates[p[0]], tuple(p[1:]))

        self.deps = []  # (file's module, module it uses, "file:line")
        self.ext_deps = []  # (file's module, label, the external crate's top-level module, "file:line")
        self.labels = [label for _, _, label in externals]
        self.unresolved = []
        for mod, code in self.code_of.items():
            if mod in self.test_files:
                continue
            self._read_file(mod, code, externals)

        self.edges = {}  # (from, to) -> ["file:line", ...]
        for mod, target, where in self.deps:
            edge = level_edge(mod, target)
            if edge is not None:
                self.edges.setdefault(edge, []).append(where)

    def rel(self, path):
        return os.path.relpath(path, self.repo)

    def absolute(self, mod, p):
        """The crate-rooted form of use path `p` written in module `mod`, or None when
        it names another crate."""
        if not p:
            return None
        if p[0] == "crate":
            return list(p[1:])
        if p[0] in ("super", "self"):
            base, rest = list(mod), list(p)
            while rest and rest[0] in ("super", "self"):
                base, rest = (base[:-1] if rest[0] == "super" else base), rest[1:]
            return base + rest
        if tuple(mod) + (p[0],) in self.modules:  # `use child::X` (2018 paths)
            return list(mod) + list(p)
        return None

    def resolve(self, segs, depth=0):
        """The module a crate-rooted path names: the longest known module it starts
        with, following a name that module imports."""
        segs = tuple(segs)
        if not segs:
            return ()
        for k in range(len(segs), -1, -1):
            if segs[:k] in self.modules:
                head = segs[:k]
                if k < len(segs) and depth < 16:
                    target = self.imports.get(head, {}).get(segs[k])
                    if target is not None and target != segs[: k + 1]:
                        found = self.resolve(target + segs[k + 1:], depth + 1)
                        if found is not None:
                            return found
                if k:
                    return head
                # A name the crate root defines itself (a binary's `main.rs`).
                if () in self.modules and re.search(
                        r"\b(?:fn|struct|enum|trait|type|const|static|mod|union)\s+" + re.escape(segs[0]) + r"\b",
                        self.code_of.get((), "")):
                    return ()
                return None
        return None

    def resolve_reexport(self, segs):
        """(crate, module) for a path into this crate that names what it re-exports from
        another crate (`rollout_actors::Collected`, the core's `machine::Collected`)."""
        segs = tuple(segs)
        for k in range(len(segs) - 1, -1, -1):
            if segs[:k] in self.modules:
                found = self.ext_imports.get((segs[:k], segs[k]))
                if found:
                    crate, path = found
                    target = crate.resolve(path + segs[k + 1:])
                    return (crate, target) if target else None
                return None
        return None

    def _read_file(self, mod, code, externals):
        path = self.files[mod]

        def add(segs, line):
            target = self.resolve(segs)
            if target is None:
                self.unresolved.append(f"{self.rel(path)}:{line}: cannot resolve crate::{'::'.join(segs)}")
            else:
                self.deps.append((mod, target, f"{self.rel(path)}:{line}"))

        def add_ext(ext, segs, line):
            ext_name, crate, label = ext
            target = crate.resolve(segs)
            if not target:
                # Re-exported from a crate of its own, which this one names too: a use of that.
                found = crate.resolve_reexport(segs)
                if found:
                    for _, c2, label2 in externals:
                        if c2 is found[0]:
                            self.ext_deps.append((mod, label2, found[1][:1], f"{self.rel(path)}:{line}"))
                            return
            if not target:
                self.unresolved.append(f"{self.rel(path)}:{line}: cannot resolve {ext_name}::{'::'.join(segs)} "
                                       f"to a module of {crate.name}/")
            else:
                self.ext_deps.append((mod, label, target[:1], f"{self.rel(path)}:{line}"))
        ext_of = {e[0]: e for e in externals}

        # Inline modules (`mod x { .. }`): inside one, `super` is the file's module.
        inline = []
        for m in re.finditer(r"\bmod\s+(" + IDENT + r")\s*\{", code):
            inline.append((m.end() - 1, matching_brace(code, m.end() - 1), m.group(1)))

        def module_at(pos):
            return mod + tuple(name for start, end, name in inline if start < pos < end)
        line_at = lambda pos: code.count("\n", 0, pos) + 1
        used = []  # spans of `use` items, so inline scanning skips them
        for m in re.finditer(r"\buse\s+([^;]+);", code):
            used.append((m.start(), m.end()))
            for p in expand_use(m.group(1)):
                if p and p[0] in ("crate", "super", "self"):
                    add(self.absolute(module_at(m.start()), p), line_at(m.start()))
                elif p and p[0] in ext_of and len(p) > 1:
                    add_ext(ext_of[p[0]], p[1:], line_at(m.start()))
        in_use = lambda pos: any(s <= pos < e for s, e in used)
        for m in re.finditer(r"(?<![A-Za-z0-9_$:])crate((?:::" + IDENT + r")+)", code):
            if not in_use(m.start()):
                add([s for s in m.group(1).split("::") if s], line_at(m.start()))
        # Inline `super::a::b` paths (in code, not in a `use`): relative to the module
        # they are written in.
        for m in re.finditer(r"(?<![A-Za-z0-9_$:])((?:super::)+)(" + IDENT + r"(?:::" + IDENT + r")*)", code):
            if not in_use(m.start()):
                p = ["super"] * m.group(1).count("super") + m.group(2).split("::")
                add(self.absolute(module_at(m.start()), p), line_at(m.start()))
        for ext in externals:
            for m in re.finditer(r"(?<![A-Za-z0-9_$:.])" + ext[0] + r"((?:::" + IDENT + r")+)", code):
                if not in_use(m.start()):
                    add_ext(ext, [s for s in m.group(1).split("::") if s], line_at(m.start()))

    # --- what the document compares -------------------------------------------------

    def children(self, level):
        """The modules of directory `level` (a module path; () for the crate's root),
        test-only modules left out."""
        n = len(level)
        return sorted({m[: n + 1] for m in self.modules
                       if len(m) > n and m[:n] == level and m[: n + 1] not in self.test_files})

    def is_dir(self, mod):
        """Whether `mod` holds modules of its own (test-only ones not counted)."""
        return any(len(m) > len(mod) and m[: len(mod)] == mod and m not in self.test_files for m in self.modules)

    def layers(self, level):
        """{module: layer} for the modules of directory `level`."""
        kids = set(self.children(level))
        graph = {k: set() for k in kids}
        for a, b in self.edges:
            if a in kids and b in kids:
                graph[a].add(b)
        layer = {}

        def of(m, seen=()):
            if m not in layer:
                if m in seen:  # a cycle: reported by the cycle check
                    return 0
                layer[m] = 1 + max((of(u, seen + (m,)) for u in graph[m]), default=-1)
            return layer[m]
        for k in kids:
            of(k)
        return layer

    def uses(self, mod):
        """What module `mod` (every file under it) uses: (the crate's modules, each at
        the level where its path and mod's part; the external crate's top-level modules)."""
        inside = lambda m: m[: len(mod)] == mod
        own, ext = set(), {}
        for f, t, _ in self.deps:
            if inside(f) and not inside(t):
                edge = level_edge(f, t)
                if edge is not None:
                    own.add(edge[1])
        for f, label, t, _ in self.ext_deps:
            if inside(f):
                ext.setdefault(label, set()).add(t)
        return own, ext

    def uses_named(self, mod):
        """`uses(mod)` as the document names them: (the crate's names, the core's)."""
        own, ext = self.uses(mod)
        own_names = set(names_of(own, mod, self.children(mod[:-1])).values()) if mod else set()
        return own_names, {label: {t[0] for t in ts} for label, ts in ext.items()}


def names_of(mods, mod, siblings):
    """Module paths as the row of module `mod` names them: a sibling (one of
    `siblings`) by its name (`timing`), a module elsewhere by its last segment
    (`metrics`) unless a sibling or another of `mods` has that name: then in full
    (`crate::checkpoint`)."""
    taken = {}
    for m in mods:
        taken.setdefault(m[-1], []).append(m)
    names = {s[-1] for s in siblings} | {mod[-1]}
    return {m: (m[-1] if m[:-1] == mod[:-1] or (len(taken[m[-1]]) == 1 and m[-1] not in names)
                else "crate::" + "::".join(m)) for m in mods}


def check_cycles(crate, verbose):
    """The cycle check of one crate: (exit status, lines to print)."""
    out = []
    if crate.unresolved:
        out.append(f"check-imports: paths that name no module of {crate.name}/:")
        out.extend("  " + u for u in crate.unresolved)
        return 2, out
    edges = crate.edges
    graph = {}
    for a, b in edges:
        graph.setdefault(a, set()).add(b)
        graph.setdefault(b, set())
    name = lambda m: "::".join(m)
    if verbose:
        for (a, b), where in sorted(edges.items()):
            out.append(f"{name(a)} -> {name(b)}  ({where[0]}{', ...' if len(where) > 1 else ''})")
    # Strongly connected components (Tarjan, iterative).
    index, low, on, stack, sccs, counter = {}, {}, set(), [], [], [0]
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter[0]
        counter[0] += 1
        stack.append(root)
        on.add(root)
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is None:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[v])
                if low[v] == index[v]:
                    comp = []
                    while True:
                        x = stack.pop()
                        on.discard(x)
                        comp.append(x)
                        if x == v:
                            break
                    if len(comp) > 1:
                        sccs.append(sorted(comp))
            elif w not in index:
                index[w] = low[w] = counter[0]
                counter[0] += 1
                stack.append(w)
                on.add(w)
                work.append((w, iter(sorted(graph[w]))))
            elif w in on:
                low[v] = min(low[v], index[w])

    if not sccs:
        out.append(f"check-imports: {len(crate.children(()))} top-level modules of {crate.name}/ "
                   f"({len(crate.files)} files), {len(edges)} import edges between sibling modules, no cycle")
        return 0, out

    def shortest_cycle(start, members):
        """The shortest cycle from `start` back to it inside `members` (BFS)."""
        prev, frontier = {start: None}, [start]
        while frontier:
            nxt = []
            for v in frontier:
                for w in sorted(graph[v] & members):
                    if w == start:
                        path = [v]
                        while path[-1] != start:
                            path.append(prev[path[-1]])
                        return path[::-1] + [start]
                    if w not in prev:
                        prev[w] = v
                        nxt.append(w)
            frontier = nxt
        return None

    out.append(f"check-imports: {len(sccs)} group(s) of modules of {crate.name}/ that import each other in a cycle:")
    for comp in sccs:
        members = set(comp)
        out.append(f"  {', '.join(name(m) for m in comp)}; shortest cycles through each:")
        seen = set()
        for m in comp:
            cycle = shortest_cycle(m, members)
            key = frozenset(zip(cycle, cycle[1:]))
            if key in seen:
                continue
            seen.add(key)
            out.append(f"    {' -> '.join(name(x) for x in cycle)}")
            for a, b in zip(cycle, cycle[1:]):
                where = edges[(a, b)]
                more = f" (+{len(where) - 1} more)" if len(where) > 1 else ""
                out.append(f"      {name(a)} -> {name(b)}: {where[0]}{more}")
    return 1, out




# --- the document -------------------------------------------------------------------

MARKER = re.compile(r"<!--\s*check-imports:\s*(layers|uses|dependencies)(?:\s+(\S+?))?/?\s*-->")
NAME = r"[A-Za-z_][A-Za-z0-9_-]*(?:::[A-Za-z_][A-Za-z0-9_]*)*"
ITEM = re.compile(r"^`?(" + NAME + r")/?`?\s*(\(.*\))?$", re.S)
DASHES = ("—", "-", "–")
PLACEHOLDER = "*(to describe)*"


def split_top(s, seps):
    """`s` split at the characters of `seps` outside parentheses and backticks."""
    parts, depth, tick, start = [], 0, False, 0
    for j, ch in enumerate(s):
        if ch == "`":
            tick = not tick
        elif tick:
            continue
        elif ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        elif ch in seps and depth == 0:
            parts.append(s[start:j])
            start = j + 1
    parts.append(s[start:])
    return parts


def parse_items(text):
    """`a (note), b` -> [(a, "(note)"), (b, "")]; `—` or nothing -> []. Raises
    ValueError naming an item that is not a name with an optional note."""
    items = []
    for part in split_top(text, ","):
        part = part.strip()
        if not part:
            continue
        if part.split(" ")[0] in DASHES:
            continue
        m = ITEM.match(part)
        if not m:
            raise ValueError(f"cannot read {part!r} as a name with an optional note in parentheses")
        items.append((m.group(1), m.group(2) or ""))
    return items


def parse_uses(cell):
    """A uses cell -> (the crate's own names, {label: another crate's names}), each
    [(name, note)]: `a (note), b; core: c` -> ([a, b], {core: [c]})."""
    own, other = [], {}
    for section in split_top(cell, ";"):
        s = section.strip()
        m = re.match(r"^([A-Za-z][A-Za-z0-9_-]*)\s*:", s)
        if m:
            other.setdefault(m.group(1), []).extend(parse_items(s[m.end():]))
        else:
            own += parse_items(s)
    return own, other


def render_items(items):
    return ", ".join(f"{n} {note}" if note else n for n, note in items)


def render_uses(own, other, labels):
    """A uses cell: the crate's own items, then each other crate's after its label
    (in the order of `labels`); `—` for none."""
    sections = [render_items(own)] if own else []
    sections += [f"{label}: {render_items(other[label])}" for label in labels if other.get(label)]
    return "; ".join(sections) or "—"


def uses_text(own, other, labels):
    """What the code uses, as a sentence's end: names only."""
    return render_uses([(n, "") for n in sorted(own)], {k: [(n, "") for n in sorted(v)] for k, v in other.items()},
                       labels).replace("—", "nothing")


def merged(items, names):
    """The items of a cell rewritten to name exactly `names`: the items that remain,
    in their order and with their notes, then the new names, sorted."""
    kept = [(n, note) for n, note in items if n in names]
    have = {n for n, _ in kept}
    return kept + [(n, "") for n in sorted(names - have)]


def table_cells(line):
    """The cells of a Markdown table row (`|` inside backticks kept)."""
    cells = split_top(line.strip(), "|")
    if cells and not cells[0].strip():
        cells = cells[1:]
    if cells and not cells[-1].strip():
        cells = cells[:-1]
    return [c.strip() for c in cells]


def table_line(cells):
    return "| " + " | ".join(cells) + " |"


def block_after(lines, i, kind):
    """The (start, end) line indexes of the code block or table that follows marker
    line i (end exclusive), or None."""
    j = i + 1
    while j < len(lines) and not lines[j].strip():
        j += 1
    if kind == "layers":
        if j >= len(lines) or not lines[j].startswith("```"):
            return None
        k = j + 1
        while k < len(lines) and not lines[k].startswith("```"):
            k += 1
        return (j + 1, k) if k < len(lines) else None
    k = j
    while k < len(lines) and lines[k].lstrip().startswith("|"):
        k += 1
    return (j, k) if k - j >= 2 else None


def crate_of(crates, d):
    """The crate holding directory `d` (relative to the repository), and d's module path."""
    for c in sorted(crates.values(), key=lambda c: -len(c.name)):
        if d == c.name or d.startswith(c.name + "/"):
            rest = d[len(c.name) + 1:]
            return c, tuple(s for s in rest.split("/") if s)
    return None, None


def compare_doc(text, crates, repo, doc_name, write=False, cargo=True):
    """The differences between the document `text` and the code, and the text --write
    makes of it: (problems, new text, what is left for a person to do)."""
    lines = text.split("\n")
    markers = [(i, MARKER.search(line)) for i, line in enumerate(lines)]
    markers = [(i, m) for i, m in markers if m]
    groups, todo, seen = [], [], set()
    # Last marker first, so that a block --write resizes moves no marker still to do.
    for i, m in reversed(markers):
        problems = []
        groups.insert(0, problems)
        kind, d = m.group(1), (m.group(2) or "").rstrip("/")
        seen.add((kind, d))
        at = lambda n: f"{doc_name}:{n + 1}"
        span = block_after(lines, i, kind)
        if span is None:
            problems.append(f"{at(i)}: the {kind} marker is not followed by a "
                            f"{'code block' if kind == 'layers' else 'table'}")
            continue
        if kind == "dependencies":
            if cargo:
                check_dependencies(lines, span, repo, at, problems, write)
            continue
        crate, level = crate_of(crates, d)
        if crate is None or (level and not crate.is_dir(level)):
            problems.append(f"{at(i)}: {d}/ is no directory of a crate this script reads")
            continue
        if kind == "layers":
            check_layers(lines, span, crate, level, d, at, problems, write)
        else:
            check_uses(lines, span, crate, level, d, at, problems, todo, write)
    problems = [p for g in groups for p in g]
    for c in crates.values():
        for kind in c.required:
            if (kind, c.name) not in seen:
                problems.append(f"{doc_name}: no `<!-- check-imports: {kind} {c.name} -->` marker")
    if cargo and ("dependencies", "") not in seen:
        problems.append(f"{doc_name}: no `<!-- check-imports: dependencies -->` marker")
    return problems, "\n".join(lines), todo


def check_layers(lines, span, crate, level, d, at, problems, write):
    start, end = span
    code = crate.layers(level)
    drawn = {}
    for n in range(start, end):
        if not lines[n].strip():
            continue
        m = re.match(r"^\s*(\d+)\s+(.*)$", lines[n])
        if not m:
            problems.append(f"{at(n)}: layers of {d}/: cannot read this line (`N   name   dir/ ...`)")
            continue
        for token in m.group(2).split():
            name = token.rstrip("/")
            mod = level + (name,)
            drawn[mod] = int(m.group(1))
            if mod not in code:
                problems.append(f"{at(n)}: layers of {d}/: `{token}` is no module of {d}/")
            elif token.endswith("/") != crate.is_dir(mod):
                problems.append(f"{at(n)}: layers of {d}/: `{token}` is "
                                f"{'a directory: `' + name + '/`' if crate.is_dir(mod) else 'a file: `' + name + '`'}")
    for mod, layer in sorted(code.items(), key=lambda kv: (-kv[1], kv[0])):
        name = mod[-1]
        if mod not in drawn:
            problems.append(f"{at(start - 1)}: layers of {d}/: `{name}` is not drawn; the code puts it in layer {layer}")
        elif drawn[mod] != layer:
            problems.append(f"{at(start - 1)}: layers of {d}/: `{name}` is drawn in layer {drawn[mod]}; "
                            f"the code puts it in layer {layer}")
    if write:
        top = max(code.values(), default=-1)
        new = []
        for layer in range(top, -1, -1):
            mods = sorted(m for m in code if code[m] == layer)
            new.append(f"{layer:>2}   " + "   ".join(m[-1] + ("/" if crate.is_dir(m) else "") for m in mods))
        lines[start:end] = new


def check_uses(lines, span, crate, level, d, at, problems, todo, write):
    start, end = span
    header = [c.lower() for c in table_cells(lines[start])]
    if "uses" not in header:
        problems.append(f"{at(start)}: the table of {d}/ has no `uses` column")
        return
    col = header.index("uses")
    rows = {}
    for n in range(start + 2, end):
        cells = table_cells(lines[n])
        m = re.match(r"^`([^`]+)`$", cells[0]) if cells else None
        if not m or len(cells) <= col:
            problems.append(f"{at(n)}: the table of {d}/: a row must name one module (`name`) and have a uses cell")
            continue
        name = m.group(1)
        # A row named by the table's directory itself stands for the whole crate (the CLI's).
        whole = name.rstrip("/") == d and not level
        mod = () if whole else level + tuple(s for s in name.rstrip("/").split("/") if s)
        if mod in rows:
            problems.append(f"{at(n)}: the table of {d}/: `{name}` has two rows")
        rows[mod] = n
        if not whole and not (mod in crate.children(mod[:-1]) if mod else False):
            problems.append(f"{at(n)}: the table of {d}/: `{name}` is no module of {crate.name}/; "
                            f"delete its row or name the module it describes")
            if write:
                todo.append(f"{at(n)}: delete the row of `{name}` or name the module it describes")
            continue
        if not whole and name.endswith("/") != crate.is_dir(mod):
            right = name.rstrip("/") + ("/" if crate.is_dir(mod) else "")
            problems.append(f"{at(n)}: the table of {d}/: `{name}` is a {'directory' if crate.is_dir(mod) else 'file'}: `{right}`")
            if write:
                cells[0] = f"`{right}`"
                lines[n] = table_line(cells)
        if cells[1] == PLACEHOLDER:
            problems.append(f"{at(n)}: the table of {d}/: what `{name}` holds is still to be written")
        try:
            own_items, other_items = parse_uses(cells[col])
        except ValueError as e:
            problems.append(f"{at(n)}: `{name}` uses: {e}")
            continue
        unknown = sorted(set(other_items) - set(crate.labels))
        if unknown:
            problems.append(f"{at(n)}: `{name}` uses: {', '.join(u + ':' for u in unknown)} names no crate "
                            f"{crate.name}/ is read with (" + (", ".join(crate.labels) or "none") + ")")
            continue
        code_own, code_other = crate.uses_named(mod)
        wanted = [("", {n_ for n_, _ in own_items}, code_own)]
        wanted += [(label + " ", {n_ for n_, _ in other_items.get(label, [])}, code_other.get(label, set()))
                   for label in crate.labels]
        if any(have != want for _, have, want in wanted):
            diff = []
            for label, have, want in wanted:
                if want - have:
                    diff.append(f"{label}not named: {', '.join(sorted(want - have))}")
                if have - want:
                    diff.append(f"{label}not used: {', '.join(sorted(have - want))}")
            problems.append(f"{at(n)}: `{name}` uses {cells[col]} but the code uses "
                            f"{uses_text(code_own, code_other, crate.labels)} ({'; '.join(diff)})")
        if write:
            other_new = {label: merged(other_items.get(label, []), code_other.get(label, set()))
                         for label in crate.labels}
            cells[col] = render_uses(merged(own_items, code_own), other_new, crate.labels)
            lines[n] = table_line(cells)

    # Every module of the level has a row, or, for a folder, every module in it has.
    missing = []

    def cover(mod):
        if mod in rows:
            return
        if crate.is_dir(mod) and any(r[: len(mod)] == mod and len(r) > len(mod) for r in rows):
            for k in crate.children(mod):
                cover(k)
        else:
            missing.append(mod)
    if () not in rows:
        for k in crate.children(level):
            cover(k)
    new_rows = []  # (line index to insert before, row)
    ncols = len(header)
    for mod in missing:
        name = "/".join(mod[len(level):]) + ("/" if crate.is_dir(mod) else "")
        problems.append(f"{at(start)}: the table of {d}/ has no row for `{name}`")
        if write:
            own, other = crate.uses_named(mod)
            cells = [f"`{name}`", PLACEHOLDER] + [""] * (ncols - 2)
            cells[col] = render_uses([(n_, "") for n_ in sorted(own)],
                                     {k: [(n_, "") for n_ in sorted(v)] for k, v in other.items()}, crate.labels)
            # After the last row of its folder, if it has one; else at the table's end.
            after = [n for r, n in rows.items() if r[:-1] == mod[:-1] and len(mod) > len(level) + 1]
            new_rows.append((max(after) + 1 if after else end, table_line(cells)))
            todo.append(f"{at(start)}: describe `{name}` in the row added for it (what it holds)")
    for at_line, row in sorted(new_rows, key=lambda r: -r[0]):
        lines[at_line:at_line] = [row]


def read_manifest(path):
    """A Cargo.toml's package name and the names of its [dependencies]."""
    with open(path, "rb") as f:
        data = f.read()
    if tomllib is not None:
        return tomllib.loads(data.decode("utf-8"))  # TOMLDecodeError is a ValueError
    manifest, section = {"package": {}, "dependencies": {}}, None
    for line in data.decode("utf-8").splitlines():
        line = line.split("#", 1)[0].strip()
        m = re.match(r"^\[([^\]]+)\]$", line)
        if m:
            section = m.group(1).strip()
        elif "=" in line and section == "dependencies":
            manifest["dependencies"][line.split("=", 1)[0].strip().split(".")[0]] = True
        elif section == "package" and re.match(r"^name\s*=", line):
            manifest["package"]["name"] = line.split("=", 1)[1].strip().strip('"')
    return manifest


def check_dependencies(lines, span, repo, at, problems, write):
    start, end = span
    header = [c.lower() for c in table_cells(lines[start])]
    if "path" not in header or "depends on" not in header:
        problems.append(f"{at(start)}: the Crates table needs a `path` and a `depends on` column")
        return
    pcol, dcol = header.index("path"), header.index("depends on")
    for n in range(start + 2, end):
        cells = table_cells(lines[n])
        if len(cells) <= max(pcol, dcol):
            problems.append(f"{at(n)}: this row has no path or depends-on cell")
            continue
        # The crate's manifest: in its directory, or above it (the core's `src/`).
        d = os.path.normpath(os.path.join(repo, cells[pcol].strip("`").rstrip("/") or "."))
        while not os.path.exists(os.path.join(d, "Cargo.toml")) and d != os.path.normpath(repo):
            d = os.path.dirname(d)
        toml = os.path.join(d, "Cargo.toml")
        path = os.path.relpath(d, repo)
        try:
            manifest = read_manifest(toml)
        except (OSError, ValueError) as e:
            problems.append(f"{at(n)}: cannot read {os.path.relpath(toml, repo)}: {e}")
            continue
        code = set(manifest.get("dependencies", {}))
        name = manifest.get("package", {}).get("name", path)
        try:
            items = parse_items(cells[dcol].replace(";", ","))
        except ValueError as e:
            problems.append(f"{at(n)}: `{name}` depends on: {e}")
            continue
        have = {n_ for n_, _ in items}
        if have != code:
            diff = []
            if code - have:
                diff.append(f"not named: {', '.join(sorted(code - have))}")
            if have - code:
                diff.append(f"not in its Cargo.toml: {', '.join(sorted(have - code))}")
            problems.append(f"{at(n)}: `{name}` depends on {', '.join(sorted(have))} but its Cargo.toml's "
                            f"[dependencies] are {', '.join(sorted(code))} ({'; '.join(diff)})")
        if write:
            cells[dcol] = render_items(merged(items, code)) or "—"
            lines[n] = table_line(cells)


# --- running it ---------------------------------------------------------------------

# The crates read by default: (source directory, the crates whose paths it names, each
# (name in paths, source directory, label in the uses cells), what the document must
# draw of it: its layers and a uses table, or only the uses).
CRATES = [
    ("src", [], ("layers", "uses")),
    ("actors/src", [("rollout", "src", "core")], ("layers", "uses")),
    ("cli/src", [("rollout_actors", "actors/src", "rollout-actors"), ("rollout", "src", "core")], ("uses",)),
]
DOC = os.path.join("docs", "ARCHITECTURE.md")


def read_crates(root, specs):
    """The crates of `specs` (see CRATES), read."""
    crates = {}
    for d, externals, required in specs:
        crate = Crate(os.path.normpath(os.path.join(root, d)), root,
                      [(name, crates[src], label) for name, src, label in externals])
        crate.required = required
        crates[d] = crate
    return crates


def print_layers(crate):
    """Each directory's modules with their layers and uses, highest layer first."""
    out = []
    levels = [()] + sorted(m for m in crate.modules if m and crate.is_dir(m) and m not in crate.test_files)
    for level in levels:
        layers = crate.layers(level)
        if not layers:
            continue
        d = "/".join((crate.name,) + level)
        out.append(f"{d}/: {max(layers.values()) + 1} layers")
        for mod in sorted(layers, key=lambda m: (-layers[m], m)):
            uses = uses_text(*crate.uses_named(mod), crate.labels)
            name = mod[-1] + ("/" if crate.is_dir(mod) else "")
            out.append(f"  {layers[mod]:>2}  {name:<18} uses {uses}")
    return out


def run(root, specs, doc, verbose=False, show=False, write=False, out=sys.stdout, err=sys.stderr):
    """Checks the crates `specs` of the repository at `root`, and the document `doc`
    (relative to root; None: no document) against them. Returns the exit status."""
    crates = read_crates(root, specs)
    status = 0
    for crate in crates.values():
        code, lines = check_cycles(crate, verbose)
        for line in lines:
            print(line, file=err if code == 2 else out)
        status = max(status, code)
    if show and status == 0:
        for crate in crates.values():
            for line in print_layers(crate):
                print(line, file=out)
    if doc is None:
        return status
    if status != 0:
        print(f"check-imports: {doc} not compared: the layers are only defined without a cycle", file=out)
        return status
    path = os.path.join(root, doc)
    with open(path, encoding="utf-8") as f:
        text = f.read()
    problems, new_text, _ = compare_doc(text, crates, root, doc, write=write)
    if write:
        if new_text != text:
            with open(path, "w", encoding="utf-8") as f:
                f.write(new_text)
            print(f"check-imports: rewrote the layer diagrams, uses and dependencies of {doc} from the code", file=out)
        problems, _, _ = compare_doc(new_text, crates, root, doc)
        if problems:
            print(f"check-imports: left for a person to do in {doc} (`--write` writes no prose):", file=out)
            for p in problems:
                print("  " + p, file=out)
            return 1
    if problems:
        print(f"check-imports: {doc} differs from the code in {len(problems)} place(s) "
              f"(`scripts/check-imports.py --write` rewrites what it can):", file=out)
        for p in problems:
            print("  " + p, file=out)
        return 1
    print(f"check-imports: {doc} draws the layers and uses of {', '.join(c + '/' for c in crates)} "
          f"and the crates' dependencies as the code has them", file=out)
    return 0


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    root = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    ap.add_argument("--src", action="append",
                    help="a crate's source directory, checked for cycles only "
                         "(repeatable; default: src and actors/src, and the document)")
    ap.add_argument("--verbose", action="store_true", help="print every edge")
    ap.add_argument("--print", dest="show", action="store_true", help="print each module's layer and uses")
    ap.add_argument("--write", action="store_true",
                    help=f"rewrite {DOC}'s layer diagrams, uses and dependencies from the code")
    ap.add_argument("--self-test", action="store_true", help="check this script on a crate of its own")
    args = ap.parse_args()
    if args.self_test:
        return self_test()
    if args.src:
        specs = [(os.path.relpath(os.path.abspath(s), root), [], ()) for s in args.src]
        return run(root, specs, None, args.verbose, args.show)
    return run(root, CRATES, DOC, args.verbose, args.show, args.write)


# --- the self-test ------------------------------------------------------------------

SELF_TEST_FILES = {
    "Cargo.toml": '[package]\nname = "rollout"\n[dependencies]\nserde = "1"\nrand = "0.9"\n',
    "src/lib.rs": "pub mod a;\npub mod b;\npub mod c;\npub use b::Thing;\n",
    "src/a.rs": "use crate::Thing;\npub fn f() -> Thing { Thing }\n",
    "src/b.rs": "/// Uses crate::c in a comment only.\npub struct Thing;\n",
    "src/c/mod.rs": "mod x;\nmod y;\n#[cfg(test)]\nmod tests;\n",
    "src/c/x.rs": "use super::y::Z;\npub fn g() -> Z { crate::a::f(); Z }\n",
    "src/c/y.rs": "pub struct Z;\n",
    "src/c/tests.rs": "use crate::b::Thing;\n",
    "ext/Cargo.toml": '[package]\nname = "ext"\n[dependencies]\nrollout = { path = ".." }\n',
    "ext/src/p.rs": "use rollout::Thing;\nuse crate::q::Q;\n",
    "ext/src/q.rs": "pub struct Q(rollout::c::Y);\n",
    "ext/src/lib.rs": "pub mod p;\npub mod q;\npub use rollout::b::Thing;\n",
    "bin/Cargo.toml": '[package]\nname = "bin"\n[dependencies]\next = { path = "../ext" }\nrollout = { path = ".." }\n',
    "bin/src/main.rs": "mod run;\nstruct Args;\nfn main() { run::go(crate::Args); }\n",
    "bin/src/run.rs": "use ext::Thing;\nuse ext::q::Q;\npub fn go(_: crate::Args) { rollout::a::f(); }\n",
}

SELF_TEST_DOC = """# Map

<!-- check-imports: dependencies -->
| crate | path | depends on |
|---|---|---|
| `rollout` | `src/` | serde (derive), rand |
| `ext` | `ext/` | rollout |
| `bin` | `bin/` | ext, rollout |

<!-- check-imports: layers src -->
```
 2   c/
 1   a
 0   b
```

<!-- check-imports: uses src -->
| module | holds | uses |
|---|---|---|
| `a` | f | b (`Thing`) |
| `b` | Thing | — |
| `c/x` | g | y, a (`f`) |
| `c/y` | Z | — |

<!-- check-imports: layers src/c -->
```
 1   x
 0   y
```

<!-- check-imports: layers ext/src -->
```
 1   p
 0   q
```

<!-- check-imports: uses ext/src -->
| module | holds | uses |
|---|---|---|
| `p` | P | q; core: b (`Thing`) |
| `q` | Q | core: c |

<!-- check-imports: uses bin/src -->
| module | holds | uses |
|---|---|---|
| `bin/src/` | the binary | ext: q; core: a, b (`Thing`, through ext) |
"""


def self_test():
    """Checks the script on a small repository: a right document passes, each kind of
    wrong one fails naming the difference, --write makes a wrong one right and keeps
    its notes, and a cycle or an unresolved path fails with its exit status."""
    failures = []

    def expect(what, cond):
        if not cond:
            failures.append(what)

    specs = [("src", [], ("layers", "uses")), ("ext/src", [("rollout", "src", "core")], ("layers", "uses")),
             ("bin/src", [("ext", "ext/src", "ext"), ("rollout", "src", "core")], ("uses",))]
    tmp = tempfile.mkdtemp(prefix="check-imports-")
    try:
        for rel, text in SELF_TEST_FILES.items():
            os.makedirs(os.path.dirname(os.path.join(tmp, rel)), exist_ok=True)
            with open(os.path.join(tmp, rel), "w", encoding="utf-8") as f:
                f.write(text)
        crates = read_crates(tmp, specs)
        check = lambda text: compare_doc(text, crates, tmp, "MAP.md")[0]
        problems = check(SELF_TEST_DOC)
        expect(f"the right document passes (got {problems})", problems == [])

        cases = [
            ("a uses cell naming a module the code does not use",
             ("| `a` | f | b (`Thing`) |", "| `a` | f | b (`Thing`), c |"), ["`a` uses", "not used: c"]),
            ("a uses cell missing a module the code uses",
             ("| `c/x` | g | y, a (`f`) |", "| `c/x` | g | y |"), ["`c/x` uses", "not named: a"]),
            ("a core use missing", ("| `q` | Q | core: c |", "| `q` | Q | — |"), ["`q` uses", "core not named: c"]),
            ("a module drawn in the wrong layer", (" 1   a\n 0   b", " 1   a   b\n"), ["`b` is drawn in layer 1"]),
            ("a module not drawn", (" 1   x\n 0   y", " 1   x"), ["`y` is not drawn"]),
            ("a directory drawn as a file", (" 2   c/", " 2   c"), ["`c` is a directory"]),
            ("a file named as a directory in a table", ("| `a` | f |", "| `a/` | f |"), ["`a/` is a file: `a`"]),
            ("a module with no row", ("| `c/y` | Z | — |\n", ""), ["no row for `c/y`"]),
            ("a row for no module", ("| `b` | Thing | — |", "| `b` | Thing | — |\n| `gone` | x | — |"),
             ["`gone` is no module"]),
            ("a dependency not named", ("| serde (derive), rand |", "| serde (derive) |"), ["not named: rand"]),
            ("a dependency not in Cargo.toml", ("| rollout |", "| rollout, tokio |"), ["not in its Cargo.toml: tokio"]),
            ("a whole crate's use of another crate missing",
             ("| ext: q; core: a, b", "| ext: q; core: a"), ["`bin/src/` uses", "core not named: b"]),
            ("a label naming no crate", ("| ext: q; core: a, b", "| ext: q; other: x; core: a, b"),
             ["other: names no crate"]),
            ("a missing marker", ("<!-- check-imports: layers ext/src -->", ""), ["no `<!-- check-imports: layers ext/src -->`"]),
        ]
        for what, (old, new), wanted in cases:
            expect(f"self-test text of {what!r} is found", old in SELF_TEST_DOC)
            problems = check(SELF_TEST_DOC.replace(old, new, 1))
            expect(f"{what}: fails naming it (got {problems})",
                   problems and all(any(w in p for p in problems) for w in wanted))

        # --write: every case above but the marker and the row for no module made right.
        wrong = SELF_TEST_DOC
        for what, (old, new), _ in cases:
            if "marker" not in what and "no module" not in what:
                wrong = wrong.replace(old, new, 1)
        _, written, todo = compare_doc(wrong, crates, tmp, "MAP.md", write=True)
        problems = check(written)
        expect(f"--write leaves only the new row's description to do (got {problems})",
               len(problems) == 1 and "still to be written" in problems[0] and len(todo) == 1)
        expect("--write keeps the notes of names that remain",
               "b (`Thing`)" in written and "serde (derive)" in written)
        expect("--write redraws the layers", " 2   c/\n 1   a\n 0   b\n" in written)
        expect("--write names a file as a file", "| `a` | f |" in written)

        # A cycle fails with 1, an unresolved path with 2, and the document is not compared.
        with open(os.path.join(tmp, "src/b.rs"), "a", encoding="utf-8") as f:
            f.write("pub fn h() { crate::a::f(); }\n")
        quiet = open(os.devnull, "w")
        expect("a cycle exits 1", run(tmp, specs, "MAP.md", out=quiet, err=quiet) == 1)
        with open(os.path.join(tmp, "src/b.rs"), "w", encoding="utf-8") as f:
            f.write("pub struct Thing;\npub fn h() { crate::nowhere::f(); }\n")
        expect("an unresolved path exits 2", run(tmp, specs, "MAP.md", out=quiet, err=quiet) == 2)
        quiet.close()
    finally:
        shutil.rmtree(tmp)
    if failures:
        print("check-imports --self-test: FAILED:")
        for f in failures:
            print("  " + f)
        return 1
    print("check-imports --self-test: a right document passes; each wrong one fails naming "
          "the difference; --write rewrites it; cycles and unresolved paths fail")
    return 0


if __name__ == "__main__":
    sys.exit(main())
