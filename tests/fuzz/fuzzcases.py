"""Hypothesis strategies for the fuzz tests: arbitrary JSON-ish values, mutations of valid
documents (drop, rename, retype, rewrap, extreme numbers, odd unicode, deep nesting), axis
expressions good and bad, and text-level damage to the files; plus the per-target case counter
that the fuzz conftest prints."""

from __future__ import annotations

import collections
import copy
import json
import math
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck
from hypothesis import strategies as st

REPO = Path(__file__).resolve().parents[2]
TOKEN = "fuzz-Wm4Xq8Rt2Zp6Ky9Lb3Nc7Vd1Hs5Gj0Fa"  # the fuzzed app's submit token (32+ random characters)
PROBLEMS = REPO / "problems"

# deadline=None: a case's time depends on the shared CPU; database=None: nothing written beside
# the repository (a failure prints its seed and the falsifying example instead).
FUZZ = {"deadline": None, "database": None,
        "suppress_health_check": [HealthCheck.too_slow, HealthCheck.data_too_large,
                                  HealthCheck.function_scoped_fixture, HealthCheck.filter_too_much]}

CASES: collections.Counter[str] = collections.Counter()  # target -> examples run, printed at the end


def count(target: str) -> None:
    CASES[target] += 1


# --- valid documents to start from ---------------------------------------------------------------------

DEFINITION = {
    "name": "fuzz_scale", "op_type": "elementwise", "description": "x times w", "tags": ["fuzz"],
    "axes": {"n": {"type": "var"}, "h": {"type": "const", "value": 8},
             "m": {"type": "expr", "expression": "max(n // 2, 1)"}},
    "inputs": {"x": {"shape": ["n", "h"], "dtype": "float32"}, "w": {"shape": ["h"], "dtype": "float32"},
               "eps": {"shape": None, "dtype": "float32"}},
    "outputs": {"y": {"shape": ["n", "h"], "dtype": "float32"}},
    "reference": "import torch\n\n\ndef run(x, w, eps):\n    return x * w + eps\n",
    "constraints": ["n >= 1"],
    "sol": {"flops": "2 * n * h", "bytes": "4 * (2 * n * h + h)"},
}
WORKLOAD = {"uuid": "w1", "axes": {"n": 16},
            "inputs": {"x": {"type": "random"}, "w": {"type": "random"}, "eps": {"type": "scalar", "value": 1e-6}},
            "tolerance": {"max_atol": 1e-3, "max_rtol": 1e-3, "required_matched_ratio": 0.99}}
SOLUTION = {
    "name": "fuzz_scale_triton", "definition": "fuzz_scale", "author": "fuzz", "description": "a seed",
    "spec": {"languages": ["triton"], "target_hardware": ["H200", "LOCAL"], "entry_point": "main.py::run",
             "dependencies": ["torch"], "destination_passing_style": True,
             "compile_options": {"cflags": ["-O3"], "cuda_cflags": [], "ld_flags": []},
             "tunables": {"BLOCK": [64, 128]}, "tunable_values": {"BLOCK": 64}},
    "sources": [{"path": "main.py", "content": "def run(x, w, eps, y):\n    y.copy_(x * w + eps)\n"},
                {"path": "util/helpers.py", "content": "X = 1\n"}],
}
TRACE = {
    "definition": "fuzz_scale", "workload": WORKLOAD, "solution": "fuzz_scale_triton",
    "evaluation": {"status": "PASSED", "environment": {"hardware": "H200", "libs": {"torch": "2.5"}},
                   "timestamp": "2026-12-02T12:00:00Z", "log": "",
                   "correctness": {"max_relative_error": 0.0, "max_absolute_error": 0.0},
                   "performance": {"latency_ms": 0.1, "reference_latency_ms": 0.2, "speedup_factor": 2.0},
                   "timing": {"median_ms": 0.1, "min_ms": 0.09, "max_ms": 0.2, "runs": 10}},
    "attempt": {"campaign": "c", "worker": "w", "tokens": 10, "gpu_seconds": 1.5},
}


