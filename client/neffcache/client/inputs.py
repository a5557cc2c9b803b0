"""What the compiler was handed, recognised by its content and read once.

The living Neuron stacks name their inputs as they please (docs/client.md): TorchNeuron
sends StableHLO bytecode as ``module.mlir`` (or an HloModuleProto as
``module.hlo.pb``), vLLM Neuron an HloModuleProto as ``graph.hlo``, libneuronxla one as
``model.MODULE_….hlo_module.pb``, and ``torch_neuronx.trace`` a folder holding
``graph.hlo``, ``metadata.json`` and ``weights/*.npy``. So the name decides nothing:

============== =================================== =======================================
kind           recognised by                       keys
============== =================================== =======================================
``hlo``        a file keying parses as an          direct (raw bytes) and canonical
               HloModuleProto                      (``fingerprint_hlo``)
``stablehlo``  MLIR bytecode's magic number        direct, and canonical when keying's
                                                   reader knows the bytecode
                                                   (``fingerprint_mlir``)
``mlir-text``  MLIR's textual form                 direct only
``directory``  a folder                            direct over every file's bytes;
                                                   canonical with ``graph.hlo``'s
                                                   fingerprint in place of its bytes
``unknown``    anything else                       none: the compiler runs uncached
============== =================================== =======================================

A file's kind between ``hlo`` and ``unknown`` is known only once it is parsed, which a
direct-key hit never needs: the same bytes were keyed before, so they were keyable.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from neffcache.keying import CacheKey, CompileContext, KeyingError, hash_threads

# A folder with more files than this is not a traced model; reading it would only cost.
MAX_DIRECTORY_FILES = 100_000
# The file of a trace folder that holds the graph (docs/client.md).
TRACE_GRAPH = "graph.hlo"
# Its map of the weights (file names relative to the folder, for torch_neuronx.trace).
TRACE_METADATA = "metadata.json"


class Unkeyable(Exception):
    """The input cannot be keyed; the message says why. The compiler runs uncached."""


class GraphInput:
    """One input, read. ``direct`` and ``canonical`` make its keys in a context;
    ``module`` is an HloModuleProto to keep beside the NEFF and to summarise for an
    explanation, when there is one (known once ``canonical`` has run)."""

    kind = "unknown"
    module: bytes | None = None

    def direct(self, ctx: CompileContext) -> CacheKey:
        raise NotImplementedError

    def canonical(self, ctx: CompileContext) -> CacheKey | None:
        """The metadata-insensitive key; None when the input has no canonical form
        (its direct key is then its only key). Unkeyable when it cannot be keyed."""
        raise NotImplementedError


def read_input(path: Path) -> GraphInput:
    """The input at ``path``; OSError when it cannot be read, Unkeyable when it is
    neither a file nor a folder (a FIFO, a device)."""
    status = os.stat(path)
    if stat.S_ISDIR(status.st_mode):
        return DirectoryInput(path)
    if not stat.S_ISREG(status.st_mode):
        raise Unkeyable(f"{path} is not a regular file or a folder")
    return FileInput(path.read_bytes())


def is_bytecode(data: bytes) -> bool:
    return data[:4] == b"ML\xefR"  # MLIR bytecode's magic number


class FileInput(GraphInput):
    """A file. Its direct key needs only its bytes (the hit path parses nothing); what
    it is, is found out when the canonical key is asked for."""

    def __init__(self, data: bytes) -> None:
        self.data = data
        self.kind = "stablehlo" if is_bytecode(data) else "file"

    def direct(self, ctx: CompileContext) -> CacheKey:
        from neffcache.keying import direct_key

        return direct_key(self.data, ctx)

    def canonical(self, ctx: CompileContext) -> CacheKey | None:
        from neffcache.keying import KeyInputs, compute_key, is_mlir_text

        if self.kind == "file" and is_mlir_text(self.data):
            self.kind = "mlir-text"
        if self.kind == "mlir-text":
            return None
        fingerprint = fingerprint_of(self.data, self.kind)
        if self.kind == "file":
            self.kind, self.module = "hlo", self.data
        return None if fingerprint is None else compute_key(KeyInputs(fingerprint, ctx))


def fingerprint_of(data: bytes, kind: str) -> str | None:
    """The canonical fingerprint of a module: StableHLO bytecode the reader does not
    know is None (the raw-bytes key stands alone); anything else is read as an
    HloModuleProto, and a file that is not one is Unkeyable."""
    import neffcache.keying as keying

    if kind == "stablehlo":
        try:
            fingerprint: str = keying.fingerprint_mlir(data)
        except KeyingError:
            return None
        return fingerprint
    try:
        fingerprint = keying.fingerprint_hlo(data)
    except KeyingError as exc:
        raise Unkeyable(f"not an HloModuleProto, MLIR or a folder ({exc})") from None
    return fingerprint


class DirectoryInput(GraphInput):
    """A trace folder: every file under it by relative path, weights streamed through
    BLAKE3; the canonical key puts ``graph.hlo``'s fingerprint in place of its bytes."""

    kind = "directory"

    def __init__(self, root: Path) -> None:
        from neffcache.keying import tree_digest

        self.raw: list[tuple[str, str]] = []
        self.graph: bytes | None = None
        for relative, path in _files(root):
            if relative == TRACE_METADATA:
                _check_metadata(path)
            if relative == TRACE_GRAPH:
                self.graph = path.read_bytes()
                self.raw.append((relative, "blake3:" + _digest_bytes(self.graph)))
            else:
                self.raw.append((relative, "blake3:" + _digest_file(path)))
        self.tree = tree_digest(self.raw)

    def direct(self, ctx: CompileContext) -> CacheKey:
        from neffcache.keying import digest_key

        return digest_key(self.tree, ctx)

    def canonical(self, ctx: CompileContext) -> CacheKey | None:
        from neffcache.keying import KeyInputs, compute_key, tree_digest

        if self.graph is None:
            return None  # no graph to canonicalise: the raw files are the key
        kind = "stablehlo" if is_bytecode(self.graph) else "hlo"
        try:
            fingerprint = fingerprint_of(self.graph, kind)
        except Unkeyable:
            return None  # a graph.hlo keying cannot read: its bytes are in the key
        if fingerprint is None:
            return None
        if kind == "hlo":
            self.module = self.graph
        label = f"{kind}:{fingerprint}"
        files = [(name, label if name == TRACE_GRAPH else value) for name, value in self.raw]
        return compute_key(KeyInputs(tree_digest(files), ctx))


