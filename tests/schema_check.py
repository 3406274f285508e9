#!/usr/bin/env python3
"""The JSON Schema (pipelines/pipeline.schema.json) and trnflow agree on the examples: every
example pipeline validates against the schema and with `trnflow validate`; and structural
mistakes in tests/broken that the schema can see are rejected by both.
Usage: schema_check.py SOURCE_DIR TRNFLOW_BINARY"""
import glob
import json
import subprocess
import sys

import jsonschema
import yaml


class Yaml12Loader(yaml.SafeLoader):
    """YAML 1.2 booleans, as yaml-cpp and editors read them: `on:` is a key, not True."""


Yaml12Loader.yaml_implicit_resolvers = {
    k: [(tag, rx) for tag, rx in v if tag != "tag:yaml.org,2002:bool"]
    for k, v in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
Yaml12Loader.add_implicit_resolver(
    "tag:yaml.org,2002:bool", __import__("re").compile(r"^(?:true|false)$"), list("tf"))


def load(path):
    with open(path) as f:
        return yaml.load(f, Loader=Yaml12Loader)


def main() -> int:
    src, trnflow = sys.argv[1], sys.argv[2]
    with open(f"{src}/pipelines/pipeline.schema.json") as f:
        schema = json.load(f)
    jsonschema.Draft7Validator.check_schema(schema)
    validator = jsonschema.Draft7Validator(schema)
    failures = 0
    checked = 0
    examples = sorted(glob.glob(f"{src}/examples/**/*.yaml", recursive=True))
    if not examples:
        print("no examples found", file=sys.stderr)
        return 1
    for path in examples:
        checked += 1
        errors = [e.message for e in validator.iter_errors(load(path))]
        ours = subprocess.run([trnflow, "validate", path], capture_output=True, text=True, cwd=src)
        if errors or ours.returncode != 0:
            failures += 1
            print(f"FAIL {path}: schema {errors[:3]}; trnflow exit {ours.returncode} {ours.stderr}")
        else:
            print(f"ok   {path}")
    # Structural mistakes: both must reject (the schema cannot see hardware rules).
    for path in sorted(glob.glob(f"{src}/tests/broken/*.yaml")):
        with open(path) as f:
            head = [f.readline() for _ in range(3)]
        if not any("# schema: rejects" in line for line in head):
            continue
        try:
            doc = load(path)
        except yaml.YAMLError:
            continue
        checked += 1
        schema_rejects = any(True for _ in validator.iter_errors(doc))
        ours = subprocess.run([trnflow, "validate", path], capture_output=True, text=True, cwd=src)
        if not schema_rejects or ours.returncode != 2:
            failures += 1
            print(f"FAIL {path}: schema rejects={schema_rejects}, trnflow exit {ours.returncode}")
        else:
            print(f"ok   {path} (rejected by both)")
    print(f"{checked - failures} passed, {failures} failed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