def library_documents(limit: int = 4) -> list[tuple[dict, list[dict]]]:
    """(definition, workloads) of a few problems of the library, as JSON values."""
    found = []
    for folder in sorted(PROBLEMS.iterdir())[:limit]:
        if (folder / "definition.json").is_file():
            definition = json.loads((folder / "definition.json").read_text())
            lines = (folder / "workload.jsonl").read_text().splitlines()
            found.append((definition, [json.loads(line) for line in lines[:3] if line.strip()]))
    return found


# --- values -----------------------------------------------------------------------------------------------

EXTREME_NUMBERS = [0, -1, 1, 2**31, 2**63, 2**64 + 1, -(2**63) - 1, 10**300, 1e308, -1e-308, 0.5, -0.0,
                   math.inf, -math.inf, math.nan, True, False]
ODD_TEXTS = ["", " ", "\x00", "\n", "a\nb", "\ud800", "\udfff", "\u2028", "\ufeff", "é", "名前", "🙂",
             "../x", "/abs", "a\\b", "$", "$.a", "[0]", "`", "'", '"', "{", "::", "a::b::c", "main.py::",
             "x" * 300, "-" * 2000 + "1", "(" * 120 + "1" + ")" * 120, "__import__('os')", "n/0", "9**9**9"]

any_chars = st.characters(exclude_categories=())  # surrogates included: JSON's `\ud800` can carry them
texts = st.one_of(st.text(max_size=12), st.text(any_chars, max_size=12), st.sampled_from(ODD_TEXTS))
numbers = st.one_of(st.integers(), st.floats(), st.sampled_from(EXTREME_NUMBERS))
scalars = st.one_of(st.none(), st.booleans(), numbers, texts)
json_values = st.recursive(scalars, lambda inner: st.one_of(
    st.lists(inner, max_size=4), st.dictionaries(texts, inner, max_size=4)), max_leaves=12)


def nested(depth: int, leaf: Any = 1) -> Any:
    value = leaf
    for level in range(depth):
        value = [value] if level % 2 else {"k": value}
    return value


# --- axis expressions -------------------------------------------------------------------------------------

_atoms = st.one_of(st.sampled_from(["n", "h", "m", "q", "0", "1", "2", "7", "0.5", "1e308", "10**400", "True",
                                    "'s'", "1j", "-1"]), st.integers(-3, 10**6).map(str))


@st.composite
def _expression(draw: st.DrawFn, depth: int = 0) -> str:
    if depth > 3 or draw(st.booleans()):
        return draw(_atoms)
    kind = draw(st.sampled_from(["bin", "bin", "unary", "call", "paren", "junk"]))
    if kind == "bin":
        op = draw(st.sampled_from(["+", "-", "*", "/", "//", "%", "**", "<<", "and", "if", ",", "@", "==", "."]))
        return f"{draw(_expression(depth + 1))} {op} {draw(_expression(depth + 1))}"
    if kind == "unary":
        return draw(st.sampled_from(["-", "+", "~", "not ", "--"])) + draw(_expression(depth + 1))
    if kind == "call":
        function = draw(st.sampled_from(["min", "max", "abs", "int", "__import__", "n", "min.__class__"]))
        args = draw(st.lists(_expression(depth + 1), max_size=3))
        keyword = draw(st.sampled_from(["", ", key=1", ", *n", ", **n"])) if args else ""
        return f"{function}({', '.join(args)}{keyword})"
    if kind == "paren":
        return f"({draw(_expression(depth + 1))})"
    return draw(st.sampled_from(["", " ", "n +", "lambda: 1", "[n]", "{n}", "n[0]", "n.real", "x := 1",
                                "\x00", "-" * 500 + "n", "(" * 200 + "n" + ")" * 200, "n " * 50]))


expressions = st.one_of(_expression(), st.sampled_from(ODD_TEXTS))


# --- mutations of a document --------------------------------------------------------------------------------


def _paths(value: Any, deepest: int = 12) -> list[tuple]:
    """Every path to a node (the root included) down to `deepest` levels, keys and indices."""
    found, stack = [], [((), value)]
    while stack:
        path, node = stack.pop()
        found.append(path)
        if len(path) >= deepest:
            continue
        if isinstance(node, dict):
            stack.extend(((*path, key), child) for key, child in node.items())
        elif isinstance(node, list):
            stack.extend(((*path, index), child) for index, child in enumerate(node))
    return sorted(found, key=lambda p: (len(p), repr(p)))


