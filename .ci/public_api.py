#!/usr/bin/env python3
"""The public API of each library crate, as a checked-in listing: api/<crate>.txt.

`python3 .ci/public_api.py` regenerates the listings into a temporary directory and diffs them
against api/; a difference fails with the diff. `python3 .ci/public_api.py --update` rewrites
api/. A deliberate change of the public surface commits its listing in the same commit, so the
change is visible in review; an accidental one fails CI.

The listing comes from rustdoc's JSON output (`--output-format json`), which is unstable:
RUSTC_BOOTSTRAP=1 lets the stable toolchain emit it. The JSON is built with every feature on,
in its own target dir (<target>/public-api): RUSTC_BOOTSTRAP changes what proc-macro2's build
script probes, so sharing the usual target dir would rebuild it, and all that depends on it,
on every switch.

Library crates are the workspace members with a lib target that may be published
(backstop-lab, the examples, benches and test helpers have `publish = false`).

From the crate root, the walk follows public modules and `pub use` re-exports (into private
modules too) and prints one line per item, sorted by path: modules, structs, unions and enums
with their public fields and variants, traits with their items, free functions, inherent
methods, trait impls of the crate's types (derived ones and the auto traits Send, Sync, Unpin,
UnwindSafe, RefUnwindSafe included; blanket impls such as `From<T> for T` left out), impls of
the crate's traits, constants, statics, type aliases, macros, and re-exports of other crates'
items (their own listings hold those). An item reachable at several paths is listed at the
shortest; every other path is a `pub use` line. Types are rendered approximately but
deterministically: a named type by its canonical path (the crate's own items by their public
path), everything else close to Rust syntax. `#[non_exhaustive]`, `#[repr]` and
`#[deprecated]` are kept; other attributes, docs and feature gates are not.

Python 3 standard library only.
"""

import difflib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections import defaultdict

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
API_DIR = os.path.join(ROOT, "api")
INSTRUCTION = "run python3 .ci/public_api.py --update and commit the listing with the change"
# Unstable traits whose impls rustdoc lists (auto traits it synthesizes, the marker that
# `#[derive(PartialEq)]` adds): they come and go with the toolchain, so they are left out.
UNSTABLE_TRAITS = {"Freeze", "UnsafeUnpin", "StructuralPartialEq"}


def cargo_metadata():
    out = subprocess.run(
        ["cargo", "metadata", "--format-version", "1", "--no-deps", "--locked"],
        cwd=ROOT, check=True, capture_output=True, text=True,
    ).stdout
    return json.loads(out)


def library_crates(meta):
    """(package name, lib target name) of each publishable workspace library, sorted."""
    members = set(meta["workspace_members"])
    crates = []
    for pkg in meta["packages"]:
        if pkg["id"] not in members or pkg.get("publish") == []:
            continue
        for target in pkg["targets"]:
            if "lib" in target["kind"] or "proc-macro" in target["kind"]:
                crates.append((pkg["name"], target["name"].replace("-", "_")))
    return sorted(crates)


def build_json(meta, crates):
    target_dir = os.path.join(meta["target_directory"], "public-api")
    env = dict(os.environ)
    env["RUSTC_BOOTSTRAP"] = "1"
    env["RUSTDOCFLAGS"] = "-Z unstable-options --output-format json"
    env["CARGO_TARGET_DIR"] = target_dir
    cmd = ["cargo", "doc", "--no-deps", "--all-features", "--locked"]
    for name, _ in crates:
        cmd += ["-p", name]
    done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        sys.stderr.write(done.stdout + done.stderr)
        sys.exit("public_api: rustdoc's JSON build failed")
    return {lib: os.path.join(target_dir, "doc", lib + ".json") for _, lib in crates}


