#!/usr/bin/python3
# SPDX-License-Identifier: MIT
# Checks that a trace.json is a valid Chrome trace event file (the JSON object form that Perfetto
# and chrome://tracing open) with a JSON schema, plus the few rules a schema cannot say. Used by
# the tests on the output of atlas::runtime::chrome_trace_json; usable on any run's trace.json.
"""usage: check_trace.py TRACE.json [--quiet] [--strict]

Errors: the schema (object with traceEvents; each event has name, ph in the format's phases,
integer pid/tid; X events have numeric ts and dur >= 0; M events name a process/thread) and every
X event's track named by a thread_name event. Warnings: X events on one track that overlap
without nesting (Perfetto mis-draws them); --strict makes warnings errors.
exit status: 0 valid; 1 usage error or python3-jsonschema missing; 2 invalid trace (every
problem is printed with its JSON path); 5 the file cannot be read."""

import importlib.util
import json
import sys

# Phases of the trace event format (Google's "Trace Event Format" document).
PHASES = ["B", "E", "X", "i", "I", "C", "b", "n", "e", "s", "t", "f", "P", "N", "O", "D", "M",
          "V", "v", "R", "c", "(", ")"]
METADATA_NAMES = ["process_name", "process_labels", "process_sort_index", "thread_name",
                  "thread_sort_index"]

SCHEMA = {
    "$schema": "http://json-schema.org/draft-07/schema#",
    "title": "Chrome trace event file (JSON object format)",
    "type": "object",
    "required": ["traceEvents"],
    "properties": {
        "traceEvents": {"type": "array", "items": {"$ref": "#/definitions/event"}},
        "displayTimeUnit": {"enum": ["ms", "ns"]},
        "otherData": {"type": "object"},
    },
    "definitions": {
        "event": {
            "type": "object",
            "required": ["name", "ph", "pid", "tid"],
            "properties": {
                "name": {"type": "string"},
                "cat": {"type": "string"},
                "ph": {"enum": PHASES},
                "ts": {"type": "number"},
                "dur": {"type": "number", "minimum": 0},
                "tdur": {"type": "number", "minimum": 0},
                "pid": {"type": "integer"},
                "tid": {"type": "integer"},
                "id": {"type": ["string", "integer"]},
                "s": {"enum": ["g", "p", "t"]},
                "args": {"type": "object"},
            },
            "allOf": [
                {"if": {"properties": {"ph": {"const": "X"}}},
                 "then": {"required": ["ts", "dur"]}},
                {"if": {"properties": {"ph": {"enum": ["B", "E", "i", "I", "C"]}}},
                 "then": {"required": ["ts"]}},
                {"if": {"properties": {"ph": {"const": "M"}}},
                 "then": {"required": ["args"],
                          "properties": {"name": {"enum": METADATA_NAMES}}}},
                {"if": {"properties": {"ph": {"const": "M"},
                                       "name": {"enum": ["process_name", "thread_name"]}}},
                 "then": {"properties": {"args": {"required": ["name"],
                                                  "properties": {"name": {"type": "string"}}}}}},
            ],
        }
    },
}


def problems_of(trace):
    """(errors, warnings) of a parsed trace, as 'path: message' strings."""
    import jsonschema
    validator = jsonschema.Draft7Validator(SCHEMA)
    errors = []
    for err in sorted(validator.iter_errors(trace), key=lambda e: list(e.absolute_path)):
        path = "/".join(str(p) for p in err.absolute_path) or "(root)"
        errors.append(f"{path}: {err.message}")
    if errors:
        return errors, []
    # Rules beyond the schema: every X event's track is named by a thread_name metadata event;
    # X events on one track should nest or follow each other.
    named = {(e["pid"], e["tid"]) for e in trace["traceEvents"]
             if e["ph"] == "M" and e["name"] == "thread_name"}
    spans = {}
    for i, e in enumerate(trace["traceEvents"]):
        if e["ph"] != "X":
            continue
        if (e["pid"], e["tid"]) not in named:
            errors.append(f"traceEvents/{i}: pid {e['pid']} tid {e['tid']} has no thread_name "
                          f"metadata event")
        spans.setdefault((e["pid"], e["tid"]), []).append((e["ts"], e["ts"] + e["dur"], i))
    warnings = []
    eps = 1e-2  # us: ts and dur are each rounded to 3 decimals, so an end may pass the next start
    for track, items in spans.items():
        stack = []
        for start, end, i in sorted(items, key=lambda x: (x[0], -x[1])):
            while stack and stack[-1][1] <= start + eps:
                stack.pop()
            if stack and end > stack[-1][1] + eps:
                warnings.append(f"traceEvents/{i}: overlaps traceEvents/{stack[-1][2]} on pid "
                                f"{track[0]} tid {track[1]} without nesting")
            stack.append((start, end, i))
    return errors, warnings


def main(argv):
    flags = {a for a in argv if a.startswith("--")}
    args = [a for a in argv if not a.startswith("--")]
    if len(args) != 1 or flags - {"--quiet", "--strict"}:
        sys.stderr.write(__doc__ + "\n")
        return 1
    if importlib.util.find_spec("jsonschema") is None:
        sys.stderr.write("ERROR: Python module 'jsonschema' is missing: install the Debian package "
                         "python3-jsonschema (apt-get install python3-jsonschema) and run with "
                         f"/usr/bin/python3; running: {sys.executable}\n")
        return 1
    path = args[0]
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except OSError as e:
        sys.stderr.write(f"ERROR: cannot read {path}: {e}\n")
        return 5
    try:
        trace = json.loads(text)
    except ValueError as e:
        sys.stderr.write(f"ERROR: {path}: not JSON: {e}\n")
        return 2
    errors, warnings = problems_of(trace)
    if "--strict" in flags:
        errors, warnings = errors + warnings, []
    for label, items in (("WARNING", warnings), ("ERROR", errors)):
        for p in items[:50]:
            sys.stderr.write(f"{label}: {path}: {p}\n")
        if len(items) > 50:
            sys.stderr.write(f"{label}: {path}: ... and {len(items) - 50} more\n")
    if errors:
        return 2
    if "--quiet" not in flags:
        events = trace["traceEvents"]
        n_x = sum(1 for e in events if e["ph"] == "X")
        tracks = len({(e["pid"], e["tid"]) for e in events if e["ph"] == "X"})
        print(f"{path}: valid Chrome trace: {len(events)} events, {n_x} complete (X) events on "
              f"{tracks} tracks, {len(warnings)} warning(s)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