def _at(doc: Any, path: tuple) -> Any:
    for part in path:
        doc = doc[part]
    return doc


def _set(doc: Any, path: tuple, value: Any) -> Any:
    if not path:
        return value
    _at(doc, path[:-1])[path[-1]] = value
    return doc


MUTATIONS = ["drop", "rename", "retype", "extreme", "odd_text", "wrap", "unwrap", "add_key", "duplicate",
             "expression", "nest", "empty"]


@st.composite
def mutated(draw: st.DrawFn, document: Any, most: int = 3) -> Any:
    """`document` with 1 to `most` random mutations at random places."""
    doc = copy.deepcopy(document)
    for _ in range(draw(st.integers(1, most))):
        path = draw(st.sampled_from(_paths(doc)))
        node = _at(doc, path)
        kind = draw(st.sampled_from(MUTATIONS))
        parent = _at(doc, path[:-1]) if path else None
        if kind == "drop" and path:
            del parent[path[-1]]
        elif kind == "rename" and path and isinstance(parent, dict):
            new_key = draw(st.one_of(texts, st.just(str(path[-1]).upper()), st.just(f"{path[-1]}_")))
            parent[new_key] = parent.pop(path[-1])
        elif kind == "retype":
            doc = _set(doc, path, draw(json_values))
        elif kind == "extreme":
            doc = _set(doc, path, draw(st.sampled_from(EXTREME_NUMBERS)))
        elif kind == "odd_text":
            doc = _set(doc, path, draw(texts))
        elif kind == "wrap":
            doc = _set(doc, path, draw(st.sampled_from([[node], {"value": node}, {"type": node}])))
        elif kind == "unwrap" and isinstance(node, (dict, list)) and node:
            doc = _set(doc, path, draw(st.sampled_from(list(node.values()) if isinstance(node, dict) else node)))
        elif kind == "add_key" and isinstance(node, dict):
            node[draw(texts)] = draw(json_values)
        elif kind == "duplicate" and isinstance(node, list) and node:
            node.append(copy.deepcopy(node[0]))
        elif kind == "expression":
            doc = _set(doc, path, draw(expressions))
        elif kind == "nest":  # the last mutation: the others would walk the deep value
            return _set(doc, path, nested(draw(st.sampled_from([30, 200])), node))
        elif kind == "empty":
            doc = _set(doc, path, draw(st.sampled_from([{}, [], "", None])))
    return doc


# --- text-level damage -----------------------------------------------------------------------------------


def dumps(value: Any) -> str:
    """JSON text of any value, NaN and Infinity included; too deep for json.dumps becomes a marker."""
    try:
        return json.dumps(value, ensure_ascii=False)
    except (RecursionError, ValueError):
        return '"too deep"'


@st.composite
def damaged_text(draw: st.DrawFn, text: str) -> str:
    """`text` unchanged most of the time, else cut, spliced, or given a huge number or deep nesting."""
    kind = draw(st.sampled_from(["keep"] * 10 + ["cut", "insert", "huge_int", "deep", "bom", "crlf", "ascii"]))
    at = draw(st.integers(0, len(text)))
    if kind == "cut":
        return text[:at]
    if kind == "insert":
        return text[:at] + draw(st.sampled_from(["\n", "{", "}", ",", '"', "\\", "\x00", "\ud800", "NaN", "]"])) \
            + text[at:]
    if kind == "huge_int":
        return text.replace("16", "1" * draw(st.sampled_from([20, 4400, 5000])), 1).replace(
            '"value": 8', '"value": ' + "9" * 4500, 1)
    if kind == "deep":
        depth = draw(st.sampled_from([900, 5000, 100_000]))
        return "[" * depth + "]" * depth if draw(st.booleans()) else text.replace('"fuzz"', "[" * depth, 1)
    if kind == "bom":
        return "\ufeff" + text
    if kind == "crlf":
        return text.replace("\n", "\r\n")
    if kind == "ascii":
        return text.encode("ascii", "backslashreplace").decode()
    return text


def jsonl(workloads: list[Any]) -> str:
    return "".join(dumps(w) + "\n" for w in workloads)