class Crate:
    def __init__(self, doc):
        self.doc = doc
        self.siblings = {}  # defining path of a sibling crate's item -> its public path
        self.index = doc["index"]
        self.paths = doc["paths"]
        self.public = {}  # local item id -> canonical public path
        self.lines = []  # (sort key, text)
        self.unnameable = set()  # local items used in the API but reachable at no public path

    # ---- lookups ----------------------------------------------------------------------------

    def item(self, id_):
        return self.index.get(str(id_))

    def is_local(self, id_):
        it = self.item(id_)
        return it is not None and it["crate_id"] == 0

    def name_of(self, id_, written):
        if id_ is not None and str(id_) in self.public:
            return self.public[str(id_)]
        summary = self.paths.get(str(id_)) if id_ is not None else None
        if summary is not None:
            path = "::".join(summary["path"])
            if summary["crate_id"] != 0:
                return self.siblings.get(path, path)
            if summary["crate_id"] == 0:
                self.unnameable.add(path)
            return path
        return written

    # ---- rendering of types -----------------------------------------------------------------

    def ty(self, t):
        if t is None:
            return "()"
        if isinstance(t, str):  # "infer"
            return "_"
        (kind, v), = t.items()
        if kind == "resolved_path":
            return self.path(v)
        if kind == "generic" or kind == "primitive":
            return v
        if kind == "tuple":
            inner = ", ".join(self.ty(x) for x in v)
            return "(" + inner + ("," if len(v) == 1 else "") + ")"
        if kind == "slice":
            return "[" + self.ty(v) + "]"
        if kind == "array":
            return "[" + self.ty(v["type"]) + "; " + v["len"] + "]"
        if kind == "pat":
            return self.ty(v["type"])
        if kind == "infer":
            return "_"
        if kind == "raw_pointer":
            return ("*mut " if v["is_mutable"] else "*const ") + self.ty(v["type"])
        if kind == "borrowed_ref":
            s = "&"
            if v["lifetime"]:
                s += v["lifetime"] + " "
            if v["is_mutable"]:
                s += "mut "
            return s + self.ty(v["type"])
        if kind == "dyn_trait":
            parts = [self.poly_trait(p) for p in v["traits"]]
            if v.get("lifetime"):
                parts.append(v["lifetime"])
            return "dyn " + " + ".join(parts)
        if kind == "impl_trait":
            return "impl " + self.bounds(v)
        if kind == "function_pointer":
            s = self.hrtb(v.get("generic_params", []))
            s += self.header(v["header"])
            return s + "fn" + self.sig(v["sig"], with_names=False)
        if kind == "qualified_path":
            args = self.args(v.get("args"))
            self_ty = v["self_type"]
            if v.get("trait") is None:
                return self.ty(self_ty) + "::" + v["name"] + args
            if self_ty == {"generic": "Self"}:
                return "Self::" + v["name"] + args
            return "<" + self.ty(self_ty) + " as " + self.path(v["trait"]) + ">::" + v["name"] + args
        return "<" + kind + ">"

    def path(self, p):
        return self.name_of(p.get("id"), p["path"]) + self.args(p.get("args"))

    def args(self, a):
        if not a:
            return ""
        if isinstance(a, str):  # return_type_notation
            return "(..)"
        (kind, v), = a.items()
        if kind == "parenthesized":
            s = "(" + ", ".join(self.ty(x) for x in v["inputs"]) + ")"
            if v.get("output") is not None:
                s += " -> " + self.ty(v["output"])
            return s
        parts = [self.generic_arg(x) for x in v["args"]]
        parts += [self.constraint(c) for c in v.get("constraints", [])]
        return "<" + ", ".join(parts) + ">" if parts else ""

    def generic_arg(self, g):
        if isinstance(g, str):
            return "_"
        (kind, v), = g.items()
        if kind == "lifetime":
            return v
        if kind == "type":
            return self.ty(v)
        if kind == "const":
            return self.constant(v)
        return "_"

    def constant(self, c):
        return c.get("value") or c.get("expr") or "_"

    def term(self, t):
        (kind, v), = t.items()
        return self.ty(v) if kind == "type" else self.constant(v)

    def constraint(self, c):
        s = c["name"] + self.args(c.get("args"))
        (kind, v), = c["binding"].items()
        if kind == "equality":
            return s + " = " + self.term(v)
        return s + ": " + self.bounds(v)

    def bound(self, b):
        (kind, v), = b.items()
        if kind == "trait_bound":
            modifier = {"maybe": "?", "maybe_const": "~const "}.get(v.get("modifier"), "")
            return self.hrtb(v.get("generic_params", [])) + modifier + self.path(v["trait"])
        if kind == "outlives":
            return v
        if kind == "use":
            names = []
            for x in v:
                names.append(x if isinstance(x, str) else next(iter(x.values())))
            return "use<" + ", ".join(names) + ">"
        return "<" + kind + ">"

    def bounds(self, bs):
        return " + ".join(self.bound(b) for b in bs)

    def poly_trait(self, p):
        return self.hrtb(p.get("generic_params", [])) + self.path(p["trait"])

    def hrtb(self, params):
        if not params:
            return ""
        return "for<" + ", ".join(self.param(p) for p in params) + "> "

    def param(self, p):
        (kind, v), = p["kind"].items()
        name = p["name"]
        if kind == "lifetime":
            return name + (": " + " + ".join(v["outlives"]) if v["outlives"] else "")
        if kind == "type":
            s = name
            if v["bounds"]:
                s += ": " + self.bounds(v["bounds"])
            if v.get("default") is not None:
                s += " = " + self.ty(v["default"])
            return s
        s = "const " + name + ": " + self.ty(v["type"])
        if v.get("default") is not None:
            s += " = " + v["default"]
        return s

    def generics(self, g):
        params = [p for p in g["params"]
                  if not (("type" in p["kind"]) and p["kind"]["type"].get("is_synthetic"))]
        return "<" + ", ".join(self.param(p) for p in params) + ">" if params else ""

    def where(self, g):
        preds = []
        for w in g["where_predicates"]:
            (kind, v), = w.items()
            if kind == "bound_predicate":
                preds.append(self.hrtb(v.get("generic_params", [])) + self.ty(v["type"]) + ": "
                             + self.bounds(v["bounds"]))
            elif kind == "lifetime_predicate":
                preds.append(v["lifetime"] + ": " + " + ".join(v["outlives"]))
            elif kind == "eq_predicate":
                preds.append(self.ty(v["lhs"]) + " = " + self.term(v["rhs"]))
        return " where " + ", ".join(preds) if preds else ""

    def header(self, h):
        s = ""
        if h.get("is_const"):
            s += "const "
        if h.get("is_async"):
            s += "async "
        if h.get("is_unsafe"):
            s += "unsafe "
        abi = h.get("abi", "Rust")
        if abi != "Rust":
            s += 'extern "' + (abi if isinstance(abi, str) else next(iter(abi))) + '" '
        return s

    def sig(self, sig, with_names=True):
        args = []
        for name, t in sig["inputs"]:
            if with_names and name == "self":
                if t == {"generic": "Self"}:
                    args.append("self")
                    continue
                ref = t.get("borrowed_ref") if isinstance(t, dict) else None
                if ref and ref["type"] == {"generic": "Self"}:
                    args.append("&" + (ref["lifetime"] + " " if ref["lifetime"] else "")
                                + ("mut " if ref["is_mutable"] else "") + "self")
                    continue
            args.append((name + ": " if with_names else "") + self.ty(t))
        if sig.get("is_c_variadic"):
            args.append("...")
        s = "(" + ", ".join(args) + ")"
        if sig.get("output") is not None:
            s += " -> " + self.ty(sig["output"])
        return s

    def attrs(self, it):
        out = []
        for a in it.get("attrs", []):
            if a == "non_exhaustive" or a == "#[non_exhaustive]":
                out.append("#[non_exhaustive]")
            elif isinstance(a, dict) and "repr" in a:
                r = a["repr"]
                parts = [] if r.get("kind") in (None, "rust") else [r["kind"]]
                if r.get("int"):
                    parts.append(r["int"])
                if r.get("align"):
                    parts.append("align(%s)" % r["align"])
                if r.get("packed"):
                    parts.append("packed(%s)" % r["packed"])
                if parts:
                    out.append("#[repr(" + ", ".join(parts) + ")]")
            elif isinstance(a, str) and a.startswith("#[repr"):
                out.append(a)
        if it.get("deprecation") is not None:
            out.append("#[deprecated]")
        return "".join(x + " " for x in sorted(out))

    # ---- the walk ---------------------------------------------------------------------------

    def collect_paths(self):
        found = defaultdict(set)
        externals = []  # (path, target) of re-exports of other crates' items
        seen = set()

        def walk(mod_id, prefix):
            key = (mod_id, prefix)
            if key in seen or len(prefix) > 32:
                return
            seen.add(key)
            for iid in self.item(mod_id)["inner"]["module"]["items"]:
                it = self.item(iid)
                if it is None:
                    continue
                (kind, v), = it["inner"].items()
                if kind == "use":
                    target = v.get("id")
                    if v["is_glob"]:
                        if target is not None and self.is_local(target) and \
                                "module" in self.item(target)["inner"]:
                            walk(target, prefix)
                        else:
                            externals.append(("::".join(prefix) + "::*", target, v["source"], "::*"))
                        continue
                    path = prefix + (v["name"],)
                    if target is not None and self.is_local(target):
                        found[str(target)].add(path)
                        if "module" in self.item(target)["inner"]:
                            walk(target, path)
                    else:
                        externals.append(("::".join(path), target, v["source"], ""))
                    continue
                if it["name"] is None:
                    continue
                path = prefix + (it["name"],)
                found[str(iid)].add(path)
                if kind == "module":
                    walk(iid, path)

        root = self.item(self.doc["root"])
        found[str(self.doc["root"])].add((root["name"],))
        walk(self.doc["root"], (root["name"],))
        for id_, paths in found.items():
            self.public[id_] = "::".join(min(paths, key=lambda p: (len(p), p)))
        self.found, self.externals = found, externals

    def defining_paths(self):
        """Defining path (as other crates' JSON names it) -> public path, of each public item."""
        out = {}
        for id_, public in self.public.items():
            summary = self.paths.get(id_)
            if summary is not None and summary["crate_id"] == 0:
                out["::".join(summary["path"])] = public
        return out

    def emit(self, path, rank, text):
        self.lines.append(((path, rank, text), text))

    def run(self):
        found = self.found
        for target_path, target, source, glob in self.externals:
            self.emit(target_path, 0, "pub use " + target_path + " = " + self.name_of(target, source) + glob)
        impls = set()
        for id_, paths in found.items():
            canonical = self.public[id_]
            for p in paths:
                p = "::".join(p)
                if p != canonical:
                    self.emit(p, 0, "pub use " + p + " = " + canonical)
            impls |= self.item_lines(self.item(id_), canonical)
        for impl_id in sorted(impls, key=int):
            self.impl_lines(self.item(impl_id))
        return sorted(self.lines)

    def item_lines(self, it, path):
        """Emits the lines of one item; returns the impl ids to list."""
        (kind, v), = it["inner"].items()
        pre = self.attrs(it)
        if kind == "module":
            self.emit(path, 1, pre + "pub mod " + path)
            return set()
        if kind in ("struct", "union"):
            head = pre + "pub " + kind + " " + path + self.generics(v["generics"])
            sk = v["kind"]
            if kind == "union":
                sk = {"plain": {"fields": v["fields"], "has_stripped_fields": v["has_stripped_fields"]}}
            if sk == "unit":
                self.emit(path, 1, head + self.where(v["generics"]) + ";")
            elif "tuple" in sk:
                fields = [("pub " + self.ty(self.item(f)["inner"]["struct_field"])) if f is not None
                          else "_" for f in sk["tuple"]]
                self.emit(path, 1, head + "(" + ", ".join(fields) + ")" + self.where(v["generics"]))
            else:
                body = " { .. }" if sk["plain"]["has_stripped_fields"] else " {}"
                self.emit(path, 1, head + self.where(v["generics"]) + body)
                self.fields(path, sk["plain"]["fields"])
            return set(str(i) for i in v["impls"])
        if kind == "enum":
            self.emit(path, 1, pre + "pub enum " + path + self.generics(v["generics"])
                      + self.where(v["generics"])
                      + (" { .. }" if v.get("has_stripped_variants") else ""))
            for var_id in v["variants"]:
                self.variant(path, self.item(var_id))
            return set(str(i) for i in v["impls"])
        if kind == "function":
            self.emit(path, 1, pre + self.function(path, v))
            return set()
        if kind == "trait":
            s = pre + "pub " + ("unsafe " if v["is_unsafe"] else "") + ("auto " if v["is_auto"] else "")
            s += "trait " + path + self.generics(v["generics"])
            if v["bounds"]:
                s += ": " + self.bounds(v["bounds"])
            s += self.where(v["generics"])
            if not v.get("is_dyn_compatible", True):
                s += " (not dyn-compatible)"
            self.emit(path, 1, s)
            for item_id in v["items"]:
                self.assoc_item(path, self.item(item_id), in_trait=True)
            return set(str(i) for i in v["implementations"])
        if kind == "type_alias":
            self.emit(path, 1, pre + "pub type " + path + self.generics(v["generics"])
                      + self.where(v["generics"]) + " = " + self.ty(v["type"]))
            return set()
        if kind == "constant":
            c = v["const"]
            s = pre + "pub const " + path + ": " + self.ty(v["type"])
            if c.get("expr") not in (None, "_"):
                s += " = " + c["expr"]
            self.emit(path, 1, s)
            return set()
        if kind == "static":
            self.emit(path, 1, pre + "pub " + ("unsafe " if v.get("is_unsafe") else "") + "static "
                      + ("mut " if v["is_mutable"] else "") + path + ": " + self.ty(v["type"]))
            return set()
        if kind == "macro":
            self.emit(path, 1, "macro_rules! " + path)
            return set()
        if kind == "proc_macro":
            self.emit(path, 1, "proc-macro(" + v["kind"] + ") " + path)
            return set()
        if kind == "trait_alias":
            self.emit(path, 1, "pub trait " + path + self.generics(v["generics"]) + " = "
                      + self.bounds(v["params"]))
            return set()
        self.emit(path, 1, kind + " " + path)
        return set()

    def fields(self, path, field_ids):
        for f in field_ids:
            field = self.item(f)
            if field is None:
                continue
            self.emit(path + "::" + field["name"], 2,
                      "pub field " + path + "::" + field["name"] + ": "
                      + self.ty(field["inner"]["struct_field"]))

    def variant(self, enum_path, var):
        v = var["inner"]["variant"]
        path = enum_path + "::" + var["name"]
        s = self.attrs(var) + "pub variant " + path
        kind = v["kind"]
        if isinstance(kind, dict) and "tuple" in kind:
            s += "(" + ", ".join(self.ty(self.item(f)["inner"]["struct_field"]) if f is not None
                                 else "_" for f in kind["tuple"]) + ")"
        elif isinstance(kind, dict) and "struct" in kind:
            s += " { .. }" if kind["struct"]["has_stripped_fields"] else " {}"
        if v.get("discriminant"):
            s += " = " + v["discriminant"]["expr"]
        self.emit(path, 2, s)
        if isinstance(kind, dict) and "struct" in kind:
            self.fields(path, kind["struct"]["fields"])

    def function(self, path, v):
        g = v["generics"]
        return ("pub " + self.header(v["header"]) + "fn " + path + self.generics(g)
                + self.sig(v["sig"]) + self.where(g))

    def assoc_item(self, owner, it, in_trait, suffix=""):
        if it is None:
            return
        (kind, v), = it["inner"].items()
        path = owner + "::" + it["name"]
        if kind == "function":
            s = self.attrs(it) + self.function(path, v)
            if in_trait:
                s = s[len("pub "):] if s.startswith("pub ") else s
                s = "trait " + s + (" { provided }" if v["has_body"] else "")
            self.emit(path, 3, s + suffix)
        elif kind == "assoc_type":
            s = ("trait " if in_trait else "pub ") + "type " + path + self.generics(v["generics"])
            if v["bounds"]:
                s += ": " + self.bounds(v["bounds"])
            s += self.where(v["generics"])
            if v.get("type") is not None:
                s += " = " + self.ty(v["type"])
            self.emit(path, 3, s + suffix)
        elif kind == "assoc_const":
            s = ("trait " if in_trait else "pub ") + "const " + path + ": " + self.ty(v["type"])
            if v.get("value") not in (None, "_"):
                s += " = " + v["value"]
            self.emit(path, 3, s + suffix)

    def impl_lines(self, it):
        if it is None:
            return
        v = it["inner"]["impl"]
        if v.get("blanket_impl") is not None:
            return
        trait = v.get("trait")
        if trait is not None and trait["path"].split("::")[-1] in UNSTABLE_TRAITS:
            return
        g = v["generics"]
        self_ty = self.ty(v["for"])
        owner = self_ty
        f = v["for"]
        if isinstance(f, dict) and "resolved_path" in f:
            owner = self.name_of(f["resolved_path"].get("id"), f["resolved_path"]["path"])
        if trait is None:
            # Inherent: each public item a line, under the type; the impl's bounds as a suffix.
            bounded = [p for p in g["params"] if "type" in p["kind"] and p["kind"]["type"]["bounds"]]
            suffix = ""
            if bounded or g["where_predicates"]:
                suffix = "  [impl" + self.generics(g) + " " + self_ty + self.where(g) + "]"
            for item_id in v["items"]:
                item = self.item(item_id)
                if item is not None and item.get("visibility") == "public":
                    self.assoc_item(self_ty, item, in_trait=False, suffix=suffix)
            return
        s = ("unsafe " if v["is_unsafe"] else "") + "impl" + self.generics(g) + " "
        s += ("!" if v["is_negative"] else "") + self.path(trait) + " for " + self_ty + self.where(g)
        assoc = []
        for item_id in v["items"]:
            item = self.item(item_id)
            if item is None:
                continue
            (kind, iv), = item["inner"].items()
            if kind == "assoc_type" and iv.get("type") is not None:
                assoc.append("type " + item["name"] + self.generics(iv["generics"]) + " = "
                             + self.ty(iv["type"]))
            elif kind == "assoc_const":
                assoc.append("const " + item["name"] + ": " + self.ty(iv["type"]))
        if assoc:
            s += " { " + "; ".join(sorted(assoc)) + " }"
        self.emit(owner, 4, s)


