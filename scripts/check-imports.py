#!/usr/bin/env python3
"""Fails on an import cycle between the modules of the core crate (src/) or of the
actors crate (actors/src/).

Each crate is meant to be layered: a module may use the modules below it, never one
that (directly or through others) uses it back. This script reads every path into
the crate that its **/*.rs files name and checks that the graphs they make have no
cycle.

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
    counts as the module it is imported from.
Test-only code is not counted: a `#[cfg(test)]` module, inline or in a file of its
own, may use whatever it needs to build its fixtures. Binaries (src/bin/) are not
part of the library crate and are not read.

Exit status: 0 with a one-line summary per crate when there is no cycle; 1 naming
every cycle, with the lines that make each of its edges; 2 when a path cannot be
resolved to a module (so that the check never passes by not seeing an edge).

Usage: scripts/check-imports.py [--src DIR ...] [--verbose]
"""

import argparse
import os
import re
import sys

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


CFG_TEST = re.compile(r"#\[cfg\(test\)\]\s*(?:#\[[^\]]*\]\s*)*(?:pub(?:\([^)]*\))?\s+)?mod\s+(" + IDENT + r")\s*([;{])")


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
    if rel == ["lib"]:
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


def check_crate(src, repo, verbose):
    """Checks one crate; returns (exit status, lines to print)."""
    out = []
    files = {}
    for root, dirs, names in os.walk(src):
        if os.path.normpath(root) == src:
            dirs[:] = [d for d in dirs if d != "bin"]
        dirs.sort()
        for name in sorted(names):
            if name.endswith(".rs"):
                path = os.path.join(root, name)
                files[module_of_file(src, path)] = path
    modules = set(files)
    rel = lambda path: os.path.relpath(path, repo)

    # Read every file once: code without comments, strings and test modules.
    code_of, test_files = {}, set()
    for mod, path in files.items():
        with open(path, encoding="utf-8") as f:
            code, test_mods = drop_test_modules(strip_code(f.read()))
        code_of[mod] = code
        test_files.update(mod + (t,) for t in test_mods)
    # A test file's own children are test code too.
    test_files = {m for m in modules if any(m[: len(t)] == t for t in test_files)}

    def absolute(mod, p):
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
        if tuple(mod) + (p[0],) in modules:  # `use child::X` (2018 paths)
            return list(mod) + list(p)
        return None

    # Names each module imports or re-exports: `use a::b::{X, Y};` -> X, Y from a::b.
    imports = {}
    for mod, code in code_of.items():
        if mod in test_files:
            continue
        for m in re.finditer(r"\buse\s+([^;]+);", code):
            for p in expand_use(m.group(1)):
                full = absolute(mod, p)
                if full:
                    imports.setdefault(mod, {})[full[-1]] = tuple(full)

    def resolve(segs, depth=0):
        """The module a crate-rooted path names: the longest known module it starts
        with, following a name that module imports."""
        segs = tuple(segs)
        if not segs:
            return ()
        for k in range(len(segs), -1, -1):
            if segs[:k] in modules:
                head = segs[:k]
                if k < len(segs) and depth < 16:
                    target = imports.get(head, {}).get(segs[k])
                    if target is not None and target != segs[: k + 1]:
                        found = resolve(target + segs[k + 1:], depth + 1)
                        if found is not None:
                            return found
                return head if k else None
        return None

    edges = {}  # (from, to) -> ["file:line", ...]
    unresolved = []

    def add(mod, segs, path, line):
        target = resolve(segs)
        if target is None:
            unresolved.append(f"{rel(path)}:{line}: cannot resolve crate::{'::'.join(segs)}")
            return
        edge = level_edge(mod, target)
        if edge is None:
            return
        edges.setdefault(edge, []).append(f"{rel(path)}:{line}")

    for mod, code in code_of.items():
        if mod in test_files or mod == ():
            continue
        path = files[mod]
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
                    add(mod, absolute(module_at(m.start()), p), path, line_at(m.start()))
        for m in re.finditer(r"(?<![A-Za-z0-9_$:])crate((?:::" + IDENT + r")+)", code):
            if any(s <= m.start() < e for s, e in used):
                continue
            segs = [s for s in m.group(1).split("::") if s]
            add(mod, segs, path, line_at(m.start()))
        # Inline `super::a::b` paths (in code, not in a `use`): relative to the module
        # they are written in.
        for m in re.finditer(r"(?<![A-Za-z0-9_$:])((?:super::)+)(" + IDENT + r"(?:::" + IDENT + r")*)", code):
            if any(s <= m.start() < e for s, e in used):
                continue
            p = ["super"] * m.group(1).count("super") + m.group(2).split("::")
            add(mod, absolute(module_at(m.start()), p), path, line_at(m.start()))

    crate = rel(src)
    if unresolved:
        out.append(f"check-imports: paths that name no module of {crate}/:")
        out.extend("  " + u for u in unresolved)
        return 2, out

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
        tops = {m[:1] for m in modules if m}
        out.append(f"check-imports: {len(tops)} top-level modules of {crate}/ ({len(files)} files), "
                   f"{len(edges)} import edges between sibling modules, no cycle")
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

    out.append(f"check-imports: {len(sccs)} group(s) of modules of {crate}/ that import each other in a cycle:")
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


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    root = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    ap.add_argument("--src", action="append",
                    help="a crate's source directory (repeatable; default: src and actors/src)")
    ap.add_argument("--verbose", action="store_true", help="print every edge")
    args = ap.parse_args()
    srcs = args.src or [os.path.join(root, "src"), os.path.join(root, "actors", "src")]
    status = 0
    for src in srcs:
        code, lines = check_crate(os.path.normpath(os.path.abspath(src)), root, args.verbose)
        for line in lines:
            print(line, file=sys.stderr if code == 2 else sys.stdout)
        status = max(status, code)
    return status


if __name__ == "__main__":
    sys.exit(main())
