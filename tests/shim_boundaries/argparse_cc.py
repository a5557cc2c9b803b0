"""A second stand-in ``neuronx-cc`` for these tests: argparse, as the documented CLI.

tests/standins/neuronx-cc parses its options by hand and accepts anything. The real
``neuronx-cc`` is a Python program whose ``compile`` options are documented in the
Neuron Compiler CLI Reference Guide (aws-neuron-sdk
``compiler/neuronx-cc/api-reference-guide/index.rst``); this stand-in declares those
options with ``argparse`` and its defaults (``allow_abbrev=True``: ``--targ`` is
``--target``, ``--out`` is ``--output``), so the tests can ask what an argparse-based
compiler would do with a command line:

* ``<model_files>`` positional; ``--framework`` and ``--target`` are required (the
  guide shows them without the square brackets it uses for optional parameters);
* value options: ``--target``, ``--framework``, ``--model-type``, ``--auto-cast``,
  ``--auto-cast-type``, ``--native-int64``, ``--implicit-integer-downcast``,
  ``--distribution-strategy``, ``--logical-nc-config``/``-lnc``/``--lnc``,
  ``--optlevel``/``-O``, ``--logfile``, ``--output``, ``--verbose``,
  ``--tensorizer-options``, ``--internal-backend-options``,
  ``--internal-hlo2tensorizer-options``; ``--pipeline`` takes one or more words;
* switches: ``--enable-mixed-precision-accumulation``,
  ``--disable-mixed-precision-accumulation``, ``--enable-saturate-infinity``,
  ``--enable-fast-context-switch``, ``--enable-fast-loading-neuron-binaries``.

Anything else is argparse's usage error (exit 2). ``--version`` prints the version
block (``ATTACK_CC_VERSION``, default the stand-in's). The NEFF is a function of the
input's bytes (a folder: its files' relative names and bytes, and the weight
files its ``metadata.json`` names, wherever they are) and every parsed option
but ``--output``, ``--logfile``, ``--verbose`` and ``--framework``. It is written to
``--output``; ``--logfile`` gets a line. Each invocation appends its argv as a JSON
line to ``ATTACK_CC_LOG`` when set.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys

VERSION = os.environ.get("ATTACK_CC_VERSION") or "2.20.9961.0+0acef03a"


def _log(argv: list[str]) -> None:
    path = os.environ.get("ATTACK_CC_LOG")
    if path:
        with open(path, "a", encoding="utf-8") as f:
            f.write(json.dumps(argv) + "\n")


def _digest(path: str) -> str:
    if not os.path.isdir(path):
        with open(path, "rb") as f:
            data = f.read()
        if not data:
            raise OSError(f"input file {path} is empty")
        return hashlib.sha256(data).hexdigest()
    tree = hashlib.sha256(b"tree")
    for dirpath, dirnames, filenames in sorted(os.walk(path)):
        dirnames.sort()
        for name in sorted(filenames):
            full = os.path.join(dirpath, name)
            with open(full, "rb") as f:
                data = f.read()
            tree.update(os.path.relpath(full, path).encode() + b"\0")
            tree.update(hashlib.sha256(data).digest())
    # torch_neuronx.trace's metadata.json names the weight files (relative paths
    # joined to the folder, as torch_neuronx writes them): the compiler reads them.
    meta = os.path.join(path, "metadata.json")
    if os.path.isfile(meta):
        with open(meta, encoding="utf-8") as f:
            weights = json.load(f).get("weights", {})
        for key, rel in sorted(weights.items()):
            with open(os.path.join(path, rel), "rb") as f:
                tree.update(key.encode() + b"\0" + hashlib.sha256(f.read()).digest())
    return tree.hexdigest()


def parser() -> argparse.ArgumentParser:
    top = argparse.ArgumentParser(prog="neuronx-cc")
    sub = top.add_subparsers(dest="command", required=True)
    c = sub.add_parser("compile")
    c.add_argument("model_files", nargs="+")
    c.add_argument("--framework", required=True, choices=["XLA"])
    c.add_argument("--target", required=True, choices=["inf2", "trn1", "trn1n", "trn2", "trn3"])
    for name in (
        "--model-type",
        "--auto-cast",
        "--auto-cast-type",
        "--native-int64",
        "--implicit-integer-downcast",
        "--distribution-strategy",
        "--tensorizer-options",
        "--internal-backend-options",
        "--internal-hlo2tensorizer-options",
        "--logfile",
        "--verbose",
    ):
        c.add_argument(name)
    c.add_argument("--logical-nc-config", "-lnc", "--lnc")
    c.add_argument("--optlevel", "-O")
    c.add_argument("--output", default="file.neff")
    c.add_argument("--pipeline", nargs="+")
    c.add_argument(
        "--enable-mixed-precision-accumulation", dest="mixed", action="store_true", default=True
    )
    c.add_argument("--disable-mixed-precision-accumulation", dest="mixed", action="store_false")
    for name in (
        "--enable-saturate-infinity",
        "--enable-fast-context-switch",
        "--enable-fast-loading-neuron-binaries",
    ):
        c.add_argument(name, action="store_true")
    return top


def main(argv: list[str]) -> int:
    _log(argv)
    if argv[:1] in (["--version"], ["-V"]):
        print(f"NeuronX Compiler version {VERSION}\n")
        return 0
    args = parser().parse_args(argv)
    if len(args.model_files) != 1:
        print("neuronx-cc: error: XLA takes one model file", file=sys.stderr)
        return 2
    try:
        digest = _digest(args.model_files[0])
    except OSError as exc:
        print(f"neuronx-cc: error: {exc}", file=sys.stderr)
        return 2
    seen = {
        k: v
        for k, v in sorted(vars(args).items())
        if k not in ("output", "logfile", "verbose", "framework", "model_files", "command")
    }
    seed = hashlib.sha256(json.dumps([digest, seen], sort_keys=True).encode()).digest()
    neff = b"ARGPARSE-NEFF\n" + b"".join(
        hashlib.sha256(seed + bytes([i])).digest() for i in range(64)
    )
    if args.logfile is not None:
        with open(args.logfile, "w", encoding="utf-8") as f:
            f.write("neuronx-cc (test stand-in) log\n")
    tmp = args.output + ".partial"
    with open(tmp, "wb") as f:
        f.write(neff)
    os.replace(tmp, args.output)
    print("Compiler status PASS")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