def listings(json_paths):
    """The listing of each crate; a sibling crate's item is named by its public path."""
    crates = {}
    for name, path in sorted(json_paths.items()):
        with open(path) as f:
            crates[name] = Crate(json.load(f))
        crates[name].collect_paths()
    siblings = {}
    for crate in crates.values():
        siblings.update(crate.defining_paths())
    out = {}
    for name, crate in crates.items():
        crate.siblings = siblings
        out[name] = listing(crate)
    return out


def listing(crate):
    doc = crate.doc
    lines = [text for _, text in crate.run()]
    header = ["# The public API of %s (rustdoc JSON format %s), generated by .ci/public_api.py."
              % (crate.item(doc["root"])["name"], doc["format_version"])]
    if crate.unnameable:
        header.append("# Used in the API but at no public path: " + ", ".join(sorted(crate.unnameable)))
    return "\n".join(header + lines) + "\n"


def main(argv):
    update = "--update" in argv[1:]
    meta = cargo_metadata()
    crates = library_crates(meta)
    jsons = build_json(meta, crates)
    fresh = listings({name: jsons[lib] for name, lib in crates})
    if update:
        if os.path.isdir(API_DIR):
            for stale in os.listdir(API_DIR):
                if stale.endswith(".txt") and stale[:-4] not in fresh:
                    os.remove(os.path.join(API_DIR, stale))
        os.makedirs(API_DIR, exist_ok=True)
        for name, text in fresh.items():
            with open(os.path.join(API_DIR, name + ".txt"), "w") as f:
                f.write(text)
        print("public_api: wrote %d listings to api/" % len(fresh))
        return 0
    tmp = tempfile.mkdtemp(prefix="public-api-")
    try:
        failed = False
        checked = set(fresh)
        if os.path.isdir(API_DIR):
            checked |= {n[:-4] for n in os.listdir(API_DIR) if n.endswith(".txt")}
        for name in sorted(checked):
            new = fresh.get(name, "")
            with open(os.path.join(tmp, name + ".txt"), "w") as f:
                f.write(new)
            committed_path = os.path.join(API_DIR, name + ".txt")
            old = open(committed_path).read() if os.path.exists(committed_path) else ""
            if old != new:
                failed = True
                sys.stdout.writelines(difflib.unified_diff(
                    old.splitlines(True), new.splitlines(True),
                    "api/%s.txt (committed)" % name, "api/%s.txt (generated)" % name))
        if failed:
            print("\npublic_api: the public API differs from api/: " + INSTRUCTION)
            return 1
        print("public_api: %d listings match api/" % len(fresh))
        return 0
    finally:
        shutil.rmtree(tmp)


if __name__ == "__main__":
    sys.exit(main(sys.argv))