def _files(root: Path) -> list[tuple[str, Path]]:
    """Every file under ``root`` as (relative POSIX path, path), symlinks to files
    followed as the compiler would; Unkeyable for anything else found there (a link to
    a folder could loop, a FIFO would never end)."""
    found: list[tuple[str, Path]] = []
    for directory, folders, names in os.walk(root, followlinks=False, onerror=_raise):
        for name in folders:
            if os.path.islink(os.path.join(directory, name)):
                raise Unkeyable(f"{os.path.join(directory, name)} links to a folder")
        for name in names:
            path = Path(directory, name)
            if not stat.S_ISREG(os.stat(path).st_mode):
                raise Unkeyable(f"{path} is not a regular file")
            found.append((path.relative_to(root).as_posix(), path))
            if len(found) > MAX_DIRECTORY_FILES:
                raise Unkeyable(f"{root} holds over {MAX_DIRECTORY_FILES} files")
    return found


def _check_metadata(path: Path) -> None:
    """Unkeyable when the trace's metadata names a file outside its folder (an absolute
    path, ``../shared/0.npy``, ``~/w.npy``): the compiler would read it, and only the
    folder's files are in the key. Names inside the folder are, as files."""
    import json

    try:
        value = json.loads(path.read_bytes())
    except ValueError:
        return  # not JSON: the compiler reads no paths out of it either
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
        elif isinstance(item, str) and _outside(item):
            raise Unkeyable(f"{path} names {item[:200]!r}, outside the folder")


def _outside(text: str) -> bool:
    import posixpath

    if text.startswith(("/", "~")):
        return True
    return posixpath.normpath(text).split("/")[0] == ".."


def _raise(error: OSError) -> None:
    raise error


def _digest_bytes(data: bytes) -> str:
    import blake3

    digest: str = blake3.blake3(data, max_threads=hash_threads(len(data))).hexdigest()
    return digest


def _digest_file(path: Path) -> str:
    import blake3

    with open(path, "rb") as f:
        hasher = blake3.blake3(max_threads=hash_threads(os.fstat(f.fileno()).st_size))
        while chunk := f.read(8 << 20):
            hasher.update(chunk)
    digest: str = hasher.hexdigest()
    return digest
